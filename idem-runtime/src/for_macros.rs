//! The contract with generated code: every item the macros' expansions name (through the
//! facade's hidden `__private` module, which lists them), the bounds they assert, each with a
//! message in our words (`#[diagnostic::on_unimplemented]`), and the small functions that carry
//! them into the engine's one run path. Not a public API.
//!
//! A tool's `Ok` and error types (`ToolOutput`, `ToolError`) are in `output`, what the path of
//! `store = …` may name in `store_path`, and the check against an rmcp `#[tool]` outside
//! `#[idem::tools]` in `rmcp_tool`; this module re-exports their items, so that the facade's
//! `__private` names each at one path.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;

use self::output::{Failed, Stored, StoredRef};
use crate::engine::erred;
use crate::engine::{sync_body, Args, Call, Codec, Ready, Reconciled};
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;

mod output;
mod rmcp_tool;
mod store_path;

pub use self::output::{ToolError, ToolOutput};
pub use self::store_path::{
    AsyncTransactional, AsyncTxStoreFromFn, AsyncTxStoreFromStatic, IntoStore, IntoStoreArc,
    StoreFromFn, StoreFromStatic,
};
#[cfg(feature = "sqlite")]
pub use self::store_path::{IntoTxStore, TxStoreFromFn, TxStoreFromStatic};
pub use rmcp_tool::{not_an_rmcp_tool, NoToolAttr, NotAnRmcpTool};

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
