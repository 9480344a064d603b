//! Retention: removing, in the background, finished records and released keys' histories that
//! outlived a store's bound, a small batch at a time. What may go is the lifecycle's rule
//! (`lifecycle/retention.rs`); each removal is the lifecycle's `purge` step, written through the
//! store's fenced delete, so a record that changed since the pass read it is kept.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, StoreError};
use crate::exec::{block_on, join_all};
use crate::lifecycle::retention::{
    history_outlived, outlived, PassReport, Removed, Retention, RetentionStatus, RETAIN_ENV,
};
use crate::lifecycle::{transition, Guard};
use crate::meter;
use crate::store::{Store, Stored};

impl Retention {
    /// The policy `$IDEM_RETAIN` gives: none when it is unset, empty or `off`; an error naming
    /// the variable when it is not a duration. What a store's builder uses when it is given
    /// no policy.
    pub fn from_env() -> Result<Option<Retention>, StoreError> {
        match std::env::var(RETAIN_ENV) {
            Ok(text) if !text.trim().is_empty() => Retention::parse(&text)
                .map_err(|e| StoreError::new(format!("${RETAIN_ENV}: {e}")).lasting()),
            _ => Ok(None),
        }
    }

    /// Runs one whole pass now on `store`, without pauses, blocking; returns what it removed.
    /// For a store that runs none in the background, from a scheduled job.
    pub fn run(&self, store: &dyn Store) -> Result<Removed, Error> {
        let mut pass = RetentionPass::new(store, self);
        while block_on(pass.next_batch())?.is_some() {}
        Ok(pass.removed())
    }
}

/// Where a pass stands: the key its next page reads after, until the store's last page.
#[derive(Debug)]
enum Stage {
    After(Option<String>),
    Ended,
}

/// One retention pass, a batch at a time: each [`RetentionPass::next_batch`] looks at one page
/// of at most the policy's `batch` keys (records and released keys' histories, in key order)
/// and removes what outlived the bound, so that whoever drives it decides when the next batch runs.
pub struct RetentionPass<'a> {
    store: &'a dyn Store,
    policy: &'a Retention,
    now: u64,
    stage: Stage,
    removed: Removed,
    reported: bool,
}

impl std::fmt::Debug for RetentionPass<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetentionPass")
            .field("stage", &self.stage)
            .field("removed", &self.removed)
            .finish_non_exhaustive()
    }
}

impl<'a> RetentionPass<'a> {
    /// A pass over `store` as `policy` says, measuring ages from now on the store's clock.
    pub fn new(store: &'a dyn Store, policy: &'a Retention) -> RetentionPass<'a> {
        RetentionPass {
            store,
            policy,
            now: store.clock(),
            stage: Stage::After(None),
            removed: Removed::default(),
            reported: false,
        }
    }

    /// Runs the next batch: what it removed, or `None` when the pass has ended.
    pub async fn next_batch(&mut self) -> Result<Option<Removed>, Error> {
        // Each stage's step moves the pass on once it has read its page; a step that fails
        // before that is tried again by the next call.
        let batch = match &self.stage {
            Stage::After(after) => self.batch_after(after.clone()).await?,
            Stage::Ended => {
                self.report();
                return Ok(None);
            }
        };
        self.removed.add(batch);
        Ok(Some(batch))
    }

    /// What the pass has removed so far.
    pub fn removed(&self) -> Removed {
        self.removed
    }

    /// Counts the ended pass in the metrics and the log, once.
    fn report(&mut self) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        let Removed { records, histories } = self.removed;
        meter::retention_pass(records, histories);
        tracing::info!(
            records,
            histories,
            "idem: a retention pass removed finished records and released keys' histories"
        );
    }

    async fn batch_after(&mut self, after: Option<String>) -> Result<Removed, Error> {
        let page = self
            .store
            .scan_page(after.as_deref(), self.policy.batch)
            .await
            .map_err(|e| Error::store(None, None, e))?;
        self.stage = match page.next {
            Some(next) => Stage::After(Some(next)),
            None => Stage::Ended,
        };
        let (keep, now) = (self.policy.keep, self.now);
        let (mut old, mut histories) = (Vec::new(), Vec::new());
        for (key, stored) in page.entries {
            match stored {
                Stored::Record(Ok(record)) if outlived(&record, keep, now) => old.push(record),
                Stored::History { last_at } if history_outlived(last_at, keep, now) => {
                    histories.push(key);
                }
                // A record that cannot be read is not known to be finished: it is kept.
                _ => {}
            }
        }
        // Each removal is the lifecycle's purge step through the store's fenced write. A
        // batch's writes are sent together: a store whose writes share durable points (sled's
        // group commit) makes them all and then waits once, instead of a sync for each.
        let instance = self.store.instance().id();
        let step = transition::purge(instance);
        let swaps = old.iter().map(|record| {
            let guard = Guard::of(record.fence(), step.change.by(), instance);
            self.store.compare_and_swap(record, guard, None, step.change.clone())
        });
        let swapped = join_all(swaps.collect()).await;
        let purges =
            histories.iter().map(|key| self.store.append_history(key, step.change.clone()));
        let purged = join_all(purges.collect()).await;
        let mut removed = Removed::default();
        for swapped in swapped {
            if swapped.map_err(|e| Error::store(None, None, e))?.is_some() {
                removed.records += 1;
            }
        }
        for (key, purged) in histories.iter().zip(purged) {
            if purged.map_err(|e| Error::store(Some(key), None, e))? {
                removed.histories += 1;
            }
        }
        Ok(removed)
    }
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    stop: bool,
    status: RetentionStatus,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rests for `rest` or until asked to stop; whether to go on.
    fn rest(&self, rest: Duration) -> bool {
        let deadline = crate::time::deadline_after(Instant::now(), rest);
        let mut state = self.lock();
        while !state.stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self.wake.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        !state.stop
    }
}

