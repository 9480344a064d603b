//! Canonical JSON: the exact text Python's `json.dumps(args, sort_keys=True,
//! separators=(",", ":"))` writes, so that keys derived here and by the Python reference agree.
//!
//! The value is first serialized into a small private tree and only then written. Going through
//! `serde_json::Value` or `serde_json::to_string` instead would make the output depend on
//! serde_json's cargo features (`preserve_order`, `arbitrary_precision`, `float_roundtrip`),
//! which feature unification can switch on in any user's build.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::ser::{self, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// The struct name serde_json gives a `Number` under `arbitrary_precision`; its one field holds
/// the number's text.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";
/// The struct name serde_json gives a `RawValue`; its one field holds the JSON text.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Writes `value` as canonical JSON: byte-for-byte what Python's
/// `json.dumps(value, sort_keys=True, separators=(",", ":"))` writes.
///
/// Object keys are sorted by code point at every depth, there is no whitespace, everything
/// outside printable ASCII is escaped as `\uXXXX`, integers of any width are written as they
/// are and floats the way Python's `repr` writes them. NaN and the infinities are refused,
/// because Python would write text that is not JSON.
///
/// # Errors
///
/// [`Error::Key`] when the value holds NaN or an infinity, a map key that is not a string,
/// number, bool or char, or when its `Serialize` impl fails.
///
/// # Examples
///
/// ```
/// use std::collections::HashMap;
///
/// let args = HashMap::from([("to", "zoë@example.com"), ("amount", "4200")]);
/// assert_eq!(
///     idem_runtime::canonical_json(&args).unwrap(),
///     r#"{"amount":"4200","to":"zo\u00eb@example.com"}"#,
/// );
/// assert_eq!(idem_runtime::canonical_json(&[100.0, 1e16, 1e-7]).unwrap(), "[100.0,1e+16,1e-07]");
/// assert!(idem_runtime::canonical_json(&f64::NAN).is_err());
/// ```
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    canonical_json_for("", value)
}

/// [`canonical_json`], with `tool` named in the error.
pub(crate) fn canonical_json_for<T: Serialize + ?Sized>(
    tool: &str,
    value: &T,
) -> Result<String, Error> {
    let node = value
        .serialize(NodeSerializer)
        .map_err(|e| Error::Key { tool: tool.to_owned(), reason: e.0 })?;
    let mut out = String::with_capacity(128);
    write_node(&node, &mut out);
    Ok(out)
}

/// A tool's argument object, the value of a `#[idem(flatten)]` parameter, as the key sees it:
/// the value's own canonical tree with every object member whose value is `null` left out, at
/// every depth (inside arrays too; an array keeps its `null` items, whose position is meaning).
/// An absent `Option` and a `null` are one intent, and an `Option` field added in a later release
/// leaves the keys of calls that do not use it as they were.
pub(crate) enum Arguments {
    Object(Object),
    /// Not an object: the value's canonical text, for the error that says so.
    Other(String),
}

/// The members of an argument object, `null`s already left out.
pub(crate) struct Object(BTreeMap<Cow<'static, str>, Node>);

/// The argument object `value` serializes to.
pub(crate) fn arguments_for<T: Serialize + ?Sized>(
    tool: &str,
    value: &T,
) -> Result<Arguments, Error> {
    let node = value
        .serialize(NodeSerializer)
        .map_err(|e| Error::Key { tool: tool.to_owned(), reason: e.0 })?;
    match without_nulls(node) {
        Node::Object(members) => Ok(Arguments::Object(Object(members))),
        other => {
            let mut text = String::new();
            write_node(&other, &mut text);
            Ok(Arguments::Other(text))
        }
    }
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.write(&[]))
    }
}

impl Object {
    /// The canonical text of the object without the members named in `ignore`.
    pub(crate) fn write(&self, ignore: &[String]) -> String {
        let mut out = String::with_capacity(128);
        out.push('{');
        let kept = self.0.iter().filter(|(name, _)| !ignore.iter().any(|i| i == name.as_ref()));
        for (i, (name, value)) in kept.enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_str(name, &mut out);
            out.push(':');
            write_node(value, &mut out);
        }
        out.push('}');
        out
    }
}

fn without_nulls(node: Node) -> Node {
    match node {
        Node::Object(members) => Node::Object(
            members
                .into_iter()
                .filter(|(_, value)| !matches!(value, Node::Null))
                .map(|(name, value)| (name, without_nulls(value)))
                .collect(),
        ),
        Node::Array(items) => Node::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Lower-case hex SHA-256 of the concatenation of `parts`.
pub(crate) fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 64];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    // Hex digits are ASCII.
    String::from_utf8_lossy(&hex).into_owned()
}

/// A JSON value as Python would see it.
enum Node {
    Null,
    Bool(bool),
    /// An integer.
    Int(Int),
    /// A finite float.
    Float(f64),
    Str(String),
    Array(Vec<Node>),
    /// Sorted by key: UTF-8 byte order is code point order, which is how Python sorts `str`.
    /// Struct field names are borrowed: most keys cost no allocation.
    Object(BTreeMap<Cow<'static, str>, Node>),
}

/// An integer, kept as a number so that building the tree allocates nothing for it.
enum Int {
    Signed(i128),
    Unsigned(u128),
    /// Decimal text, normalized (from serde_json's `arbitrary_precision`).
    Text(String),
}

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

