//! # idem: tool calls that are safe to retry
//!
//! An agent retries its tools twice over: the orchestration loop on errors, and the model when
//! it reads a timeout. A write that cannot tell it already ran then runs twice. `idem` gives every
//! intended effect a stable key derived from the intent (tool, arguments, scope), reserves it
//! atomically in a durable store, runs the effect once, records the result and replays it to
//! every later attempt. Where a crash leaves it unknown whether an effect landed, the key is
//! reported in doubt instead of guessed.
//!
//! `cargo run --example agent_loop` shows a double charge and what each protection does about
//! it; `cargo run --example crash_recovery` shows a process killed mid-effect and an operator
//! settling the key it left in doubt.
//!
//! ## Quick start
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
//! // Without this, the store opens at $IDEM_STORE, else ./idem.sled.
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
//! The same works on `async fn` (the store's syncs never block the executor), on methods (`self`
//! is never part of the key), and stacked with `#[async_trait]` or rmcp's `#[tool]`.
//!
//! ## What happens on each call
//!
//! The key is `sha256(scope, tool, canonical JSON of the arguments)`, the same one a Python
//! service derives with `json.dumps(args, sort_keys=True, separators=(",", ":"))` (see
//! [`Key::derive`]). Then:
//!
//! | the store holds for the key | the call |
//! | --- | --- |
//! | nothing | reserves it durably, runs the body |
//! | a finished result | returns it without running the body (a *replay*) |
//! | a call still running | waits for it (`wait`, 30 s), then replays its result |
//! | a record in doubt | returns [`Error::InDoubt`] and runs nothing (or reruns with `in_doubt = "rerun"`) |
//!
//! And once the body has run:
//!
//! | the body | the record |
//! | --- | --- |
//! | returned `Ok(v)` | `v` is stored durably and replayed to every later call |
//! | returned `Err(e)` | the key is released: an error means nothing landed, and the next call runs again |
//! | returned `Err(e)` after calling [`may_have_landed()`] | in doubt: the body said the effect may have landed |
//! | panicked, its future was dropped, or the process died | in doubt: the effect may have landed |
//!
//! So a tool that turns "no answer in time" into a plain `Err` tells idem that nothing landed,
//! and the next attempt runs the body again. If the target system may have acted, either call
//! [`may_have_landed()`] before returning that `Err` (the key stays in doubt and nothing runs
//! twice), or send the vendor the key (next section): then running again is harmless.
//!
//! ## Sending the key to the vendor
//!
//! idem's record knows what the body reported, not what the vendor did while a response was
//! lost. Vendors that take an idempotency key (Stripe's `Idempotency-Key` header and many
//! others) close that gap: inside the body, [`current_key()`] is the call's key, the same on
//! every attempt of the same intent.
//!
//! ```
//! #[idem::idempotent(scope = "order_id", in_doubt = "rerun")]
//! fn charge_card(amount: u64, order_id: &str) -> Result<String, idem::Error> {
//!     let key = idem::current_key();
//!     // payments.post("/v1/charges").header("Idempotency-Key", key.as_str()) …
//!     Ok(format!("charged {amount} under key {key}"))
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # idem::set_default_store(std::sync::Arc::new(idem::SledStore::open(dir.path())?));
//! let key = idem::Key::derive("charge_card", "o-17", &serde_json::json!({"amount": 4200}))?;
//! assert_eq!(charge_card(4200, "o-17")?, format!("charged 4200 under key {key}"));
//! assert!(idem::try_current_key().is_none(), "outside a call there is no key");
//! # Ok(()) }
//! ```
//!
//! With the vendor deduplicating, `in_doubt = "rerun"` is safe: a call that finds its key in
//! doubt runs the body again with the same key, and the vendor answers with what it already did.
//!
//! ## Choosing the scope
//!
//! The scope says which unit of work the effect belongs to: an order, a ticket, a step of a
//! plan. It is required because only the caller knows it.
//!
//! - Too broad (the customer, the conversation) and a genuine second charge with the same
//!   arguments is swallowed as a replay of the first.
//! - Too narrow (a timestamp, a random id per attempt) and every retry is a new intent: nothing
//!   is deduplicated.
//! - Never the model's tool-call id: the model issues a new one when it calls again, which is
//!   exactly the repeat to catch.
//!
//! `scope = "req.order_id"` reaches into a parameter's fields. Parameters that are not part of
//! the intent (a client handle, a logger) are left out of the key with `#[idem(skip)]`.
//!
//! ## Reads, unkeyed writes, and `retry!`
//!
//! [`#[read]`](read) and [`#[write]`](write) classify tools that take no key. The classification
//! is known at compile time ([`tool_info!`], [`Kind`], and the MCP hints of [`Annotations`]), and
//! [`retry!`] uses it: it retries a read or an idempotent tool with exponential backoff and
//! jitter ([`Backoff`]), and refuses, at compile time, a `#[write]` or an unclassified function.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::time::Duration;
//!
//! static TRIES: AtomicU32 = AtomicU32::new(0);
//!
//! /// Fails twice, then answers.
//! #[idem::read]
//! fn get_balance(customer: &str) -> Result<u64, String> {
//!     match TRIES.fetch_add(1, Ordering::SeqCst) {
//!         0 | 1 => Err("the service is busy".to_owned()),
//!         _ => Ok(customer.len() as u64 * 100),
//!     }
//! }
//!
//! #[idem::write]
//! fn send_fax(to: &str) -> Result<(), String> {
//!     Ok(())
//! }
//!
//! # fn main() {
//! let quick = idem::Backoff::default().min_delay(Duration::from_millis(1));
//! assert_eq!(idem::retry!(get_balance("cus_42"), backoff = quick), Ok(600));
//! assert_eq!(TRIES.load(Ordering::SeqCst), 3);
//!
//! // Stop early on errors another attempt cannot fix.
//! let _ = idem::retry!(get_balance("cus_42"), when = |e: &String| e.contains("busy"));
//!
//! assert_eq!(idem::tool_info!(send_fax).kind, idem::Kind::Write);
//! // idem::retry!(send_fax("+1 555")) does not compile: a write with no key is never retried.
//! # }
//! ```
//!
//! `retry!` takes free functions declared at module level (not inside another function's body),
//! associated functions of an inherent `impl` (`Ledger::settle(…)`), and methods of an `impl`
//! block under [`#[idem::tools]`](tools), named by their type's path
//! (`idem::retry!(Bank::get_balance(&bank, "acct-1"))`, `Self::get_balance(…)`,
//! `<Adder as Tool>::call(…)`). A method taking `self` outside such a block has no compile-time
//! classification to check. Where a tool is imported alone (`mod charge; pub use
//! charge::charge;`), import its hidden companion with it (`pub use charge::{charge,
//! __idem_tool_charge};`); the compile error names it.
//!
//! ## Errors
//!
//! Every failure travels in the tool's own error type as an [`Error`], whose message names the
//! key and the tool and says what to do. The one to plan for is [`Error::InDoubt`]: an earlier
//! attempt was interrupted after its body started, and idem will not guess whether the effect
//! landed. Someone checks the target system and settles the key, with `idem resolve` or
//! [`admin::resolve`]:
//!
//! ```
//! use idem::admin::Resolution;
//!
//! #[derive(Debug)]
//! enum MailError {
//!     Idem(idem::Error),
//! }
//!
//! impl From<idem::Error> for MailError {
//!     fn from(error: idem::Error) -> Self {
//!         MailError::Idem(error)
//!     }
//! }
//!
//! #[idem::idempotent(scope = "ticket")]
//! fn send_reply(ticket: u32, text: &str) -> Result<String, MailError> {
//!     panic!("the mail server hung up after accepting the message");
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = std::sync::Arc::new(idem::SledStore::open(dir.path())?);
//! idem::set_default_store(store.clone());
//!
//! // The body panicked: the reply may have gone out.
//! assert!(std::panic::catch_unwind(|| send_reply(7, "Fixed.")).is_err());
//!
//! let key = match send_reply(7, "Fixed.") {
//!     Err(MailError::Idem(error @ idem::Error::InDoubt { .. })) => {
//!         assert!(error.to_string().contains("idem resolve"));
//!         idem::Key::parse(error.key().unwrap())?
//!     }
//!     other => panic!("expected the key in doubt, got {other:?}"),
//! };
//!
//! // The mail log shows the reply was sent: record that, and later calls replay it.
//! idem::admin::resolve(
//!     store.as_ref(),
//!     &key,
//!     Resolution::Done(serde_json::json!("sent")),
//!     "ann@ops-1",
//!     Some("the vendor shows the message as sent"),
//! )?;
//! assert_eq!(send_reply(7, "Fixed.").unwrap(), "sent");
//! # Ok(()) }
//! ```
//!
//! ## Reconcilers
//!
//! Where the vendor can be asked by the key the body sent it, name a reconciler and no operator
//! is needed: a call that finds its key in doubt holds it (as a takeover does: no other caller
//! asks or runs the body meanwhile) and asks. [`Reconciled::Landed`] records the result and
//! returns it, [`Reconciled::NotLanded`] releases the key and runs the body with it, and
//! [`Reconciled::CannotTell`], an `Err` or a panic leave the key in doubt, with
//! [`Error::InDoubt`]'s `reason` saying why (under `in_doubt = "rerun"`, the body then runs
//! again). A reconciler has the tool's shape (sync or `async`) and takes only the key, since a
//! [`Sweep`] at start-up has nothing else (records never keep the arguments); on a tool taking
//! `&self`, a name without `::` is a method of the same type and gets `&self` first.
//!
//! ```
//! use idem::{Key, Reconciled};
//!
//! # static VENDOR: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
//! # fn vendor_charge(key: &Key) -> String {
//! #     let mut charges = VENDOR.lock().unwrap();
//! #     let id = format!("ch_{}", charges.len() + 1);
//! #     charges.push((key.to_string(), id.clone()));
//! #     id
//! # }
//! # fn vendor_find(key: &Key) -> Option<String> {
//! #     VENDOR.lock().unwrap().iter().find(|(k, _)| k == key.as_str()).map(|(_, id)| id.clone())
//! # }
//! #[idem::idempotent(scope = "order_id", reconcile = "find_charge")]
//! fn charge_card(amount: u64, order_id: &str) -> Result<String, String> {
//!     let id = vendor_charge(&idem::current_key());
//!     // The vendor charged, and its answer was lost.
//!     idem::may_have_landed();
//!     Err(format!("no answer for {id}"))
//! }
//!
//! fn find_charge(key: &Key) -> Result<Reconciled<String>, String> {
//!     Ok(vendor_find(key).map_or(Reconciled::NotLanded, Reconciled::Landed))
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # idem::set_default_store(std::sync::Arc::new(idem::SledStore::open(dir.path())?));
//! assert!(charge_card(4200, "o-17").is_err(), "the answer was lost: in doubt");
//! assert_eq!(charge_card(4200, "o-17")?, "ch_1", "reconciled from the vendor, not charged again");
//!
//! // At start-up, the same reconciler settles every key of the tool left in doubt.
//! let report = idem::Sweep::new().tool("charge_card", find_charge).run()?;
//! assert_eq!(report.still_in_doubt().count(), 0);
//! # Ok(()) }
//! ```
//!
//! The other variants: [`Error::InFlight`] (another call held the key past the wait),
//! [`Error::Replay`] (a stored result no longer fits the return type), [`Error::Key`] (the
//! arguments have no canonical JSON, such as a NaN), [`Error::Result`] (the `Ok` value cannot be
//! stored) and [`Error::Store`] (the backend failed). The enum is `#[non_exhaustive]`.
//!
//! ## Stores and durability
//!
//! A [`Store`] keeps one record per key. The embedded default is [`SledStore`], on sled 0.34 (its
//! stable line, pinned to 0.34.7): one process at a time, opened explicitly or lazily at
//! `$IDEM_STORE`, else `./idem.sled`. Its [`Durability`] says how far a write goes before the
//! call goes on: `Fsync` (the default; survives a power loss), `Flush` (survives a process
//! crash) or `None` (tests).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::{Arc, OnceLock};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let store = idem::SledStore::builder(dir.path().join("idem.sled"))
//!     .durability(idem::Durability::Flush)
//!     .default_wait(Duration::from_secs(10))
//!     .open()?;
//! idem::set_default_store(Arc::new(store));
//!
//! // A tool may name its own store instead: `store = path` takes a function or a static.
//! static AUDIT: OnceLock<Arc<dyn idem::Store>> = OnceLock::new();
//! fn audit_store() -> Arc<dyn idem::Store> {
//!     Arc::clone(AUDIT.get().expect("opened at start-up"))
//! }
//!
//! #[idem::idempotent(scope = "entry", store = audit_store, ttl = "24h")]
//! fn record_audit(entry: &str) -> Result<u32, idem::Error> {
//!     Ok(entry.len() as u32)
//! }
//!
//! let audit = idem::SledStore::open(dir.path().join("audit.sled"))?;
//! AUDIT.set(Arc::new(audit)).ok();
//! assert_eq!(record_audit("refund o-17")?, 11);
//! # Ok(()) }
//! ```
//!
//! Several processes or machines share one store with `idem-postgres`'s `PgStore` (atomic
//! inserts, leases with heartbeats so that a dead owner is noticed, `LISTEN/NOTIFY` for waiters).
//!
//! ## The `idem` command
//!
//! The `idem-cli` crate installs `idem`, the operator's view of a store (sled or `postgres://`):
//! `idem key` computes a key, `idem ls --status in-doubt` and `idem show KEY` inspect records,
//! `idem resolve KEY --release | --done JSON` settles one in doubt, `idem purge` removes finished
//! ones and `idem stats` counts them. [`admin`] holds the same operations as functions. Every
//! change of a record is kept in its key's [`history`], which `idem show` prints.

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
/// | `scope = "param"` or `"param.field"` | the unit of work the effect belongs to (see the crate docs) | required |
/// | `tool = "name"` | the tool name in the key: pin it to keep keys across a rename or a move, or to tell two functions of one name apart (unpinned, `a::send` and `b::send` share the keys of `send`, and the second is refused with [`Error::SharedToolName`]) | the function's name |
/// | `store = path` | a function or static giving the store | the process default store |
/// | `wait = "30s"` | how long a concurrent caller waits for the running one | 30 s |
/// | `ttl = "24h"` | how long a finished result is replayed | until purged |
/// | `in_doubt = "fail"` or `"rerun"` | what a call does when it finds its key in doubt | `"fail"` |
/// | `reconcile = "path"` | a function asked, with the key, whether an effect left in doubt landed (see the crate docs, *Reconcilers*) | none |
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
/// `idem_tools()`, the block's classified tools in order, whose MCP hints `idem::mcp::annotate`
/// (feature `rmcp`) copies into an rmcp router. It stacks with `#[tool_router]` in either order.
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
/// idem's runtime, and [`mcp::annotate`] fills a router's MCP hints from the classification.
#[cfg(feature = "rmcp")]
pub use idem_runtime::mcp;