/// Runs a store's retention passes on a thread of its own, from its start until it is
/// dropped (which stops the thread at its next batch and waits for it). The opener
/// (`engine/open/`) starts one beside a store whose builder is given a retention (`retain`, or
/// `IDEM_RETAIN`); a store that has no such option can have one started over a handle to it.
pub struct Retainer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Retainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retainer").field("status", &self.status()).finish_non_exhaustive()
    }
}

impl Retainer {
    /// Starts passes over `store` as `policy` says, the first at once. Each batch is a few
    /// fenced deletes: calls never wait for a pass, only, like any two writes of one key, for
    /// the one delete of their key.
    pub fn start(store: Arc<dyn Store>, policy: Retention) -> Result<Retainer, StoreError> {
        let status = RetentionStatus {
            keep_ms: millis(policy.keep),
            batch: policy.batch as u64,
            every_ms: millis(policy.every),
            ..RetentionStatus::default()
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State { stop: false, status }),
            wake: Condvar::new(),
        });
        let running = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("idem-retain".into())
            .spawn(move || retain(store.as_ref(), &policy, &running))
            .map_err(|e| StoreError::with_source("cannot start the retention thread", e))?;
        Ok(Retainer { shared, thread: Some(thread) })
    }

    /// The policy, and what the passes removed so far.
    pub fn status(&self) -> RetentionStatus {
        self.shared.lock().status.clone()
    }

    /// A handle that reads the same status, for another handle to the same store.
    pub fn view(&self) -> RetainerView {
        RetainerView(Arc::clone(&self.shared))
    }
}

impl Drop for Retainer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // The thread ends at its next batch; a panic there has been logged by the hook.
            let _ = thread.join();
        }
    }
}

/// Reads a [`Retainer`]'s status from elsewhere (another handle to the store it runs on).
#[derive(Clone)]
pub struct RetainerView(Arc<Shared>);

impl RetainerView {
    /// The policy, and what the passes removed so far.
    pub fn status(&self) -> RetentionStatus {
        self.0.lock().status.clone()
    }
}

impl std::fmt::Debug for RetainerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RetainerView").field(&self.status()).finish()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The retainer's thread: a pass, a rest of `every`, and again, until asked to stop.
fn retain(store: &dyn Store, policy: &Retention, shared: &Shared) {
    while pass(store, policy, shared) && shared.rest(policy.every) {}
}

/// One pass, resting `pause` between batches; whether to go on.
fn pass(store: &dyn Store, policy: &Retention, shared: &Shared) -> bool {
    let started = Instant::now();
    let mut pass = RetentionPass::new(store, policy);
    let mut batches = 0u64;
    loop {
        match block_on(pass.next_batch()) {
            Ok(Some(batch)) => {
                batches += 1;
                shared.lock().status.removed.add(batch);
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "idem: a retention pass failed; the next pass tries again");
                shared.lock().status.last_error = Some(e.to_string());
                return true;
            }
        }
        if !shared.rest(policy.pause) {
            return false;
        }
    }
    let removed = pass.removed();
    let report = PassReport {
        ended_at: store.clock(),
        took_ms: millis(started.elapsed()),
        batches,
        removed,
    };
    let mut state = shared.lock();
    state.status.passes += 1;
    let recent = &mut state.status.recent_passes;
    if recent.len() == RetentionStatus::RECENT {
        recent.remove(0);
    }
    recent.push(report);
    !state.stop
}
