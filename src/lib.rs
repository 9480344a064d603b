//! # idem: tool calls that are safe to retry
//!
//! An agent retries its tools twice over: the orchestration loop on errors, and the model when
//! it reads a timeout. A write that cannot tell it already ran then runs twice. `idem` gives every
//! intended effect a stable key derived from the intent (tool, arguments, scope), reserves it
//! atomically in a durable store, runs the effect once, records the result and replays it to
//! every later attempt. Where a crash leaves it unknown whether an effect landed, the key is
//! reported in doubt instead of guessed.
//!
//! ## Example
//!
//! Mark the tool with [`#[idempotent]`](idempotent), naming the parameter that identifies the
//! unit of work. Its result must be `Serialize + DeserializeOwned` (it is stored and replayed)
//! and its error type must take an [`Error`] (the store can fail).
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! #[derive(Debug)]
//! enum PayError {
//!     Idem(idem::Error),
//! }
//!
//! impl From<idem::Error> for PayError {
//!     fn from(error: idem::Error) -> Self {
//!         PayError::Idem(error)
//!     }
//! }
//!
//! static CHARGES: AtomicU32 = AtomicU32::new(0);
//!
//! #[idem::idempotent(scope = "order_id")]
//! fn charge_card(amount: u64, customer: &str, order_id: &str) -> Result<String, PayError> {
//!     let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
//!     Ok(format!("ch_{n}"))
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Without this, the store opens at $IDEM_STORE, else in the user's data directory.
//! let dir = tempfile::tempdir()?;
//! idem::set_default_store(std::sync::Arc::new(idem::SledStore::open(dir.path())?));
//!
//! // The orchestration retries, the model calls again: one charge, the same answer each time.
//! for _ in 0..3 {
//!     assert_eq!(charge_card(4200, "cus_42", "o-17").unwrap(), "ch_1");
//! }
//! assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
//!
//! // Another order is another intent.
//! assert_eq!(charge_card(4200, "cus_42", "o-18").unwrap(), "ch_2");
//! # Ok(()) }
//! ```
//!
//! The same works on `async fn`, on methods (`self` is never part of the key), and stacked with
//! `#[async_trait]` or rmcp's `#[tool]`. A body that returns `Err` releases the key, and the next
//! call runs it again; a body that panics, whose future is dropped, or whose process dies after
//! it started leaves the key in doubt, as does an `Err` after [`may_have_landed()`].
//!
//! ## The main items
//!
//! - Classifying tools: [`#[idempotent]`](idempotent) (keyed, run once per intent),
//!   [`#[read]`](read) (safe to repeat), [`#[write]`](write) (runs every time, never retried),
//!   and [`#[tools]`](tools) for the methods of an `impl` block. [`tool_info!`] reads a tool's
//!   [`ToolInfo`]: its [`Kind`] and the MCP hints of its [`Annotations`].
//! - Retrying: [`retry!`] repeats a read or an idempotent call with a [`Backoff`], and refuses a
//!   write at compile time.
//! - Inside a body: [`current_key()`] is the call's [`Key`], to send to a vendor that
//!   deduplicates by idempotency key; [`fencing_token()`] is a number greater for every later
//!   owner of the key, for a system of record to refuse a stale owner's late write;
//!   [`may_have_landed()`] keeps the key in doubt when the body returns an error after the
//!   vendor may have acted.
//! - Keys in doubt: [`Error::InDoubt`] says which key and what to do. A reconciler (the
//!   `reconcile` option) answers with [`Reconciled`], at a call or in a [`Sweep`] at start-up;
//!   an operator settles a key with [`admin::resolve`] (or `idem resolve`), and every change of
//!   a record is kept in its key's [`history`].
//! - Stores: the [`Store`] trait, [`SledStore`] (embedded, one process; see
//!   [`SledStoreBuilder`] and [`Durability`]), [`MemoryStore`] (the reference of the storage
//!   contract, in memory and not durable: for examples and unit tests), [`set_default_store`],
//!   [`open_default_store`] and [`default_store`]; `SqliteStore` (feature `sqlite`) shares one
//!   file between the processes of one machine, and `idem-postgres`'s `PgStore` one database
//!   between processes anywhere; [`open_store`] and [`set_default_store_named`] take a store by
//!   its name (`sqlite:PATH`, `postgres://…`, or a sled directory), as `$IDEM_STORE` does. The
//!   [`admin`] module holds the operator's operations. A store of your own, and the client of a
//!   running process's admin socket (`remote::Remote`, Unix), are `idem-agent-runtime`'s: its
//!   `store` module is what an implementor needs, and its conformance suite checks the result.
//! - Without the macros: [`Call`] runs one keyed call, and [`Key::derive`] computes a key as a
//!   Python service does (`json.dumps(args, sort_keys=True, separators=(",", ":"))`).
//!
//! ## Features
//!
//! - `metrics` (default): counters and histograms of calls and durable points through the
//!   `metrics` facade.
//! - `rmcp`: rmcp tool signatures with no glue (`Result<Json<T>, ErrorData>`,
//!   `Result<CallToolResult, ErrorData>`), idem's outcomes as tool results the model reads, and
//!   `mcp::annotate`, which fills a router's MCP hints from the classification.
//! - `sqlite`: the SQLite store (`SqliteStore`, `sqlite:PATH` in `$IDEM_STORE` and
//!   [`open_store`]), and transactional tools on it (`#[idempotent(…, transactional = "tx")]`).
//! - `postgres`: `postgres://…` in `$IDEM_STORE` and [`open_store`], through `idem-postgres`.
//!   (An async transactional tool on a `PgStore` needs only idem-postgres, not this feature.)
//!
//! ## Further reading
//!
//! The repository's README.md teaches the rest, with examples: "Choosing the scope", "With
//! rmcp", "With rig", "Calling HTTP APIs" (the workspace crate `idem-reqwest`: the key in the
//! vendor's header, and failures classified), "Settling keys in doubt: a reconciler, or `idem
//! resolve`", "What is guaranteed, and what is not", "Stores and durability", "The `idem`
//! command" and "Metrics".
//! DESIGN.md is the contract: the record's states and who may change them. The examples
//! `agent_loop`, `crash_recovery`, `crash_reconcile` and `mcp_server` run the whole story.

