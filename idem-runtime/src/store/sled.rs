//! The embedded store: sled 0.34, one process at a time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use self::chunks::{Chunks, MAX_RESULT, MAX_VALUE};
use self::encoding::{decode, encode, encoded_len, set_history, Spilled};
use self::history::History;
use super::notify::Hub;
use super::sync::{Syncer, Ticket};
use super::{Durability, Reserved, Store, StoreFuture, DEFAULT_WAIT};
use crate::error::StoreError;
use crate::history::{Change, Entry};
use crate::loom::Arc;
use crate::protocol::Status;
use crate::record::{now_ms, Record};

/// What a swap wrote that its settling must know: its history entry's number, whether it
/// purged the history, and whether it entered the key in the in-flight index.
#[derive(Clone, Copy)]
struct Settled {
    seq: u64,
    purge: bool,
    indexed: bool,
}

mod chunks;
mod encoding;
mod files;
mod history;
mod open;
#[cfg(unix)]
mod peer;
#[cfg(unix)]
mod serve;

pub use self::open::SledStoreBuilder;

const TREE: &str = "idem.records";
const CHUNKS: &str = "idem.chunks";

/// The keys a crash may have left needing attention (a superset of them, at any point a crash can
/// stop at): records in flight, and records whose result's chunks are being written or removed.
/// Opening a store reads only these, not the whole store.
const IN_FLIGHT: &str = "idem.in-flight";

/// Every key's history, one entry per change (see `sled/history.rs`).
const HISTORY: &str = "idem.history";

/// Written (in sled's default tree) once a store's in-flight index is complete. A store without
/// it was written before the index existed: its first open scans every record, once.
const INDEXED: &[u8] = b"idem.in-flight-indexed";

/// The embedded store, on [sled](https://docs.rs/sled/0.34.7) 0.34 (its stable line).
///
/// sled takes an exclusive lock on its directory: one process at a time. When a store opens,
/// every record still `InFlight` was left by a process that died mid-call, so it is marked
/// `InDoubt` before anything else can read it. An index of in-flight keys, written with the
/// records, finds them without reading the rest of the store.
///
/// With [`Durability::Fsync`] (the default) every durable point is sled's `flush()` followed by
/// an `fdatasync` of sled's data file (sled 0.34's flush ends in `sync_file_range`, which does
/// not flush the device's write cache), and of any directory whose entries changed; the files
/// sled creates at open are synced before the store is used. Concurrent calls share those syncs
/// (group commit). After a sync fails, the store refuses every write until it is reopened.
///
/// A result may be up to [`SledStore::MAX_RESULT`] bytes of JSON text; a larger one is refused
/// with an error before anything is recorded, and the key is left in doubt, since the body ran.
/// A result past 4 KiB is kept in chunks beside its record, so that sled never writes a value
/// to a file of its own (which it would not sync).
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = idem_runtime::SledStore::open(dir.path().join("idem.sled"))?;
/// # drop(store);
/// # Ok(()) }
/// ```
pub struct SledStore {
    /// Declared first so that it stops serving before the rest of the store goes away.
    #[cfg(unix)]
    admin: Option<serve::Server>,
    tree: sled::Tree,
    index: sled::Tree,
    chunks: Chunks,
    history: History,
    db: sled::Db,
    path: PathBuf,
    owner: String,
    durability: Durability,
    default_wait: Duration,
    /// Shared with the admin socket's handle, so that both see one poisoning and one group
    /// commit.
    syncer: Option<std::sync::Arc<Syncer>>,
    hub: Arc<Hub>,
    /// Serialise the writes of one key (see `cas`), and a history's read against them;
    /// striped, since contention on a key is rare.
    key_locks: std::sync::Arc<[std::sync::Mutex<()>]>,
}

fn io_error(
    path: &Path,
    what: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::with_source(format!("{what} {}", path.display()), e)
}

impl SledStore {
    /// The largest result the store keeps, in bytes of its JSON text (16 MiB).
    pub const MAX_RESULT: usize = MAX_RESULT;

