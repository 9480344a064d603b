//! The contract with generated code: every item the macros' expansions name (through the
//! facade's hidden `__private` module, which lists them), the bounds they assert, each with a
//! message in our words (`#[diagnostic::on_unimplemented]`), and the small functions that carry
//! them into the engine's one run path. Not a public API.

use std::fmt::Display;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::erred;
use crate::engine::{sync_body, Args, Call, Codec, Ready, Reconciled};
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::store::Store;

mod rmcp_tool;
pub use rmcp_tool::{not_an_rmcp_tool, NoToolAttr, NotAnRmcpTool};

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

/// The condition of `approve_if = "…"`: whether a person must approve this call.
#[diagnostic::on_unimplemented(
    message = "the `approve_if` condition is a `{Self}`, not a `bool`",
    label = "this condition must be true when a person must approve the call",
    note = "write an expression over the tool's arguments that is a `bool`, such as \
            \"amount > 10_000\" or \"req.amount > 10_000\" for a flattened argument"
)]
pub trait ApprovalCondition {
    /// Whether the call needs approval.
    fn holds(self) -> bool;
}
impl ApprovalCondition for bool {
    fn holds(self) -> bool {
        self
    }
}

/// Whether `condition` asks a person to approve the call, checked to be a `bool`.
pub fn approval_condition<C: ApprovalCondition>(condition: C) -> bool {
    condition.holds()
}

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

/// The engine's view of a tool's `Ok` value. `ToolOutput` and `ToolError` have no supertraits,
/// so that a failed bound is one obligation, reported once in our words: an async tool awaits
/// the engine's future, whose bounds the compiler checks again there, and supertraits would be
/// reported there as raw `Serialize`/`From` errors beside ours.
struct Stored<T>(T);

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
struct StoredRef<'a, T>(&'a T);

impl<T: ToolOutput> Serialize for StoredRef<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.store(serializer)
    }
}

/// The engine's view of a tool's error type.
struct Failed<E>(E);

impl<E: ToolError> From<Error> for Failed<E> {
    fn from(error: Error) -> Self {
        Failed(E::from_idem(error))
    }
}

/// Runs a sync tool body through the engine, or returns the error that prevented the call.
pub fn run_sync<T: ToolOutput, E: ToolError>(
    call: Result<Call, Error>,
    body: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let call = call.map_err(|e| E::from_idem(crate::retry::raise(e)))?;
    call.run(|| body().map(Stored).map_err(Failed))
        .map(|stored| stored.0)
        .map_err(|failed| failed.0)
}

/// The codec of an async tool's body: its result and error types, checked here, in a sync
/// call made before anything is awaited, so that each unmet bound is reported once, in our
/// words. [`run_async`] itself has no bounds on them, so awaiting it reports nothing again.
pub fn codec_of<T, E, F, Fut>(_body: &F) -> Codec<T, E>
where
    T: ToolOutput,
    E: ToolError,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    Codec {
        encode: |value| serde_json::to_string(&StoredRef(value)),
        decode: |json| serde_json::from_str::<Stored<T>>(json).map(|stored| stored.0),
        error: E::from_idem,
    }
}

/// Runs an async tool body through the engine, or returns the error that prevented the call.
pub async fn run_async<T, E, F, Fut>(
    codec: Codec<T, E>,
    call: Result<Call, Error>,
    body: F,
) -> Result<T, E>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = call.map_err(|e| (codec.error)(crate::retry::raise(e)))?;
    call.execute(codec, None::<fn(Key) -> Ready<T>>, body).await
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

pub use crate::retry::{
    attempt_async, attempt_sync, pause, pause_blocking, retry_any, Attempted, Retrying,
};

/// The arguments of `tool`, none yet, ready for [`key_arg`].
pub fn args(tool: &str) -> Result<Args, Error> {
    Ok(Args::new(tool))
}

/// A parameter marked `#[idem(flatten)]`: the tool's whole argument object.
#[diagnostic::on_unimplemented(
    message = "the parameter type `{Self}` is the tool's argument object (`#[idem(flatten)]`) but \
               is not `Serialize`",
    label = "its fields are the key's arguments",
    note = "derive `serde::Serialize` for it (a request struct usually derives `Deserialize` \
            already), or drop `#[idem(flatten)]` and mark it `#[idem(skip)]`"
)]
pub trait FlattenParam: Serialize {}
impl<T: Serialize + ?Sized> FlattenParam for T {}