#![deny(missing_docs)]
// docs.rs (`--cfg docsrs`, nightly) marks each item that a feature gates with that feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Runs a side-effecting tool at most once per intent: later calls with the same scope and
/// arguments replay its recorded result.
///
/// ```text
/// #[idem::idempotent(scope = "order_id")]
/// #[idem::idempotent(scope = "req.order_id", tool = "charge_card", wait = "10s", ttl = "7d")]
/// #[idem::idempotent(scope = "order_id", store = my_store, in_doubt = "rerun")]
/// ```
///
/// | option | meaning | default |
/// | --- | --- | --- |
/// | `scope = "param"` or `"param.field"` | the unit of work the effect belongs to (README.md, *Choosing the scope*) | required |
/// | `tool = "name"` | the tool name in the key: pin it to keep keys across a rename or a move, or to tell two functions of one name apart (unpinned, `a::send` and `b::send` share the keys of `send`, and the second is refused with [`Error::SharedToolName`]) | the function's name |
/// | `store = path` | a function or static giving the store | the process default store |
/// | `wait = "30s"` | how long a concurrent caller waits for the running one | 30 s |
/// | `ttl = "24h"` | how long a finished result is replayed | until purged |
/// | `in_doubt = "fail"` or `"rerun"` | what a call does when it finds its key in doubt | `"fail"` |
/// | `destructive = false` | the write only adds (an order, a ticket): MCP's `destructiveHint` is false (also on `#[write]`) | `true` |
/// | `reconcile = "path"` | a function asked, with the key alone, whether an effect left in doubt landed: sync or `async` as the tool is, answering [`Reconciled`]; on a tool taking `&self`, a name without `::` is a method of the same type (README.md, *Settling keys in doubt*) | none |
/// | `approve` | every call needs a person's approval before the body runs (README.md, *A person approves a risky write*); the approval covers the key, so no input may be left out of it (`ignore`, `#[idem(skip)]`: a compile error) | no approval |
/// | `approve_if = "amount > 10_000"` | a call needs approval when this `bool` expression over the tool's arguments is true; no input may be left out of the key, as with `approve` | no approval |
/// | `approval_ttl = "1h"` | an approval not used within this time is asked for again (with `approve` or `approve_if`) | never expires |
/// | `approve_wait = "5m"` | how long a call waits for the decision, woken by it, before it returns [`Error::AwaitingApproval`] (with `approve` or `approve_if`) | no wait |
/// | `crate = "path"` | where this crate is, when it is renamed | `::idem` |
///
/// A parameter marked `#[idem(skip)]` is left out of the key. A parameter marked
/// `#[idem(flatten)]` is the tool's whole argument object (rmcp's `Parameters(req)`, rig's
/// `Args`): the key is derived over its fields, the `arguments` an MCP client sends, and the scope
/// may name one of them directly (`scope = "invoice_id"`, which stays in the arguments). The
/// function must return `Result<T, E>` with `T: Serialize + DeserializeOwned` (a `Json<T>` is
/// stored as its `T`) and `E: From<idem::Error>` (`String` has it, and rmcp's `ErrorData` with
/// the `rmcp` feature); each misuse is a compile error that says how to fix it.
///
/// ```
/// #[derive(serde::Serialize)]
/// struct Payment {
///     invoice_id: String,
///     amount: u64,
/// }
///
/// #[idem::idempotent(scope = "invoice_id")]
/// fn send_payment(#[idem(flatten)] req: Payment) -> Result<u64, String> {
///     Ok(req.amount)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # idem::set_default_store(std::sync::Arc::new(idem::SledStore::open(dir.path())?));
/// assert_eq!(send_payment(Payment { invoice_id: "inv-1".into(), amount: 4200 })?, 4200);
/// // The key of a tools/call whose arguments are {"invoice_id": "inv-1", "amount": 4200}:
/// let arguments = serde_json::json!({"invoice_id": "inv-1", "amount": 4200});
/// let key = idem::Key::derive("send_payment", "inv-1", &arguments)?;
/// assert!(idem::admin::show(idem::default_store()?.as_ref(), &key).is_ok());
/// # Ok(()) }
/// ```
///
/// ```
/// #[idem::idempotent(scope = "step", tool = "book_room")]
/// async fn book(#[idem(skip)] client: &str, room: u32, step: &str) -> Result<String, idem::Error> {
///     Ok(format!("{client} booked {room} ({})", idem::current_key()))
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # idem::set_default_store(std::sync::Arc::new(idem::SledStore::open(dir.path())?));
/// let first = book("https://a.example", 12, "plan-3/step-2").await?;
/// let again = book("https://b.example", 12, "plan-3/step-2").await?;
/// assert_eq!(first, again, "the client is skipped: the same intent, replayed");
/// # Ok(()) }
/// ```
pub use idem_macros::idempotent;

