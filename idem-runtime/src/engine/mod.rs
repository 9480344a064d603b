//! The engine that every idempotent call goes through: derive, reserve, replay or wait, run once,
//! record. Generated code calls it through the facade's hidden module; it is usable directly as
//! [`Call`].
//!
//! [`Call`], its builder and its one run path (`Call::execute`) live here; the call as the
//! decisions read it in `parts`, how a result is stored and read back in `codec`, the state
//! machine in `machine`, what a call holds while it owns its key in `reservation`, what a body
//! can reach (`current_key()`, `fencing_token()`, `may_have_landed()`) in `context`, the
//! argument tree in `args`, reconcilers (what they answer, how they are asked) in
//! `reconciler`, and the sweep in `sweep`.

use std::fmt::Display;
use std::future::{ready, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use self::codec::reports_failure;
use self::context::Current;
use self::machine::{encode_for_replay, Acquired};
use self::parts::CallParts;
use crate::canonical::canonical_json_for;
use crate::error::Error;
use crate::exec::block_on;
use crate::failpoint::failpoint;
use crate::key::Key;
use crate::meter::{self, Outcome};
use crate::retry::raise;
use crate::store::Store;

mod approval;
mod args;
mod codec;
mod context;
mod decide;
mod heartbeat;
mod machine;
pub(crate) mod open;
mod parts;
mod reconciler;
mod reservation;
pub(crate) mod retention;
mod settle;
mod sweep;
mod transact;
#[cfg(feature = "sqlite")]
pub(crate) mod transact_sqlite;
mod waiting;

pub use self::args::Args;
pub use self::codec::Codec;
// The MCP helpers mark a result to be recorded with it.
#[cfg(feature = "rmcp")]
pub(crate) use self::codec::FINAL_ERROR;
pub use self::context::{
    current_key, fencing_token, may_have_landed, try_current_key, try_fencing_token,
};
pub use self::decide::Next;
pub(crate) use self::reconciler::erred;
pub use self::reconciler::Reconciled;
pub use self::sweep::{Sweep, SweepOutcome, SweepReport, Swept};
pub use self::transact::{Attempt, Retries, Site};
pub use self::waiting::waiting;

/// How long a call waits for another owner of its key when it sets no [`Call::wait`]: the
/// engine's, whatever the store (a store holds records, not a caller's patience).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// What a call does when it finds its key in doubt (or left in flight by a dead owner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum InDoubtPolicy {
    /// Return [`Error::InDoubt`] and run nothing: an operator decides (the default).
    #[default]
    Fail,
    /// Take the record over and run the body again with the same key. Safe only where the
    /// target system deduplicates that key (push it with [`current_key`]).
    Rerun,
}

/// One idempotent call: its key and the policy it runs under.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// use std::sync::Arc;
/// use idem_runtime::{Call, MemoryStore, Store};
///
/// // A durable store in a real program (`SledStore`, `SqliteStore`, idem-postgres's `PgStore`).
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let mut runs = 0;
/// for _ in 0..3 {
///     let charge: Result<String, idem_runtime::Error> =
///         Call::new("charge_card", "order-17", &serde_json::json!({"amount": 4200}))?
///             .store(store.clone())
///             .run(|| { runs += 1; Ok("ch_1".to_string()) });
///     assert_eq!(charge?, "ch_1");
/// }
/// assert_eq!(runs, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Call {
    tool: String,
    /// The function making the call, by path, when it is known (the attributes pass it).
    function: Option<String>,
    scope: String,
    key: Key,
    store: Option<Arc<dyn Store>>,
    wait: Option<Duration>,
    ttl: Option<Duration>,
    in_doubt: InDoubtPolicy,
    approval: Option<Approval>,
}

/// What a call of a tool that needs a person's approval asks for (see [`Call::approve`]).
#[derive(Clone, Copy, Debug, Default)]
struct Approval {
    /// How long an approval may wait for a call to use it before a call asks again.
    ttl: Option<Duration>,
    /// How long a call waits for the decision before it returns [`Error::AwaitingApproval`].
    wait: Option<Duration>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("tool", &self.tool)
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("wait", &self.wait)
            .field("ttl", &self.ttl)
            .field("in_doubt", &self.in_doubt)
            .field("approval", &self.approval)
            .finish_non_exhaustive()
    }
}

