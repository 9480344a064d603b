//! Keys agree with the Python reference derivation on random inputs: 10,000 `(tool, scope,
//! args)` cases drawn from a fixed seed go through `Key::derive` (as Rust values, and as the
//! `serde_json::Value` parsed from the arguments' text) and through the real `idem key` binary,
//! and each canonical text and key is compared with what `vectors/reference.py` derives from the
//! same text in one python3 run. The binary runs once per case, on twice as many threads as
//! there are cores (a process spends much of its short life starting and exiting).
//!
//! The cases aim at where a JSON writer can differ from Python's `json.dumps`: floats of every
//! magnitude (subnormals, 1e16, 1e21, 15–17 significant digits, doubles halfway between two
//! shortest spellings), integers beyond u64, i64 and 128 bits, control characters, DEL, BMP and
//! astral characters written raw or escaped, empty names, repeated names, and nesting.
//!
//! A failure prints the seed and both canonical texts; `IDEM_DIFFERENTIAL_SEED=<hex>` runs the
//! cases of another seed.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Instant;

use idem_runtime::{canonical_json, Key};
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

/// The seed CI runs; a failure names the seed it ran with.
const SEED: u64 = 0x1de3_0015_d1ff_5eed;
/// Cases per run, each through `Key::derive` and the `idem` binary.
const CASES: usize = 10_000;
/// Mismatches printed in full before the test gives up.
const SHOWN: usize = 12;

/// A random source from proptest's ChaCha generator, so a seed gives the same cases everywhere.
struct Draw(TestRng);