    /// Opens (or creates) the store in directory `path` with the default options.
    pub fn open(path: impl AsRef<Path>) -> Result<SledStore, crate::Error> {
        SledStore::builder(path).open()
    }

    /// Options for opening the store in directory `path`.
    pub fn builder(path: impl AsRef<Path>) -> SledStoreBuilder {
        SledStoreBuilder {
            path: path.as_ref().to_owned(),
            durability: Durability::Fsync,
            cache_bytes: 64 * 1024 * 1024,
            default_wait: DEFAULT_WAIT,
            create: true,
            lock_wait: Duration::ZERO,
            admin_socket: true,
        }
    }

    /// The directory this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The durability this store was opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Completes once every write made so far is durable (at once when all already are, or
    /// when the store keeps nothing durable). Readers await it before acting on what they read,
    /// so that no caller is handed a result the store could still lose: a waiter woken by a
    /// write, or a replay racing the owner's sync.
    async fn durable(&self) -> Result<(), StoreError> {
        match self.syncer.as_deref().and_then(Syncer::barrier) {
            Some(ticket) => ticket.await,
            None => Ok(()),
        }
    }

    fn read(&self, key: &str) -> Result<Option<sled::IVec>, StoreError> {
        self.tree.get(key.as_bytes()).map_err(|e| io_error(&self.path, "cannot read", e))
    }

