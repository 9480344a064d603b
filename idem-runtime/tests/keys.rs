//! Keys and canonical JSON agree with the Python reference derivation, byte for byte.
//!
//! Expected texts not taken from the key vectors (`vectors/keys.jsonl`) were produced with
//! `python3 -c 'import json; print(json.dumps(v, sort_keys=True, separators=(",", ":")))'`.

use std::collections::{BTreeMap, HashMap};

use idem_runtime::{canonical_json, Error, Key};
use proptest::prelude::*;
use serde::ser::{Error as _, Serializer};
use serde::Serialize;
use serde_json::Value;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/keys.jsonl");

/// One line of the key vectors, computed by the Python reference.
struct Vector {
    tool: String,
    scope: String,
    args: Value,
    canonical: String,
    key: String,
}

fn vectors() -> Vec<Vector> {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| {
        panic!(
            "cannot read the key vectors at {VECTORS}: {e}; they are part of the repository \
             (vectors/keys.jsonl): restore the file from git"
        )
    });
    let vectors: Vec<Vector> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let mut v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{VECTORS} line {}: not JSON: {e}", i + 1));
            let mut text = |field: &str| match v[field].take() {
                Value::String(s) => s,
                other => panic!("{VECTORS} line {}: `{field}` is not a string: {other}", i + 1),
            };
            Vector {
                tool: text("tool"),
                scope: text("scope"),
                canonical: text("canonical"),
                key: text("key"),
                args: v["args"].take(),
            }
        })
        .collect();
    assert!(vectors.len() >= 10, "{VECTORS} holds only {} vectors", vectors.len());
    vectors
}

fn canonical<T: Serialize + ?Sized>(value: &T) -> String {
    canonical_json(value).unwrap()
}

fn refusal<T: Serialize + ?Sized>(value: &T) -> String {
    match canonical_json(value) {
        Err(Error::Key { reason, .. }) => reason,
        other => panic!("expected Error::Key, got {other:?}"),
    }
}

#[test]
fn every_vector_matches_when_args_are_a_json_value() {
    for v in vectors() {
        assert_eq!(canonical(&v.args), v.canonical, "canonical JSON of {}", v.args);
        let key = Key::derive(&v.tool, &v.scope, &v.args).unwrap();
        assert_eq!(key.as_str(), v.key, "key of {} / {} / {}", v.tool, v.scope, v.args);
        assert_eq!(Key::derive_canonical(&v.tool, &v.scope, &v.canonical), key);
    }
}

#[derive(Serialize)]
struct ChargeCard {
    customer: &'static str,
    amount: i64,
}

#[derive(Serialize)]
struct SendEmail {
    to: &'static str,
    subject: &'static str,
    body: &'static str,
}

#[derive(Serialize)]
struct CreateTicket {
    title: &'static str,
    tags: Vec<&'static str>,
    priority: u8,
    assignee: Option<String>,
}

#[derive(Serialize)]
struct BookRoom {
    slots: Vec<Slot>,
    room: Room,
    confirm: bool,
}

#[derive(Serialize)]
struct Slot {
    start: &'static str,
    end: &'static str,
}

#[derive(Serialize)]
struct Room {
    name: &'static str,
    floor: u32,
}

#[derive(Serialize)]
struct Noop {}

#[derive(Serialize)]
struct Transfer {
    neg: i64,
    big: u64,
    amount: i32,
}

#[derive(Serialize)]
struct Tag {
    tab: &'static str,
    quote: &'static str,
    ctrl: &'static str,
    backslash: &'static str,
}

#[derive(Serialize)]
struct Greet {
    name: &'static str,
    city: &'static str,
}