/// Classifies a tool as a read: no effect, safe to repeat, accepted by [`retry!`]. The body runs
/// on every call; nothing is stored.
///
/// ```
/// #[idem::read]
/// fn get_balance(customer: &str) -> Result<u64, std::io::Error> {
///     Ok(customer.len() as u64)
/// }
///
/// # fn main() {
/// assert_eq!(idem::tool_info!(get_balance).kind, idem::Kind::Read);
/// assert!(idem::tool_info!(get_balance).annotations().read_only_hint);
/// assert_eq!(idem::retry!(get_balance("cus_42")).unwrap(), 6);
/// # }
/// ```
pub use idem_macros::read;

/// Classifies a tool as a write with no key: it runs on every call, and [`retry!`] refuses it at
/// compile time. Use it for effects you have decided not to key, so that the decision is visible.
///
/// ```
/// #[idem::write]
/// fn send_fax(to: &str) -> Result<(), std::io::Error> {
///     Ok(())
/// }
///
/// # fn main() {
/// let info = idem::tool_info!(send_fax);
/// assert!(!info.retry_safe() && info.annotations().destructive_hint);
/// # }
/// ```
pub use idem_macros::write;

/// Calls a `#[read]` or `#[idempotent]` function again with exponential backoff and jitter until
/// it succeeds, `when` refuses its error, or the [`Backoff`] gives up (5 retries by default);
/// returns the last result. An attempt that failed on an idem error no attempt can fix (a key in
/// doubt, arguments with no key: [`Error::is_retryable`] is false) ends it at once.
///
/// ```text
/// idem::retry!(get_balance("cus_42"))
/// idem::retry!(charge_card(4200, "cus_42", "o-17").await, backoff = idem::Backoff::default().max_retries(3))
/// idem::retry!(get_balance("cus_42"), when = |e: &MyError| e.is_transient())
/// ```
///
/// It takes a call of a free or associated function by its path, and checks at compile time that
/// the function is safe to repeat: a `#[write]`, an unclassified function or a method called as
/// `receiver.method(…)` is a compile error that names the fix. A method of a block under
/// [`#[idem::tools]`](tools) is taken by its type's path: `Bank::get_balance(&bank, "acct-1")`.
/// An async call sleeps on tokio's timer; a sync one sleeps the thread. Each attempt evaluates
/// the call anew where the macro stands, so an argument may borrow mutably and the borrow ends
/// with the attempt: `idem::retry!(<Adder as Tool>::call(&adder, &mut context, args.clone()).await)`
/// repeats a rig tool.
///
/// ```
/// # use std::sync::atomic::{AtomicU32, Ordering};
/// static TRIES: AtomicU32 = AtomicU32::new(0);
///
/// #[idem::read]
/// async fn fetch_rate(currency: &str) -> Result<f64, String> {
///     if TRIES.fetch_add(1, Ordering::SeqCst) == 0 {
///         return Err(format!("{currency}: timed out"));
///     }
///     Ok(1.08)
/// }
///
/// # #[tokio::main]
/// # async fn main() {
/// let quick = idem::Backoff::default().min_delay(std::time::Duration::from_millis(1));
/// assert_eq!(idem::retry!(fetch_rate("EUR").await, backoff = quick), Ok(1.08));
/// # }
/// ```
pub use idem_macros::retry;