    fn into_text(self) -> String {
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

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a bool",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a float",
            Node::Str(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
        }
    }
}

/// Why a value has no canonical form; becomes the `reason` of [`Error::Key`].
#[derive(Debug)]
struct Refusal(String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

impl ser::Error for Refusal {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Refusal(msg.to_string())
    }
}

type Result<T, E = Refusal> = std::result::Result<T, E>;

fn float(value: f64) -> Result<Node> {
    if value.is_finite() {
        Ok(Node::Float(value))
    } else {
        Err(Refusal(format!(
            "the float {value} has no JSON form (Python would write non-JSON text for it)"
        )))
    }
}

/// A serde_json `Number` given as text (under `arbitrary_precision`), read the way Python's
/// `json.loads` would read it.
fn number_from_text(text: &str) -> Result<Node> {
    let (negative, magnitude) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if !magnitude.is_empty() && magnitude.bytes().all(|b| b.is_ascii_digit()) {
        // Python's int has no leading zeros and no negative zero.
        let digits = magnitude.trim_start_matches('0');
        return Ok(match (digits.is_empty(), negative) {
            (true, _) => Node::Int(Int::Unsigned(0)),
            (false, true) => Node::Int(Int::Text(format!("-{digits}"))),
            (false, false) => Node::Int(Int::Text(digits.to_owned())),
        });
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() => Ok(Node::Float(value)),
        _ => Err(Refusal(format!(
            "the number {text} does not fit a 64-bit float (Python would write non-JSON text for it)"
        ))),
    }
}

/// A serde_json `RawValue`: its text is parsed and canonicalized like any other value.
fn raw_value(text: &str) -> Result<Node> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Refusal(format!("a raw JSON value does not parse: {e}")))?;
    value.serialize(NodeSerializer)
}

/// The text of a map key, as serde_json and Python turn keys into strings.
fn key_text(key: Node) -> Result<String> {
    match key {
        Node::Str(text) => Ok(text),
        Node::Int(int) => Ok(int.into_text()),
        Node::Bool(value) => Ok(value.to_string()),
        Node::Float(value) => {
            let mut text = String::new();
            write_float(value, &mut text);
            Ok(text)
        }
        other => Err(Refusal(format!(
            "a map key must be a string, number, bool or char, not {}",
            other.kind()
        ))),
    }
}

/// Builds a [`Node`] from any `Serialize` value, shaped as serde_json shapes it.
struct NodeSerializer;

impl ser::Serializer for NodeSerializer {
    type Ok = Node;
    type Error = Refusal;
    type SerializeSeq = SeqBuilder;
    type SerializeTuple = SeqBuilder;
    type SerializeTupleStruct = SeqBuilder;
    type SerializeTupleVariant = VariantBuilder<SeqBuilder>;
    type SerializeMap = MapBuilder;
    type SerializeStruct = StructBuilder;
    type SerializeStructVariant = VariantBuilder<StructBuilder>;

    fn serialize_bool(self, v: bool) -> Result<Node> {
        Ok(Node::Bool(v))
    }

    fn serialize_i8(self, v: i8) -> Result<Node> {
        Ok(Node::Int(Int::Signed(v.into())))
    }

    fn serialize_i16(self, v: i16) -> Result<Node> {
        Ok(Node::Int(Int::Signed(v.into())))
    }

    fn serialize_i32(self, v: i32) -> Result<Node> {
        Ok(Node::Int(Int::Signed(v.into())))
    }

    fn serialize_i64(self, v: i64) -> Result<Node> {
        Ok(Node::Int(Int::Signed(v.into())))
    }

    fn serialize_i128(self, v: i128) -> Result<Node> {
        Ok(Node::Int(Int::Signed(v)))
    }

    fn serialize_u8(self, v: u8) -> Result<Node> {
        Ok(Node::Int(Int::Unsigned(v.into())))
    }

    fn serialize_u16(self, v: u16) -> Result<Node> {
        Ok(Node::Int(Int::Unsigned(v.into())))
    }

    fn serialize_u32(self, v: u32) -> Result<Node> {
        Ok(Node::Int(Int::Unsigned(v.into())))
    }

    fn serialize_u64(self, v: u64) -> Result<Node> {
        Ok(Node::Int(Int::Unsigned(v.into())))
    }

    fn serialize_u128(self, v: u128) -> Result<Node> {
        Ok(Node::Int(Int::Unsigned(v)))
    }

