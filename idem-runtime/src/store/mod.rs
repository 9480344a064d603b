//! The storage interface a backend implements ([`Store`]), what an implementor needs with it,
//! where the process default store lives, and the stores this crate ships (the reference store in memory,
//! sled and SQLite).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use crate::lifecycle::lease::{Held, Lease};
use crate::lifecycle::owner::new_instance;
use crate::lifecycle::Record;

pub(crate) mod access;
pub(crate) mod beside;
pub(crate) mod default;
pub(crate) mod memory;
pub mod name;
mod notify;
mod options;
mod page;
pub(crate) mod sled;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod sync;
pub(crate) mod transaction;
pub(crate) mod walk;

/// The future a [`Store`] method returns: boxed, `Send`, and runnable on any executor (the sync
/// engine drives it with a plain thread-parking loop, so a store must not need an ambient tokio
/// runtime; a networked store runs its I/O on a runtime of its own).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// How far a store goes before it reports a write as done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Every durable point reaches stable storage (survives a power loss).
    #[default]
    Fsync,
    /// Writes reach the operating system (survive a process crash, not a power loss).
    Flush,
    /// Nothing is waited for: for tests and throwaway stores.
    None,
}

/// What a backend stores: a durable map from keys to [`Record`]s, each key with its history, and
/// the few atomic operations the engine builds every rule on. A backend knows no policy: the
/// lifecycle (`idem_runtime::store::transition` rules, [`Guard::of`],
/// [`assess()`]) decides, a write's guard comes in as data, and the backend stores atomically, durably, and
/// tells waiters.
///
/// Every method that changes a record returns only once the change is as durable as the store's
/// [`Durability`] says, and appends the [`Change`]'s [`Entry`] to the key's history in the same
/// atomic step (no durable point of its own): a change that landed is in the history, and one
/// that did not is not. A change whose event [ends the
/// history](crate::lifecycle::history::Event::ends_history) (a purge) removes the history with the record.
/// Implementations must be linearizable per key. The conformance suite
/// (`idem_runtime::conformance_suite!`, feature `conformance`) checks all of it.
pub trait Store: Send + Sync + 'static {
    /// Who this store opened as, and the terms of its leases ([`Instance`]): the engine writes
    /// its [`id`](Instance::id) into the owners of the records its calls reserve, and stamps
    /// and renews the leases of those records on its [`lease`](Instance::lease) terms. Read
    /// on every reservation and guard: a getter of what the store made as it opened.
    fn instance(&self) -> &Instance;

    /// The record under `key`, if any, once it is durable. An absence may be answered before
    /// the write that removed the record is durable, but never before any write that follows
    /// it: a write that acts on the absence (a reservation) lands only after the removal.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// Inserts `record` under its key if no record is there, durably: [`Inserted::New`] with
    /// its owner's fencing token when it did, [`Inserted::Existing`] with the record already
    /// there (durable) otherwise.
    fn insert_if_absent<'a>(
        &'a self,
        record: &'a Record,
        change: Change<'a>,
    ) -> StoreFuture<'a, Inserted>;

    /// Replaces the record `expected` by `new` (deletes it when `new` is `None`) only if the
    /// stored record passes `guard` (the engine's [`Guard::of`] the write; the store compares,
    /// with [`Guard::passes`], the stored fence and lease with it, now on this store's
    /// [`clock`](Store::clock), atomically with the write), durably. The future answers whether
    /// it did (`None`: refused; a caller that lost its record cannot write), with the fencing
    /// token of `new`'s owner when `new` is in flight (a takeover; see [`Inserted::New`]), and a
    /// number of no meaning otherwise; it answers once the write is as durable as the store's
    /// [`Durability`] says.
    ///
    /// The write is sent before this returns, after every write of `expected`'s owner still
    /// under way (which it must not overtake), and goes on whatever becomes of the future: the
    /// future only reports how it ended. It borrows nothing, needs no runtime, and may be dropped
    /// unpolled. So the engine calls this one method from `Drop` as well (a panic, a dropped
    /// future), where nothing can be awaited, and hands the future to a thread that tries the
    /// write again after a failure. A backend that must own the records to send them (to
    /// another thread, over a network) copies or encodes them here; one that writes at once
    /// copies nothing.
    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>>;

    /// Appends `change`'s entry to the history of `key` without changing its record, durably,
    /// and returns whether it did: for the one event that is no change of state,
    /// [`Event::LateWriteRefused`], always (the entry's state is the record's as it stands, or
    /// absent; it follows every entry of a change made before it, and precedes those made
    /// after). An entry that [ends the history](Event::ends_history) (a purge's,
    /// `idem_runtime::store::transition::purge`) removes the history instead, atomically and
    /// only while the key has no record, and says whether there was a history to remove. A
    /// reservation of the key racing the removal keeps its own entry: it either continues the
    /// old history or starts a fresh one. A crash part-way shows the whole history or none.
    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool>;

    /// The history of `key`, oldest first: one entry per change that landed, including those
    /// before a release deleted the record (a later reservation continues it), none from before
    /// a purge. Empty when the key has none. Durable, as from [`Store::get`].
    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>>;

    /// Up to `limit` keys that sort after `after` (from the first when `None`), in key order,
    /// each once: a key with a record beside it ([`Stored::Record`], an `Err` naming the key
    /// for a record that cannot be read: one bad record must not hide the rest), and a key with
    /// a history but no record (a released key) with its last entry's time on the store's
    /// clock ([`Stored::History`]); and [where the next page starts](Page::next), `None` at the
    /// end. How the operator interface, a sweep and a retention pass walk the whole store, a
    /// page at a time, so that none holds a whole store in memory. A page seeks by key: it
    /// reads nothing before `after`. A store that keeps records and histories apart reads a
    /// page of each and joins them with [`Page::merge`]. An `Err` of the whole future means
    /// the store could not be read.
    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page>;

    /// Resolves once the record under `key` is no longer in the state `seen` was in (returning
    /// it, or `None` when it is gone), or at `deadline` (returning it unchanged). Must not poll
    /// in a loop. A store with leases also returns when `seen`'s lease lapses.
    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Extends each lease of `held` whose record is still in flight under that owner and
    /// attempt, with its lease not yet lapsed on this store's clock, to `until` (milliseconds on
    /// that clock), in one storage operation: the engine's heartbeat renews every lease a store's
    /// calls hold with one call. Answers, for each of `held` in order, whether it was extended.
    /// A lapsed lease is never extended: a peer that saw it lapse may take the record over. A
    /// store without leases keeps the default, which extends none.
    fn renew<'a>(&'a self, held: &'a [Held], until: u64) -> StoreFuture<'a, Vec<bool>> {
        let _ = until;
        Box::pin(std::future::ready(Ok(vec![false; held.len()])))
    }

    /// Now, in milliseconds since the Unix epoch, on the clock this store's leases are read on
    /// (a shared database's clock for a store that several machines share). This machine's
    /// clock by default.
    fn clock(&self) -> u64 {
        now_ms()
    }
}

