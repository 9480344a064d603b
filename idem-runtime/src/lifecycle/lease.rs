//! Whether an owner still holds its in-flight record, written once, on one clock: the store's
//! ([`Store::clock`](crate::store::Store::clock)).
//!
//! A store shared by several processes (PostgreSQL) gives every in-flight record a lease, which
//! its owner renews while the body runs; the owner holds the record until the lease lapses on
//! the store's clock. A store that one process holds (sled) writes no lease: an in-flight
//! record is held while its owner is a call of this instance, and one left by another instance
//! was left by a process that died.

use std::time::Duration;

use super::owner::instance_of;
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