/// Classifies the methods of an `impl` block at compile time, as the attributes do for free
/// functions: an inherent block (rmcp's `#[tool_router]`) or a trait impl (rig's `Tool::call`).
/// With it, [`tool_info!`] and [`retry!`] take a method by its type's path, and the type gains
/// `idem_tools()`, the block's classified tools in order. A framework's name for a tool is its
/// name (rig's `<T as Tool>::NAME`, rmcp's `#[tool(name = "…")]` or the method's), in its key
/// and record, and each rmcp `#[tool]` gets the MCP hints it leaves unset written into it. It
/// stacks with `#[tool_router]` in either order, and makes the router `#[tool_router]` generates
/// answer idem's outcomes (in doubt, in flight elsewhere, …) as tool results the model reads
/// (with the `rmcp` feature; see `idem::mcp::annotate`, which it calls). An rmcp `#[tool]`
/// classified in a block without it fails to build, whichever of the two attributes is above,
/// with a message that names the method and this fix.
/// When some of the block's tools name a reconciler (`reconcile = "…"`), the type also gains
/// `idem_sweep(&self) -> Sweep`, a [`Sweep`] of those tools asking through `self` (which it
/// shares, so the type must be `Sync`), to run at start-up: `bank.idem_sweep().run()`.
///
/// ```
/// struct Bank;
///
/// #[idem::tools]
/// impl Bank {
///     #[idem::read]
///     fn get_balance(&self, account: &str) -> Result<u64, String> {
///         Ok(account.len() as u64)
///     }
///
///     #[idem::write]
///     fn delete_account(&self, account: &str) -> Result<(), String> {
///         Ok(())
///     }
/// }
///
/// # fn main() {
/// assert_eq!(idem::tool_info!(Bank::get_balance).kind, idem::Kind::Read);
/// let names: Vec<&str> = Bank::idem_tools().iter().map(|tool| tool.name).collect();
/// assert_eq!(names, ["get_balance", "delete_account"]);
/// assert_eq!(idem::retry!(Bank::get_balance(&Bank, "acct-1")), Ok(6));
/// // idem::retry!(Bank::delete_account(&Bank, "acct-1")) does not compile: a write.
/// # }
/// ```
///
/// A method is named by its type's path: `Bank::get_balance`, `Self::get_balance` inside the
/// `impl`, `<Adder as Tool>::call`. The classification sits in the hidden companion constants
/// (`__idem_tool_<name>`) that the attribute cannot declare on a method taking `self`, which this
/// declares in a second inherent `impl` of the type; so the type must be local to the crate, and
/// one `#[idem::tools]` block per type lists its tools.
pub use idem_macros::tools;