impl Call {
    /// A call of `tool` in `scope` with `args` (any `Serialize` value; a struct or map of the
    /// tool's parameters by name). Fails with [`Error::Key`] when the arguments cannot be put in
    /// canonical JSON (NaN, a failing `Serialize`).
    pub fn new(
        tool: &str,
        scope: impl Display,
        args: &(impl Serialize + ?Sized),
    ) -> Result<Call, Error> {
        let canonical = canonical_json_for(tool, args)?;
        Ok(Call::from_canonical(tool, scope, canonical))
    }

    /// A call whose arguments are already canonical JSON (see [`Args`]).
    pub fn from_canonical(tool: &str, scope: impl Display, canonical: impl AsRef<str>) -> Call {
        let scope = scope.to_string();
        Call {
            key: Key::derive_canonical(tool, &scope, canonical.as_ref()),
            tool: tool.to_owned(),
            function: None,
            scope,
            store: None,
            wait: None,
            ttl: None,
            in_doubt: InDoubtPolicy::Fail,
            approval: None,
        }
    }

    /// The function making the call, by path (`billing::send`): recorded with the key, so that
    /// another function sharing the tool name (and so the keys) is refused rather than handed
    /// this one's result ([`Error::SharedToolName`]). The attributes pass it unless `tool = "…"`
    /// pins the name.
    pub fn function(mut self, path: impl Into<String>) -> Call {
        self.function = Some(path.into());
        self
    }

    /// The store to use instead of the process default.
    pub fn store(mut self, store: Arc<dyn Store>) -> Call {
        self.store = Some(store);
        self
    }

    /// How long to wait for a concurrent owner of the key; [`DEFAULT_WAIT`] otherwise.
    pub fn wait(mut self, wait: Duration) -> Call {
        self.wait = Some(wait);
        self
    }

    /// How long a finished record is replayed; kept until purged otherwise.
    pub fn ttl(mut self, ttl: Duration) -> Call {
        self.ttl = Some(ttl);
        self
    }

    /// What to do when the key is in doubt.
    pub fn in_doubt(mut self, policy: InDoubtPolicy) -> Call {
        self.in_doubt = policy;
        self
    }

    /// Whether the body needs a person's approval before it runs (for exactly these arguments:
    /// the key stands for them). When `required`, a call that finds its key absent (or its
    /// result expired) records it as awaiting approval and returns [`Error::AwaitingApproval`]
    /// without running the body, as does every call until a person decides (`idem approve` or
    /// `idem deny`, or [`crate::admin::decide`]). After an approval the next call runs the body
    /// once; after a denial every call returns [`Error::Denied`]. A key found awaiting a
    /// decision, approved or denied is treated so whether or not this call requires approval.
    ///
    /// ```
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// # let store: std::sync::Arc<dyn idem_runtime::Store> =
    /// #     std::sync::Arc::new(idem_runtime::MemoryStore::new());
    /// use idem_runtime::admin::{self, Decision};
    /// use idem_runtime::{Call, Error};
    ///
    /// let refund = || Call::new("refund", "order-17", &5000).map(|c| c.store(store.clone()).approve(true));
    /// let asked: Result<String, Error> = refund()?.run(|| Ok("re_1".to_string()));
    /// let Err(Error::AwaitingApproval { key, .. }) = asked else { panic!("{asked:?}") };
    /// // A person approves it (`idem approve KEY`).
    /// admin::decide(store.as_ref(), &key.parse()?, Decision::Approve, "ann@host", None)?;
    /// let refunded: String = refund()?.run(|| Ok::<_, Error>("re_1".to_string()))?;
    /// assert_eq!(refunded, "re_1");
    /// # Ok(()) }
    /// ```
    pub fn approve(mut self, required: bool) -> Call {
        self.approval = match (required, self.approval) {
            (true, approval) => Some(approval.unwrap_or_default()),
            (false, _) => None,
        };
        self
    }

    /// How long an approval stays good for a call to use it: a call that finds an approval
    /// older than this asks again (the key awaits approval anew). Without it an approval never
    /// expires. Implies [`Call::approve`].
    pub fn approval_ttl(mut self, ttl: Duration) -> Call {
        self.approval = Some(Approval { ttl: Some(ttl), ..self.approval.unwrap_or_default() });
        self
    }

    /// How long a call waits for a person's decision (woken by it, as a waiter for an owner
    /// is) before it returns [`Error::AwaitingApproval`]: with it, one call of the agent goes
    /// on once the key is approved. Without it a call does not wait. Implies [`Call::approve`].
    pub fn approve_wait(mut self, wait: Duration) -> Call {
        self.approval = Some(Approval { wait: Some(wait), ..self.approval.unwrap_or_default() });
        self
    }

