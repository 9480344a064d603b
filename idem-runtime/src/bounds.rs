//! The bounds that generated code asserts, each with a message in our words
//! (`#[diagnostic::on_unimplemented]`), and the small functions that carry them. Used through
//! the facade's hidden module only.

use std::fmt::Display;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::{Args, Call};
use crate::error::Error;
use crate::store::Store;

/// The error type of an idempotent tool: it must carry an [`Error`].
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of an idempotent tool cannot carry an `idem::Error`",
    label = "this tool's error type has no `From<idem::Error>`",
    note = "the store can fail, and its errors travel in the tool's own error type: add \
            `impl From<idem::Error> for {Self}`, or a `#[from] idem::Error` variant with thiserror"
)]
pub trait ToolError: From<Error> {}
impl<E: From<Error>> ToolError for E {}

/// The `Ok` type of an idempotent tool: stored as JSON, replayed to later attempts.
#[diagnostic::on_unimplemented(
    message = "the result type `{Self}` of an idempotent tool cannot be stored and replayed",
    label = "this tool's result is not `Serialize + DeserializeOwned`",
    note = "the Ok value is recorded as JSON and handed back to every later attempt: derive \
            `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait ToolOutput: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> ToolOutput for T {}

/// A parameter that is part of the key.
#[diagnostic::on_unimplemented(
    message = "the parameter type `{Self}` is part of the idempotency key but is not `Serialize`",
    label = "this parameter is in the key",
    note = "derive `serde::Serialize` for it, or mark the parameter `#[idem(skip)]` if it is not \
            part of the intent (a client handle, a logger)"
)]
pub trait KeyParam: Serialize {}
impl<T: Serialize + ?Sized> KeyParam for T {}

/// The value a `scope = "…"` names.
#[diagnostic::on_unimplemented(
    message = "the scope `{Self}` does not implement `Display`",
    label = "the scope names this value",
    note = "the scope enters the key as its `Display` text: point `scope` at a string, a number, \
            or a field that implements `Display`"
)]
pub trait ScopeValue: Display {}
impl<S: Display + ?Sized> ScopeValue for S {}

/// Adds one key parameter to `args`.
pub fn key_arg<V: KeyParam + ?Sized>(
    args: Args,
    name: &'static str,
    value: &V,
) -> Result<Args, Error> {
    args.arg(name, value)
}

/// The scope value, checked to be `Display`.
pub fn scope<S: ScopeValue + ?Sized>(scope: &S) -> &S {
    scope
}

/// Runs a sync tool body through the engine, or returns the error that prevented the call.
pub fn run_sync<T: ToolOutput, E: ToolError>(
    call: Result<Call, Error>,
    body: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    call.map_err(crate::retry::raise)?.run(body)
}

/// Runs an async tool body through the engine, or returns the error that prevented the call.
pub async fn run_async<T, E, F, Fut>(call: Result<Call, Error>, body: F) -> Result<T, E>
where
    T: ToolOutput,
    E: ToolError,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    call.map_err(crate::retry::raise)?.run_async(body).await
}

/// What a store-giving function may return.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give a store",
    note = "`store = path` names a function returning `Arc<dyn idem::Store>` (or \
            `Result<Arc<dyn idem::Store>, idem::Error>`), or a static that derefs to \
            `Arc<dyn idem::Store>` such as a `LazyLock<Arc<dyn idem::Store>>`"
)]
pub trait IntoStore {
    /// The store.
    fn into_store(self) -> Result<Arc<dyn Store>, Error>;
}

impl IntoStore for Arc<dyn Store> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        Ok(self)
    }
}

impl<S: Store> IntoStore for Arc<S> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        Ok(self)
    }
}

impl<S: IntoStore> IntoStore for Result<S, Error> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        self.and_then(IntoStore::into_store)
    }
}

/// `store = f` where `f` is a function: call it. Chosen by method resolution, so generated code
/// need not know whether the path names a function or a static.
pub trait StoreFromFn {
    /// The store the function gives.
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error>;
}

impl<F: Fn() -> R, R: IntoStore> StoreFromFn for F {
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error> {
        self().into_store()
    }
}

/// `store = STATIC` where the static derefs to a store (a `LazyLock<Arc<dyn Store>>`).
pub trait StoreFromStatic {
    /// The store the static holds.
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error>;
}

impl<T: Deref<Target = Arc<dyn Store>>> StoreFromStatic for T {
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error> {
        Ok(Arc::clone(self))
    }
}

pub use crate::retry::{retry_any, retry_async, retry_blocking};

/// The arguments of `tool`, none yet, ready for [`key_arg`].
pub fn args(tool: &str) -> Result<Args, Error> {
    Ok(Args::new(tool))
}
