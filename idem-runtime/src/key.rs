//! Intent keys: what names one intended effect, so that a retry finds the record of the first try.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::canonical::{canonical_json_for, sha256_hex};
use crate::error::Error;

/// How many hex digits a key keeps of the SHA-256.
const KEY_LEN: usize = 32;

/// The idempotency key of one intended effect: 32 lower-case hex digits,
/// `hex(sha256(scope + "\0" + tool + "\0" + canonical_json(args)))[..32]`.
///
/// The same tool, scope and arguments always give the same key, here and in the Python
/// reference derivation. It serializes as its text.
///
/// # Examples
///
/// ```
/// use idem_runtime::Key;
///
/// let key = Key::derive("charge_card", "step-7", &serde_json::json!({
///     "customer": "cus_123",
///     "amount": 4200,
/// }))
/// .unwrap();
/// assert_eq!(key.as_str(), "82e1e1a327aa97bb3929e05cc4ca3bd5");
/// assert_eq!(serde_json::to_string(&key).unwrap(), r#""82e1e1a327aa97bb3929e05cc4ca3bd5""#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Derives the key of calling `tool` with `args` within `scope`.
    ///
    /// `args` is usually an object of the tool's parameters by name; its field order does not
    /// matter, because the canonical JSON sorts keys.
    ///
    /// # Errors
    ///
    /// [`Error::Key`], naming `tool`, when `args` has no canonical JSON (see
    /// [`canonical_json`](crate::canonical_json)): NaN or an infinity, a map key that is not a
    /// string, number, bool or char, or a failing `Serialize` impl.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Key;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Charge<'a> {
    ///     customer: &'a str,
    ///     amount: u64,
    /// }
    ///
    /// let first = Key::derive("charge_card", "step-7", &Charge { customer: "cus_123", amount: 4200 });
    /// let retry = Key::derive("charge_card", "step-7", &Charge { customer: "cus_123", amount: 4200 });
    /// let next = Key::derive("charge_card", "step-8", &Charge { customer: "cus_123", amount: 4200 });
    /// assert_eq!(first.as_ref().unwrap(), retry.as_ref().unwrap());
    /// assert_ne!(first.unwrap(), next.unwrap());
    ///
    /// let nan = std::collections::HashMap::from([("kg", f64::NAN)]);
    /// assert!(Key::derive("weigh", "s", &nan).is_err());
    /// ```
    pub fn derive(tool: &str, scope: &str, args: &impl Serialize) -> Result<Key, Error> {
        let canonical = canonical_json_for(tool, args)?;
        Ok(Key::derive_canonical(tool, scope, &canonical))
    }

    /// Derives the key from arguments already written as canonical JSON, for callers that keep
    /// the text (to store it, or to fingerprint it) and so should not serialize twice.
    ///
    /// `canonical` must come from [`canonical_json`](crate::canonical_json); any other text
    /// gives a key the Python reference would not derive.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{canonical_json, Key};
    ///
    /// let args = serde_json::json!({"customer": "cus_123", "amount": 4200});
    /// let canonical = canonical_json(&args).unwrap();
    /// assert_eq!(
    ///     Key::derive_canonical("charge_card", "step-7", &canonical),
    ///     Key::derive("charge_card", "step-7", &args).unwrap(),
    /// );
    /// ```
    pub fn derive_canonical(tool: &str, scope: &str, canonical: &str) -> Key {
        let mut digest =
            sha256_hex(&[scope.as_bytes(), b"\0", tool.as_bytes(), b"\0", canonical.as_bytes()]);
        digest.truncate(KEY_LEN);
        Key(digest)
    }

    /// Reads a key as printed by [`Display`](fmt::Display) or `idem ls`: exactly 32 lower-case
    /// hex digits.
    ///
    /// # Errors
    ///
    /// [`Error::NotAKey`] naming the text and saying what a key looks like.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Key;
    ///
    /// let key = Key::parse("82e1e1a327aa97bb3929e05cc4ca3bd5").unwrap();
    /// assert_eq!(key.to_string(), "82e1e1a327aa97bb3929e05cc4ca3bd5");
    ///
    /// assert!(Key::parse("82E1E1A327AA97BB3929E05CC4CA3BD5").is_err());
    /// assert!(Key::parse("82e1e1a3").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Key, Error> {
        let is_key =
            s.len() == KEY_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if is_key {
            Ok(Key(s.to_owned()))
        } else {
            Err(Error::NotAKey { text: s.to_owned() })
        }
    }

    /// The key's text: 32 lower-case hex digits.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Key;
    ///
    /// let key = Key::derive_canonical("noop", "", "{}");
    /// assert_eq!(key.as_str(), "363d96d70c0e4e0cc4612aaaf7f84ad7");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Writes the key's 32 hex digits.
///
/// # Examples
///
/// ```
/// use idem_runtime::Key;
///
/// let key = Key::derive_canonical("noop", "", "{}");
/// assert_eq!(format!("key {key}"), "key 363d96d70c0e4e0cc4612aaaf7f84ad7");
/// ```
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key's text, as [`Key::as_str`].
///
/// # Examples
///
/// ```
/// use idem_runtime::Key;
///
/// fn log_key(key: impl AsRef<str>) -> usize {
///     key.as_ref().len()
/// }
/// assert_eq!(log_key(Key::derive_canonical("noop", "", "{}")), 32);
/// ```
impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Parses as [`Key::parse`].
///
/// # Examples
///
/// ```
/// use idem_runtime::Key;
///
/// let key: Key = "363d96d70c0e4e0cc4612aaaf7f84ad7".parse().unwrap();
/// assert_eq!(key, Key::derive_canonical("noop", "", "{}"));
/// ```
impl FromStr for Key {
    type Err = Error;

    fn from_str(s: &str) -> Result<Key, Error> {
        Key::parse(s)
    }
}

/// Serializes as the key's text.
impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Deserializes from the key's text, refusing anything [`Key::parse`] refuses.
///
/// # Examples
///
/// ```
/// use idem_runtime::Key;
///
/// let key: Key = serde_json::from_str(r#""363d96d70c0e4e0cc4612aaaf7f84ad7""#).unwrap();
/// assert_eq!(key.as_str(), "363d96d70c0e4e0cc4612aaaf7f84ad7");
/// assert!(serde_json::from_str::<Key>(r#""not a key""#).is_err());
/// ```
impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        let text = String::deserialize(deserializer)?;
        Key::parse(&text).map_err(serde::de::Error::custom)
    }
}
