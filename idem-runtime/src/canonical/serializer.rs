//! Building the tree from any `Serialize` value, shaped as serde_json shapes it, including
//! serde_json's own `Number` (under `arbitrary_precision`) and `RawValue` tokens.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::ser::{self, Serialize};

use super::node::{Int, Node};
use super::write::write_float;

/// The struct name serde_json gives a `Number` under `arbitrary_precision`; its one field holds
/// the number's text.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";
/// The struct name serde_json gives a `RawValue`; its one field holds the JSON text.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Why a value has no canonical form; becomes the `reason` of
/// [`Error::Key`](crate::error::Error::Key).
#[derive(Debug)]
pub(super) struct Refusal(pub(super) String);

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

/// The tree of `value`, shaped as serde_json shapes it.
pub(super) fn node_of<T: Serialize + ?Sized>(value: &T) -> Result<Node> {
    value.serialize(NodeSerializer)
}

/// Builds a [`Node`] from any `Serialize` value, shaped as serde_json shapes it.
struct NodeSerializer;

/// The `serialize_*` method of each integer type: the value as an [`Int`] of its sign.
macro_rules! widened_integers {
    ($($method:ident($ty:ty) => $sign:ident),* $(,)?) => {$(
        fn $method(self, v: $ty) -> Result<Node> {
            Ok(Node::Int(Int::$sign(v.into())))
        }
    )*};
}

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

    // Python's int has no width: every integer is kept at the widest of its sign.
    widened_integers! {
        serialize_i8(i8) => Signed,
        serialize_i16(i16) => Signed,
        serialize_i32(i32) => Signed,
        serialize_i64(i64) => Signed,
        serialize_i128(i128) => Signed,
        serialize_u8(u8) => Unsigned,
        serialize_u16(u16) => Unsigned,
        serialize_u32(u32) => Unsigned,
        serialize_u64(u64) => Unsigned,
        serialize_u128(u128) => Unsigned,
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

/// A sequence, a tuple and a tuple struct are all an array: each element is pushed, and the
/// end is the array.
macro_rules! array_builder {
    ($($trait:ident::$element:ident),*) => {$(
        impl ser::$trait for SeqBuilder {
            type Ok = Node;
            type Error = Refusal;

            fn $element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
                self.push(value)
            }

            fn end(self) -> Result<Node> {
                Ok(Node::Array(self.0))
            }
        }
    )*};
}

array_builder!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field
);

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