#[test]
fn every_vector_matches_when_args_are_structs_declared_in_another_order() {
    let vectors = vectors();
    let check = |i: usize, args: &dyn erased::Args| {
        let v = &vectors[i];
        assert_eq!(args.canonical(), v.canonical, "vector {i} ({})", v.tool);
        assert_eq!(args.key(&v.tool, &v.scope).as_str(), v.key, "vector {i} ({})", v.tool);
    };
    let charge = ChargeCard { customer: "cus_123", amount: 4200 };
    check(0, &charge);
    check(1, &charge);
    check(2, &charge);
    check(
        3,
        &SendEmail { to: "ada@example.com", subject: "Your receipt", body: "Thanks!\nLine two" },
    );
    check(
        4,
        &CreateTicket {
            title: "Printer on fire",
            tags: vec!["hw", "urgent"],
            priority: 1,
            assignee: None,
        },
    );
    check(
        5,
        &BookRoom {
            slots: vec![Slot { start: "09:00", end: "10:00" }],
            room: Room { name: "Lovelace", floor: 3 },
            confirm: true,
        },
    );
    check(6, &Noop {});
    check(7, &Transfer { neg: i64::MIN, big: u64::MAX, amount: -15 });
    check(8, &Tag { tab: "a\tb", quote: "say \"hi\"", ctrl: "\u{1}", backslash: "a\\b" });
    check(9, &Greet { name: "Zoë", city: "Zürich" });
}

/// Lets the struct test above hold different argument types in one closure.
mod erased {
    use super::*;

    pub trait Args {
        fn canonical(&self) -> String;
        fn key(&self, tool: &str, scope: &str) -> Key;
    }

    impl<T: Serialize> Args for T {
        fn canonical(&self) -> String {
            canonical(self)
        }

        fn key(&self, tool: &str, scope: &str) -> Key {
            Key::derive(tool, scope, self).unwrap()
        }
    }
}

#[test]
fn floats_are_written_as_python_repr_writes_them() {
    let cases: &[(f64, &str)] = &[
        (100.0, "100.0"),
        (0.1, "0.1"),
        (0.3, "0.3"),
        (1e-7, "1e-07"),
        (1e16, "1e+16"),
        (1e15, "1000000000000000.0"),
        (1e15 + 0.5, "1000000000000000.5"),
        (1e-4, "0.0001"),
        (0.000123, "0.000123"),
        (1e-5, "1e-05"),
        (2.5e-5, "2.5e-05"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.5e300, "1.5e+300"),
        (-1.5e-300, "-1.5e-300"),
        (1e22, "1e+22"),
        (123456789.123, "123456789.123"),
        (123456789012345678.0, "1.2345678901234568e+17"),
        (9007199254740993.0, "9007199254740992.0"),
        (5e-324, "5e-324"),
        (2.2250738585072014e-308, "2.2250738585072014e-308"),
        (f64::MAX, "1.7976931348623157e+308"),
    ];
    for &(value, python) in cases {
        assert_eq!(canonical(&value), python, "repr of {value:e}");
    }
}

#[test]
// The literals are the doubles' exact values, to show that each lies halfway.
#[allow(clippy::excessive_precision)]
fn floats_halfway_between_two_shortest_spellings_take_the_even_digit_as_python_does() {
    // Each double lies exactly halfway between two 16- or 17-digit spellings that both read back
    // to it; Python's `repr` takes the even last digit, Rust's `{:e}` the upper one. Parsed as a
    // `Value`, `241804605705217.62` also needs serde_json's `float_roundtrip`, which the runtime
    // turns on: without it serde_json reads the neighbouring double.
    let cases: &[(f64, &str)] = &[
        (-627677689651098.25, "-627677689651098.2"),
        (888043386393181.25, "888043386393181.2"),
        (241804605705217.625, "241804605705217.62"),
        (732602826094648.25, "732602826094648.2"),
    ];
    for &(value, python) in cases {
        assert_eq!(canonical(&value), python, "repr of {value:e}");
        let parsed: Value = serde_json::from_str(&format!("{{\"a\":{python}}}")).unwrap();
        assert_eq!(canonical(&parsed), format!("{{\"a\":{python}}}"), "{python} parsed as a Value");
    }
}

#[test]
fn f32_is_written_as_the_double_python_would_receive() {
    assert_eq!(canonical(&0.1f32), "0.10000000149011612");
    assert_eq!(canonical(&1.5f32), "1.5");
    assert_eq!(canonical(&-0.0f32), "-0.0");
}

