//! Writing the tree as Python's `json.dumps(…, sort_keys=True, separators=(",", ":"))` writes
//! it: strings escaped to printable ASCII and floats in the spelling of Python's `repr`.

use std::fmt::Write as _;

use super::node::{Int, Node};

impl Int {
    fn write(&self, out: &mut String) {
        // Writing to a String cannot fail.
        match self {
            Int::Signed(v) => {
                let _ = write!(out, "{v}");
            }
            Int::Unsigned(v) => {
                let _ = write!(out, "{v}");
            }
            Int::Text(text) => out.push_str(text),
        }
    }

    pub(super) fn into_text(self) -> String {
        match self {
            Int::Text(text) => text,
            other => {
                let mut text = String::new();
                other.write(&mut text);
                text
            }
        }
    }
}

/// Writes `node` as canonical text.
pub(super) fn write_node(node: &Node, out: &mut String) {
    match node {
        Node::Null => out.push_str("null"),
        Node::Bool(true) => out.push_str("true"),
        Node::Bool(false) => out.push_str("false"),
        Node::Int(int) => int.write(out),
        Node::Float(value) => write_float(*value, out),
        Node::Str(text) => write_str(text, out),
        Node::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_node(item, out);
            }
            out.push(']');
        }
        Node::Object(entries) => {
            out.push('{');
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(key, out);
                out.push(':');
                write_node(value, out);
            }
            out.push('}');
        }
    }
}

/// Writes a string the way Python's `json.dumps` does with `ensure_ascii=True`: only printable
/// ASCII is written as is; DEL and everything above it become `\uXXXX`.
pub(super) fn write_str(text: &str, out: &mut String) {
    out.push('"');
    // Runs of printable ASCII other than `"` and `\\` go out as they are, in one copy.
    let plain = |b: u8| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\';
    let mut rest = text;
    while !rest.is_empty() {
        let run = rest.bytes().position(|b| !plain(b)).unwrap_or(rest.len());
        out.push_str(&rest[..run]);
        rest = &rest[run..];
        let Some(c) = rest.chars().next() else { break };
        rest = &rest[c.len_utf8()..];
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// Writes a finite float the way Python's `repr` does: the shortest digits that read back to
/// the same double, in positional notation for exponents from -4 to 15 and in scientific
/// notation (`1e+16`, `1e-05`) outside them.
pub(super) fn write_float(value: f64, out: &mut String) {
    if value.is_sign_negative() {
        out.push('-');
    }
    let (digits, exponent) = repr_digits(value.abs());
    if !(-4..16).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
    } else if exponent < 0 {
        out.push_str("0.");
        for _ in 1..exponent.unsigned_abs() {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let point = exponent.unsigned_abs() as usize + 1;
        if point >= digits.len() {
            out.push_str(&digits);
            for _ in digits.len()..point {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    }
}

/// The significant digits and decimal exponent of Python's `repr` of a finite, non-negative
/// float: the fewest digits that read back to the same double and, among those, the ones
/// nearest to its exact value, a tie going to the even digit.
fn repr_digits(value: f64) -> (String, i32) {
    fn split(scientific: &str) -> (String, i32) {
        let (mantissa, exponent) = scientific.split_once('e').unwrap_or((scientific, "0"));
        (mantissa.chars().filter(|c| *c != '.').collect(), exponent.parse().unwrap_or(0))
    }
    // Rust's `{:e}` writes the fewest digits too, but when the exact value lies halfway between
    // two such candidates it takes the upper one: -627677689651098.25 is written
    // `...098.3`, where Python writes `...098.2`.
    let shortest = split(&format!("{value:e}"));
    // Rounding the exact value to that many digits (ties to even) gives the nearest candidate;
    // it is the answer whenever it still reads back to the same double.
    let precision = shortest.0.len().saturating_sub(1);
    let nearest = format!("{value:.precision$e}");
    if nearest.parse::<f64>() == Ok(value) {
        split(&nearest)
    } else {
        shortest
    }
}