/// What an opened store is, as the engine reads it ([`Store::instance`]): who it is, the terms
/// of its leases, and whether its reads are round trips. Made once, as the store opens.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Instance {
    id: String,
    lease: Option<Lease>,
    remote_reads: bool,
}

impl Instance {
    /// A new instance of a store of `kind` (`sled`, `pg`; at most 16 bytes), whose records
    /// carry no lease: an id unique across processes and machines,
    /// `<kind>:<host>:<pid>:<n>:<random>` (the machine and process that opened it, the
    /// how-many-th store this process opened, and 32 random bits).
    pub fn new(kind: &str) -> Instance {
        Instance { id: new_instance(kind), lease: None, remote_reads: false }
    }

    /// This instance, for a store whose owners' liveness is a lease (one that several
    /// processes share): every record its calls leave in flight carries a lease on `terms`.
    pub fn with_lease(self, terms: Lease) -> Instance {
        Instance { lease: Some(terms), ..self }
    }

    /// This instance, for a store whose every read is a round trip to another machine (a
    /// database server): a call then reserves its key at once and learns what the key holds
    /// from the reservation ([`Inserted::Existing`]), instead of reading it first, so that a
    /// fresh call and a replay each take one round trip, not two. A store that reads from its
    /// own memory or file keeps the default, and a replay there writes nothing and builds no
    /// record to insert.
    pub fn with_remote_reads(self) -> Instance {
        Instance { remote_reads: true, ..self }
    }

    /// The instance's id, which the engine writes into the owners of the records its calls
    /// reserve (`<id>#<call>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The terms of the leases this store's in-flight records carry: the engine stamps a
    /// record it leaves in flight with a lease until [`Lease::until`] the store's
    /// [`clock`](Store::clock), and its heartbeat renews the leases its calls hold every
    /// `renew_every`, through [`Store::renew`]. `None`: records carry no lease, and an owner
    /// holds its record while it is a call of this instance.
    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Whether every read of this store is a round trip ([`Instance::with_remote_reads`]):
    /// the engine then asks [`Store::insert_if_absent`] first, and [`Store::get`] otherwise.
    pub fn remote_reads(&self) -> bool {
        self.remote_reads
    }
}

/// What [`Store::insert_if_absent`] found.
// Returned once per reservation and taken apart at once: boxing the record would only add an
// allocation to the common path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inserted {
    /// The record was inserted. `token` is its owner's fencing token: a number greater than
    /// the token of every owner the key had before (after a release, a takeover, a purge, and
    /// across restarts), which the body reads with `idem::fencing_token()` and hands to a
    /// system of record, so that a stale owner's late write can be refused there.
    New {
        /// The fencing token of the record's owner.
        token: u64,
    },
    /// A record was already there; here it is, as stored.
    Existing(Record),
}

// What a store implementor needs besides the trait, in one place.
pub use self::beside::Beside;
pub use self::notify::{Notifier, Watch};
pub use self::options::{CommonOptions, Retention};
pub use self::page::{Page, RecordPage, Stored};
pub use self::transaction::{Committed, Transaction};
pub use crate::error::StoreError;
pub use crate::lifecycle::history::{Answer, Change, Entry, Event};
pub use crate::lifecycle::lease;
pub use crate::lifecycle::{
    assess, now_ms, Assessment, Fence, Guard, Liveness, Owner, RecordParts,
};
