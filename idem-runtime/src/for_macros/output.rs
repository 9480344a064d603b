//! What a tool gives back, its `Ok` type and its error type: the bounds the macros assert on
//! them, each with a message in our words, and the engine's view of each.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Error;

/// The error type of an idempotent tool: it must carry an [`Error`].
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of an idempotent tool cannot carry an `idem::Error`",
    label = "this tool's error type has no `From<idem::Error>`",
    note = "the store can fail, and its errors travel in the tool's own error type: if `{Self}` \
            is yours, add `impl From<idem::Error> for {Self}` (or a `#[from] idem::Error` variant \
            with thiserror); `String` works as it is, and rmcp's `ErrorData` with idem's `rmcp` \
            feature; another crate's type cannot take the impl, so return an error type of your own"
)]
pub trait ToolError {
    /// The idem error, in the tool's error type.
    fn from_idem(error: Error) -> Self;
}
impl<E: From<Error>> ToolError for E {
    fn from_idem(error: Error) -> Self {
        E::from(error)
    }
}

/// The `Ok` type of an idempotent tool: stored as JSON, replayed to later attempts.
#[diagnostic::on_unimplemented(
    message = "the result type `{Self}` of an idempotent tool cannot be stored and replayed",
    label = "this tool's result is not `Serialize + DeserializeOwned`",
    note = "the Ok value is recorded as JSON and handed back to every later attempt: if `{Self}` \
            is yours, derive `serde::Serialize` and `serde::Deserialize` for it; another crate's \
            type cannot take them, so return a struct of your own that holds it (a `Json<T>` \
            wrapper is taken off for you: only its `T` needs them)"
)]
pub trait ToolOutput: Sized {
    /// Serializes the value.
    fn store<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Deserializes a stored value.
    fn replay<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}
impl<T: Serialize + DeserializeOwned> ToolOutput for T {
    fn store<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize(serializer)
    }
    fn replay<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer)
    }
}

/// The engine's view of a tool's `Ok` value. `ToolOutput` and `ToolError` have no supertraits,
/// so that a failed bound is one obligation, reported once in our words: an async tool awaits
/// the engine's future, whose bounds the compiler checks again there, and supertraits would be
/// reported there as raw `Serialize`/`From` errors beside ours.
pub(super) struct Stored<T>(pub(super) T);

impl<T: ToolOutput> Serialize for Stored<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.store(serializer)
    }
}

impl<'de, T: ToolOutput> serde::Deserialize<'de> for Stored<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::replay(deserializer).map(Stored)
    }
}

/// A borrowed `Ok` value, serialized as [`ToolOutput`] says.
pub(super) struct StoredRef<'a, T>(pub(super) &'a T);

impl<T: ToolOutput> Serialize for StoredRef<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.store(serializer)
    }
}

/// The engine's view of a tool's error type.
pub(super) struct Failed<E>(pub(super) E);

impl<E: ToolError> From<Error> for Failed<E> {
    fn from(error: Error) -> Self {
        Failed(E::from_idem(error))
    }
}
