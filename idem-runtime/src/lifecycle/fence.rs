//! Who may change a record, written once: a write names the state it expects (the fence), and
//! the store makes it only while the record is still in that state. A caller whose record was
//! settled or taken over meanwhile cannot write.
//!
//! [`Guard::of`] is the whole rule, which the engine applies before each write; a store only
//! compares its stored record with the guard ([`Guard::passes`]: the memory, sled and SQLite
//! stores under the key's lock or in the write's transaction; the PostgreSQL store in the
//! `WHERE` clause of its writes, `schema.rs`'s `fence`).

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

/// What a write asks of the stored record besides being in the state the writer saw (its
/// [`Fence`]): decided by the engine before it writes ([`Guard::of`]), and checked by the store
/// as data, atomically with the write ([`Guard::passes`]), so that no backend runs the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Guard {
    /// The fence alone: the record seen was not in flight, or the writer is its owner, writing
    /// through the store instance its owner belongs to.
    Fence,
    /// The fence, and the stored record's owner must have lost it: its lease ran out on the
    /// store's clock (`lease_until <= now`). A stored record with no lease passes only when
    /// `unleased` is true: its owner belongs to another instance of a store that writes no lease
    /// (sled, the memory store: one process each), so it died with that instance.
    Lapsed {
        /// Whether a stored record without a lease passes.
        unleased: bool,
    },
}

impl Guard {
    /// The guard of a write by `writer` (an owner, an operator's `user@host`, or a store
    /// instance), through the store instance `instance`, of a record the writer saw as
    /// `expected`: an in-flight record whose owner still holds it (see [`lease::holds`](super::lease::holds)) may be
    /// replaced by that owner only, through its own instance. The whole rule of who may change
    /// a record.
    pub fn of(expected: Fence<'_>, writer: &str, instance: &str) -> Guard {
        let own = expected.owner == writer && instance_of(writer) == instance;
        if expected.status != Status::InFlight || own {
            return Guard::Fence;
        }
        // `lease::held` without a lease: an owner of this instance holds its record.
        Guard::Lapsed { unleased: instance_of(expected.owner) != instance }
    }

    /// Whether the stored record, read as its fence and lease, lets the write expecting
    /// `expected` through at `now` on the store's clock: a comparison of the stored fields with
    /// this guard's data, which the store makes atomically with the write.
    pub fn passes(
        self,
        expected: Fence<'_>,
        stored: Fence<'_>,
        lease_until: Option<u64>,
        now: u64,
    ) -> bool {
        expected == stored
            && match self {
                Guard::Fence => true,
                Guard::Lapsed { unleased } => lease_until.map_or(unleased, |until| until <= now),
            }
    }
}

/// Whether a write that expects `expected`, made by `writer` at `now` on the store's clock,
/// through the store instance `instance`, may replace `stored`: [`Guard::of`] the write,
/// checked by [`Guard::passes`]. The rule in one call, for the lifecycle's model and tests.
pub fn admits(
    expected: Fence<'_>,
    stored: &Record,
    writer: &str,
    now: u64,
    instance: &str,
) -> bool {
    let guard = Guard::of(expected, writer, instance);
    guard.passes(expected, stored.fence(), stored.lease_until, now)
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
    fn the_engine_decides_the_guard_and_the_store_only_compares() {
        let owner = Owner::new_call("sled:h:1:0:0");
        let held = transition::reserve_record("k", "t", "s", None, &owner, 10);
        let fence = held.fence();
        assert_eq!(Guard::of(fence, owner.as_str(), "sled:h:1:0:0"), Guard::Fence, "its owner");
        assert_eq!(
            Guard::of(fence, "ann@host", "sled:h:1:0:0"),
            Guard::Lapsed { unleased: false },
            "an owner of this instance holds a record without a lease"
        );
        assert_eq!(
            Guard::of(fence, "ann@host", "sled:h:2:0:0"),
            Guard::Lapsed { unleased: true },
            "an owner of another instance of a one-process store died with it"
        );
        let doubt = held.in_doubt(11);
        assert_eq!(Guard::of(doubt.fence(), "ann@host", "sled:h:1:0:0"), Guard::Fence);

        let lapsed = Guard::Lapsed { unleased: false };
        assert!(!lapsed.passes(fence, fence, None, 10), "no lease, and none may lapse");
        assert!(!lapsed.passes(fence, fence, Some(11), 10), "the lease still runs");
        assert!(lapsed.passes(fence, fence, Some(10), 10), "the lease ran out");
        assert!(!Guard::Fence.passes(fence, doubt.fence(), None, 10), "the state moved");
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