/// Makes one parameter the whole argument object of the key.
pub fn flatten_arg<V: FlattenParam + ?Sized>(
    args: Args,
    name: &'static str,
    value: &V,
) -> Result<Args, Error> {
    args.flatten(name, value)
}

/// What a reconciler returns: whether the effect landed, or an error that says why it cannot
/// tell.
#[diagnostic::on_unimplemented(
    message = "a reconciler answers `Result<idem::Reconciled<T>, E>`, not `{Self}`",
    label = "this reconciler's answer",
    note = "answer `Reconciled::Landed(result)` (the effect landed: `T` is the tool's `Ok` type, \
            the `T` inside a `Json<T>`), `Reconciled::NotLanded` or `Reconciled::CannotTell`, in \
            an `Ok`; an `Err` of any type that implements `Display` leaves the key in doubt and \
            says why"
)]
pub trait ReconcilerAnswer<T> {
    /// The answer, with the error as the reason the key stays in doubt.
    fn answer(self) -> Result<Reconciled<T>, String>;
}

impl<T, R: Display> ReconcilerAnswer<T> for Result<Reconciled<T>, R> {
    fn answer(self) -> Result<Reconciled<T>, String> {
        self.map_err(erred)
    }
}

/// A function named by `reconcile = "…"` on a sync tool: it takes the call's key (a method's,
/// `&self` first) and answers whether the effect landed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot reconcile this tool",
    label = "named by `reconcile`",
    note = "a reconciler of a sync tool is `fn(&idem::Key) -> Result<idem::Reconciled<T>, E>`, \
            with `T` the tool's `Ok` type (the `T` inside a `Json<T>`) and an error `E` that \
            implements `Display`; a method's takes `&self` first: \
            `fn(&self, &idem::Key) -> Result<idem::Reconciled<T>, E>`"
)]
pub trait SyncReconciler<A, T> {
    /// Asks, with the error as the reason the key stays in doubt.
    fn ask(self, args: A) -> Result<Reconciled<T>, String>;
}