/// rmcp without glue (feature `rmcp`): `From<idem::Error>` for rmcp's `ErrorData` lives in
/// idem's runtime, [`annotate`](mcp::annotate) fills a router's MCP hints from the
/// classification, and [`IdempotentClient`](mcp::IdempotentClient) keys the calls an MCP client
/// sends.
#[cfg(feature = "rmcp")]
pub mod mcp {
    pub use idem_runtime::mcp::{
        annotate, ask_for_approval, final_error, IdempotentClient, Protection, ToolPolicy,
    };
}

/// What an operator does with records: show, scan, settle, approve, purge, count. Blocking
/// calls on a store this process opened, for scripts and tests; the `idem` command runs the same
/// operations, on a store a running process holds too.
pub mod admin {
    pub use idem_runtime::admin::{
        decide, history, purge, resolve, scan, show, stats, Decision, Filter, Listing, Purge,
        Purged, Resolution, Stats,
    };
}

/// A key's history: one [`Entry`](history::Entry) per change of its record, each naming its
/// [`Event`](history::Event) and who made it ([`admin::history`] reads it).
pub mod history {
    pub use idem_runtime::history::{Answer, Entry, Event};
}

/// Retention: a store's background removal of finished records and released keys' histories
/// past a bound ([`Retention`](retention::Retention), given to a store's builder), and what its
/// passes did ([`RetentionStatus`](retention::RetentionStatus), in [`admin::Stats`]).
pub mod retention {
    pub use idem_runtime::retention::{Retention, RetentionStatus};
}

// What only a store implementor needs (the fence, the record's parts, the notifier) and the
// client of a running process's admin socket are in `idem-agent-runtime` (`idem_runtime::store`,
// `idem_runtime::remote`): a user of idem never names them, and the facade stays small
// (tests/facade.rs counts it).
pub use idem_runtime::{
    current_key, default_store_path, fencing_token, may_have_landed, set_default_store,
    try_current_key, try_fencing_token, Annotations, Backoff, Call, Durability, Error,
    InDoubtPolicy, Key, Kind, MemoryStore, Reconciled, Record, SledStore, SledStoreBuilder, Status,
    Store, StoreError, Sweep, SweepOutcome, SweepReport, Swept, ToolInfo,
};

/// The SQLite store (feature `sqlite`): one file that several processes on one machine share.
#[cfg(feature = "sqlite")]
pub use idem_runtime::{rusqlite, SqliteStore, SqliteStoreBuilder};

mod named;
pub use named::{default_store, open_default_store, open_store, set_default_store_named};