#[test]
fn nan_and_infinities_are_refused_naming_the_tool() {
    assert!(refusal(&f64::NAN).contains("NaN"));
    assert!(refusal(&f64::INFINITY).contains("inf"));
    assert!(refusal(&f64::NEG_INFINITY).contains("-inf"));
    assert!(refusal(&f32::NAN).contains("NaN"));
    assert!(refusal(&BTreeMap::from([("deep", vec![1.0, f64::NAN])])).contains("NaN"));

    let err = Key::derive("weigh", "s", &BTreeMap::from([("kg", f64::INFINITY)])).unwrap_err();
    assert!(matches!(&err, Error::Key { tool, .. } if tool == "weigh"), "{err:?}");
    assert!(err.to_string().contains("`weigh`"), "{err}");
}

#[test]
fn integers_of_any_width_are_written_as_they_are() {
    assert_eq!(canonical(&u128::MAX), "340282366920938463463374607431768211455");
    assert_eq!(canonical(&i128::MIN), "-170141183460469231731687303715884105728");
    assert_eq!(canonical(&i128::MAX), "170141183460469231731687303715884105727");
    assert_eq!(canonical(&u64::MAX), "18446744073709551615");
    assert_eq!(canonical(&i64::MIN), "-9223372036854775808");
    assert_eq!(canonical(&(0u8, -1i8, 65535u16)), "[0,-1,65535]");
}