    fn serialize_f32(self, v: f32) -> Result<Node> {
        // A Python peer receives the f32 widened to a double, so that is what it prints.
        float(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<Node> {
        float(v)
    }

    fn serialize_char(self, v: char) -> Result<Node> {
        Ok(Node::Str(v.to_string()))
    }

    fn serialize_str(self, v: &str) -> Result<Node> {
        Ok(Node::Str(v.to_owned()))
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<Node> {
        Ok(Node::Array(v.iter().map(|b| Node::Int(Int::Unsigned((*b).into()))).collect()))
    }

    fn serialize_none(self) -> Result<Node> {
        Ok(Node::Null)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Node> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<Node> {
        Ok(Node::Null)
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<Node> {
        Ok(Node::Null)
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Node> {
        Ok(Node::Str(variant.to_owned()))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Node> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Node> {
        let inner = value.serialize(NodeSerializer)?;
        Ok(Node::Object(BTreeMap::from([(Cow::Borrowed(variant), inner)])))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<SeqBuilder> {
        Ok(SeqBuilder(Vec::with_capacity(len.unwrap_or(0))))
    }

    fn serialize_tuple(self, len: usize) -> Result<SeqBuilder> {
        Ok(SeqBuilder(Vec::with_capacity(len)))
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<SeqBuilder> {
        Ok(SeqBuilder(Vec::with_capacity(len)))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantBuilder<SeqBuilder>> {
        Ok(VariantBuilder { variant, inner: SeqBuilder(Vec::with_capacity(len)) })
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<MapBuilder> {
        Ok(MapBuilder { entries: BTreeMap::new(), key: None })
    }

    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<StructBuilder> {
        Ok(StructBuilder { name, entries: BTreeMap::new() })
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<VariantBuilder<StructBuilder>> {
        Ok(VariantBuilder { variant, inner: StructBuilder { name: "", entries: BTreeMap::new() } })
    }
}

struct SeqBuilder(Vec<Node>);

impl SeqBuilder {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.0.push(value.serialize(NodeSerializer)?);
        Ok(())
    }
}

impl ser::SerializeSeq for SeqBuilder {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.push(value)
    }

    fn end(self) -> Result<Node> {
        Ok(Node::Array(self.0))
    }
}

impl ser::SerializeTuple for SeqBuilder {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.push(value)
    }

    fn end(self) -> Result<Node> {
        Ok(Node::Array(self.0))
    }
}

impl ser::SerializeTupleStruct for SeqBuilder {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.push(value)
    }

    fn end(self) -> Result<Node> {
        Ok(Node::Array(self.0))
    }
}

struct MapBuilder {
    entries: BTreeMap<Cow<'static, str>, Node>,
    /// The key given by `serialize_key`, waiting for its value.
    key: Option<String>,
}

impl ser::SerializeMap for MapBuilder {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<()> {
        self.key = Some(key_text(key.serialize(NodeSerializer)?)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Refusal("a map value was serialized before its key".to_owned()))?;
        self.entries.insert(Cow::Owned(key), value.serialize(NodeSerializer)?);
        Ok(())
    }

    fn end(self) -> Result<Node> {
        Ok(Node::Object(self.entries))
    }
}

struct StructBuilder {
    name: &'static str,
    entries: BTreeMap<Cow<'static, str>, Node>,
}

impl ser::SerializeStruct for StructBuilder {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<()> {
        self.entries.insert(Cow::Borrowed(key), value.serialize(NodeSerializer)?);
        Ok(())
    }

    fn end(mut self) -> Result<Node> {
        let token = match self.name {
            NUMBER_TOKEN => NUMBER_TOKEN,
            RAW_VALUE_TOKEN => RAW_VALUE_TOKEN,
            _ => return Ok(Node::Object(self.entries)),
        };
        match (self.entries.remove(token), self.entries.is_empty()) {
            (Some(Node::Str(text)), true) if token == NUMBER_TOKEN => number_from_text(&text),
            (Some(Node::Str(text)), true) => raw_value(&text),
            _ => Err(Refusal(format!("serde_json's {token} did not hold its text"))),
        }
    }
}

/// A tuple or struct variant, written as `{"Variant": ...}` the way serde_json writes it.
struct VariantBuilder<B> {
    variant: &'static str,
    inner: B,
}

impl<B> VariantBuilder<B> {
    fn wrap(self, inner: Node) -> Node {
        Node::Object(BTreeMap::from([(Cow::Borrowed(self.variant), inner)]))
    }
}

impl ser::SerializeTupleVariant for VariantBuilder<SeqBuilder> {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.inner.push(value)
    }

    fn end(mut self) -> Result<Node> {
        let items = std::mem::take(&mut self.inner.0);
        Ok(self.wrap(Node::Array(items)))
    }
}

impl ser::SerializeStructVariant for VariantBuilder<StructBuilder> {
    type Ok = Node;
    type Error = Refusal;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<()> {
        ser::SerializeStruct::serialize_field(&mut self.inner, key, value)
    }

    fn end(mut self) -> Result<Node> {
        let entries = std::mem::take(&mut self.inner.entries);
        Ok(self.wrap(Node::Object(entries)))
    }
}

fn write_node(node: &Node, out: &mut String) {
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
fn write_str(text: &str, out: &mut String) {
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
fn write_float(value: f64, out: &mut String) {
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