impl<'k, F, O, T> SyncReconciler<(&'k Key,), T> for F
where
    F: FnOnce(&'k Key) -> O,
    O: ReconcilerAnswer<T>,
{
    fn ask(self, (key,): (&'k Key,)) -> Result<Reconciled<T>, String> {
        self(key).answer()
    }
}

impl<'k, S, F, O, T> SyncReconciler<(S, &'k Key), T> for F
where
    F: FnOnce(S, &'k Key) -> O,
    O: ReconcilerAnswer<T>,
{
    fn ask(self, (receiver, key): (S, &'k Key)) -> Result<Reconciled<T>, String> {
        self(receiver, key).answer()
    }
}

/// A function named by `reconcile = "…"` on an async tool: an `async fn` that takes the call's
/// key (a method's, `&self` first) and answers whether the effect landed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot reconcile this tool",
    label = "named by `reconcile`",
    note = "a reconciler of an async tool is `async fn(&idem::Key) -> Result<idem::Reconciled<T>, \
            E>`, with `T` the tool's `Ok` type (the `T` inside a `Json<T>`) and an error `E` that \
            implements `Display`; a method's takes `&self` first: \
            `async fn(&self, &idem::Key) -> Result<idem::Reconciled<T>, E>`"
)]
pub trait AsyncReconciler<A, T> {
    /// The future of its answer.
    type Answer: Future<Output: ReconcilerAnswer<T>>;
    /// Asks.
    fn ask(self, args: A) -> Self::Answer;
}

impl<'k, F, Fut, T> AsyncReconciler<(&'k Key,), T> for F
where
    F: FnOnce(&'k Key) -> Fut,
    Fut: Future<Output: ReconcilerAnswer<T>>,
{
    type Answer = Fut;
    fn ask(self, (key,): (&'k Key,)) -> Fut {
        self(key)
    }
}

impl<'k, S, F, Fut, T> AsyncReconciler<(S, &'k Key), T> for F
where
    F: FnOnce(S, &'k Key) -> Fut,
    Fut: Future<Output: ReconcilerAnswer<T>>,
{
    type Answer = Fut;
    fn ask(self, (receiver, key): (S, &'k Key)) -> Fut {
        self(receiver, key)
    }
}

/// Asks a sync tool's reconciler.
pub fn ask_sync<A, T, F: SyncReconciler<A, T>>(
    reconcile: F,
    args: A,
) -> Result<Reconciled<T>, String> {
    reconcile.ask(args)
}

/// Asks an async tool's reconciler.
pub async fn ask_async<A, T, F: AsyncReconciler<A, T>>(
    reconcile: F,
    args: A,
) -> Result<Reconciled<T>, String> {
    reconcile.ask(args).await.answer()
}

/// [`run_sync`] for a tool with a reconciler.
pub fn run_sync_reconciled<T: ToolOutput, E: ToolError>(
    call: Result<Call, Error>,
    reconcile: impl FnOnce(&Key) -> Result<Reconciled<T>, String>,
    body: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let call = call.map_err(|e| E::from_idem(crate::retry::raise(e)))?;
    let reconcile = |key: Key| std::future::ready(reconcile(&key).map(|answer| answer.map(Stored)));
    let body = sync_body(|| body().map(Stored).map_err(Failed));
    block_on(call.execute(Codec::serde(), Some(reconcile), body))
        .map(|stored| stored.0)
        .map_err(|failed| failed.0)
}

/// [`run_async`] for a tool with a reconciler.
pub async fn run_async_reconciled<T, E, Rf, RFut, F, Fut>(
    codec: Codec<T, E>,
    call: Result<Call, Error>,
    reconcile: Rf,
    body: F,
) -> Result<T, E>
where
    Rf: FnOnce(Key) -> RFut,
    RFut: Future<Output = Result<Reconciled<T>, String>>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = call.map_err(|e| (codec.error)(crate::retry::raise(e)))?;
    call.execute(codec, Some(reconcile), body).await
}

/// An rmcp tool router of a block under `#[idem::tools]`, as the block's router function returns
/// it: its routes answer idem's errors as tool results the model reads, and carry the hints the
/// `#[tool]`s left unset ([`crate::mcp::annotate`]).
#[cfg(feature = "rmcp")]
pub fn tool_router_answers<S: rmcp::service::MaybeSend + 'static>(
    router: rmcp::handler::server::router::tool::ToolRouter<S>,
    tools: &[crate::classify::ToolInfo],
) -> rmcp::handler::server::router::tool::ToolRouter<S> {
    crate::mcp::annotate(router, tools)
}

/// Without idem's `rmcp` feature there is no rmcp router to change, and idem's errors reach an
/// rmcp client as the tool's own errors (see the README's "With rmcp").
#[cfg(not(feature = "rmcp"))]
pub fn tool_router_answers<R>(router: R, _tools: &[crate::classify::ToolInfo]) -> R {
    router
}

/// What a transactional tool's `store = …` may give: the SQLite store whose file holds the
/// tool's tables.
#[cfg(feature = "sqlite")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give the SQLite store a transactional tool runs on",
    note = "`store = path` on a transactional tool names a function returning \
            `Arc<idem::SqliteStore>` (or `Result<Arc<idem::SqliteStore>, idem::Error>`), or a \
            static that derefs to `Arc<idem::SqliteStore>`: the tool's writes commit in that \
            store's file, with its record"
)]
pub trait IntoTxStore {
    /// The store.
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl IntoTxStore for Arc<crate::store::sqlite::SqliteStore> {
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        Ok(self)
    }
}

#[cfg(feature = "sqlite")]
impl<S: IntoTxStore> IntoTxStore for Result<S, Error> {
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        self.and_then(IntoTxStore::into_tx_store)
    }
}

/// `store = f` on a transactional tool, where `f` is a function: call it.
#[cfg(feature = "sqlite")]
pub trait TxStoreFromFn {
    /// The store the function gives.
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl<F: Fn() -> R, R: IntoTxStore> TxStoreFromFn for F {
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        self().into_tx_store()
    }
}

/// `store = STATIC` on a transactional tool, where the static derefs to the store.
#[cfg(feature = "sqlite")]
pub trait TxStoreFromStatic {
    /// The store the static holds.
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl<T: Deref<Target = Arc<crate::store::sqlite::SqliteStore>>> TxStoreFromStatic for T {
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        Ok(Arc::clone(self))
    }
}

/// Runs a sync transactional tool's body through the engine, on the caller's thread: its
/// writes through the transaction commit with the call's record, or neither does.
#[cfg(feature = "sqlite")]
pub fn run_transactional<T: ToolOutput, E: ToolError>(
    call: Result<Call, Error>,
    store: Result<Arc<crate::store::sqlite::SqliteStore>, Error>,
    body: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let raise = |e| E::from_idem(crate::retry::raise(e));
    let (call, store) = (call.map_err(raise)?, store.map_err(raise)?);
    let codec = Codec::<Stored<T>, Failed<E>>::serde();
    store
        .run_transactional(call, codec, |tx| body(tx).map(Stored).map_err(Failed))
        .map(|stored| stored.0)
        .map_err(|failed| failed.0)
}

