//! The backend-neutral store interface, and the stores this crate ships.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::history::{Change, Entry};
use crate::record::Record;

mod notify;
pub(crate) mod sled;
pub(crate) mod sync;

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

/// A durable map from keys to [`Record`]s with the few atomic operations the engine needs.
///
/// Every method that changes a record returns only once the change is as durable as the store's
/// [`Durability`] says. Implementations must be linearizable per key.
///
/// Every change carries a [`Change`] saying what it is, and the store appends its
/// [`Entry`](crate::history::Entry) to the key's history in the same atomic step as the change
/// itself, with no durable point of its own: a change that landed is in the history, and one
/// that did not is not. A change whose event [ends the
/// history](crate::history::Event::ends_history) (a purge) removes the history with the record
/// instead. A store refuses a change that [`Change::check`] refuses, before writing anything.
pub trait Store: Send + Sync + 'static {
    /// The identity this store instance writes into the records it reserves or takes over.
    fn owner_id(&self) -> &str;

    /// Inserts `record` under `record.key` if no record is there, durably: [`Reserved::Mine`]
    /// when the insert happened, [`Reserved::Taken`] with the record already there otherwise.
    /// The history gets `change` only when the insert happened.
    fn reserve<'a>(&'a self, record: &'a Record, change: Change<'a>) -> StoreFuture<'a, Reserved>;

    /// The record under `key`, if any.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// Replaces `current` by `new` (or deletes it when `new` is `None`) only if the stored
    /// record is still in the state `current` was ([`Record::fence`], and
    /// [`Fence::admits`](crate::Fence::admits)), durably. Returns whether the swap happened. This
    /// is the fence: a caller that lost its record cannot write. The history gets `change`
    /// only when the swap happened.
    fn replace<'a>(
        &'a self,
        current: &'a Record,
        new: Option<&'a Record>,
        change: Change<'a>,
    ) -> StoreFuture<'a, bool>;

    /// Like [`Store::replace`], but does not wait: it is called from `Drop` (a panic or a
    /// dropped future), where nothing can be awaited. Failures are logged.
    fn replace_detached(&self, current: &Record, new: Option<Record>, change: Change<'_>);

    /// The history of `key`, oldest first: one entry per change that landed, including those
    /// before a release deleted the record (a later reservation continues it), none from before
    /// a purge. Empty when the key has none. What it returns is durable, as from [`Store::get`].
    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>>;

    /// Resolves once the record under `key` differs from `seen` (returning it, or `None` when
    /// it is gone), or at `deadline` (returning it unchanged). Must not poll in a loop.
    fn changed<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>>;

    /// Whether the owner of an `InFlight` record is still running it: a fact only the store
    /// knows (on sled, whether the owner is this process; on PostgreSQL, whether its lease
    /// holds). [`assess`](crate::assess) treats a dead owner's record as in doubt.
    fn owner_alive(&self, record: &Record) -> bool;

    /// Every record, in no particular order (for the operator commands). A record that cannot
    /// be read is an `Err` naming its key, in its place: one bad record must not hide the rest.
    /// An `Err` of the whole future means the store itself could not be read.
    fn scan(&self) -> StoreFuture<'_, Vec<Result<Record, StoreError>>>;

    /// Bytes the store takes on disk, when the backend can tell.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }

    /// The record under `key` when the store can tell without a round trip: the engine asks
    /// before it builds a reservation, so that a replay (the common case of a key that is
    /// there) builds none. A record returned is durable, as from [`Store::get`]; `None` means
    /// absent or not looked up, and need not wait for durability, since the engine then calls
    /// [`Store::reserve`], which decides atomically. The default looks nothing up: a networked
    /// store answers both questions in one round trip with `reserve`.
    fn peek<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        let _ = key;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// How long a caller waits for an in-flight owner when the call sets no `wait`.
    fn default_wait(&self) -> Duration {
        DEFAULT_WAIT
    }

    /// How many callers of [`Store::changed`] for `key` have registered for its next change
    /// (and so cannot miss it), or `None` when the store cannot tell. For tests, which must know
    /// that a waiter is waiting before they change the record; the conformance suite needs it.
    #[doc(hidden)]
    fn waiters(&self, key: &str) -> Option<usize> {
        let _ = key;
        None
    }
}

/// The wait used when neither the call nor the store sets one.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// What [`Store::reserve`] found.
// Returned once per reservation and taken apart at once: boxing the record would only add an
// allocation to the common path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The record was inserted: the caller owns the key.
    Mine,
    /// A record was already there; here it is, as stored.
    Taken(Record),
}
