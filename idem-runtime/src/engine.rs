//! The engine that every idempotent call goes through: derive, reserve, replay or wait, run once,
//! record. Generated code calls it through the facade's hidden module; it is usable directly as
//! [`Call`].

use std::cell::RefCell;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::canonical::{canonical_json_for, fingerprint};
use crate::error::Error;
use crate::exec::block_on;
use crate::failpoint::failpoint;
use crate::key::Key;
use crate::meter::{self, Outcome};
use crate::record::{now_ms, Record, Status};
use crate::store::Store;

/// What a call does when it finds its key in doubt (or left in flight by a dead owner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InDoubtPolicy {
    /// Return [`Error::InDoubt`] and run nothing: an operator decides (the default).
    #[default]
    Fail,
    /// Take the record over and run the body again with the same key. Safe only where the
    /// target system deduplicates that key (push it with [`current_key`]).
    Rerun,
}

/// What the body of the running call can reach: its key, and whether it said that its effect
/// may have landed.
#[derive(Clone)]
struct Current {
    key: Key,
    may_have_landed: Arc<AtomicBool>,
}

impl Current {
    fn new(key: &Key) -> Current {
        Current { key: key.clone(), may_have_landed: Arc::default() }
    }
}

tokio::task_local! {
    static ASYNC_CALL: Current;
}

thread_local! {
    static SYNC_CALLS: RefCell<Vec<Current>> = const { RefCell::new(Vec::new()) };
}

tokio::task_local! {
    static ASYNC_VERDICT: Arc<AtomicBool>;
}

thread_local! {
    static SYNC_VERDICT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Returns `error` after noting, for an enclosing `idem::retry!`, whether calling again could
/// help: an in-doubt key, arguments with no key or a stored result that no longer fits stay as
/// they are however often the call repeats, so `retry!` returns them at once.
pub(crate) fn noted(error: Error) -> Error {
    if !error.is_retryable() {
        let set = |verdict: &Arc<AtomicBool>| verdict.store(true, Ordering::SeqCst);
        if ASYNC_VERDICT.try_with(set).is_err() {
            SYNC_VERDICT.with(|verdict| verdict.borrow().as_ref().map(set));
        }
    }
    error
}

/// Runs one sync attempt of `retry!`; returns its outcome and whether its error was final.
pub(crate) fn attempt_sync<R>(attempt: impl FnOnce() -> R) -> (R, bool) {
    let verdict = Arc::new(AtomicBool::new(false));
    let outer = SYNC_VERDICT.with(|slot| slot.replace(Some(Arc::clone(&verdict))));
    let outcome = attempt();
    SYNC_VERDICT.with(|slot| *slot.borrow_mut() = outer);
    (outcome, verdict.load(Ordering::SeqCst))
}

/// Runs one async attempt of `retry!`; returns its outcome and whether its error was final.
pub(crate) async fn attempt_async<F: Future>(attempt: F) -> (F::Output, bool) {
    let verdict = Arc::new(AtomicBool::new(false));
    let outcome = ASYNC_VERDICT.scope(Arc::clone(&verdict), attempt).await;
    (outcome, verdict.load(Ordering::SeqCst))
}

/// The innermost idempotent call whose body is running on this task or thread.
fn current() -> Option<Current> {
    ASYNC_CALL
        .try_with(Current::clone)
        .ok()
        .or_else(|| SYNC_CALLS.with(|calls| calls.borrow().last().cloned()))
}

/// The key of the idempotent call whose body is running, if any.
pub fn try_current_key() -> Option<Key> {
    current().map(|call| call.key)
}

/// Says, from inside the body, that the effect may have landed although the body is about to
/// return `Err`: the key is then left in doubt instead of released, so that no retry runs the
/// effect a second time.
///
/// Call it where the outcome is unknown: a request was sent and its answer timed out or the
/// connection dropped. Without it an `Err` means "nothing landed" and the next call runs the
/// body again. Returns `false` (and does nothing) outside the body of an idempotent call.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let store: std::sync::Arc<dyn idem_runtime::Store> =
/// #     std::sync::Arc::new(idem_runtime::SledStore::open(dir.path())?);
/// use idem_runtime::{Call, Error};
///
/// let outcome: Result<String, Error> = Call::new("charge_card", "order-17", &4200)?
///     .store(store.clone())
///     .run(|| {
///         // … the request went out, and its answer timed out:
///         idem_runtime::may_have_landed();
///         Err(Error::Key { tool: "charge_card".into(), reason: "timed out".into() })
///     });
/// assert!(outcome.is_err());
/// let again: Result<String, Error> = Call::new("charge_card", "order-17", &4200)?
///     .store(store)
///     .run(|| Ok("ch_2".to_string()));
/// assert!(matches!(again, Err(Error::InDoubt { .. })), "not run a second time");
/// # Ok(()) }
/// ```
pub fn may_have_landed() -> bool {
    match current() {
        Some(call) => {
            call.may_have_landed.store(true, Ordering::SeqCst);
            true
        }
        None => {
            tracing::warn!("idem::may_have_landed() called outside an idempotent call: ignored");
            false
        }
    }
}

/// The key of the idempotent call whose body is running: send it to the vendor as its
/// idempotency key, so that a rerun after a crash is deduplicated there too.
///
/// # Panics
///
/// Outside the body of an idempotent call (there is no key there); use [`try_current_key`] to
/// ask without panicking. A task spawned from the body does not inherit the key: read it first
/// and move it in.
pub fn current_key() -> Key {
    try_current_key().expect(
        "idem::current_key() called outside an idempotent call: call it inside the body of an \
         #[idempotent] function or Call::run, or use idem::try_current_key()",
    )
}

struct SyncCallScope;

impl SyncCallScope {
    fn enter(call: &Current) -> SyncCallScope {
        SYNC_CALLS.with(|calls| calls.borrow_mut().push(call.clone()));
        SyncCallScope
    }
}

impl Drop for SyncCallScope {
    fn drop(&mut self) {
        SYNC_CALLS.with(|calls| calls.borrow_mut().pop());
    }
}

/// Builds the canonical arguments of a call one parameter at a time, so that generated code
/// needs no struct of its own (and works for generic parameters).
#[derive(Debug)]
pub struct Args {
    tool: String,
    fields: Vec<(&'static str, String)>,
}

impl Args {
    /// Arguments of `tool`, none yet.
    pub fn new(tool: &str) -> Args {
        Args { tool: tool.to_owned(), fields: Vec::new() }
    }

    /// Adds parameter `name` (an identifier: it needs no escaping).
    pub fn arg<V: Serialize + ?Sized>(
        mut self,
        name: &'static str,
        value: &V,
    ) -> Result<Args, Error> {
        let text = canonical_json_for(&self.tool, value).map_err(|e| match e {
            Error::Key { tool, reason } => {
                Error::Key { tool, reason: format!("parameter `{name}`: {reason}") }
            }
            other => other,
        })?;
        self.fields.push((name, text));
        Ok(self)
    }

    /// The canonical JSON object of all parameters, keys sorted.
    pub fn canonical(mut self) -> String {
        self.fields.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::from("{");
        for (i, (name, text)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(name);
            out.push_str("\":");
            out.push_str(text);
        }
        out.push('}');
        out
    }
}

/// One idempotent call: its key and the policy it runs under.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// use std::sync::Arc;
/// use idem_runtime::{Call, SledStore, Store};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
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
    scope: String,
    key: Key,
    /// The canonical arguments, fingerprinted only when a record is written: a replay needs no
    /// fingerprint.
    canonical: String,
    store: Option<Arc<dyn Store>>,
    wait: Option<Duration>,
    ttl: Option<Duration>,
    in_doubt: InDoubtPolicy,
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
            .finish_non_exhaustive()
    }
}