/// The `idem::admin` operations on a sled store that a running process holds, through its
/// admin socket (Unix only).
#[cfg(unix)]
pub use idem_runtime::remote;
pub use idem_runtime::{
    admin, assess, canonical_json, current_key, default_store, default_store_path, history,
    may_have_landed, set_default_store, try_current_key, Annotations, Args, Assessment, Backoff,
    Call, Durability, Error, Fence, InDoubtPolicy, Key, Kind, Owner, Reconciled, Record, Reserved,
    SledStore, SledStoreBuilder, Status, Store, StoreError, StoreFuture, Sweep, SweepOutcome,
    SweepReport, Swept, ToolInfo,
};

/// The only contract between the macros and the runtime: the code `idem-macros` generates names
/// these items, and only these, by absolute path. Not a public API.
#[doc(hidden)]
pub mod __private {
    // Building and running a call (`#[idempotent]`).
    pub use idem_runtime::bounds::{
        args, codec_of, flatten_arg, key_arg, run_async, run_sync, scope, StoreFromFn,
        StoreFromStatic,
    };
    pub use idem_runtime::{Call, InDoubtPolicy};
    // A tool with a reconciler (`reconcile = "…"`).
    pub use idem_runtime::bounds::{
        ask_async, ask_sync, run_async_reconciled, run_sync_reconciled,
    };
    pub use idem_runtime::{Key, Sweep};
    // The classification: the type of the companion constant every attribute declares beside
    // its function, read by `tool_info!` and `retry!`.
    pub use idem_runtime::{Kind, ToolInfo};
    // `retry!`.
    pub use idem_runtime::bounds::{
        attempt_async, attempt_sync, pause, pause_blocking, retry_any, Retrying,
    };
    pub use idem_runtime::Backoff;
    // Named by the compiler's messages when a bound above fails, so that they read
    // `idem::__private::ToolError` rather than a path into the runtime.
    pub use idem_runtime::bounds::{
        AsyncReconciler, FlattenParam, IntoStore, KeyParam, ReconcilerAnswer, ScopeValue,
        SyncReconciler, ToolError, ToolOutput,
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
