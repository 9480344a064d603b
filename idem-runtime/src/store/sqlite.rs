//! The SQLite store: one file that several processes on one machine share.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use self::owners::Owners;
use self::wake::Wake;
use self::writer::{Write, Writer};
use super::beside::Beside;
use super::notify::Notifier;
use super::{Inserted, Instance, Page, Store, StoreFuture};
use crate::error::StoreError;
use crate::lifecycle::history::{Change, Entry};
use crate::lifecycle::{lease, now_ms, Guard, Record, Status};

mod fault;
mod open;
mod owners;
mod pages;
mod schema;
pub(crate) mod transaction;
mod wake;
mod writer;

pub(crate) use self::open::begins_as_database;
pub use self::open::SqliteStoreBuilder;

/// How often a waiter reads its record again even when nothing told it of a change: the
/// safety net under the announcements of other processes (see `sqlite/wake.rs`).
const RECHECK: Duration = Duration::from_secs(1);

/// How long a probe that found a record's owner alive counts, as the record's `lease_until`:
/// the record is held that long, after which whoever asks probes again.
const PROBED_ALIVE: u64 = 60_000;

/// The most connections of each kind (reading, transactional) kept open between uses.
const IDLE: usize = 8;

/// A store in one SQLite file that several processes on one machine share, each with its own
/// `SqliteStore` (and a process may open several).
///
/// - **One owner per key**: a reservation is one write transaction (`BEGIN IMMEDIATE`), which
///   SQLite lets one process at a time make: it reads the key and inserts the record, or finds
///   the record already there.
/// - **Durability**: the file runs in WAL mode. With [`Durability::Fsync`](super::Durability)
///   (the default) every connection sets `synchronous = FULL`: a commit syncs the write-ahead
///   log before it returns, so a change the store reported survives a power loss. `Flush` is
///   `synchronous = NORMAL` (the log is written at commit, synced at checkpoints: a process
///   crash loses nothing, a power loss may lose the last commits), `None` is `OFF`.
/// - **A dead owner is seen at once**: every instance holds a lock on a file of its own in
///   `<file>-idem/` for as long as it is open, which the system lets go of when its process
///   ends, however it ends. An in-flight record whose owner's lock is free was left by a
///   process that died: it is in doubt for every caller, and its waiters wake as the process
///   ends. No lease runs out first.
/// - **Waiting without polling**: a settling write wakes the waiters of its process at once,
///   and those of other processes through a datagram to each listening instance.
/// - **Bounded queueing**: writers of several processes queue for the file's write lock for
///   the [busy timeout](SqliteStoreBuilder::busy_timeout), then fail with an error that says
///   so; SQLite's `SQLITE_BUSY` never reaches a caller otherwise, and a write that fails leaves
///   nothing of itself.
///
/// Writes run on a thread of the instance, in the order they were made; reads run on the
/// caller's thread (a replay is a read).
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = idem_runtime::SqliteStore::open(dir.path().join("idem.sqlite"))?;
/// # drop(store);
/// # Ok(()) }
/// ```
pub struct SqliteStore {
    /// The retention passes its opener started, on a handle of their own; declared first:
    /// dropped, they stop (and drop their handle of the store) before the writer goes.
    pub(crate) beside: Beside,
    /// Dropping its last handle makes the writes still queued before the rest goes.
    writer: Arc<Writer>,
    shared: Arc<Shared>,
}

/// What the store's writer thread shares with its callers.
struct Shared {
    options: SqliteStoreBuilder,
    /// The file, as messages name it.
    what: String,
    instance: Instance,
    owners: Owners,
    /// The crate's concurrency types (loom's under its models), as every `Notifier` is held.
    notifier: crate::loom::Arc<Notifier>,
    wake: Wake,
    /// Connections for the callers' reads.
    readers: Idle,
    /// Connections for transactional calls, whose bodies get them: kept apart from the
    /// readers, so that nothing a body did to its connection reaches idem's reads.
    transacting: Idle,
}

/// Open connections to the file, kept between uses (at most [`IDLE`]).
#[derive(Default)]
struct Idle(Mutex<Vec<Connection>>);