static CALL_SEQ: AtomicU64 = AtomicU64::new(0);

enum Acquired<T> {
    Replay(T),
    Owned(Box<Owned>),
}

/// The reservation a call holds while its body runs. Dropped unsettled, it marks the record in
/// doubt once the body has started (a panic or a dropped future), or releases it before.
struct Owned {
    store: Arc<dyn Store>,
    record: Record,
    started: bool,
    settled: bool,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.started {
            meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
            tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body panicked or its future was dropped");
            self.store.replace_detached(&self.record, Some(self.record.in_doubt(now_ms())));
        } else {
            self.store.replace_detached(&self.record, None);
        }
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
    pub fn from_canonical(tool: &str, scope: impl Display, canonical: impl Into<String>) -> Call {
        let scope = scope.to_string();
        let canonical = canonical.into();
        Call {
            key: Key::derive_canonical(tool, &scope, &canonical),
            canonical,
            tool: tool.to_owned(),
            scope,
            store: None,
            wait: None,
            ttl: None,
            in_doubt: InDoubtPolicy::Fail,
        }
    }

    /// The store to use instead of the process default.
    pub fn store(mut self, store: Arc<dyn Store>) -> Call {
        self.store = Some(store);
        self
    }

    /// How long to wait for a concurrent owner of the key (the store's default otherwise).
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

