//! The storage capability transactional calls run on: idem's writes inside one transaction of
//! the store's database, and its commit. The engine decides what to write
//! (`engine/transact.rs`).

use std::future::Future;

use super::Inserted;
use crate::error::StoreError;
use crate::lifecycle::history::Change;
use crate::lifecycle::{Guard, Record};

/// idem's writes inside one transaction of a store's database: the storage capability that
/// transactional calls run on (the SQLite store lends one on its file, idem-postgres on its
/// database). Storage only: what to write is the engine's decision. Dropping it rolls back.
pub trait Transaction {
    /// What the body writes through: the driver's transaction (or its connection).
    type Body;

    /// The body's handle on the transaction.
    fn body(&mut self) -> &mut Self::Body;

    /// The record of `key`, as this transaction sees it.
    fn get(&mut self, key: &str) -> impl Future<Output = Result<Option<Record>, StoreError>>;

    /// Inserts `record` with its history row `change` unless the key holds a record, which is
    /// returned instead.
    fn insert_if_absent(
        &mut self,
        record: &Record,
        change: &Change<'_>,
    ) -> impl Future<Output = Result<Inserted, StoreError>>;

    /// Replaces `expected` by `new`, with its history row `change`, if the stored record
    /// passes `guard` (as [`Store::compare_and_swap`](super::Store::compare_and_swap)): the new
    /// owner's fencing token, or `None` when refused (nothing written).
    fn compare_and_swap(
        &mut self,
        expected: &Record,
        guard: Guard,
        new: &Record,
        change: &Change<'_>,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>>;

    /// The key's record as committed before the transaction began, when the store read it in
    /// the round trip that began it (`None`: not read, or no record). The engine replays a
    /// finished one from it, writing nothing in the transaction. Given once.
    fn committed_before(&mut self) -> Option<Record> {
        None
    }

    /// The body starts: from here on, a commit or rollback made through the store's connection
    /// is the body's own.
    fn body_starts(&mut self);

    /// The body has returned: whether it committed or rolled back the transaction itself
    /// (`Some`), and if so whether what it wrote may have been kept (`Some(true)`: a commit the
    /// store could not refuse). A store that can tell only at the commit says `None` here and
    /// [`Committed::EndedByBody`] there.
    fn body_ended(&mut self) -> impl Future<Output = Result<Option<bool>, StoreError>>;

    /// Replaces `held` by `done` (the body's result, with its history row `change`) if the
    /// stored record passes `guard`, and commits, together or not at all.
    fn complete_and_commit(
        self,
        held: &Record,
        guard: Guard,
        done: &Record,
        change: &Change<'_>,
    ) -> impl Future<Output = Result<Committed, StoreError>>;
}

/// How [`Transaction::complete_and_commit`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// The result and the body's writes are committed.
    Committed,
    /// The record was not as the call left it (nothing committed): something other than idem
    /// wrote to idem's tables inside the transaction.
    NotAsLeft,
    /// The body committed or rolled back the transaction itself. `landed` says whether what it
    /// wrote may have been kept (a commit the store could not refuse): the key is then left in
    /// doubt. Otherwise the store turned it into a rollback, and nothing of the call is kept.
    EndedByBody {
        /// Whether the body's own commit may have kept its writes (and the record in flight).
        landed: bool,
    },
}
