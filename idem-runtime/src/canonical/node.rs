//! The tree a value is serialized into before it is written.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// A JSON value as Python would see it.
pub(super) enum Node {
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
pub(super) enum Int {
    Signed(i128),
    Unsigned(u128),
    /// Decimal text, normalized (from serde_json's `arbitrary_precision`).
    Text(String),
}

impl Node {
    pub(super) fn kind(&self) -> &'static str {
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