    /// The call's idempotency key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The call's name, key and policy, as the engine's decisions read them.
    pub(crate) fn parts(&self) -> CallParts<'_> {
        CallParts {
            tool: &self.tool,
            function: self.function.as_deref(),
            scope: &self.scope,
            key: &self.key,
            wait: self.wait,
            in_doubt: self.in_doubt,
            approval: self.approval,
        }
    }

    fn resolve_store(&self) -> Result<Arc<dyn Store>, Error> {
        match &self.store {
            Some(store) => Ok(Arc::clone(store)),
            None => self::open::default::default_store().map_err(|e| match e {
                Error::Store { source, .. } => self.store_error(source),
                other => other,
            }),
        }
    }

    fn store_error(&self, source: crate::error::StoreError) -> Error {
        Error::store(Some(self.key.as_str()), Some(&self.tool), source)
    }

    /// Counts a call that ends before its body runs (a replay, or an error), and the time it
    /// waited for another owner; the other outcomes are counted where the record is settled.
    fn count_acquired<T>(
        &self,
        acquired: Result<Acquired<T>, Error>,
        started: Instant,
        waited_since: Option<Instant>,
    ) -> Result<Acquired<T>, Error> {
        if let Some(since) = waited_since {
            meter::wait(&self.tool, since.elapsed());
        }
        match &acquired {
            Ok(Acquired::Owned(_)) => {}
            Ok(Acquired::Replay(_)) if waited_since.is_some() => {
                meter::call(&self.tool, Outcome::Waited, started.elapsed())
            }
            Ok(Acquired::Replay(_)) => meter::call(&self.tool, Outcome::Replay, started.elapsed()),
            Ok(Acquired::Reconciled(_)) => {
                meter::call(&self.tool, Outcome::Reconciled, started.elapsed())
            }
            Err(e) => meter::call(&self.tool, Outcome::of_error(e), started.elapsed()),
        }
        acquired
    }

    /// Runs a sync body at most once for this key; needs no async runtime.
    pub fn run<T, E>(self, body: impl FnOnce() -> Result<T, E>) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        block_on(self.execute(Codec::serde(), None::<fn(Key) -> Ready<T>>, sync_body(body)))
    }

    /// [`Call::run`] for a tool with a reconciler: a call that finds its key in doubt (or in
    /// flight under a dead owner) first asks `reconcile` whether the effect landed, holding the
    /// key meanwhile as a takeover does, so that no other caller asks or runs the body at once.
    /// [`Reconciled::Landed`] is recorded and returned, [`Reconciled::NotLanded`] releases the
    /// key and runs the body with it, and [`Reconciled::CannotTell`], an `Err` or a panic
    /// leave the key in doubt: then [`Error::InDoubt`] says why, unless the policy is
    /// [`InDoubtPolicy::Rerun`], which runs the body again. A call asks at most once.
    ///
    /// ```
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// # let store: std::sync::Arc<dyn idem_runtime::Store> =
    /// #     std::sync::Arc::new(idem_runtime::MemoryStore::new());
    /// use idem_runtime::{Call, Error, Reconciled};
    ///
    /// let call = || Call::new("charge_card", "order-17", &4200).map(|c| c.store(store.clone()));
    /// // An attempt whose answer was lost: the key is left in doubt.
    /// let lost: Result<String, Error> = call()?.run(|| {
    ///     idem_runtime::may_have_landed();
    ///     Err(Error::Key { tool: "charge_card".into(), reason: "timed out".into() })
    /// });
    /// assert!(lost.is_err());
    /// // The next call asks the vendor, which has the charge under the key.
    /// let charge: String = call()?.run_reconciled(
    ///     |_key| Ok::<_, String>(Reconciled::Landed("ch_1".to_string())),
    ///     || Ok::<_, Error>("ch_2".to_string()),
    /// )?;
    /// assert_eq!(charge, "ch_1", "recorded from the vendor's answer; the body did not run");
    /// # Ok(()) }
    /// ```
    pub fn run_reconciled<T, E, R>(
        self,
        reconcile: impl FnOnce(&Key) -> Result<Reconciled<T>, R>,
        body: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        R: Display,
    {
        let reconcile = move |key: Key| ready(reconcile(&key).map_err(reconciler::erred));
        block_on(self.execute(Codec::serde(), Some(reconcile), sync_body(body)))
    }

    /// Runs an async body at most once for this key. The future is `Send` when the body's is;
    /// it never blocks the executor on a sync.
    pub async fn run_async<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(Codec::serde(), None::<fn(Key) -> Ready<T>>, body).await
    }

    /// [`Call::run_async`] for a tool with a reconciler, as [`Call::run_reconciled`] describes.
    /// The reconciler takes the key by value, so that its future may keep it:
    /// `|key| async move { find_charge(&key).await }`.
    pub async fn run_async_reconciled<T, E, R, Rf, RFut, F, Fut>(
        self,
        reconcile: Rf,
        body: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        R: Display,
        Rf: FnOnce(Key) -> RFut,
        RFut: Future<Output = Result<Reconciled<T>, R>>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let reconcile = move |key: Key| {
            let answer = reconcile(key);
            async move { answer.await.map_err(reconciler::erred) }
        };
        self.execute(Codec::serde(), Some(reconcile), body).await
    }

    /// The one run path of every call, sync and async, generated or written by hand: acquire
    /// the key (replay, wait, reconcile, or own it), run the body once with the call as the
    /// current one, and settle the record by how the body ended. A sync call drives it with
    /// [`block_on`]. `codec` carries the result's encoding and the error's conversion, so that
    /// this future has no bounds on `T` and `E` (generated code checks them once, in its own
    /// words, before it awaits).
    pub(crate) async fn execute<T, E, Rf, RFut, F, Fut>(
        self,
        codec: Codec<T, E>,
        mut reconcile: Option<Rf>,
        body: F,
    ) -> Result<T, E>
    where
        Rf: FnOnce(Key) -> RFut,
        RFut: Future<Output = Result<Reconciled<T>, String>>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let fail = |e| (codec.error)(raise(e));
        let started = Instant::now();
        let mut waited_since = None;
        let acquired = match self.resolve_store() {
            Ok(store) => self.acquire(codec, &store, &mut waited_since, &mut reconcile).await,
            Err(e) => Err(e),
        };
        let mut owned = match self.count_acquired(acquired, started, waited_since).map_err(fail)? {
            Acquired::Replay(value) | Acquired::Reconciled(value) => return Ok(value),
            Acquired::Owned(owned) => owned,
        };
        failpoint("after_reserve");
        owned.start();
        let call = Current::new(&self.key, owned.token());
        match call.enter_async(body()).await {
            Ok(value) => {
                failpoint("after_body");
                let json = encode_for_replay(codec, &value);
                if json.as_deref().is_ok_and(reports_failure) {
                    // A result that says it failed (an MCP tool result with `isError: true`)
                    // is the body's error, told to the model: not recorded, so that a later
                    // call runs the body again.
                    tracing::debug!(key = %self.key, tool = %self.tool, "idem: the result says it failed; not recorded");
                    self.after_error(owned, call.may_have_landed()).await;
                    return Ok(value);
                }
                let recorded = self.complete(codec, owned, json).await.map_err(fail)?;
                meter::call(&self.tool, Outcome::Fresh, started.elapsed());
                failpoint("after_complete");
                // The key moved on while the body ran: every caller gets what is recorded.
                Ok(recorded.unwrap_or(value))
            }
            Err(e) => {
                self.after_error(owned, call.may_have_landed()).await;
                Err(e)
            }
        }
    }
}

/// Runs `body` as the call of `key`, whose owner has fencing token `token`: inside it,
/// `current_key()` and `fencing_token()` answer for that call (a store's own run path,
/// idem-postgres's transactional calls, runs its bodies so).
pub(crate) async fn as_current<F: Future>(key: &Key, token: u64, body: F) -> F::Output {
    Current::new(key, token).enter_async(body).await
}

/// A sync body as the run path's async body: it runs at the first poll, inside the call (the
/// call is entered for the length of each poll), not when the closure is called.
pub(crate) fn sync_body<B>(body: B) -> impl FnOnce() -> SyncBody<B> {
    move || SyncBody(Some(body))
}

/// The future of a sync body: ready at its first poll.
pub(crate) struct SyncBody<B>(Option<B>);

// The body is moved out whole, never pinned in place.
impl<B> Unpin for SyncBody<B> {}

impl<B: FnOnce() -> R, R> Future for SyncBody<B> {
    type Output = R;

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<R> {
        let body = self.get_mut().0.take().expect("a sync body is polled once");
        Poll::Ready(body())
    }
}

/// The reconciler's future of a call that has none.
pub(crate) type Ready<T> = std::future::Ready<Result<Reconciled<T>, String>>;