    /// The call's idempotency key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    fn resolve_store(&self) -> Result<Arc<dyn Store>, Error> {
        match &self.store {
            Some(store) => Ok(Arc::clone(store)),
            None => crate::default::default_store().map_err(|e| match e {
                Error::Store { source, .. } => {
                    Error::store(Some(self.key.as_str()), &self.tool, source)
                }
                other => other,
            }),
        }
    }

    fn store_error(&self, source: crate::StoreError) -> Error {
        Error::store(Some(self.key.as_str()), &self.tool, source)
    }

    /// An owner no other call of this process has: the store instance, then this call's number.
    fn fresh_owner(store: &dyn Store) -> String {
        format!("{}#{}", store.owner_id(), CALL_SEQ.fetch_add(1, Ordering::Relaxed))
    }

    fn fresh_record(&self, store: &dyn Store) -> Record {
        Record::reserve(
            self.key.as_str(),
            &self.tool,
            &self.scope,
            &Call::fresh_owner(store),
            &fingerprint(&self.canonical),
            now_ms(),
        )
    }

    fn replay<T: DeserializeOwned>(&self, record: &Record) -> Result<T, Error> {
        // A unit result of the first (JSON) sled format reads back as no result: `null`.
        let json = record.result.as_deref().unwrap_or("null");
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: replay");
        serde_json::from_str(json).map_err(|source| Error::Replay {
            key: self.key.to_string(),
            tool: self.tool.clone(),
            source,
        })
    }

    /// Reserves the key, or finds its result, or waits for its owner; `waited_since` is set
    /// when a wait for another owner begins.
    async fn acquire<T: DeserializeOwned>(
        &self,
        store: &Arc<dyn Store>,
        waited_since: &mut Option<Instant>,
    ) -> Result<Acquired<T>, Error> {
        // Taken when the first wait begins: a replay never needs the clock for it.
        let mut deadline = None;
        let mut peek = true;
        'reserve: loop {
            let found = if std::mem::take(&mut peek) {
                store.peek(self.key.as_str()).await.map_err(|e| self.store_error(e))?
            } else {
                None
            };
            let mut existing = match found {
                Some(existing) => existing,
                None => {
                    let mine = self.fresh_record(store.as_ref());
                    let mut pending = Owned {
                        store: Arc::clone(store),
                        record: mine,
                        started: false,
                        settled: false,
                    };
                    match store.reserve(&pending.record).await {
                        Ok(None) => {
                            tracing::debug!(key = %self.key, tool = %self.tool, "idem: reserved");
                            return Ok(Acquired::Owned(Box::new(pending)));
                        }
                        Ok(Some(existing)) => {
                            pending.settled = true;
                            existing
                        }
                        Err(e) => {
                            // The insert may or may not have happened: undo it if it did.
                            return Err(self.store_error(e));
                        }
                    }
                }
            };
            loop {
                let takeover = match existing.status {
                    Status::Done if !existing.is_expired(now_ms()) => {
                        return self.replay(&existing).map(Acquired::Replay)
                    }
                    Status::Done => Some(self.fresh_record(store.as_ref())),
                    Status::InFlight if store.owner_alive(&existing) => {
                        tracing::debug!(key = %self.key, tool = %self.tool, "idem: waiting for the owner");
                        let deadline = *deadline.get_or_insert_with(|| {
                            let now = *waited_since.insert(Instant::now());
                            now + self.wait.unwrap_or_else(|| store.default_wait())
                        });
                        match store.changed(self.key.as_str(), &existing, deadline).await {
                            Err(e) => return Err(self.store_error(e)),
                            Ok(None) => continue 'reserve,
                            Ok(Some(now)) if crate::store::same_state(&now, &existing) => {
                                if Instant::now() >= deadline {
                                    return Err(Error::InFlight {
                                        key: self.key.to_string(),
                                        tool: self.tool.clone(),
                                        since_ms: existing.created_at,
                                    });
                                }
                                existing = now;
                            }
                            Ok(Some(now)) => existing = now,
                        }
                        None
                    }
                    Status::InFlight | Status::InDoubt => match self.in_doubt {
                        InDoubtPolicy::Fail => {
                            tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: not running");
                            return Err(Error::InDoubt {
                                key: self.key.to_string(),
                                tool: self.tool.clone(),
                                since_ms: existing.updated_at,
                            });
                        }
                        InDoubtPolicy::Rerun => {
                            let owner = Call::fresh_owner(store.as_ref());
                            Some(existing.taken_over(&owner, now_ms()))
                        }
                    },
                };
                if let Some(mine) = takeover {
                    match store.replace(&existing, Some(&mine)).await {
                        Ok(true) => {
                            meter::takeover(&self.tool);
                            tracing::info!(key = %self.key, tool = %self.tool, attempts = mine.attempts, "idem: took over");
                            return Ok(Acquired::Owned(Box::new(Owned {
                                store: Arc::clone(store),
                                record: mine,
                                started: false,
                                settled: false,
                            })));
                        }
                        Ok(false) => match store.get(self.key.as_str()).await {
                            Ok(Some(now)) => existing = now,
                            Ok(None) => continue 'reserve,
                            Err(e) => return Err(self.store_error(e)),
                        },
                        Err(e) => return Err(self.store_error(e)),
                    }
                }
            }
        }
    }

    /// Records `value` as the call's result. The effect has landed by now, so a failure leaves
    /// the record in doubt.
    async fn complete<T: Serialize>(&self, mut owned: Box<Owned>, value: &T) -> Result<(), Error> {
        let json = match serde_json::to_string(value) {
            Ok(json) => json,
            Err(e) => {
                // Drop marks it in doubt.
                drop(owned);
                return Err(Error::Result {
                    key: self.key.to_string(),
                    tool: self.tool.clone(),
                    reason: e.to_string(),
                });
            }
        };
        let done = owned.record.done_json(json, now_ms(), self.ttl);
        match owned.store.replace(&owned.record, Some(&done)).await {
            Ok(true) => {
                owned.settled = true;
                tracing::debug!(key = %self.key, tool = %self.tool, "idem: done");
                Ok(())
            }
            Ok(false) => {
                // Someone settled or took the record over while the body ran (an operator, or a
                // fleet peer after our lease lapsed): their write stands, ours is refused.
                owned.settled = true;
                tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the body ran; its result was not stored");
                Ok(())
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    /// Settles the record after the body returned `Err`: released, unless the body said its
    /// effect may have landed, in which case it is left in doubt.
    async fn after_error(&self, owned: Box<Owned>, call: &Current) {
        if call.may_have_landed.load(Ordering::SeqCst) {
            self.leave_in_doubt(owned).await
        } else {
            self.release(owned).await
        }
    }

    async fn leave_in_doubt(&self, mut owned: Box<Owned>) {
        let doubt = owned.record.in_doubt(now_ms());
        match owned.store.replace(&owned.record, Some(&doubt)).await {
            Ok(_) => {
                owned.settled = true;
                meter::call(&self.tool, Outcome::InDoubt, Duration::ZERO);
                tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: the body failed after its effect may have landed");
            }
            Err(e) => {
                // Unsettled, the guard tries once more as it drops.
                tracing::error!(key = %self.key, tool = %self.tool, error = %e, "idem: cannot mark the key in doubt")
            }
        }
    }

    async fn release(&self, mut owned: Box<Owned>) {
        owned.settled = true;
        meter::call(&self.tool, Outcome::Released, Duration::ZERO);
        match owned.store.replace(&owned.record, None).await {
            Ok(_) => {
                tracing::debug!(key = %self.key, tool = %self.tool, "idem: released after an error")
            }
            Err(e) => {
                tracing::error!(key = %self.key, tool = %self.tool, error = %e, "idem: cannot release the key after an error")
            }
        }
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
            Err(e) => meter::call(&self.tool, Outcome::of_error(e), started.elapsed()),
        }
        acquired.map_err(noted)
    }

    /// Runs a sync body at most once for this key; needs no async runtime.
    pub fn run<T, E>(self, body: impl FnOnce() -> Result<T, E>) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let started = Instant::now();
        let mut waited_since = None;
        let acquired = self
            .resolve_store()
            .and_then(|store| block_on(self.acquire::<T>(&store, &mut waited_since)));
        let mut owned = match self.count_acquired(acquired, started, waited_since)? {
            Acquired::Replay(value) => return Ok(value),
            Acquired::Owned(owned) => owned,
        };
        failpoint("after_reserve");
        owned.started = true;
        let call = Current::new(&self.key);
        let outcome = {
            let _scope = SyncCallScope::enter(&call);
            body()
        };
        match outcome {
            Ok(value) => {
                failpoint("after_body");
                block_on(self.complete(owned, &value)).map_err(noted)?;
                meter::call(&self.tool, Outcome::Fresh, started.elapsed());
                failpoint("after_complete");
                Ok(value)
            }
            Err(e) => {
                block_on(self.after_error(owned, &call));
                Err(e)
            }
        }
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
        let started = Instant::now();
        let mut waited_since = None;
        let acquired = match self.resolve_store() {
            Ok(store) => self.acquire::<T>(&store, &mut waited_since).await,
            Err(e) => Err(e),
        };
        let mut owned = match self.count_acquired(acquired, started, waited_since)? {
            Acquired::Replay(value) => return Ok(value),
            Acquired::Owned(owned) => owned,
        };
        failpoint("after_reserve");
        owned.started = true;
        let call = Current::new(&self.key);
        let outcome = ASYNC_CALL.scope(call.clone(), body()).await;
        match outcome {
            Ok(value) => {
                failpoint("after_body");
                self.complete(owned, &value).await.map_err(noted)?;
                meter::call(&self.tool, Outcome::Fresh, started.elapsed());
                failpoint("after_complete");
                Ok(value)
            }
            Err(e) => {
                self.after_error(owned, &call).await;
                Err(e)
            }
        }
    }
}