impl Draw {
    fn new(seed: u64) -> Draw {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Draw(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n`; the modulo bias is irrelevant for test data.
    fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// An argument value as a Rust program would hold it.
#[derive(Debug)]
enum Arg {
    Null,
    Bool(bool),
    Signed(i128),
    Unsigned(u128),
    /// An integer wider than 128 bits: only a serde_json `Number` under `arbitrary_precision`
    /// holds it.
    Wide(String),
    Float(f64),
    Str(String),
    Array(Vec<Arg>),
    /// Members in the order written, a repeated name included (the last one wins, in Python and
    /// in the canonical form).
    Object(Vec<(String, Arg)>),
}

impl Serialize for Arg {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Arg::Null => serializer.serialize_unit(),
            Arg::Bool(v) => serializer.serialize_bool(*v),
            // The narrowest type that holds the value, as a Rust parameter would have.
            Arg::Signed(v) => match i64::try_from(*v) {
                Ok(v) => serializer.serialize_i64(v),
                Err(_) => serializer.serialize_i128(*v),
            },
            Arg::Unsigned(v) => match u64::try_from(*v) {
                Ok(v) => serializer.serialize_u64(v),
                Err(_) => serializer.serialize_u128(*v),
            },
            Arg::Wide(text) => serde_json::Number::from_str(text)
                .map_err(serde::ser::Error::custom)?
                .serialize(serializer),
            Arg::Float(v) => serializer.serialize_f64(*v),
            Arg::Str(v) => serializer.serialize_str(v),
            Arg::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Arg::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (name, value) in members {
                    map.serialize_entry(name, value)?;
                }
                map.end()
            }
        }
    }
}

/// One random call: the Rust value of its arguments and the JSON text a model would send.
struct Case {
    tool: String,
    scope: String,
    args: Arg,
    text: String,
    /// The text holds a `\uXXXX` escape of a lone surrogate: Python reads it, no Rust string
    /// can hold it, so only the binary's refusal is checked.
    lone_surrogate: bool,
}

/// Floats spelled so that the interesting boundaries of Python's `repr` come up often.
const FLOAT_TEXTS: &[&str] = &[
    "1e16",
    "1E+16",
    "10000000000000000.0",
    "9999999999999998.0",
    "1e21",
    "1000000000000000000000.0",
    "1e22",
    "1e15",
    "999999999999999.9",
    "9007199254740993.0",
    "0.0",
    "-0.0",
    "5e-324",
    "4.9406564584124654e-324",
    "2.2250738585072014e-308",
    "2.225073858507201e-308",
    "1.7976931348623157e308",
    "0.0001",
    "0.00001",
    "1e-5",
    "123456789012345678.0",
    "100.0",
    "1E2",
    "2.5e-5",
    "0.1",
    "0.30000000000000004",
    "-627677689651098.2",
    "241804605705217.62",
];

fn generate(draw: &mut Draw) -> Case {
    let mut case = Case {
        tool: name(draw),
        scope: if draw.one_in(10) { String::new() } else { text_of(draw, 12, false) },
        args: Arg::Null,
        text: String::new(),
        lone_surrogate: false,
    };
    let mut text = String::new();
    let lone = draw.one_in(150);
    case.args = object(draw, 0, &mut text, lone);
    case.text = text;
    case.lone_surrogate = lone;
    case
}

/// A tool name: usually an identifier, sometimes any text.
fn name(draw: &mut Draw) -> String {
    if draw.one_in(5) {
        return text_of(draw, 8, false);
    }
    let len = 1 + draw.below(16);
    (0..len).map(|_| *draw.pick(&['a', 'e', 'r', 't', '_', 'z', '0', '9', 'Q'])).collect()
}

/// A JSON object of up to six members; `lone` puts a lone surrogate escape in one of them.
fn object(draw: &mut Draw, depth: usize, out: &mut String, lone: bool) -> Arg {
    let count = if depth == 0 { draw.below(7) } else { draw.below(4) };
    let count = if lone { count.max(1) } else { count };
    let lone_at = draw.below(count.max(1));
    let mut members: Vec<(String, Arg)> = Vec::new();
    out.push('{');
    for i in 0..count {
        if i > 0 {
            out.push(',');
        }
        space(draw, out);
        let member = match members.last() {
            Some((last, _)) if draw.one_in(12) => last.clone(),
            _ if draw.one_in(15) => String::new(),
            _ => text_of(draw, 10, true),
        };
        write_string(draw, &member, out);
        out.push(':');
        space(draw, out);
        let arg = if lone && i == lone_at {
            write_lone_surrogate(draw, out);
            Arg::Null
        } else {
            value(draw, depth + 1, out)
        };
        members.push((member, arg));
    }
    out.push('}');
    Arg::Object(members)
}

fn space(draw: &mut Draw, out: &mut String) {
    if draw.one_in(8) {
        let space: &&str = draw.pick(&[" ", "\n", "\t ", "\r\n"]);
        out.push_str(space);
    }
}

fn value(draw: &mut Draw, depth: usize, out: &mut String) -> Arg {
    let nested = if depth < 5 { 2 } else { 0 };
    match draw.below(9 + nested) {
        0 => {
            out.push_str("null");
            Arg::Null
        }
        1 => {
            let v = draw.one_in(2);
            out.push_str(if v { "true" } else { "false" });
            Arg::Bool(v)
        }
        2 | 3 => integer(draw, out),
        4..=6 => float(draw, out),
        7 | 8 => {
            let text = text_of(draw, 16, true);
            write_string(draw, &text, out);
            Arg::Str(text)
        }
        9 => {
            let len = draw.below(5);
            out.push('[');
            let items = (0..len)
                .map(|i| {
                    if i > 0 {
                        out.push(',');
                    }
                    space(draw, out);
                    value(draw, depth + 1, out)
                })
                .collect();
            out.push(']');
            Arg::Array(items)
        }
        _ => object(draw, depth, out, false),
    }
}

fn integer(draw: &mut Draw, out: &mut String) -> Arg {
    let random_i128 = |draw: &mut Draw| (i128::from(draw.u64() as i64) << 64) | draw.u64() as i128;
    let arg = match draw.below(8) {
        0 => Arg::Signed(draw.below(2001) as i128 - 1000),
        1 => Arg::Signed(draw.u64() as i64 as i128),
        2 => Arg::Unsigned(draw.u64() as u128),
        3 => Arg::Signed(*draw.pick(&[
            i128::from(i64::MIN),
            i128::from(i64::MAX),
            i128::from(i64::MIN) - 1,
            i128::from(u64::MAX) + 1,
            i128::MIN,
            i128::MAX,
        ])),
        4 => Arg::Unsigned(*draw.pick(&[u128::from(u64::MAX), u128::MAX])),
        5 => Arg::Signed(random_i128(draw)),
        6 => Arg::Unsigned((u128::from(draw.u64()) << 64) | u128::from(draw.u64())),
        _ => {
            // Beyond u128 and below i128::MIN: 40 to 80 digits.
            let mut text = String::from(if draw.one_in(2) { "-" } else { "" });
            text.push(char::from(b'1' + draw.below(9) as u8));
            for _ in 0..39 + draw.below(41) {
                text.push(char::from(b'0' + draw.below(10) as u8));
            }
            out.push_str(&text);
            return Arg::Wide(text);
        }
    };
    match &arg {
        // Python reads `-0` as the int 0.
        Arg::Signed(0) if draw.one_in(4) => out.push_str("-0"),
        Arg::Signed(v) => {
            let _ = write!(out, "{v}");
        }
        Arg::Unsigned(v) => {
            let _ = write!(out, "{v}");
        }
        _ => unreachable!("only integers are drawn here"),
    }
    arg
}

/// A float and a spelling of it that reads back to exactly that double, in Rust and in Python
/// (both read decimal text correctly rounded).
fn float(draw: &mut Draw, out: &mut String) -> Arg {
    let sign = if draw.one_in(2) { "-" } else { "" };
    loop {
        let text = match draw.below(5) {
            // Any double, every exponent equally likely (NaN and infinities are drawn again).
            0 => {
                let bits = draw.u64() & !(1 << 63);
                spell(draw, f64::from_bits(bits))
            }
            // Subnormal (or zero).
            1 => {
                let bits = draw.u64() & ((1 << 52) - 1);
                spell(draw, f64::from_bits(bits))
            }
            2 => draw.pick(FLOAT_TEXTS).trim_start_matches('-').to_owned(),
            _ => decimal(draw),
        };
        let value: f64 = format!("{sign}{text}")
            .parse()
            .unwrap_or_else(|e| panic!("the test spelled {sign}{text}: {e}"));
        if value.is_finite() {
            out.push_str(sign);
            out.push_str(&text);
            return Arg::Float(value);
        }
    }
}

/// `value` spelled as Rust's `{:?}`, `{:e}` or 17 significant digits: each reads back exactly.
fn spell(draw: &mut Draw, value: f64) -> String {
    match draw.below(3) {
        0 => format!("{value:?}"),
        1 => format!("{value:e}"),
        _ => format!("{value:.16e}"),
    }
}

/// 15 to 17 random significant digits, at any magnitude or between 1e10 and 1e18, where two
/// shortest spellings of a double are often equally near it.
fn decimal(draw: &mut Draw) -> String {
    let digits: String = (0..15 + draw.below(3))
        .map(|i| char::from(b'0' + if i == 0 { 1 + draw.below(9) } else { draw.below(10) } as u8))
        .collect();
    let exponent =
        if draw.one_in(2) { draw.below(640) as i32 - 330 } else { draw.below(8) as i32 + 10 };
    match draw.below(3) {
        0 => format!("{}.{}e{}", &digits[..1], &digits[1..], exponent),
        1 => format!("{}E{:+}", digits, exponent - digits.len() as i32 + 1),
        _ => positional(&digits, exponent),
    }
}

/// `digits` with the decimal point after the `exponent + 1`-th digit, as `123.45` or `0.00123`.
fn positional(digits: &str, exponent: i32) -> String {
    let point = exponent + 1;
    if point <= 0 {
        format!("0.{}{}", "0".repeat(point.unsigned_abs() as usize), digits)
    } else if point as usize >= digits.len() {
        format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
    } else {
        format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
    }
}

/// Up to `max` characters from every class JSON escaping treats differently. Object names and
/// argument strings may hold NUL; tool and scope travel as command-line arguments, which cannot.
fn text_of(draw: &mut Draw, max: usize, nul: bool) -> String {
    let len = draw.below(max + 1);
    let mut text = String::new();
    while text.chars().count() < len {
        let c = match draw.below(10) {
            0..=3 => char::from(b' ' + draw.below(95) as u8),
            4 => *draw.pick(&['"', '\\', '/', '\u{7f}', '\n', '\t']),
            5 => char::from(draw.below(0x20) as u8),
            6 => char::from_u32(0x80 + draw.below(0x780) as u32).unwrap_or('é'),
            7 => {
                *draw.pick(&['\u{2028}', '\u{2029}', '\u{feff}', '\u{fffe}', '\u{ffff}', 'é', 'ß'])
            }
            8 => char::from_u32(0x800 + draw.below(0xf800) as u32).unwrap_or('\u{e000}'),
            _ => match draw.below(3) {
                0 => *draw.pick(&['\u{1f600}', '\u{10000}', '\u{10ffff}', '𝄞']),
                _ => char::from_u32(0x10000 + draw.below(0x100000) as u32).unwrap_or('😀'),
            },
        };
        if c != '\0' || nul {
            text.push(c);
        }
    }
    text
}

/// Writes `text` as a JSON string, each character raw or escaped at random, as different JSON
/// writers (and models) do.
fn write_string(draw: &mut Draw, text: &str, out: &mut String) {
    let hex = |draw: &mut Draw, out: &mut String, unit: u32| {
        let _ = if draw.one_in(2) {
            write!(out, "\\u{unit:04x}")
        } else {
            write!(out, "\\u{unit:04X}")
        };
    };
    out.push('"');
    for c in text.chars() {
        let escape = draw.one_in(3);
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if escape => out.push_str("\\/"),
            '\n' if escape => out.push_str("\\n"),
            '\t' if escape => out.push_str("\\t"),
            '\r' if escape => out.push_str("\\r"),
            '\u{8}' if escape => out.push_str("\\b"),
            '\u{c}' if escape => out.push_str("\\f"),
            // JSON allows no raw control character in a string.
            '\0'..='\u{1f}' => hex(draw, out, c as u32),
            _ if escape => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    hex(draw, out, u32::from(*unit));
                }
            }
            _ => out.push(c),
        }
    }
    out.push('"');
}

fn write_lone_surrogate(draw: &mut Draw, out: &mut String) {
    let unit = 0xd800 + draw.below(0x800);
    // A high half followed by something that is not a low half, or a low half alone.
    let _ = write!(out, "\"ab\\u{unit:04x}{}\"", draw.pick(&["", "x", "\\u0041", "\\n"]));
}

/// Notes which kinds of input `arg` holds, so that the test fails if the generator stops
/// producing one of them.
fn cover(arg: &Arg, depth: usize, seen: &mut BTreeSet<&'static str>) {
    fn note(seen: &mut BTreeSet<&'static str>, what: &'static str, yes: bool) {
        if yes {
            seen.insert(what);
        }
    }
    match arg {
        Arg::Float(v) => {
            let v = v.abs();
            note(seen, "a subnormal float", v != 0.0 && v < f64::MIN_POSITIVE);
            note(seen, "a float of 1e16", v == 1e16);
            note(seen, "a float of 1e21", v == 1e21);
            note(seen, "a float above 1e21", v > 1e21);
            note(seen, "a float below 1e-300", v < 1e-300);
            let digits = format!("{v:e}").split('e').next().map_or(0, |m| m.replace('.', "").len());
            note(seen, "a float of 15 significant digits", digits == 15);
            note(seen, "a float of 16 significant digits", digits == 16);
            note(seen, "a float of 17 significant digits", digits == 17);
        }
        Arg::Signed(v) => note(seen, "an integer below i64::MIN", *v < i128::from(i64::MIN)),
        Arg::Unsigned(v) => note(seen, "an integer above u64::MAX", *v > u128::from(u64::MAX)),
        Arg::Wide(_) => note(seen, "an integer beyond 128 bits", true),
        Arg::Str(text) => {
            note(seen, "a control character", text.chars().any(|c| c < ' '));
            note(seen, "DEL", text.contains('\u{7f}'));
            note(seen, "an astral character", text.chars().any(|c| c > '\u{ffff}'));
            note(seen, "an empty string", text.is_empty());
        }
        Arg::Array(items) => {
            note(seen, "an empty array", items.is_empty());
            note(seen, "nesting four deep", depth >= 4);
            for item in items {
                cover(item, depth + 1, seen);
            }
        }
        Arg::Object(members) => {
            note(seen, "an empty object", members.is_empty());
            note(seen, "nesting four deep", depth >= 4);
            for (i, (name, value)) in members.iter().enumerate() {
                note(seen, "an empty name", name.is_empty());
                note(seen, "a repeated name", members[..i].iter().any(|(other, _)| other == name));
                cover(value, depth + 1, seen);
            }
        }
        Arg::Null | Arg::Bool(_) => {}
    }
}

/// What the Python reference derived for one case.
struct Reference {
    canonical: String,
    key: String,
}

/// Runs `vectors/reference.py --batch` once over every case; `None` when python3 is missing.
fn reference(cases: &[Case]) -> Option<Vec<Reference>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/reference.py");
    let mut input = String::new();
    for case in cases {
        let line = serde_json::json!({"tool": case.tool, "scope": case.scope, "args": case.text});
        input.push_str(&line.to_string());
        input.push('\n');
    }
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("cases.jsonl");
    std::fs::write(&batch, input).unwrap();
    let output = match Command::new("python3")
        .arg(script)
        .arg("--batch")
        .stdin(std::fs::File::open(&batch).unwrap())
        .stderr(Stdio::inherit())
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("cannot run python3 {script}: {e}"),
    };
    assert!(output.status.success(), "python3 {script} --batch failed: {}", output.status);
    let text = String::from_utf8(output.stdout).expect("the reference writes ASCII");
    let derived: Vec<Reference> = text
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            Reference {
                canonical: v["canonical"].as_str().unwrap().to_owned(),
                key: v["key"].as_str().unwrap().to_owned(),
            }
        })
        .collect();
    assert_eq!(derived.len(), cases.len(), "the reference answered a different number of cases");
    Some(derived)
}

/// What `idem key --json` printed for one case, or how it failed.
enum Cli {
    Derived { canonical: String, key: String },
    Failed { code: Option<i32>, stderr: String },
}

fn run_cli(case: &Case, dir: &std::path::Path) -> Cli {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("key")
        .arg("--json")
        // `--name=value`, so that a value starting with `-` is not read as an option.
        .arg(format!("--tool={}", case.tool))
        .arg(format!("--scope={}", case.scope))
        .arg(format!("--args={}", case.text))
        .current_dir(dir)
        .env_remove("IDEM_STORE")
        .output()
        .expect("the idem binary runs");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        return Cli::Failed { code: output.status.code(), stderr };
    }
    let printed: Value =
        serde_json::from_slice(&output.stdout).expect("idem key --json prints JSON");
    Cli::Derived {
        canonical: printed["canonical"].as_str().unwrap().to_owned(),
        key: printed["key"].as_str().unwrap().to_owned(),
    }
}

/// Collects mismatches, printing the first few in full.
struct Report {
    seed: u64,
    mismatches: usize,
    text: String,
}

impl Report {
    fn mismatch(&mut self, index: usize, case: &Case, path: &str, expected: &Reference, got: &str) {
        self.mismatches += 1;
        if self.mismatches <= SHOWN {
            let _ = writeln!(
                self.text,
                "case {index} (seed {seed:#x}), {path}:\n  tool {tool:?}, scope {scope:?}\n  \
                 args text:  {text}\n  Python:     {canonical} -> {key}\n  idem:       {got}\n",
                seed = self.seed,
                tool = case.tool,
                scope = case.scope,
                text = case.text,
                canonical = expected.canonical,
                key = expected.key,
            );
        }
    }
}

/// `canonical -> key` as idem derived it, or the error.
fn derived(result: Result<(String, Key), idem_runtime::Error>) -> String {
    match result {
        Ok((canonical, key)) => format!("{canonical} -> {key}"),
        Err(e) => format!("error: {e}"),
    }
}

fn through_runtime<T: Serialize>(
    case: &Case,
    args: &T,
) -> Result<(String, Key), idem_runtime::Error> {
    let canonical = canonical_json(args)?;
    let key = Key::derive(&case.tool, &case.scope, args)?;
    Ok((canonical, key))
}

#[test]
fn keys_agree_with_the_python_reference_on_random_cases() {
    let seed = match std::env::var("IDEM_DIFFERENTIAL_SEED") {
        Ok(text) => {
            let text = text.trim_start_matches("0x");
            u64::from_str_radix(text, 16).expect("IDEM_DIFFERENTIAL_SEED is a hex number")
        }
        Err(_) => SEED,
    };
    // The wide-integer cases hold their value in a serde_json `Number`, which needs the
    // `arbitrary_precision` feature this crate turns on.
    let wide = "-123456789012345678901234567890123456789012";
    assert_eq!(serde_json::Number::from_str(wide).unwrap().to_string(), wide);

    let started = Instant::now();
    let mut draw = Draw::new(seed);
    let cases: Vec<Case> = (0..CASES).map(|_| generate(&mut draw)).collect();
    let mut seen = BTreeSet::new();
    for case in &cases {
        cover(&case.args, 0, &mut seen);
        let text = case.text.to_ascii_lowercase();
        let escaped_pair = ["\\ud8", "\\ud9", "\\uda", "\\udb"].iter().any(|p| text.contains(p));
        for (what, yes) in [
            ("a lone surrogate escape", case.lone_surrogate),
            (
                "an astral character escaped as a surrogate pair",
                escaped_pair && !case.lone_surrogate,
            ),
            ("an empty scope", case.scope.is_empty()),
            ("an empty tool name", case.tool.is_empty()),
        ] {
            if yes {
                seen.insert(what);
            }
        }
    }
    let wanted = [
        "a subnormal float",
        "a float of 1e16",
        "a float of 1e21",
        "a float above 1e21",
        "a float below 1e-300",
        "a float of 15 significant digits",
        "a float of 16 significant digits",
        "a float of 17 significant digits",
        "an integer below i64::MIN",
        "an integer above u64::MAX",
        "an integer beyond 128 bits",
        "a control character",
        "DEL",
        "an astral character",
        "an empty string",
        "an empty array",
        "an empty object",
        "nesting four deep",
        "an empty name",
        "a repeated name",
        "a lone surrogate escape",
        "an astral character escaped as a surrogate pair",
        "an empty scope",
        "an empty tool name",
    ];
    let missing: Vec<&str> = wanted.iter().filter(|w| !seen.contains(*w)).copied().collect();
    assert!(missing.is_empty(), "seed {seed:#x} drew no case with {missing:?}");
    let generated = started.elapsed();
    let Some(expected) = reference(&cases) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs python3 for the differential test against the reference"
        );
        eprintln!(
            "\n*** NOTICE: python3 is not installed: the differential test against the Python \
             reference derivation is SKIPPED ***\n"
        );
        return;
    };
    let python = started.elapsed() - generated;

    let mut report = Report { seed, mismatches: 0, text: String::new() };
    let mut lone = 0;
    for (index, (case, expected)) in cases.iter().zip(&expected).enumerate() {
        if case.lone_surrogate {
            lone += 1;
            // Python derives a key; no Rust string can hold the text, so the binary must
            // refuse it clearly (checked below).
            assert!(
                serde_json::from_str::<Value>(&case.text).is_err(),
                "case {index}: {}",
                case.text
            );
            continue;
        }
        let want = format!("{} -> {}", expected.canonical, expected.key);
        let typed = derived(through_runtime(case, &case.args));
        if typed != want {
            report.mismatch(index, case, "Key::derive of Rust values", expected, &typed);
        }
        let parsed: Value = serde_json::from_str(&case.text)
            .unwrap_or_else(|e| panic!("case {index} (seed {seed:#x}): {e}: {}", case.text));
        let parsed = derived(through_runtime(case, &parsed));
        if parsed != want {
            report.mismatch(
                index,
                case,
                "Key::derive of the parsed serde_json::Value",
                expected,
                &parsed,
            );
        }
    }
    let in_process = started.elapsed() - generated - python;

    // The binary, over every case.
    let all: Vec<usize> = (0..CASES).collect();
    let threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8);
    let dir = tempfile::tempdir().unwrap();
    let answers: Vec<(usize, Cli)> = std::thread::scope(|scope| {
        let workers: Vec<_> = all
            .chunks(CASES.div_ceil(threads))
            .map(|chunk| {
                let (cases, dir) = (&cases, dir.path());
                scope.spawn(move || {
                    chunk.iter().map(|&i| (i, run_cli(&cases[i], dir))).collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a worker panicked")).collect()
    });
    for (index, answer) in answers {
        let (case, expected) = (&cases[index], &expected[index]);
        match (case.lone_surrogate, answer) {
            (false, Cli::Derived { canonical, key }) => {
                if canonical != expected.canonical || key != expected.key {
                    let got = format!("{canonical} -> {key}");
                    report.mismatch(index, case, "idem key", expected, &got);
                }
            }
            (true, Cli::Failed { code: Some(2), stderr })
                if stderr.starts_with("idem: --args holds `\\u")
                    && stderr.contains("a lone UTF-16 surrogate") => {}
            (_, Cli::Failed { code, stderr }) => {
                let got = format!("exit status {code:?}: {}", stderr.trim_end());
                report.mismatch(index, case, "idem key", expected, &got);
            }
            (true, Cli::Derived { canonical, key }) => {
                let got = format!("{canonical} -> {key}, where a clear refusal was expected");
                report.mismatch(index, case, "idem key", expected, &got);
            }
        }
    }
    let cli = started.elapsed() - generated - python - in_process;
    eprintln!(
        "differential test, seed {seed:#x}: {CASES} cases ({lone} with a lone surrogate), \
         the idem binary on {threads} threads; drawing {generated:.2?}, python3 {python:.2?}, \
         in-process {in_process:.2?}, binary {cli:.2?}"
    );
    assert!(
        report.mismatches == 0,
        "{} mismatch(es) with the Python reference (seed {seed:#x}; rerun with \
         IDEM_DIFFERENTIAL_SEED={seed:x}):\n\n{}",
        report.mismatches,
        report.text
    );
}
