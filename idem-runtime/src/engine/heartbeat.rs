//! The lease heartbeat: one per store whose records carry leases ([`Instance::lease`]), the
//! same for every such backend. A call that reserves or takes over a record holds its lease
//! (which the transition stamped) from then until it writes the record again; the heartbeat
//! renews every lease a store's calls hold with one [`Store::renew`] per interval, and forgets a
//! lease the store refuses to renew (it lapsed, or the record changed hands), whose owner's
//! later write is then fenced by the store.
//!
//! The heartbeat is a thread of its own (`idem-heartbeat`), which drives the store's futures
//! with [`block_on`], so that it renews the leases of sync calls on plain threads and of async
//! calls on any executor alike. It holds the store weakly and ends once the store is gone.
//!
//! [`Instance::lease`]: crate::store::Instance::lease

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::exec::block_on;
use crate::lifecycle::lease::{self, Held, Lease};
use crate::lifecycle::{Record, Status};
use crate::store::Store;

/// The shortest lease: shorter, and a heartbeat's round trip would be a large part of it.
const SHORTEST: Duration = Duration::from_millis(100);

impl Lease {
    /// Leases of `length`, renewed every `renew_every` (a third of the length when `None`);
    /// refused when the lease is shorter than 100 ms, or is not renewed before it lapses.
    pub fn new(length: Duration, renew_every: Option<Duration>) -> Result<Lease, StoreError> {
        if length < SHORTEST {
            return Err(StoreError::new("the lease must be at least 100 ms").lasting());
        }
        let renew_every = renew_every.unwrap_or(length / 3);
        if renew_every >= length || renew_every.is_zero() {
            return Err(StoreError::new(
                "the heartbeat must be shorter than the lease (and not zero), or leases lapse \
                 while bodies run",
            )
            .lasting());
        }
        Ok(Lease { length, renew_every })
    }
}

/// The heartbeats of the stores this process's calls hold leases of, by store instance.
static HEARTBEATS: Mutex<Option<HashMap<String, Arc<Heartbeat>>>> = Mutex::new(None);

fn heartbeats() -> MutexGuard<'static, Option<HashMap<String, Arc<Heartbeat>>>> {
    HEARTBEATS.lock().unwrap_or_else(|e| e.into_inner())
}

/// One store's heartbeat: the leases its calls hold.
struct Heartbeat {
    store: Weak<dyn Store>,
    lease: Lease,
    held: Holdings,
    /// When the next renewal is due (`None` while no lease is held): `renew_every` after the
    /// last, or sooner for a lease taken whose stamp leaves less.
    due: Mutex<Option<Instant>>,
    /// Wakes the thread when a lease taken brings the renewal forward: notified under `due`,
    /// so that no wake-up is lost.
    sooner: Condvar,
}

/// The leases held, by key: the one state calls (holding, forgetting) and the heartbeat
/// (renewing, forgetting what the store refused) share.
#[derive(Default)]
struct Holdings(crate::loom::Mutex<HashMap<String, Held>>);

impl Holdings {
    fn lock(&self) -> crate::loom::MutexGuard<'_, HashMap<String, Held>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `held` is its key's lease now (a newer owner's replaces an older one's).
    fn hold(&self, held: Held) {
        self.lock().insert(held.key.clone(), held);
    }

    /// Forgets `held`, only if it is still its key's lease: a newer holding of the same key,
    /// taken after a renewal read the old one, is kept.
    fn forget(&self, held: &Held) {
        let mut all = self.lock();
        if all.get(&held.key) == Some(held) {
            all.remove(&held.key);
        }
    }

    /// Every lease held now, for one renewal.
    fn now(&self) -> Vec<Held> {
        self.lock().values().cloned().collect()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// After a renewal of `asked` that extended those `renewed` says: forgets the others.
    fn refused(&self, asked: &[Held], renewed: &[bool]) {
        for (n, held) in asked.iter().enumerate() {
            if !renewed.get(n).copied().unwrap_or(false) {
                // Settled meanwhile (then it is forgotten already), or lost: either way the
                // owner's final write is fenced by the store.
                self.forget(held);
                tracing::debug!(key = %held.key, owner = %held.owner, "idem: lease not renewed");
            }
        }
    }
}

/// A lease a call holds, renewed by its store's heartbeat until [`Leased::forget`] (or a drop).
pub(super) struct Leased {
    heartbeat: Arc<Heartbeat>,
    held: Held,
}

/// Holds the lease of `record`, which a call of `store` just reserved or took over, when the
/// store leases its records; `None` for a store without leases.
pub(super) fn hold(store: &Arc<dyn Store>, record: &Record) -> Option<Leased> {
    let lease = store.instance().lease()?;
    if record.status != Status::InFlight {
        return None;
    }
    let due = Instant::now() + first_renewal(record, lease, store.clock());
    let heartbeat = {
        let mut all = heartbeats();
        let all = all.get_or_insert_with(HashMap::new);
        let instance = store.instance().id();
        match all.get(instance) {
            // Alive: a heartbeat whose store went (another handle of the same instance) is
            // replaced.
            Some(heartbeat) if heartbeat.store.strong_count() > 0 => Arc::clone(heartbeat),
            _ => {
                let heartbeat = Heartbeat::start(store, lease);
                all.insert(instance.to_owned(), Arc::clone(&heartbeat));
                heartbeat
            }
        }
    };
    let held = Held::of(record);
    heartbeat.take(held.clone(), due);
    Some(Leased { heartbeat, held })
}

/// How long from `now` (on the store's clock) the first renewal of `record`'s lease may wait: as
/// long as a renewal `renew_every` after the lease was stamped would (the lease then has
/// `length - renew_every` left), so that a write that took a while to land, its lease stamped
/// before it was sent, is renewed before the lease lapses, and at once when it took longer than
/// that. A record with no lease, or one already lapsed, is renewed at once (and the store
/// refuses a lapsed one).
fn first_renewal(record: &Record, terms: Lease, now: u64) -> Duration {
    let left = lease::left(record, now).unwrap_or_default();
    left.saturating_sub(terms.length.saturating_sub(terms.renew_every))
}

impl Leased {
    /// The call no longer holds this lease: it wrote its record (whether or not the write
    /// landed: an owner whose last write failed lets its lease lapse, so that the key turns in
    /// doubt for others as after a crash, rather than look running for as long as the store
    /// lives). A newer holding of the same key is kept.
    pub(super) fn forget(&self) {
        self.heartbeat.held.forget(&self.held);
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        self.forget();
    }
}

impl Heartbeat {
    fn start(store: &Arc<dyn Store>, lease: Lease) -> Arc<Heartbeat> {
        let heartbeat = Arc::new(Heartbeat {
            store: Arc::downgrade(store),
            lease,
            held: Holdings::default(),
            due: Mutex::new(None),
            sooner: Condvar::new(),
        });
        let beating = Arc::clone(&heartbeat);
        let started = std::thread::Builder::new()
            .name("idem-heartbeat".to_owned())
            .spawn(move || beating.run());
        if let Err(e) = started {
            // The leases then lapse while bodies run, and their keys turn in doubt for others:
            // what a process that cannot start a thread can offer.
            tracing::error!(error = %e, "idem: cannot start the lease heartbeat");
        }
        heartbeat
    }