    /// sled's compare-and-swap, with the entry `change` adds to the key's history (see
    /// `sled/history.rs`). `Ok(Ok(ticket))` when it happened (the ticket, if any, completes
    /// once it is durable), `Ok(Err(current))` with the stored bytes when they were not `old`.
    fn cas(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> Result<Result<Option<Ticket>, Option<sled::IVec>>, StoreError> {
        let old_view = old.and_then(|old| decode(key, old).ok());
        let was_in_flight = old_view.as_ref().is_some_and(|view| view.status == Status::InFlight);
        let old_spilled = old_view.as_ref().and_then(|view| view.spilled);
        let old_history = old_view.as_ref().map(|view| view.history);
        let in_flight = new.is_some_and(|new| new.status == Status::InFlight);
        // Everything that could refuse the write is checked before anything is written.
        change.check().map_err(|why| {
            StoreError::new(format!(
                "key {}: {why}; nothing was written",
                String::from_utf8_lossy(key)
            ))
        })?;
        let (mut bytes, spilled) = match new {
            Some(record) => {
                let (bytes, spilled) = self.lay_out(record)?;
                (Some(bytes), spilled)
            }
            None => (None, None),
        };
        let entry = history::encode(&change, new.map(|record| record.status), now_ms());
        let purge = change.event.ends_history();
        // A write that leaves or enters flight, or writes or drops a result's chunks, or purges
        // a history, is indexed: a crash part-way leaves the key in the index for the next open
        // to settle.
        let indexed =
            was_in_flight || in_flight || spilled.is_some() || old_spilled.is_some() || purge;
        if let Some(syncer) = &self.syncer {
            syncer.begin_write()?;
        }
        // Every write of a key holds its lock: the entry and the swap are one step to every
        // other writer and reader of the key.
        let _key_lock = self.lock_key(key);
        let mut written = None;
        let swapped = (|| {
            // Under the lock no other write of the key can come between this read and the
            // swap, so a write that would be refused writes nothing, not even its entry.
            let current = self.tree.get(key)?;
            if current.as_deref() != old {
                return Ok(Err(current));
            }
            if indexed {
                self.index.insert(key, &[][..])?;
            }
            let seq = self.history.confirmed(key, old_history)? + 1;
            self.history.write(key, seq, entry)?;
            written = Some(seq);
            #[cfg(feature = "failpoints")]
            {
                // A crash test stops here with the entry on disk and the change not made.
                let point = format!("after_entry_{}", change.event.as_str());
                if crate::failpoint::armed(&point) {
                    let _ = self.db.flush();
                    crate::failpoint::failpoint(&point);
                }
            }
            if let Some(bytes) = &mut bytes {
                set_history(bytes, seq);
            }
            if let (Some(spilled), Some(text)) =
                (spilled, new.and_then(|record| record.result.as_deref()))
            {
                // The chunks go first: the sync that makes the record durable covers them.
                self.chunks.write(key, spilled.id, text)?;
                #[cfg(feature = "failpoints")]
                {
                    // A crash test stops here with the chunks on disk and no record pointing
                    // to them.
                    let _ = self.db.flush();
                    crate::failpoint::failpoint("after_chunks");
                }
            }
            self.tree.compare_and_swap(key, old, bytes).map(|swap| swap.map_err(|c| c.current))
        })();
        let won = matches!(swapped, Ok(Ok(())));
        if let (Err(e), Some(syncer)) = (&swapped, &self.syncer) {
            syncer.poison(format!("a write failed: {e}"));
        }
        let ticket = self.syncer.as_deref().and_then(|syncer| syncer.end_write(won));
        if let (Ok(outcome), Some(seq)) = (&swapped, written) {
            self.settle_indexed(
                key,
                outcome,
                if won { old_spilled } else { spilled },
                in_flight,
                Settled { seq, purge, indexed },
            );
        }
        match swapped {
            Ok(Ok(())) => {
                self.hub.notify(&String::from_utf8_lossy(key));
                Ok(Ok(ticket))
            }
            Ok(Err(current)) => Ok(Err(current)),
            Err(e) => Err(io_error(&self.path, "cannot write to", e)),
        }
    }

    /// Serialises the writes of `key` (striped: contention on one key is rare), so that one
    /// writer's index removal never drops the entry of another's newer write, and a history
    /// entry and the record's change that confirms it are one step to everyone else. A sled
    /// transaction would tie the writes too, but it takes sled's global write lock, which waits
    /// for every flush: it made fresh calls on a large store ten times slower.
    fn lock_key(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ()> {
        let stripe = key.iter().fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b.into()));
        self.key_locks[stripe % self.key_locks.len()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After a swap that wrote its history entry (`outcome`, under the key's lock): removes
    /// the entry if the swap was refused after all, the history a purge ended, the chunks no
    /// record points to any more (`unused`), then the key's index entry unless the stored
    /// record is in flight. sled recovers a prefix of its writes, so at any point a crash stops
    /// at, the index holds every key that is in flight or may have chunks no record points to
    /// or a purged history; a failure here leaves the entry, and the next open finishes the job.
    fn settle_indexed(
        &self,
        key: &[u8],
        outcome: &Result<(), Option<sled::IVec>>,
        unused: Option<Spilled>,
        in_flight: bool,
        written: Settled,
    ) {
        let settled = (|| {
            match outcome {
                // Only a write made without the key's lock can change the record under it; the
                // entry of a change that did not happen goes.
                Err(_) => self.history.remove(key, written.seq)?,
                Ok(()) if written.purge => {
                    #[cfg(feature = "failpoints")]
                    if crate::failpoint::armed("after_purge_swap") {
                        // A crash test stops here with the record gone and its history not.
                        let _ = self.db.flush();
                        crate::failpoint::failpoint("after_purge_swap");
                    }
                    self.history.remove_through(key, written.seq)?
                }
                Ok(()) => {}
            }
            if !written.indexed {
                return Ok(());
            }
            if let Some(unused) = unused {
                self.chunks.remove(key, unused.id)?;
            }
            let still_needed = match outcome {
                Ok(()) => in_flight,
                Err(current) => current.as_deref().is_some_and(|bytes| {
                    decode(key, bytes).is_ok_and(|view| view.status == Status::InFlight)
                }),
            };
            if !still_needed {
                self.index.remove(key)?;
            }
            Ok::<(), sled::Error>(())
        })();
        if let Err(e) = settled {
            tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "idem: cannot remove a result's chunks, a purged history or an index entry; the next open removes them");
        }
    }

    /// How `record` is written: its bytes, and where its result's chunks go when it does not
    /// fit in the record. Refuses what the store cannot keep, before anything is written.
    fn lay_out(&self, record: &Record) -> Result<(Vec<u8>, Option<Spilled>), StoreError> {
        let result_len = record.result.as_ref().map_or(0, String::len);
        if result_len > MAX_RESULT {
            return Err(StoreError::new(format!(
                "key {}: the result of tool `{}` is {result_len} bytes of JSON, more than the \
                 {MAX_RESULT} bytes the sled store keeps; nothing was recorded for it: return \
                 less (for example where the data is kept, not the data)",
                record.key, record.tool
            )));
        }
        if encoded_len(record, false) <= MAX_VALUE {
            return Ok((encode(record, None), None));
        }
        if record.result.is_some() && encoded_len(record, true) <= MAX_VALUE {
            let id =
                self.db.generate_id().map_err(|e| io_error(&self.path, "cannot write to", e))?;
            // Bounded by MAX_RESULT above.
            let spilled = Spilled { id, len: result_len as u32 };
            return Ok((encode(record, Some(spilled)), Some(spilled)));
        }
        Err(StoreError::new(format!(
            "key {}: tool `{}` with its scope takes {} bytes, more than the {MAX_VALUE} bytes a \
             sled record holds; nothing was recorded for it: use a shorter scope or tool name",
            record.key,
            record.tool,
            encoded_len(record, true)
        )))
    }

    /// The record under `key`, with its result read back from its chunks when it has them.
    fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        loop {
            let Some(bytes) = self.read(key)? else { return Ok(None) };
            let view = decode(key.as_bytes(), &bytes)?;
            let mut record = view.to_record(key);
            let Some(spilled) = view.spilled else { return Ok(Some(record)) };
            let text = self
                .chunks
                .read(key.as_bytes(), spilled)
                .map_err(|e| io_error(&self.path, "cannot read", e))?;
            match text.map(String::from_utf8) {
                Some(Ok(text)) => {
                    record.result = Some(text);
                    return Ok(Some(record));
                }
                // Replaced since it was read, and its chunks removed: read it again.
                None if self.read(key)?.as_ref() != Some(&bytes) => continue,
                _ => {
                    return Err(StoreError::new(format!(
                        "the record under key {key} is damaged (its result's chunks are missing \
                         or not UTF-8); nothing was run for it: stop the agents, copy the store \
                         aside, and inspect it"
                    )))
                }
            }
        }
    }

    /// Swaps `current` for `new` if it is still stored; the ticket of the swap, or `None`
    /// when it was not (`Some(None)`: swapped, nothing to wait for).
    fn replace_now(
        &self,
        current: &Record,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> Result<Option<Option<Ticket>>, StoreError> {
        let key = current.key.as_bytes();
        match self.read(&current.key)? {
            Some(bytes) if current.fence().admits(decode(key, &bytes)?.fence()) => {
                Ok(self.cas(key, Some(&bytes), new, change)?.ok())
            }
            _ => Ok(None),
        }
    }

    /// The record under `key`, once it is durable.
    async fn read_durable(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let record = self.load(key)?;
        self.durable().await?;
        Ok(record)
    }
}

impl Store for SledStore {
    fn owner_id(&self) -> &str {
        &self.owner
    }

    fn reserve<'a>(&'a self, record: &'a Record, change: Change<'a>) -> StoreFuture<'a, Reserved> {
        Box::pin(async move {
            let key = record.key.as_bytes();
            // Most calls that find their key are replays: a read answers them without encoding
            // the record or attempting a swap. The insert below stays atomic either way.
            if let Some(existing) = self.load(&record.key)? {
                self.durable().await?;
                return Ok(Reserved::Taken(existing));
            }
            match self.cas(key, None, Some(record), change)? {
                Ok(ticket) => {
                    if let Some(ticket) = ticket {
                        ticket.await?;
                    }
                    Ok(Reserved::Mine)
                }
                Err(Some(bytes)) => {
                    let view = decode(key, &bytes)?;
                    let existing = match view.spilled {
                        None => Some(view.to_record(&record.key)),
                        Some(_) => self.load(&record.key)?,
                    };
                    self.durable().await?;
                    match existing {
                        Some(existing) => Ok(Reserved::Taken(existing)),
                        // Purged again since the swap saw it: the caller tries again.
                        None => Err(StoreError::new(format!(
                            "key {}: the record appeared and was removed while this call \
                             reserved it; retry the call",
                            record.key
                        ))),
                    }
                }
                // A swap expecting no value fails only when there is one.
                Err(None) => Err(StoreError::new(format!(
                    "key {}: sled refused to insert a record where it reports none; retry",
                    record.key
                ))),
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(self.read_durable(key))
    }

    fn replace<'a>(
        &'a self,
        current: &'a Record,
        new: Option<&'a Record>,
        change: Change<'a>,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            match self.replace_now(current, new, change)? {
                Some(ticket) => {
                    if let Some(ticket) = ticket {
                        ticket.await?;
                    }
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    fn replace_detached(&self, current: &Record, new: Option<Record>, change: Change<'_>) {
        match self.replace_now(current, new.as_ref(), change) {
            // The sync is asked for but not awaited: a crash before it lands leaves the record
            // in flight, which the next open marks in doubt, the same outcome.
            Ok(_) => {}
            Err(e) => {
                tracing::error!(key = %current.key, tool = %current.tool, error = %e, "idem: cannot settle record")
            }
        }
    }

    fn changed<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // Watch before reading, so that a change between the read and the wait is seen.
            let watch = Hub::watch(&self.hub, key);
            let current = self.read_durable(key).await?;
            match &current {
                Some(record) if record.fence() == seen.fence() => {}
                _ => return Ok(current),
            }
            let _ = crate::exec::until(watch, deadline).await;
            self.read_durable(key).await
        })
    }

    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        Box::pin(async move {
            let entries = {
                // Under the key's lock, the record and its entries are read as one state.
                let _key_lock = self.lock_key(key.as_bytes());
                let bytes = self.read(key)?;
                let record = match &bytes {
                    Some(bytes) => Some(decode(key.as_bytes(), bytes)?.history),
                    None => None,
                };
                let read_error = |e| io_error(&self.path, "cannot read", e);
                let confirmed =
                    self.history.confirmed(key.as_bytes(), record).map_err(read_error)?;
                self.history.read(key.as_bytes(), confirmed)?
            };
            self.durable().await?;
            Ok(entries)
        })
    }

