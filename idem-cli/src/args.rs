//! The `--args` JSON of `idem key`.
//!
//! serde_json reads it with `arbitrary_precision` (every number is kept as written, so an
//! integer of any width stays exact) and `float_roundtrip` (a float becomes the double nearest
//! its text, as Python's `json.loads` reads it); this crate's manifest turns both on. The
//! canonical text is then the runtime's `canonical_json`, as for any other caller.

use serde_json::Value;

/// Reads the arguments of a call: one JSON object of the tool's parameters by name. A name
/// given twice keeps its last value, as in Python.
pub(crate) fn parse_args(text: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| match lone_surrogate(text) {
        // Python would read it, but a Rust string, and so a Rust tool's parameter, cannot hold
        // half a character; serde_json's own message ("unexpected end of hex escape") does not
        // say so.
        Some(escape) => format!(
            "--args holds `{escape}`, a lone UTF-16 surrogate, which no Rust tool can receive as \
             text: write the whole character, or both halves of its surrogate pair"
        ),
        None => format!(
            "--args is not valid JSON: {e}; pass one JSON object, such as '{{\"amount\":4200}}'"
        ),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(format!(
            "--args must be a JSON object of the tool's parameters by name, such as \
             '{{\"amount\":4200}}', not {value}"
        ))
    }
}

/// The first `\uXXXX` escape in `text` that is half of a surrogate pair without its other
/// half.
fn lone_surrogate(text: &str) -> Option<&str> {
    let unit = |at: usize| {
        let hex = text.get(at + 2..at + 6)?;
        let ok = text[at..].starts_with("\\u") && hex.bytes().all(|b| b.is_ascii_hexdigit());
        ok.then(|| u16::from_str_radix(hex, 16).ok()).flatten()
    };
    let mut at = 0;
    while let Some(found) = text[at..].find('\\') {
        at += found;
        match unit(at) {
            Some(0xd800..=0xdbff) => match unit(at + 6) {
                Some(0xdc00..=0xdfff) => at += 12,
                _ => return text.get(at..at + 6),
            },
            Some(0xdc00..=0xdfff) => return text.get(at..at + 6),
            // Any other escape is the backslash and at least one character.
            _ => at += 1 + text[at + 1..].chars().next().map_or(0, char::len_utf8),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        idem_runtime::canonical_json(&parse_args(text).unwrap()).unwrap()
    }

    #[test]
    fn keeps_integers_of_any_width_exact() {
        assert_eq!(
            canonical(
                r#"{"a": 170141183460469231731687303715884105727, "b": -0, "c": 340282366920938463463374607431768211456, "d": -1234567890123456789012345678901234567890}"#
            ),
            r#"{"a":170141183460469231731687303715884105727,"b":0,"c":340282366920938463463374607431768211456,"d":-1234567890123456789012345678901234567890}"#
        );
    }

    #[test]
    fn reads_floats_as_python_does() {
        assert_eq!(
            canonical(
                r#"{"a": 1E2, "b": 0.1, "c": 1e-7, "d": -0.0, "e": 2.2250738585072011e-308, "f": -627677689651098.2, "g": 241804605705217.62}"#
            ),
            r#"{"a":100.0,"b":0.1,"c":1e-07,"d":-0.0,"e":2.225073858507201e-308,"f":-627677689651098.2,"g":241804605705217.62}"#
        );
    }

    #[test]
    fn decodes_strings_and_keeps_the_last_repeated_name() {
        assert_eq!(
            canonical(r#"{"s": "\u00e9\ud83d\ude00\/\"\n\u007f", "k": 1, "k": 2}"#),
            r#"{"k":2,"s":"\u00e9\ud83d\ude00/\"\n\u007f"}"#
        );
    }

    #[test]
    fn refuses_what_cannot_be_a_key_saying_what_to_pass() {
        let not_object = parse_args("[1]").unwrap_err();
        assert!(not_object.contains("must be a JSON object") && not_object.contains("[1]"));
        let broken = parse_args("{\"a\": }").unwrap_err();
        assert!(broken.contains("--args is not valid JSON") && broken.contains("pass one JSON"));
        assert!(parse_args("{\"a\": 1} x").unwrap_err().contains("not valid JSON"));
        for (text, escape) in [
            (r#"{"a": "\ud800"}"#, r"`\ud800`"),
            (r#"{"a": "x\uDBFFy"}"#, r"`\uDBFF`"),
            (r#"{"a": "\\\ud83d\ude00\udc00"}"#, r"`\udc00`"),
            (r#"{"\ud800\u0041": 1}"#, r"`\ud800`"),
        ] {
            let lone = parse_args(text).unwrap_err();
            assert!(lone.contains("lone UTF-16 surrogate") && lone.contains(escape), "{lone}");
        }
        // An escaped backslash before `u` is not an escape; a stray backslash is no panic.
        assert!(parse_args("{\"a\": \"\\é\\\"}").unwrap_err().contains("not valid JSON"));
        let not_lone = parse_args(r#"{"a": "\\ud800", "b": }"#).unwrap_err();
        assert!(not_lone.contains("not valid JSON"), "{not_lone}");
        let infinite = parse_args(r#"{"a": 1e400}"#).unwrap();
        assert!(idem_runtime::canonical_json(&infinite).is_err());
    }
}