impl Idle {
    fn lock(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection, or a new one with the store's settings when none is.
    fn take(&self, options: &SqliteStoreBuilder, what: &str) -> Result<Connection, StoreError> {
        let idle = self.lock().pop();
        match idle {
            Some(conn) => Ok(conn),
            None => open::connect(options, what),
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.lock();
        if idle.len() < IDLE {
            idle.push(conn);
        }
    }
}

impl SqliteStore {
    /// Options for opening the store in the file `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder::new(path.as_ref())
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.shared.options.path
    }

    /// Bytes the store takes on disk, its file and its write-ahead log (what `idem stats`
    /// prints).
    pub fn size_on_disk(&self) -> Option<u64> {
        let path = self.path();
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        Some(size(path) + size(Path::new(&wal)))
    }

    /// The durability this store was opened with.
    pub fn durability(&self) -> super::Durability {
        self.shared.options.common.durability
    }

    /// Queues `body` on the writer thread (see `sqlite/writer.rs`); the future answers once the
    /// transaction that holds it has committed, and the waiters of `key` in every process have
    /// been told when `body` says it changed the record. Dropping the future does not stop the
    /// write.
    fn write<T: Send + 'static>(
        &self,
        key: &str,
        doing: String,
        body: impl FnOnce(&rusqlite::Transaction<'_>, &Shared) -> Result<(T, bool), rusqlite::Error>
            + Send
            + 'static,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + Send {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.writer.queue(Box::new(Pending {
            shared: Arc::clone(&self.shared),
            key: key.to_owned(),
            doing,
            body: Some(body),
            outcome: None,
            answer,
        }));
        async move {
            answered
                .await
                .unwrap_or_else(|_| Err(StoreError::new("the SQLite store's writer has stopped")))
        }
    }
}

