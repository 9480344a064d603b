//! The `--args` JSON of `idem key`, read so that every number keeps its exact value.
//!
//! `serde_json::Value` would turn an integer wider than 64 bits into a float, and without
//! serde_json's `float_roundtrip` feature it may read a float one unit off in the last place;
//! either would give a different key than the Python reference and the crate derive. This
//! reader keeps integers as text (up to 128 bits, the widest a Rust parameter can be) and reads
//! floats with the standard library's correctly rounded parser. The tree is handed to
//! `canonical_json` through `Serialize`, so the canonical form is the runtime's, not ours.

use serde::ser::{Error as _, Serialize, SerializeMap, SerializeSeq, Serializer};

/// A JSON value with its numbers as written.
#[derive(Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// An integer (no fraction, no exponent), as written.
    Int(String),
    /// A number with a fraction or an exponent, as written.
    Float(String),
    Str(String),
    Array(Vec<Json>),
    /// Members in the order written; a repeated name keeps its last value, as Python does.
    Object(Vec<(String, Json)>),
}

/// Reads the arguments of a call: one JSON object.
pub(crate) fn parse_args(text: &str) -> Result<Json, String> {
    // serde_json's syntax errors name the line and column; ours only back it up.
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| format!("--args is not valid JSON: {e}"))?;
    let mut reader = Reader { text: text.as_bytes(), at: 0 };
    reader.skip_space();
    let value = reader.value().map_err(|e| format!("--args is not valid JSON: {e}"))?;
    reader.skip_space();
    if reader.at != reader.text.len() {
        return Err(format!("--args is not valid JSON: trailing text at byte {}", reader.at));
    }
    match value {
        Json::Object(_) => Ok(value),
        _ => Err("--args must be a JSON object of the tool's parameters by name, such as \
                  '{\"amount\":4200}'"
            .to_owned()),
    }
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected `{}` at byte {}", char::from(byte), self.at))
        }
    }

    fn literal(&mut self, word: &str, value: Json) -> Result<Json, String> {
        if self.text[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(format!("unexpected text at byte {}", self.at))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        match self.peek() {
            Some(b'n') => self.literal("null", Json::Null),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'[') => self.array(),
            Some(b'{') => self.object(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(format!("expected a value at byte {}", self.at)),
        }
    }

    fn array(&mut self) -> Result<Json, String> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.skip_space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_space();
            items.push(self.value()?);
            self.skip_space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(format!("expected `,` or `]` at byte {}", self.at)),
            }
        }
    }

    fn object(&mut self) -> Result<Json, String> {
        self.expect(b'{')?;
        let mut members = Vec::new();
        self.skip_space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_space();
            let name = self.string()?;
            self.skip_space();
            self.expect(b':')?;
            self.skip_space();
            members.push((name, self.value()?));
            self.skip_space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(format!("expected `,` or `}}` at byte {}", self.at)),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.at;
        let bad = |at: usize| format!("malformed number at byte {at}");
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(bad(start)),
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            float = true;
            if self.digits() == 0 {
                return Err(bad(start));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            float = true;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(bad(start));
            }
        }
        // Only ASCII was consumed, so the slice is valid UTF-8.
        let text = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
        Ok(if float { Json::Float(text) } else { Json::Int(text) })
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.text.get(self.at..self.at + 4).ok_or_else(|| self.bad_escape())?;
        let digits = std::str::from_utf8(digits).map_err(|_| self.bad_escape())?;
        let value = u32::from_str_radix(digits, 16).map_err(|_| self.bad_escape())?;
        self.at += 4;
        Ok(value)
    }

    fn bad_escape(&self) -> String {
        format!("malformed \\u escape at byte {}", self.at)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        loop {
            let byte = self.peek().ok_or_else(|| "unterminated string".to_owned())?;
            self.at += 1;
            match byte {
                b'"' => break,
                b'\\' => {
                    let escape = self.peek().ok_or_else(|| "unterminated string".to_owned())?;
                    self.at += 1;
                    let c = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(format!("unknown escape at byte {}", self.at - 1)),
                    };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                0x00..=0x1f => {
                    return Err(format!("control character in a string at byte {}", self.at - 1))
                }
                _ => out.push(byte),
            }
        }
        // The input is a &str and escapes were decoded to whole characters.
        String::from_utf8(out).map_err(|_| "a string is not UTF-8".to_owned())
    }

    /// The character of a `\uXXXX` escape (the `\u` already read), joining surrogate pairs.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let lone = "a lone UTF-16 surrogate in a \\u escape cannot be part of a key's arguments";
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if !self.text[self.at..].starts_with(b"\\u") {
                    return Err(lone.to_owned());
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(lone.to_owned());
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(lone.to_owned()),
            code => code,
        };
        char::from_u32(code).ok_or_else(|| self.bad_escape())
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => serializer.serialize_unit(),
            Json::Bool(value) => serializer.serialize_bool(*value),
            Json::Int(text) => {
                if let Ok(value) = text.parse::<i64>() {
                    serializer.serialize_i64(value)
                } else if let Ok(value) = text.parse::<u64>() {
                    serializer.serialize_u64(value)
                } else if let Ok(value) = text.parse::<i128>() {
                    serializer.serialize_i128(value)
                } else if let Ok(value) = text.parse::<u128>() {
                    serializer.serialize_u128(value)
                } else {
                    Err(S::Error::custom(format!(
                        "the integer {text} is wider than 128 bits, wider than any Rust parameter"
                    )))
                }
            }
            // Correctly rounded; an out-of-range value becomes an infinity, which
            // `canonical_json` refuses as Python's `json.dumps` would fail to write it.
            Json::Float(text) => match text.parse::<f64>() {
                Ok(value) => serializer.serialize_f64(value),
                Err(e) => Err(S::Error::custom(format!("the number {text}: {e}"))),
            },
            Json::Str(text) => serializer.serialize_str(text),
            Json::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (name, value) in members {
                    map.serialize_entry(name, value)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        idem_runtime::canonical_json(&parse_args(text).unwrap()).unwrap()
    }

    #[test]
    fn keeps_wide_integers_exact() {
        assert_eq!(
            canonical(
                r#"{"a": 170141183460469231731687303715884105727, "b": -0, "c": 340282366920938463463374607431768211455}"#
            ),
            r#"{"a":170141183460469231731687303715884105727,"b":0,"c":340282366920938463463374607431768211455}"#
        );
    }

    #[test]
    fn reads_floats_as_python_does() {
        assert_eq!(
            canonical(
                r#"{"a": 1E2, "b": 0.1, "c": 1e-7, "d": -0.0, "e": 2.2250738585072011e-308}"#
            ),
            r#"{"a":100.0,"b":0.1,"c":1e-07,"d":-0.0,"e":2.225073858507201e-308}"#
        );
    }

    #[test]
    fn decodes_strings_and_keeps_the_last_repeated_name() {
        assert_eq!(
            canonical(r#"{"s": "\u00e9\ud83d\ude00\/\"\n", "k": 1, "k": 2}"#),
            r#"{"k":2,"s":"\u00e9\ud83d\ude00/\"\n"}"#
        );
    }

    #[test]
    fn refuses_what_cannot_be_a_key() {
        assert!(parse_args("[1]").unwrap_err().contains("must be a JSON object"));
        assert!(parse_args("{\"a\": }").unwrap_err().contains("not valid JSON"));
        assert!(parse_args("{\"a\": 1} x").is_err());
        assert!(parse_args(r#"{"a": "\ud800"}"#).is_err());
        let huge = parse_args(r#"{"a": 1234567890123456789012345678901234567890}"#).unwrap();
        assert!(idem_runtime::canonical_json(&huge).is_err());
        let infinite = parse_args(r#"{"a": 1e400}"#).unwrap();
        assert!(idem_runtime::canonical_json(&infinite).is_err());
    }
}