#[test]
fn non_ascii_is_escaped_with_surrogate_pairs_above_the_bmp() {
    assert_eq!(canonical("😀"), r#""\ud83d\ude00""#);
    assert_eq!(canonical("Zoë"), r#""Zo\u00eb""#);
    assert_eq!(canonical("\u{80}\u{7ff}\u{ffff}\u{2028}"), r#""\u0080\u07ff\uffff\u2028""#);
    assert_eq!(canonical(&'é'), r#""\u00e9""#);
}

#[test]
fn control_characters_quotes_and_backslashes_are_escaped_like_python() {
    assert_eq!(canonical("\"\\\n\r\t\u{8}\u{c}\u{0}\u{1f}"), r#""\"\\\n\r\t\b\f\u0000\u001f""#);
}

#[test]
fn slash_is_written_as_is_and_del_is_escaped_like_python() {
    // Python's ensure_ascii keeps only ' '..='~' as is, so DEL (0x7f) is escaped.
    assert_eq!(canonical("a/b<>&'"), r#""a/b<>&'""#);
    assert_eq!(canonical("\u{7f}"), r#""\u007f""#);
}

#[test]
fn object_keys_are_sorted_by_code_point_at_every_depth() {
    let args = serde_json::json!({
        "b": {"z": 1, "a": [{"y": 2, "x": 3}]},
        "a": 0,
        "B": 1,
        "é": 2,
        "😀": 3,
        "\u{e000}": 4,
    });
    // U+E000 sorts before U+1F600 by code point, though not by UTF-16 code unit.
    assert_eq!(
        canonical(&args),
        r#"{"B":1,"a":0,"b":{"a":[{"x":3,"y":2}],"z":1},"\u00e9":2,"\ue000":4,"\ud83d\ude00":3}"#
    );
}

#[derive(Serialize)]
enum Shape {
    Unit,
    Newtype(u8),
    Tuple(u8, &'static str),
    Struct { z: bool, a: Option<u8> },
}

#[derive(Serialize)]
struct Unit;

#[derive(Serialize)]
struct Meters(f64);

#[derive(Serialize)]
struct Pair(u8, u8);

/// Serializes through `serialize_bytes`, as `serde_bytes` does.
struct Bytes(&'static [u8]);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

#[test]
fn serde_data_model_is_shaped_as_serde_json_shapes_it() {
    let cases: Vec<(String, &str)> = vec![
        (canonical(&Shape::Unit), r#""Unit""#),
        (canonical(&Shape::Newtype(7)), r#"{"Newtype":7}"#),
        (canonical(&Shape::Tuple(1, "x")), r#"{"Tuple":[1,"x"]}"#),
        (canonical(&Shape::Struct { z: true, a: None }), r#"{"Struct":{"a":null,"z":true}}"#),
        (canonical(&()), "null"),
        (canonical(&Unit), "null"),
        (canonical(&Some(Meters(2.0))), "2.0"),
        (canonical(&Pair(1, 2)), "[1,2]"),
        (canonical(&Bytes(b"\x00\xff")), "[0,255]"),
        (canonical(&Vec::<u8>::new()), "[]"),
        (canonical(&BTreeMap::<String, u8>::new()), "{}"),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

#[test]
fn non_string_map_keys_are_stringified_then_sorted_as_text() {
    assert_eq!(canonical(&BTreeMap::from([(10, "a"), (9, "b")])), r#"{"10":"a","9":"b"}"#);
    assert_eq!(canonical(&BTreeMap::from([(true, 1), (false, 2)])), r#"{"false":2,"true":1}"#);
    assert_eq!(canonical(&BTreeMap::from([('é', 1)])), r#"{"\u00e9":1}"#);
    assert_eq!(canonical(&BTreeMap::from([(u128::MAX, 1)])), format!(r#"{{"{}":1}}"#, u128::MAX));
    assert_eq!(canonical(&[(1e16, 1)].map(|(k, v)| FloatKey(k, v))), r#"[{"1e+16":1}]"#);
    assert_eq!(canonical(&BTreeMap::from([(Compass::North, 1)])), r#"{"North":1}"#);
}

#[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
enum Compass {
    North,
}

#[test]
fn composite_map_keys_are_refused() {
    let reason = refusal(&BTreeMap::from([((1, 2), "pair")]));
    assert!(reason.contains("map key"), "{reason}");
    let reason = refusal(&BTreeMap::from([(None::<u8>, 1)]));
    assert!(reason.contains("map key"), "{reason}");
}

/// A one-entry map with a float key, which Python stringifies with `repr`.
struct FloatKey(f64, u8);

impl Serialize for FloatKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(&self.0, &self.1)?;
        map.end()
    }
}

/// A `Serialize` impl that fails the way user code reports its own errors.
struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom("the session handle cannot be serialized"))
    }
}

#[test]
fn errors_of_serialize_impls_become_key_errors_with_their_message() {
    let reason = refusal(&BTreeMap::from([("session", Unserializable)]));
    assert_eq!(reason, "the session handle cannot be serialized");
    let err = Key::derive("login", "s", &vec![Unserializable]).unwrap_err();
    assert!(matches!(&err, Error::Key { tool, .. } if tool == "login"), "{err:?}");
}

#[test]
fn key_is_32_hex_digits_of_scope_tool_and_canonical_args() {
    let args = BTreeMap::from([("amount", 4200)]);
    let key = Key::derive("charge_card", "step-7", &args).unwrap();
    assert_eq!(key.as_str().len(), 32);
    assert_eq!(key.to_string(), key.as_str());
    assert_eq!(AsRef::<str>::as_ref(&key), key.as_str());
    assert_eq!(Key::derive_canonical("charge_card", "step-7", r#"{"amount":4200}"#), key);
    assert_ne!(Key::derive("step-7", "charge_card", &args).unwrap(), key);
    assert_ne!(
        Key::derive("charge_card", "step-7", &BTreeMap::from([("amount", 4201)])).unwrap(),
        key
    );
    // The separators keep a scope and tool that run into each other apart.
    assert_ne!(Key::derive_canonical("b", "a", "{}"), Key::derive_canonical("", "ab", "{}"));
}

#[test]
fn key_parse_accepts_exactly_32_lower_case_hex_digits() {
    let text = "82e1e1a327aa97bb3929e05cc4ca3bd5";
    assert_eq!(Key::parse(text).unwrap().as_str(), text);
    assert_eq!(text.parse::<Key>().unwrap().as_str(), text);
    for bad in [
        "",
        "82e1e1a3",
        "82E1E1A327AA97BB3929E05CC4CA3BD5",
        "82e1e1a327aa97bb3929e05cc4ca3bd5a",
        "82e1e1a327aa97bb3929e05cc4ca3bdg",
        " 82e1e1a327aa97bb3929e05cc4ca3bd",
    ] {
        let err = Key::parse(bad).unwrap_err();
        assert!(matches!(&err, Error::NotAKey { .. }), "expected Error::NotAKey, got {err:?}");
        let reason = err.to_string();
        assert!(reason.contains(&format!("{bad:?}")), "{reason}");
        assert!(reason.contains("32 lower-case hex digits"), "{reason}");
    }
}

#[test]
fn key_serializes_as_its_text_and_refuses_other_text() {
    let key = Key::derive_canonical("noop", "", "{}");
    let json = serde_json::to_string(&key).unwrap();
    assert_eq!(json, r#""363d96d70c0e4e0cc4612aaaf7f84ad7""#);
    assert_eq!(serde_json::from_str::<Key>(&json).unwrap(), key);
    let err = serde_json::from_str::<Key>(r#""nope""#).unwrap_err();
    assert!(err.to_string().contains("32 lower-case hex digits"), "{err}");
}

proptest! {
    #[test]
    fn hashmap_insertion_order_changes_neither_canonical_json_nor_key(
        entries in proptest::collection::btree_map(".{0,8}", any::<i64>(), 0..16),
        inner in proptest::collection::btree_map("[a-zA-Z0-9é😀]{0,4}", any::<bool>(), 0..8),
    ) {
        let forward: HashMap<String, (i64, HashMap<String, bool>)> = entries
            .iter()
            .map(|(k, v)| (k.clone(), (*v, inner.clone().into_iter().collect())))
            .collect();
        let mut backward = HashMap::new();
        for (k, v) in entries.iter().rev() {
            backward.insert(k.clone(), (*v, inner.clone().into_iter().rev().collect::<HashMap<_, _>>()));
        }
        let sorted: BTreeMap<&String, (i64, &BTreeMap<String, bool>)> =
            entries.iter().map(|(k, v)| (k, (*v, &inner))).collect();

        let text = canonical(&sorted);
        prop_assert_eq!(canonical(&forward), text.clone());
        prop_assert_eq!(canonical(&backward), text.clone());
        prop_assert_eq!(
            Key::derive("t", "s", &forward).unwrap(),
            Key::derive("t", "s", &backward).unwrap()
        );
        prop_assert!(text.is_ascii());
        let back: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back, serde_json::to_value(&sorted).unwrap());
    }

    #[test]
    fn finite_floats_read_back_to_the_same_double(bits in any::<u64>()) {
        let value = f64::from_bits(bits);
        prop_assume!(value.is_finite());
        let text = canonical(&value);
        prop_assert_eq!(text.parse::<f64>().unwrap().to_bits(), bits, "{}", text);
        prop_assert!(text.contains('.') || text.contains('e'), "{}", text);
    }
}

const FLATTENED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/flattened.jsonl");

/// The argument object of a flattened tool, as `Args::flatten` keys it, agrees with the
/// reference's rule: null members left out at every depth, ignored fields left out.
#[test]
fn every_flattened_vector_matches() {
    let text = std::fs::read_to_string(FLATTENED).unwrap_or_else(|e| {
        panic!("cannot read {FLATTENED}: {e}; it is part of the repository: restore it from git")
    });
    let mut checked = 0;
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let (tool, scope) = (v["tool"].as_str().unwrap(), v["scope"].as_str().unwrap());
        let ignore: Vec<&str> =
            v["ignore"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        let text = idem_runtime::Args::new(tool)
            .flatten("arguments", &v["arguments"])
            .unwrap()
            .ignoring(&ignore)
            .canonical();
        assert_eq!(text, v["canonical"].as_str().unwrap(), "{FLATTENED} line {}", number + 1);
        let key = Key::derive_canonical(tool, scope, &text);
        assert_eq!(key.as_str(), v["key"].as_str().unwrap(), "{FLATTENED} line {}", number + 1);
        checked += 1;
    }
    assert!(checked >= 5, "{FLATTENED} holds only {checked} vectors");
}