/// A write on its way through the writer thread.
struct Pending<T, F> {
    shared: Arc<Shared>,
    key: String,
    /// What the write does, for its error messages ("cannot write key K").
    doing: String,
    body: Option<F>,
    /// What the body did: its value, and whether it changed the record.
    outcome: Option<Result<(T, bool), rusqlite::Error>>,
    /// Where the answer goes (the caller may have gone: it then goes nowhere).
    answer: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Write for Pending<T, F>
where
    T: Send,
    F: FnOnce(&rusqlite::Transaction<'_>, &Shared) -> Result<(T, bool), rusqlite::Error> + Send,
{
    fn run(&mut self, tx: &rusqlite::Transaction<'_>) -> bool {
        let Some(body) = self.body.take() else { return false };
        let outcome = body(tx, &self.shared);
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn finish(self: Box<Self>, ended: Result<(), &rusqlite::Error>) {
        let Pending { shared, key, doing, outcome, answer, .. } = *self;
        let answered = match (outcome, ended) {
            (Some(Err(e)), _) => Err(fault::store_error(&shared.what, &doing, e)),
            (_, Err(e)) => Err(fault::shared_error(&shared.what, &doing, e)),
            (Some(Ok((value, changed))), Ok(())) => {
                if changed {
                    shared.announce(&key);
                }
                Ok(value)
            }
            (None, Ok(())) => Err(StoreError::new(format!("{doing}: the write never ran"))),
        };
        drop(answer.send(answered));
    }
}

impl Shared {
    /// Runs `read` on a reading connection of the pool (opened when none is free).
    fn read<T>(
        &self,
        doing: &str,
        read: impl FnOnce(&Connection) -> Result<T, rusqlite::Error>,
    ) -> Result<T, StoreError> {
        let conn = self.readers.take(&self.options, &self.what)?;
        let out = read(&conn).map_err(|e| fault::store_error(&self.what, doing, e));
        self.readers.give_back(conn);
        out
    }

    /// Tells the waiters of `key`, in this process and in the others, that its record changed:
    /// called once the change has committed.
    fn announce(&self, key: &str) {
        self.notifier.notify(key);
        self.wake.announce(key);
    }

    /// `record` as the lifecycle must see it: an in-flight record of another instance carries
    /// what its owner's lock says as its lease (held for a while when the owner lives, lapsed
    /// when it is gone); see `sqlite/owners.rs`. A dead owner's lease lapsed when it last wrote
    /// the record, not at the reading, so that a fenced write whose clock was read a moment
    /// before this reading still finds it lapsed (a lease is held while `until > now`).
    fn present(&self, record: Record) -> Record {
        self.probe(record).0
    }

    /// [`Shared::present`], and whether it found the record's owner gone.
    fn probe(&self, mut record: Record) -> (Record, bool) {
        let mut gone = false;
        if record.status == Status::InFlight && !record.owner.is_of(self.instance.id()) {
            let now = now_ms();
            gone = !self.owners.alive(record.owner.instance());
            record.lease_until = Some(if gone {
                record.updated_at.min(now)
            } else {
                now.saturating_add(PROBED_ALIVE)
            });
        }
        (record, gone)
    }

    /// The record of `key`, as [`Shared::present`] shows it. A read outside a write sees the
    /// file as it was a moment before the owner is asked about: an owner may write its record
    /// and close its store in between, and would then be found gone behind a record it had
    /// already settled. So an owner found gone is believed only once a second read, made after
    /// the asking, still finds the record as the first read did (a gone owner writes no more).
    /// Inside a write ([`Shared::stored`]) no other process writes between the two.
    fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let read = || self.read(&format!("cannot read key {key}"), |conn| schema::read(conn, key));
        let mut found = read()?;
        loop {
            let Some(record) = found else { return Ok(None) };
            if record.status == Status::InFlight {
                crate::failpoint::pause("sqlite_read_before_probe");
            }
            let (presented, gone) = self.probe(record);
            if !gone {
                return Ok(Some(presented));
            }
            match read()? {
                Some(again) if again.is_as(&presented) => return Ok(Some(presented)),
                other => found = other,
            }
        }
    }

    /// The stored record of `key`, as [`Shared::present`] shows it, inside a write.
    fn stored(
        &self,
        tx: &rusqlite::Transaction<'_>,
        key: &str,
    ) -> rusqlite::Result<Option<Record>> {
        Ok(schema::read(tx, key)?.map(|record| self.present(record)))
    }

    async fn watch(
        &self,
        key: &str,
        seen: &Record,
        deadline: Instant,
    ) -> Result<Option<Record>, StoreError> {
        loop {
            // Watch (and listen to other processes) before reading, so that a change between
            // the read and the wait is seen.
            let watch = Notifier::watch(&self.notifier, key);
            self.wake.listen();
            let record = match self.get(key)? {
                Some(record) if record.is_as(seen) => record,
                other => return Ok(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Some(record));
            }
            if record.status == Status::InFlight && !record.owner.is_of(self.instance.id()) {
                if !lease::holds(&record, now_ms(), self.instance.id()) {
                    // Its owner is gone: the caller must know now.
                    return Ok(Some(record));
                }
                self.owners.wake_at_end(record.owner.instance(), &self.notifier);
            }
            let wake = deadline.min(now + RECHECK);
            let _ = crate::exec::until(watch, wake).await;
        }
    }
}

/// The outcome of a write that changed the record, for [`SqliteStore::write`].
fn changed<T>(value: T) -> Result<(T, bool), rusqlite::Error> {
    Ok((value, true))
}

impl Store for SqliteStore {
    fn instance(&self) -> &Instance {
        &self.shared.instance
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(std::future::ready(self.shared.get(key)))
    }

    fn insert_if_absent<'a>(
        &'a self,
        record: &'a Record,
        change: Change<'a>,
    ) -> StoreFuture<'a, Inserted> {
        let (new, entry) = (record.clone(), OwnedChange::of(&change));
        let doing = format!("cannot reserve key {}", record.key);
        Box::pin(self.write(&record.key, doing, move |tx, shared| {
            // Nobody waits for a key to appear.
            Ok((reserve(tx, shared, &new, &entry.change())?, false))
        }))
    }

    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>> {
        // The writer thread needs the records of its own. Queued now, behind this owner's
        // earlier writes (the writer takes them in order); the future only reports the outcome.
        let (expected, new, entry) = (expected.clone(), new.cloned(), OwnedChange::of(&change));
        let doing = format!("cannot write key {}", expected.key);
        let key = expected.key.clone();
        Box::pin(self.write(&key, doing, move |tx, shared| {
            swap(tx, shared, &expected, guard, new.as_ref(), &entry.change())
        }))
    }

    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool> {
        let (owned, entry) = (key.to_owned(), OwnedChange::of(&change));
        let doing = format!("cannot write the history of key {key}");
        Box::pin(self.write(key, doing, move |tx, _| {
            let record = schema::read(tx, &owned)?;
            if entry.change().event().ends_history() {
                // Nothing of the purge is kept: the history goes whole, as with a purged
                // record, and only from a key with no record.
                let removed = record.is_none() && schema::remove_history(tx, &owned)? > 0;
                return Ok((removed, false));
            }
            schema::append(tx, &owned, &entry.change(), record.map(|r| r.status), now_ms())?;
            Ok((true, false))
        }))
    }

    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        let doing = format!("cannot read the history of key {key}");
        Box::pin(std::future::ready(self.shared.read(&doing, |conn| schema::history(conn, key))))
    }

    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page> {
        let doing = "cannot list a page of the store";
        let read = |conn: &Connection| {
            Ok((pages::records(conn, after, limit)?, pages::histories(conn, after, limit)?))
        };
        let page = self.shared.read(doing, read).map(|(records, histories)| {
            let records = records
                .into_iter()
                .map(|(key, found)| (key, found.map(|r| self.shared.present(r))))
                .collect();
            Page::merge(records, histories, limit)
        });
        Box::pin(std::future::ready(page))
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(self.shared.watch(key, seen, deadline))
    }
}

