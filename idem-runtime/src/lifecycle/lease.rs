//! Whether an owner still holds its in-flight record, written once, on one clock: the store's
//! ([`Store::clock`](crate::store::Store::clock)).
//!
//! The records of a store shared by several processes (PostgreSQL) carry leases on the terms it
//! states ([`Lease`]): the transition that leaves a record in flight stamps one, which the
//! store stores as given and the engine's heartbeat renews while the body runs; the owner holds
//! the record until the lease lapses on the store's clock. A store that one process holds
//! (sled) has no lease terms, and its records carry none: an in-flight record is held while its
//! owner is a call of this instance, and one left by another instance was left by a process
//! that died.

use std::time::Duration;

use super::owner::{instance_of, Owner};
use super::record::Record;

/// Whether the owner of the in-flight `record` still holds it at `now` (milliseconds on the
/// store's clock), seen from the store instance `instance`.
pub fn holds(record: &Record, now: u64, instance: &str) -> bool {
    held(record.owner.as_str(), record.lease_until, now, instance)
}

/// [`holds`], for a record read only as far as its owner and lease.
pub(crate) fn held(owner: &str, lease_until: Option<u64>, now: u64, instance: &str) -> bool {
    match lease_until {
        Some(until) => until > now,
        None => instance_of(owner) == instance,
    }
}

/// How long `record`'s lease still runs at `now`; `None` when it has lapsed or there is none.
pub fn left(record: &Record, now: u64) -> Option<Duration> {
    let until = record.lease_until?;
    (until > now).then(|| Duration::from_millis(until - now))
}

/// The terms of the leases a store's in-flight records carry ([`Instance::lease`]): how long a
/// lease lasts past the transition that stamped it or its last renewal, and how often the
/// engine's heartbeat renews the leases its calls hold. Made with `Lease::new`, which checks
/// that a renewal comes before the lease lapses.
///
/// [`Instance::lease`]: crate::store::Instance::lease
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// How long a lease lasts past the write or the renewal that set it.
    pub length: Duration,
    /// How often the heartbeat renews every lease held: shorter than `length`.
    pub renew_every: Duration,
}

impl Lease {
    /// The end of a lease set at `now` on the store's clock (milliseconds): what a transition
    /// that leaves a record in flight stamps in its `lease_until`, and each renewal sets.
    pub fn until(&self, now: u64) -> u64 {
        now.saturating_add(u64::try_from(self.length.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A lease a call holds: its key, and the owner and attempt that hold it, which is what a
/// renewal names ([`Store::renew`]). A record that changed hands, or settled, has another owner,
/// attempt or status, and its lease is not renewed.
///
/// [`Store::renew`]: crate::store::Store::renew
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Held {
    /// The record's key.
    pub key: String,
    /// The owner that holds it.
    pub owner: Owner,
    /// The owner's attempt.
    pub attempts: u32,
}

impl Held {
    /// The lease of `record`, as its owner holds it.
    pub fn of(record: &Record) -> Held {
        Held { key: record.key.clone(), owner: record.owner.clone(), attempts: record.attempts }
    }
}
