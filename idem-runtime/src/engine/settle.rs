//! Settling writes that failed after a body may have acted: the result of a call whose effect
//! ran, a key marked in doubt, a release, an entry of a key's history. A call cannot wait for the
//! store to recover, and the write must not be lost, or the key stays in flight under a live
//! owner and every later call waits for it and fails. So the engine hands such a write to one
//! thread of the process, which tries it again, with a growing pause, until the store takes it,
//! refuses it (the record changed hands meanwhile: that write stands), or says it never will
//! (`StoreError::lasting`), for as long as the store is open: it holds no store open, so that a
//! store closed to be opened again (a failed sync on sled is cleared so) is not kept from it. A
//! key whose write never landed is in flight under an owner that is gone once the store closes:
//! the next call finds it in doubt. It is the same for every store: a store only stores.
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::exec::block_on;
use crate::lifecycle::history::Change;
use crate::lifecycle::{Guard, Record};
use crate::store::{Store, StoreFuture};

/// The first pause before a failed write is tried again; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between two tries of one write.
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// A write the store has not taken yet.
// Rare, and moved once to the settling thread: boxing the records would only add allocations.
#[allow(clippy::large_enum_variant)]
pub(super) enum Unsettled {
    /// Replace `expected` by `new` (absent when `None`), as `Store::compare_and_swap`.
    Swap { store: Weak<dyn Store>, expected: Record, new: Option<Record>, change: Change<'static> },
    /// Append `change` to the history of `key`, as `Store::append_history`.
    History { store: Weak<dyn Store>, key: String, change: Change<'static> },
}

impl Unsettled {
    /// Tries the write once: `true` once it needs no more tries (stored, refused by the fence,
    /// or the store closed), `false` when it failed and must be tried again.
    fn try_once(&self) -> bool {
        let (Unsettled::Swap { store, .. } | Unsettled::History { store, .. }) = self;
        let Some(store) = store.upgrade() else {
            tracing::warn!(key = %self.key(), "idem: the store closed before a settling write that had failed was stored; the next call finds the key in doubt");
            return true;
        };
        match self {
            Unsettled::Swap { expected, new, change, .. } => {
                let (key, tool) = (&expected.key, &expected.tool);
                let guard = Guard::of(expected.fence(), change.by(), store.instance().id());
                let written = store.compare_and_swap(expected, guard, new.as_ref(), change.clone());
                match block_on(written) {
                    Ok(Some(_)) => {
                        tracing::info!(key = %key, tool = %tool, event = %change.event(), "idem: a settling write that had failed is stored");
                        true
                    }
                    Ok(None) => {
                        tracing::warn!(key = %key, tool = %tool, event = %change.event(), "idem: the record changed hands before a settling write that had failed was stored; that write stands");
                        true
                    }
                    Err(e) if !e.is_retryable() => {
                        tracing::error!(key = %key, tool = %tool, error = %e, "idem: the store refuses a settling write for good; the key is left as it is");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, tool = %tool, error = %e, "idem: a settling write failed again; trying later");
                        false
                    }
                }
            }
            Unsettled::History { key, change, .. } => {
                match block_on(store.append_history(key, change.clone())) {
                    Ok(_) => true,
                    Err(e) if !e.is_retryable() => {
                        tracing::error!(key = %key, error = %e, "idem: the store refuses a history entry for good");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "idem: a history entry failed again; trying later");
                        false
                    }
                }
            }
        }
    }

    /// The key the write is for.
    fn key(&self) -> &str {
        match self {
            Unsettled::Swap { expected, .. } => &expected.key,
            Unsettled::History { key, .. } => key,
        }
    }
}

/// What the settling thread is handed.
enum Job {
    /// A write that failed once: try it again after the first pause.
    Failed(Unsettled),
    /// A write a store sent from a `Drop` (`Store::compare_and_swap`, whose write goes on
    /// unawaited): wait for how it ended, and try it again if it failed.
    Sent(StoreFuture<'static, Option<u64>>, Unsettled),
}

/// Tries `unsettled`, which failed once, again in the background until the store takes it.
pub(super) fn keep_trying(unsettled: Unsettled) {
    hand_over(Job::Failed(unsettled));
}

/// Watches `sent`, a write a store sent from a `Drop` as `unsettled`, and tries it again in
/// the background if it failed.
pub(super) fn watch_sent(sent: StoreFuture<'static, Option<u64>>, unsettled: Unsettled) {
    hand_over(Job::Sent(sent, unsettled));
}

fn hand_over(job: Job) {
    static SETTLER: OnceLock<Mutex<Option<Sender<Job>>>> = OnceLock::new();
    let settler = SETTLER.get_or_init(|| Mutex::new(start()));
    let sender = settler.lock().unwrap_or_else(PoisonError::into_inner);
    let refused = match sender.as_ref() {
        Some(sender) => sender.send(job).err().map(|mpsc::SendError(job)| job),
        None => Some(job),
    };
    if let Some(job) = refused {
        // No thread to hand it to: try it once here, without waiting, and say so.
        tracing::error!("idem: the settling thread is not running; a failed write is tried once more, then left");
        match job {
            Job::Failed(unsettled) => drop(unsettled.try_once()),
            Job::Sent(sent, _) => drop(sent),
        }
    }
}

/// Starts the settling thread; `None` if the system refused a thread.
fn start() -> Option<Sender<Job>> {
    let (sender, jobs) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("idem-settle".into()).spawn(move || run(jobs));
    match spawned {
        Ok(_) => Some(sender),
        Err(e) => {
            tracing::error!(error = %e, "idem: cannot start the settling thread");
            None
        }
    }
}

/// The settling thread: takes jobs, and tries each write that failed when its pause is over.
fn run(jobs: Receiver<Job>) {
    // Writes waiting for their next try: when, the pause after the next failure, and the write.
    let mut waiting: Vec<(Instant, Duration, Unsettled)> = Vec::new();
    loop {
        let next = waiting.iter().map(|(at, _, _)| *at).min();
        let job = match next {
            None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => jobs.recv_timeout(at.saturating_duration_since(Instant::now())),
        };
        match job {
            Ok(Job::Failed(unsettled)) => {
                waiting.push((Instant::now() + FIRST_PAUSE, FIRST_PAUSE * 2, unsettled))
            }
            Ok(Job::Sent(sent, unsettled)) => {
                if block_on(sent).is_err() {
                    waiting.push((Instant::now() + FIRST_PAUSE, FIRST_PAUSE * 2, unsettled));
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            // The sender is a static, so this is the process ending: nothing more comes.
            Err(RecvTimeoutError::Disconnected) => match next {
                None => return,
                Some(at) => std::thread::sleep(at.saturating_duration_since(Instant::now())),
            },
        }
        let now = Instant::now();
        waiting = waiting
            .into_iter()
            .filter_map(|(at, pause, unsettled)| {
                if at > now {
                    return Some((at, pause, unsettled));
                }
                if unsettled.try_once() {
                    return None;
                }
                Some((Instant::now() + pause, (pause * 2).min(LONGEST_PAUSE), unsettled))
            })
            .collect();
    }
}
