//! Canonical JSON: the exact text Python's `json.dumps(args, sort_keys=True,
//! separators=(",", ":"))` writes, so that keys derived here and by the Python reference agree.
//!
//! The value is first serialized into a small private tree and only then written. Going through
//! `serde_json::Value` or `serde_json::to_string` instead would make the output depend on
//! serde_json's cargo features (`preserve_order`, `arbitrary_precision`, `float_roundtrip`),
//! which feature unification can switch on in any user's build.
//!
//! The entry points and the argument object live here; the tree in `node`, the serde
//! `Serializer` that builds it in `serializer`, and the writer of Python's text in `write`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use self::node::Node;
use self::serializer::node_of;
use self::write::{write_node, write_str};
use crate::error::Error;

mod node;
mod serializer;
mod write;

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
    let node = node_of(value).map_err(|e| Error::Key { tool: tool.to_owned(), reason: e.0 })?;
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
    let node = node_of(value).map_err(|e| Error::Key { tool: tool.to_owned(), reason: e.0 })?;
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
