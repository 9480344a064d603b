//! The leases this store instance holds, and the heartbeat that renews them while bodies run.
//!
//! A lease is held from a successful reserve or takeover until this instance replaces or
//! deletes the record. One task renews every held lease in a single statement per interval; a
//! lease the database refuses to renew (it lapsed, or the record changed hands) is dropped here,
//! and the body's eventual write is fenced by the store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use idem_runtime::store::Owner;
use idem_runtime::{Record, StoreError};
use tokio::sync::Notify;

/// Who holds a record: the owner and attempt this instance wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) owner: Owner,
    pub(crate) attempts: u32,
}

impl Holder {
    pub(crate) fn of(record: &Record) -> Holder {
        Holder { owner: record.owner.clone(), attempts: record.attempts }
    }
}

/// The leases held, by key, and a wake-up for the heartbeat when the first one is taken.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<HashMap<String, Holder>>,
    taken: Notify,
}

impl Leases {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Holder>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This instance now holds `record`'s lease.
    pub(crate) fn hold(&self, record: &Record) {
        self.lock().insert(record.key.clone(), Holder::of(record));
        self.taken.notify_one();
    }

    /// This instance no longer holds the lease of `key` as `holder` (a newer holding of the same
    /// key is kept).
    pub(crate) fn drop_if(&self, key: &str, holder: &Holder) {
        let mut held = self.lock();
        if held.get(key) == Some(holder) {
            held.remove(key);
        }
    }

    /// Every lease held now.
    pub(crate) fn snapshot(&self) -> Vec<(String, Holder)> {
        self.lock().iter().map(|(k, h)| (k.clone(), h.clone())).collect()
    }

    /// Resolves once at least one lease is held.
    pub(crate) async fn until_any(&self) {
        loop {
            let taken = self.taken.notified();
            if !self.lock().is_empty() {
                return;
            }
            taken.await;
        }
    }
}

/// Renews every held lease each `every`, for as long as the store lives. `renew` sends the
/// leases held and answers with those the database renewed; the others are dropped here.
pub(crate) async fn heartbeat<F, R>(leases: &Leases, every: Duration, renew: F)
where
    F: Fn(Vec<(String, Holder)>) -> R,
    R: Future<Output = Result<Vec<(String, Holder)>, StoreError>>,
{
    loop {
        leases.until_any().await;
        tokio::time::sleep(every).await;
        let holding = leases.snapshot();
        if holding.is_empty() {
            continue;
        }
        match renew(holding.clone()).await {
            Ok(renewed) => {
                for (key, holder) in holding.iter().filter(|h| !renewed.contains(h)) {
                    // Settled meanwhile (then the lease is already dropped), or lost: either way
                    // the body's final write is fenced by the store.
                    leases.drop_if(key, holder);
                    tracing::debug!(key = %key, owner = %holder.owner, "idem: lease not renewed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "idem: cannot renew leases; running calls lose their keys if this lasts past the lease")
            }
        }
    }
}