/// Inserts `new` with its history row unless the key holds a record, which it returns then:
/// the reservation of a plain call and of a transactional one.
fn reserve(
    tx: &rusqlite::Transaction<'_>,
    shared: &Shared,
    new: &Record,
    change: &Change<'_>,
) -> Result<Inserted, rusqlite::Error> {
    if let Some(existing) = shared.stored(tx, &new.key)? {
        return Ok(Inserted::Existing(existing));
    }
    let token = schema::append(tx, &new.key, change, Some(new.status), now_ms())?;
    schema::put(tx, new)?;
    Ok(Inserted::New { token })
}

/// Replaces `expected` by `new` (deletes it when `None`) if the stored record, as
/// [`Shared::present`] shows it, passes `guard` now; the fencing token, or `None` when refused.
fn swap(
    tx: &rusqlite::Transaction<'_>,
    shared: &Shared,
    expected: &Record,
    guard: Guard,
    new: Option<&Record>,
    change: &Change<'_>,
) -> Result<(Option<u64>, bool), rusqlite::Error> {
    let now = now_ms();
    let Some(stored) = shared.stored(tx, &expected.key)? else { return Ok((None, false)) };
    if !guard.passes(expected.fence(), stored.fence(), stored.lease_until, now) {
        return Ok((None, false));
    }
    match new {
        Some(new) => {
            let token = schema::append(tx, &new.key, change, Some(new.status), now)?;
            schema::put(tx, new)?;
            changed(Some(token))
        }
        None if change.event().ends_history() => {
            schema::delete(tx, &expected.key)?;
            schema::remove_history(tx, &expected.key)?;
            // A purge leaves no entry to number: its token means nothing.
            changed(Some(0))
        }
        None => {
            let token = schema::append(tx, &expected.key, change, None, now)?;
            schema::delete(tx, &expected.key)?;
            changed(Some(token))
        }
    }
}

/// A [`Change`] that the writer thread can own.
struct OwnedChange {
    event: crate::lifecycle::history::Event,
    by: String,
    note: Option<String>,
}

impl OwnedChange {
    fn of(change: &Change<'_>) -> OwnedChange {
        let note = change.note().map(str::to_owned);
        OwnedChange { event: change.event(), by: change.by().to_owned(), note }
    }

    /// The change again (already made to fit, so nothing of it is cut).
    fn change(&self) -> Change<'_> {
        let change = Change::new(self.event, &self.by);
        match &self.note {
            Some(note) => change.with_note(note.as_str()),
            None => change,
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path())
            .field("instance", &self.shared.instance.id())
            .finish_non_exhaustive()
    }
}
