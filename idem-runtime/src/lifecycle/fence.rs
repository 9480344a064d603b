//! Who may change a record, written once: a write names the state it expects (the fence), and
//! the store makes it only while the record is still in that state. A caller whose record was
//! settled or taken over meanwhile cannot write.
//!
//! [`admits`] is the whole rule. The sled store calls it under the key's lock; the PostgreSQL
//! store states the same rule in the `WHERE` clause of its writes (its `sql.rs` says which).

use super::lease;
use super::owner::instance_of;
use super::record::Record;
use super::status::Status;

/// The state a write is fenced on: the status, owner and attempts the writer saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fence<'a> {
    /// The status seen.
    pub status: Status,
    /// The owner seen.
    pub owner: &'a str,
    /// The attempts seen.
    pub attempts: u32,
}

impl Record {
    /// The state a write that replaces this record is fenced on.
    pub fn fence(&self) -> Fence<'_> {
        Fence { status: self.status, owner: self.owner.as_str(), attempts: self.attempts }
    }
}

impl Record {
    /// Whether this record is still in the state `seen` was in (same status, owner and
    /// attempts): what a waiter asks of each record it reads.
    pub fn is_as(&self, seen: &Record) -> bool {
        self.fence() == seen.fence()
    }
}

/// Whether a write that expects `expected`, made by `writer` (an owner, an operator's
/// `user@host`, or a store instance) at `now` on the store's clock, through the store instance
/// `instance`, may replace `stored`: the record must still be in the state the writer saw, and
/// an in-flight record whose owner still holds it (see [`lease::holds`]) may be replaced by that
/// owner only, through its own instance.
pub fn admits(
    expected: Fence<'_>,
    stored: &Record,
    writer: &str,
    now: u64,
    instance: &str,
) -> bool {
    admits_stored(expected, stored.fence(), stored.lease_until, writer, now, instance)
}

/// [`admits`], for a stored record read only as far as its fence and lease.
pub(crate) fn admits_stored(
    expected: Fence<'_>,
    stored: Fence<'_>,
    lease_until: Option<u64>,
    writer: &str,
    now: u64,
    instance: &str,
) -> bool {
    expected == stored
        && (stored.status != Status::InFlight
            || (stored.owner == writer && instance_of(writer) == instance)
            || !lease::held(stored.owner, lease_until, now, instance))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{transition, Owner};

    #[test]
    fn only_the_owner_replaces_a_record_it_still_holds() {
        let owner = Owner::new_call("sled:h:1:0:0");
        let held = transition::reserve_record("k", "t", "s", None, &owner, 10);
        let fence = held.fence();
        assert!(admits(fence, &held, owner.as_str(), 10, "sled:h:1:0:0"));
        assert!(!admits(fence, &held, "ann@host", 10, "sled:h:1:0:0"), "a live owner keeps it");
        assert!(admits(fence, &held, "ann@host", 10, "sled:h:2:0:0"), "another process died");
        let doubt = held.in_doubt(11);
        assert!(!admits(fence, &doubt, owner.as_str(), 11, "sled:h:1:0:0"), "the state moved");
        assert!(admits(doubt.fence(), &doubt, "ann@host", 11, "sled:h:1:0:0"));
    }

    #[test]
    fn a_leased_record_is_free_once_its_lease_lapses() {
        let owner = Owner::new_call("pg:h:1:0:0");
        let mut held = transition::reserve_record("k", "t", "s", None, &owner, 10);
        held.lease_until = Some(100);
        assert!(!admits(held.fence(), &held, "pg:h:2:0:0#1", 99, "pg:h:1:0:0"));
        assert!(admits(held.fence(), &held, "pg:h:2:0:0#1", 100, "pg:h:1:0:0"));
    }
}