    fn owner_alive(&self, record: &Record) -> bool {
        // sled is single-process: only this instance can be running a body.
        record.owner.is_of(&self.owner)
    }

    fn scan(&self) -> StoreFuture<'_, Vec<Result<Record, StoreError>>> {
        Box::pin(async move {
            let mut records = Vec::new();
            for entry in self.tree.iter() {
                let (key, bytes) = entry.map_err(|e| io_error(&self.path, "cannot read", e))?;
                let key = String::from_utf8_lossy(&key);
                // One damaged record is reported as such; the listing goes on.
                match decode(key.as_bytes(), &bytes) {
                    Ok(view) if view.spilled.is_none() => records.push(Ok(view.to_record(&key))),
                    Ok(_) => {
                        if let Some(record) = self.load(&key).transpose() {
                            records.push(record);
                        }
                    }
                    Err(e) => records.push(Err(e)),
                }
            }
            self.durable().await?;
            Ok(records)
        })
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.db.size_on_disk().ok()
    }

    fn peek<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // Absent is not waited for: the reservation that follows is atomic and durable, and
            // waiting here would make a fresh call wait for its neighbours' syncs.
            match self.load(key)? {
                Some(record) => {
                    self.durable().await?;
                    Ok(Some(record))
                }
                None => Ok(None),
            }
        })
    }

    fn default_wait(&self) -> Duration {
        self.default_wait
    }

    fn waiters(&self, key: &str) -> Option<usize> {
        Some(self.hub.watchers(key))
    }
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("owner", &self.owner)
            .field("durability", &self.durability)
            .finish()
    }
}