    fn lock_due(&self) -> MutexGuard<'_, Option<Instant>> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `held`, whose first renewal is due at `due`: the next renewal comes no later.
    fn take(&self, held: Held, due: Instant) {
        self.held.hold(held);
        let mut next = self.lock_due();
        if next.is_none_or(|at| due < at) {
            *next = Some(due);
            self.sooner.notify_one();
        }
    }

    /// Renews every lease held, when the first renewal of a lease taken is due
    /// ([`first_renewal`]: `renew_every` after its stamp) and every interval while any is held,
    /// until the store is gone.
    fn run(self: Arc<Self>) {
        let every = self.lease.renew_every;
        loop {
            {
                let mut due = self.lock_due();
                loop {
                    let now = Instant::now();
                    let wait = match *due {
                        Some(at) if at <= now => break,
                        Some(at) => at - now,
                        None if self.store.strong_count() == 0 => {
                            drop(due);
                            self.end();
                            return;
                        }
                        None => every,
                    };
                    due = self.sooner.wait_timeout(due, wait).unwrap_or_else(|e| e.into_inner()).0;
                }
                // The next renewal, unless a lease taken meanwhile brings it forward.
                *due = Some(Instant::now() + every);
            }
            let Some(store) = self.store.upgrade() else {
                self.end();
                return;
            };
            self.beat(store.as_ref());
            // A lease taken since is held already (`take` holds it before it reads `due`), so
            // an idle heartbeat misses none.
            let mut due = self.lock_due();
            if self.held.is_empty() {
                *due = None;
            }
        }
    }

    /// One renewal of every lease held, in one storage operation.
    fn beat(&self, store: &dyn Store) {
        let asked = self.held.now();
        if asked.is_empty() {
            return;
        }
        let until = self.lease.until(store.clock());
        match block_on(store.renew(&asked, until)) {
            Ok(renewed) => self.held.refused(&asked, &renewed),
            Err(e) => {
                tracing::warn!(error = %e, "idem: cannot renew leases; running calls lose their keys if this lasts past the lease")
            }
        }
    }

    /// The store is gone: this heartbeat leaves the list (a store opened later has another
    /// instance, and so another heartbeat).
    fn end(self: &Arc<Self>) {
        let mut all = heartbeats();
        if let Some(all) = all.as_mut() {
            all.retain(|_, heartbeat| !Arc::ptr_eq(heartbeat, self));
        }
    }
}

/// A model of the held set under loom (`cargo test -p idem-agent-runtime --features loom --lib
/// loom_`): a renewal the store refuses forgets only the holdings it asked about, so a newer
/// owner's lease of the same key, or another key's, taken meanwhile, is kept and renewed next.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use super::*;
    use crate::lifecycle::Owner;

    fn held(key: &str, owner: &str) -> Held {
        Held { key: key.to_owned(), owner: Owner::from(owner), attempts: 1 }
    }

    #[test]
    fn loom_a_refused_renewal_forgets_only_what_it_asked_about() {
        crate::loom::model(|| {
            let holdings = crate::loom::Arc::new(Holdings::default());
            holdings.hold(held("k", "a#1"));
            let beat = {
                let holdings = crate::loom::Arc::clone(&holdings);
                crate::loom::thread::spawn(move || {
                    // The store refuses every lease it is asked about.
                    let asked = holdings.now();
                    holdings.refused(&asked, &[]);
                    asked
                })
            };
            // Meanwhile the first owner settles, a new owner takes the key over, and another
            // call reserves another key.
            holdings.forget(&held("k", "a#1"));
            holdings.hold(held("k", "b#2"));
            holdings.hold(held("j", "c#3"));
            let asked = beat.join().unwrap();
            let now = holdings.now();
            for taken in [held("k", "b#2"), held("j", "c#3")] {
                assert!(
                    now.contains(&taken) || asked.contains(&taken),
                    "{taken:?} was forgotten unasked: held {now:?}, asked {asked:?}"
                );
            }
            assert!(!now.contains(&held("k", "a#1")), "the settled owner's lease is gone");
        });
    }
}
