//! Transactional calls on the SQLite store: the body's writes and the call's record commit in
//! one SQLite transaction on the store's file, or neither does. The engine runs them
//! (`engine/transact/sqlite.rs`); this file lends it a [`Transaction`] on the file:
//!
//! - `BEGIN IMMEDIATE` takes the file's write lock before anything is read, so every other
//!   writer of the file (another run of the same key, a plain call's reservation, in this
//!   process or another) waits for this transaction to end, for at most the busy timeout.
//! - idem's writes are the store's own reservation and fenced swap, on the transaction.
//! - While the body runs, commit and rollback hooks on the connection catch a COMMIT or
//!   ROLLBACK of its own (`COMMIT; BEGIN` included): SQLite turns such a commit into a
//!   rollback, so nothing of the call lands and the key stays free.
//! - The commit is as durable as the store's writes (the connection has the store's
//!   `synchronous`), and wakes the key's waiters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::{Connection, TransactionBehavior};

use super::{fault, reserve, swap, Shared, SqliteStore};
use crate::error::StoreError;
use crate::lifecycle::history::Change;
use crate::lifecycle::{Guard, Record};
use crate::store::transaction::{Committed, Transaction};
use crate::store::{Inserted, Instance};

/// What lends a store's transactional connections, for as long as an attempt needs one (a
/// thread of its own may outlive the borrow of the store).
#[derive(Clone)]
pub(crate) struct Lender(Arc<Shared>);

impl SqliteStore {
    /// What lends this store's transactional connections.
    pub(crate) fn lender(&self) -> Lender {
        Lender(Arc::clone(&self.shared))
    }
}

impl Lender {
    /// The instance the store's owners are written as.
    pub(crate) fn instance(&self) -> &Instance {
        &self.0.instance
    }

    /// A connection of the store's transactional ones (kept apart from the readers', so that
    /// nothing a body does to its connection reaches idem's reads).
    pub(crate) fn lend(&self) -> Result<Lent<'_>, StoreError> {
        let shared = &*self.0;
        let conn = shared.transacting.take(&shared.options, &shared.what)?;
        Ok(Lent { shared, conn: Some(conn) })
    }
}

/// A lent connection, given back when it drops outside any transaction (one whose rollback
/// failed is still in its transaction: it is closed, never lent again).
pub(crate) struct Lent<'s> {
    shared: &'s Shared,
    conn: Option<Connection>,
}

impl Lent<'_> {
    /// `BEGIN IMMEDIATE`: the file's write lock, taken before anything is read.
    pub(crate) fn begin(&self) -> Result<SqliteTransaction<'_>, StoreError> {
        let conn = self.conn.as_ref().expect("a lent connection until it drops");
        SqliteTransaction::begin(conn, self.shared)
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take().filter(Connection::is_autocommit) {
            self.shared.transacting.give_back(conn);
        }
    }
}

/// A transaction on the store's file, as the engine writes a call's record through it.
pub(crate) struct SqliteTransaction<'c> {
    /// Declared before the transaction: its hooks go before the transaction rolls back.
    own_end: Option<OwnEnd<'c>>,
    tx: rusqlite::Transaction<'c>,
    conn: &'c Connection,
    shared: &'c Shared,
}

impl<'c> SqliteTransaction<'c> {
    /// `BEGIN IMMEDIATE` on `conn`: the file's write lock, taken before anything is read.
    fn begin(conn: &'c Connection, shared: &'c Shared) -> Result<Self, StoreError> {
        match rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Ok(tx) => Ok(SqliteTransaction { own_end: None, tx, conn, shared }),
            Err(e) => Err(fault::store_error(&shared.what, "cannot begin the transaction", e)),
        }
    }

    fn failed(&self, doing: &str, key: &str, e: rusqlite::Error) -> StoreError {
        fault::store_error(&self.shared.what, &format!("{doing} key {key}"), e)
    }
}

impl<'c> Transaction for SqliteTransaction<'c> {
    type Body = rusqlite::Transaction<'c>;

    fn body(&mut self) -> &mut rusqlite::Transaction<'c> {
        &mut self.tx
    }

    async fn get(&mut self, key: &str) -> Result<Option<Record>, StoreError> {
        self.shared.stored(&self.tx, key).map_err(|e| self.failed("cannot read", key, e))
    }

    async fn insert_if_absent(
        &mut self,
        record: &Record,
        change: &Change<'_>,
    ) -> Result<Inserted, StoreError> {
        reserve(&self.tx, self.shared, record, change)
            .map_err(|e| self.failed("cannot reserve", &record.key, e))
    }

    async fn compare_and_swap(
        &mut self,
        expected: &Record,
        guard: Guard,
        new: &Record,
        change: &Change<'_>,
    ) -> Result<Option<u64>, StoreError> {
        match swap(&self.tx, self.shared, expected, guard, Some(new), change) {
            Ok((token, _)) => Ok(token),
            Err(e) => Err(self.failed("cannot take over", &expected.key, e)),
        }
    }

    fn body_starts(&mut self) {
        self.own_end = Some(OwnEnd::watch(self.conn));
    }

    async fn body_ended(&mut self) -> Result<Option<bool>, StoreError> {
        let ended_itself = self.own_end.take().is_some_and(|watch| watch.seen());
        // A commit of the body's own was turned into a rollback: nothing of it was kept (and
        // dropping the transaction rolls back whatever the body began after it).
        Ok((ended_itself || self.tx.is_autocommit()).then_some(false))
    }

    async fn complete_and_commit(
        self,
        held: &Record,
        guard: Guard,
        done: &Record,
        change: &Change<'_>,
    ) -> Result<Committed, StoreError> {
        match swap(&self.tx, self.shared, held, guard, Some(done), change) {
            Ok((Some(_), _)) => {}
            Ok((None, _)) => return Ok(Committed::NotAsLeft),
            Err(e) => return Err(self.failed("cannot record the result of", &held.key, e)),
        }
        let (shared, key) = (self.shared, held.key.as_str());
        let committed = self.tx.commit();
        committed.map_err(|e| {
            fault::store_error(
                &shared.what,
                &format!("cannot commit the transaction of key {key}"),
                e,
            )
        })?;
        shared.announce(key);
        Ok(Committed::Committed)
    }
}

/// Watches a run's connection, while the body has it, for a COMMIT or ROLLBACK the body makes
/// itself (`COMMIT; BEGIN` included, which leaves the connection in a transaction): a commit is
/// refused, so SQLite rolls it back and nothing of the run lands, and either is noted. The
/// hooks go when the watch drops, before the connection is lent again.
struct OwnEnd<'c> {
    conn: &'c Connection,
    seen: Arc<AtomicBool>,
}

impl<'c> OwnEnd<'c> {
    fn watch(conn: &'c Connection) -> OwnEnd<'c> {
        let seen = Arc::new(AtomicBool::new(false));
        let (committed, rolled_back) = (Arc::clone(&seen), Arc::clone(&seen));
        conn.commit_hook(Some(move || {
            committed.store(true, Ordering::SeqCst);
            // `true` turns the commit into a rollback.
            true
        }));
        conn.rollback_hook(Some(move || rolled_back.store(true, Ordering::SeqCst)));
        OwnEnd { conn, seen }
    }

    /// Whether the body committed or rolled back by itself.
    fn seen(&self) -> bool {
        self.seen.load(Ordering::SeqCst)
    }
}

impl Drop for OwnEnd<'_> {
    fn drop(&mut self) {
        self.conn.commit_hook(None::<fn() -> bool>);
        self.conn.rollback_hook(None::<fn()>);
    }
}