/// The only contract between the macros and the runtime: the code `idem-macros` generates names
/// these items, and only these, by absolute path. Not a public API.
#[doc(hidden)]
pub mod __private {
    // Building and running a call (`#[idempotent]`).
    pub use idem_runtime::for_macros::{
        args, codec_of, flatten_arg, key_arg, run_async, run_sync, scope, StoreFromFn,
        StoreFromStatic,
    };
    pub use idem_runtime::{Call, InDoubtPolicy};
    // A transactional tool (`transactional = "tx"`) on the SQLite store.
    #[cfg(feature = "sqlite")]
    pub use idem_runtime::for_macros::{
        run_transactional, IntoTxStore, TxStoreFromFn, TxStoreFromStatic,
    };
    // An async transactional tool: the store named lends the transaction (idem-postgres).
    pub use idem_runtime::for_macros::{
        run_transactional_async, AsyncTransactional, AsyncTxStoreFromFn, AsyncTxStoreFromStatic,
    };
    // A tool with a reconciler (`reconcile = "…"`).
    pub use idem_runtime::for_macros::{
        ask_async, ask_sync, run_async_reconciled, run_sync_reconciled,
    };
    pub use idem_runtime::{Key, Sweep};
    // A tool that needs approval (`approve_if = "…"`).
    pub use idem_runtime::for_macros::approval_condition;
    // The classification: the type of the companion constant every attribute declares beside
    // its function, read by `tool_info!` and `retry!`.
    pub use idem_runtime::{Kind, ToolInfo};
    // `retry!`.
    pub use idem_runtime::for_macros::{
        attempt_async, attempt_sync, pause, pause_blocking, retry_any, Retrying,
    };
    pub use idem_runtime::Backoff;
    // rmcp's router under `#[idem::tools]`: idem's answers as tool results.
    pub use idem_macros::wrap_tool_router;
    pub use idem_runtime::for_macros::tool_router_answers;
    // A method classified outside `#[idem::tools]`: the check that it is not an rmcp `#[tool]`.
    pub use idem_runtime::for_macros::{not_an_rmcp_tool, NoToolAttr};
    // Named by the compiler's messages when a bound above fails, so that they read
    // `idem::__private::ToolError` rather than a path into the runtime.
    pub use idem_runtime::for_macros::{
        ApprovalCondition, AsyncReconciler, Attempted, FlattenParam, IntoStore, KeyParam,
        NotAnRmcpTool, ReconcilerAnswer, ScopeValue, SyncReconciler, ToolError, ToolOutput,
    };
}

/// The compile-time classification ([`ToolInfo`]) of a function marked `#[idem::read]`,
/// `#[idem::idempotent]` or `#[idem::write]`, named by its path. A constant expression.
///
/// ```
/// #[idem::read]
/// fn get_balance(customer: &str) -> Result<u64, idem::Error> {
///     Ok(customer.len() as u64)
/// }
///
/// const INFO: idem::ToolInfo = idem::tool_info!(get_balance);
///
/// # fn main() {
/// assert_eq!(INFO.name, "get_balance");
/// assert_eq!(INFO.kind, idem::Kind::Read);
/// assert!(INFO.annotations().read_only_hint);
/// # }
/// ```
///
/// It reads a hidden companion constant, `__idem_tool_<name>`, that the attribute declares
/// beside the function with the function's visibility, so it takes a tool declared at module
/// level or in an inherent `impl`, not inside a function's body. Where the function is imported
/// alone (`mod charge; pub use charge::charge;`), import the companion with it
/// (`pub use charge::{charge, __idem_tool_charge};`): the compile error names it. A method that
/// takes `self` or names `Self` has one only under [`#[idem::tools]`](tools), which declares it in
/// an inherent `impl` of the type; name it by its type's path
/// (`idem::tool_info!(Bank::send_payment)`, `idem::tool_info!(<Adder as Tool>::call)`).
#[macro_export]
macro_rules! tool_info {
    ($($tool:tt)+) => {
        $crate::__tool_info!($crate, $($tool)+)
    };
}

#[doc(hidden)]
pub use idem_macros::tool_info as __tool_info;