/// A store that runs an async transactional tool (`transactional = "tx"` on an `async fn`) whose
/// body is `B`: it lends the transaction `B` takes (`D`, the function type `fn(TX)` of the
/// parameter's type `TX` as the tool writes it, so that a store that lends another driver's
/// transaction is told apart by its type, before the body's signature is compared), and runs
/// the call on the engine's one transactional path (`Call::transact`). A store crate implements it for its store and its
/// drivers' transactions (idem-postgres: `PgStore` with `&mut tokio_postgres::Transaction<'_>`,
/// `SqlxStore` with `&mut sqlx::PgConnection`), so that the macros know no database.
#[diagnostic::on_unimplemented(
    message = "the store `{Self}` cannot run this async transactional tool",
    label = "the store `store = …` gives",
    note = "an async tool marked `transactional = \"tx\"` runs on a PostgreSQL store \
            (`Arc<idem_postgres::PgStore>`, from a function or a static) and takes \
            `tx: &mut tokio_postgres::Transaction<'_>`, that store's own driver; one taking \
            `tx: &mut sqlx::PgConnection` needs a store that carries the application's sqlx pool \
            (`Arc<idem_postgres::SqlxStore>`, feature `sqlx`); on a SQLite store a transactional \
            tool is a plain `fn` taking `tx: &rusqlite::Transaction<'_>`"
)]
pub trait AsyncTransactional<D, B, T, E> {
    /// Runs `call` with `body` in a transaction of this store: its writes commit with the call's
    /// record, or neither does.
    fn run_transactional(&self, call: Call, body: B) -> impl Future<Output = Result<T, E>>;
}

/// What a function named by `store = …` on an async transactional tool returns: the store, or
/// an error in getting it.
pub trait IntoStoreArc {
    /// The store's type.
    type Store: ?Sized;
    /// The store.
    fn into_store_arc(self) -> Result<Arc<Self::Store>, Error>;
}

impl<S: ?Sized> IntoStoreArc for Arc<S> {
    type Store = S;
    fn into_store_arc(self) -> Result<Arc<S>, Error> {
        Ok(self)
    }
}

impl<S: ?Sized> IntoStoreArc for Result<Arc<S>, Error> {
    type Store = S;
    fn into_store_arc(self) -> Result<Arc<S>, Error> {
        self
    }
}

/// `store = f` on an async transactional tool, where `f` is a function: call it.
pub trait AsyncTxStoreFromFn {
    /// The store's type.
    type Store: ?Sized;
    /// The store the function gives.
    fn __idem_async_tx_store(&self) -> Result<Arc<Self::Store>, Error>;
}

impl<F: Fn() -> R, R: IntoStoreArc> AsyncTxStoreFromFn for F {
    type Store = R::Store;
    fn __idem_async_tx_store(&self) -> Result<Arc<R::Store>, Error> {
        self().into_store_arc()
    }
}

/// `store = STATIC` on an async transactional tool, where the static derefs to an `Arc` of the
/// store.
pub trait AsyncTxStoreFromStatic {
    /// The store's type.
    type Store: ?Sized;
    /// The store the static holds.
    fn __idem_async_tx_store(&self) -> Result<Arc<Self::Store>, Error>;
}

impl<T: Deref<Target = Arc<S>>, S: ?Sized> AsyncTxStoreFromStatic for T {
    type Store = S;
    fn __idem_async_tx_store(&self) -> Result<Arc<S>, Error> {
        Ok(Arc::clone(self))
    }
}

/// Runs an async transactional tool's body through the store that lends its transaction. A
/// plain `fn` making the future, so that a store that lends no such transaction is reported
/// once, where the tool names it, rather than again where the future is awaited. The generated
/// code names `D`, the transaction the body takes (`fn(TX)`, see [`AsyncTransactional`]).
pub fn run_transactional_async<S, D, B, T, E>(
    call: Result<Call, Error>,
    store: Result<Arc<S>, Error>,
    body: B,
) -> impl Future<Output = Result<T, E>>
where
    S: AsyncTransactional<D, B, T, E> + ?Sized,
    E: ToolError,
{
    let ready = call.and_then(|call| store.map(|store| (call, store)));
    async move {
        let (call, store) = ready.map_err(|e| E::from_idem(crate::retry::raise(e)))?;
        store.run_transactional(call, body).await
    }
}
