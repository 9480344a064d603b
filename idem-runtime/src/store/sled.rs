//! The embedded store: sled 0.34, one process at a time.

use std::path::{Path, PathBuf};
use std::time::Instant;

use self::chunks::{Chunks, MAX_RESULT};
use self::encoding::view::decode;
use self::history::History;
use self::write::Swapped;
use super::beside::Beside;
use super::notify::Notifier;
use super::sync::Syncer;
use super::{Durability, Inserted, Instance, Page, Store, StoreFuture};
use crate::error::StoreError;
use crate::lifecycle::history::{Change, Entry};
use crate::lifecycle::{now_ms, Guard, Record};
use crate::loom::Arc;

mod chunks;
mod encoding;
mod files;
mod history;
mod open;
mod pages;
mod recent;
mod write;

pub use self::open::SledStoreBuilder;

const TREE: &str = "idem.records";
const CHUNKS: &str = "idem.chunks";

/// The keys a crash may have left needing attention (a superset of them, at any point a crash can
/// stop at): records in flight, records whose result's chunks are being written or removed, and
/// keys whose history a purge is removing.
/// Opening a store reads only these, not the whole store.
const IN_FLIGHT: &str = "idem.in-flight";

/// sled's segment, the unit its data file grows by (sled's default, which the store keeps).
const SEGMENT: u64 = 512 * 1024;

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
    /// The admin socket and the retention passes its opener started, on handles of their own;
    /// declared first, so that they stop before the rest of the store goes away.
    pub(crate) beside: Beside,
    tree: sled::Tree,
    index: sled::Tree,
    chunks: Chunks,
    history: History,
    db: sled::Db,
    path: PathBuf,
    owner: Instance,
    durability: Durability,
    /// Shared with the admin socket's handle, so that both see one poisoning and one group
    /// commit.
    syncer: Option<std::sync::Arc<Syncer>>,
    notifier: Arc<Notifier>,
    /// Serialise the writes of one key (see `cas`), and a history's read against them;
    /// striped, since contention on a key is rare.
    key_locks: std::sync::Arc<[std::sync::Mutex<()>]>,
    /// Finished records written or read lately (see `sled/recent.rs`); shared with the admin
    /// socket's handle, whose writes keep it true too.
    recent: std::sync::Arc<recent::Recent>,
}

fn io_error(
    path: &Path,
    what: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::with_source(format!("{what} {}", path.display()), e)
}

/// Bytes the sled store in `dir` takes on disk, as sled counts them (its data file and its
/// blobs), whether or not a process holds it.
pub(crate) fn size_on_disk(dir: &Path) -> Option<u64> {
    let size = |path: &Path| std::fs::metadata(path).map(|meta| meta.len());
    let mut bytes = size(&dir.join("db")).ok()?;
    for blob in std::fs::read_dir(dir.join("blobs")).into_iter().flatten().flatten() {
        // sled removes blobs lazily: one gone meanwhile counts nothing.
        bytes += size(&blob.path()).unwrap_or(0);
    }
    // sled grows its data file a segment at a time, and opening a store fills out the segment
    // it was last writing: counted in whole segments, the size is the same whether the holder
    // is asked or the store is opened to ask.
    Some(bytes.div_ceil(SEGMENT) * SEGMENT)
}

impl SledStore {
    /// The largest result the store keeps, in bytes of its JSON text (16 MiB).
    pub const MAX_RESULT: usize = MAX_RESULT;

    /// Options for opening the store in directory `path`.
    pub fn builder(path: impl AsRef<Path>) -> SledStoreBuilder {
        SledStoreBuilder::new(path.as_ref())
    }

    /// The directory this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the store takes on disk (what `idem stats` prints).
    pub fn size_on_disk(&self) -> Option<u64> {
        size_on_disk(&self.path)
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

    /// The record under `key`, with its result read back from its chunks when it has them: from
    /// the cache of recent records when it has it, else from sled, under the key's lock so that
    /// what the cache then keeps is what sled holds.
    fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        if let Some(record) = self.recent.get(key) {
            return Ok(Some(record));
        }
        let _key_lock = self.lock_key(key.as_bytes());
        let bytes = self.read(key)?;
        self.load_read(key, bytes)
    }

    /// [`SledStore::load`] of the `bytes` read under the key's lock, which the caller holds.
    fn load_read(
        &self,
        key: &str,
        bytes: Option<sled::IVec>,
    ) -> Result<Option<Record>, StoreError> {
        self.recent.set(key.as_bytes(), bytes.as_ref());
        let Some(bytes) = bytes else { return Ok(None) };
        let view = decode(key.as_bytes(), &bytes)?;
        let mut record = view.to_record(key);
        let Some(spilled) = view.spilled else { return Ok(Some(record)) };
        let text = self
            .chunks
            .read(key.as_bytes(), spilled)
            .map_err(|e| io_error(&self.path, "cannot read", e))?;
        // Under the key's lock the record cannot have been replaced since it was read, so
        // missing chunks are damage.
        match text.map(String::from_utf8) {
            Some(Ok(text)) => {
                record.result = Some(text);
                Ok(Some(record))
            }
            _ => Err(StoreError::new(format!(
                "the record under key {key} is damaged (its result's chunks are missing or not \
                 UTF-8); nothing was run for it: stop the agents, copy the store aside, and \
                 inspect it"
            ))),
        }
    }

    /// Swaps `expected` for `new` if the stored record passes `guard`; the swap, or `None`
    /// when it was refused.
    fn swap_now(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> Result<Option<Swapped>, StoreError> {
        let key = expected.key.as_bytes();
        // Read, fenced and swapped under the key's lock, so that the bytes fenced are those
        // swapped.
        let key_lock = self.lock_key(key);
        let Some(bytes) = self.read(&expected.key)? else { return Ok(None) };
        let stored = decode(key, &bytes)?;
        let (fence, lease) = (stored.fence(), stored.lease_until);
        if !guard.passes(expected.fence(), fence, lease, now_ms()) {
            return Ok(None);
        }
        Ok(self.cas_held(key, Some(&bytes), new, change, &key_lock)?.ok())
    }

    /// The record under `key`, once it is durable.
    async fn read_durable(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let record = self.load(key)?;
        self.durable().await?;
        Ok(record)
    }
}

/// A record that was there when a reservation looked and was gone when it read it.
fn gone_while_reserved(key: &str) -> StoreError {
    StoreError::new(format!(
        "key {key}: the record appeared and was removed while this call reserved it; retry the \
         call"
    ))
}

impl Store for SledStore {
    fn instance(&self) -> &Instance {
        &self.owner
    }

    fn insert_if_absent<'a>(
        &'a self,
        record: &'a Record,
        change: Change<'a>,
    ) -> StoreFuture<'a, Inserted> {
        Box::pin(async move {
            let key = record.key.as_bytes();
            // Most calls that find their key are replays: a read answers them without encoding
            // the record or attempting a swap. The insert is made under the same lock as the
            // read that found no record, so nothing can come between.
            let swapped = match self.recent.get(&record.key) {
                Some(existing) => Err(Some(existing)),
                None => {
                    let key_lock = self.lock_key(key);
                    match self.read(&record.key)? {
                        Some(bytes) => Err(self.load_read(&record.key, Some(bytes))?),
                        None => Ok(self.cas_held(key, None, Some(record), change, &key_lock)?),
                    }
                }
            };
            let swapped = match swapped {
                Ok(swapped) => swapped,
                Err(existing) => {
                    self.durable().await?;
                    return match existing {
                        Some(existing) => Ok(Inserted::Existing(existing)),
                        None => Err(gone_while_reserved(&record.key)),
                    };
                }
            };
            match swapped {
                Ok(Swapped { ticket, token }) => {
                    if let Some(ticket) = ticket {
                        ticket.await?;
                    }
                    Ok(Inserted::New { token })
                }
                Err(Some(bytes)) => {
                    let view = decode(key, &bytes)?;
                    let existing = match view.spilled {
                        None => Some(view.to_record(&record.key)),
                        Some(_) => self.load(&record.key)?,
                    };
                    self.durable().await?;
                    match existing {
                        Some(existing) => Ok(Inserted::Existing(existing)),
                        // Purged again since the swap saw it: the caller tries again.
                        None => Err(gone_while_reserved(&record.key)),
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
        Box::pin(async move {
            // An absence is not waited for: every later write of this store lands after the
            // removal, and waiting here would make each fresh call wait for its neighbours'
            // syncs before its own.
            match self.load(key)? {
                Some(record) => {
                    self.durable().await?;
                    Ok(Some(record))
                }
                None => Ok(None),
            }
        })
    }

    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>> {
        // Swapped now, under the key's lock. The future waits only for the durable point, which
        // the sync thread makes whether or not anyone waits; a crash before it loses the swap,
        // as of any write not yet answered.
        let swapped = self.swap_now(expected, guard, new, change);
        Box::pin(async move {
            let Some(Swapped { ticket, token }) = swapped? else { return Ok(None) };
            if let Some(ticket) = ticket {
                ticket.await?;
            }
            Ok(Some(token))
        })
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // Watch before reading, so that a change between the read and the wait is seen.
            let watch = Notifier::watch(&self.notifier, key);
            let current = self.read_durable(key).await?;
            match &current {
                Some(record) if record.is_as(seen) => {}
                _ => return Ok(current),
            }
            let _ = crate::exec::until(watch, deadline).await;
            self.read_durable(key).await
        })
    }

    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            if change.event().ends_history() {
                let Some(ticket) = self.remove_history_now(key.as_bytes(), change)? else {
                    return Ok(false);
                };
                if let Some(ticket) = ticket {
                    ticket.await?;
                }
                return Ok(true);
            }
            // The entry must be confirmed like any other (`sled/history.rs`): written through
            // `cas` with the record unchanged, whose swap moves the record's history number on
            // to it; or, with no record, as an entry that leaves the key absent, which confirms
            // itself. A write between the read and the swap makes the swap fail: read again.
            loop {
                let bytes = self.read(key)?;
                let record = match &bytes {
                    Some(_) => match self.load(key)? {
                        Some(record) => Some(record),
                        None => continue,
                    },
                    None => None,
                };
                let old = bytes.as_deref();
                if let Ok(Swapped { ticket, .. }) =
                    self.cas(key.as_bytes(), old, record.as_ref(), change.clone())?
                {
                    if let Some(ticket) = ticket {
                        ticket.await?;
                    }
                    return Ok(true);
                }
            }
        })
    }

    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        Box::pin(async move {
            let entries = {
                // Under the key's lock, the record and its entries are read as one state.
                let _key_lock = self.lock_key(key.as_bytes());
                let bytes = self.read(key)?;
                let record = match &bytes {
                    Some(bytes) => {
                        let view = decode(key.as_bytes(), bytes)?;
                        Some((view.history, view.inline))
                    }
                    None => None,
                };
                self.history.read_all(key.as_bytes(), record)?
            };
            self.durable().await?;
            Ok(entries)
        })
    }

    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            let page = self.scan_page_now(after, limit)?;
            self.durable().await?;
            Ok(page)
        })
    }
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("owner", &self.owner.id())
            .field("durability", &self.durability)
            .finish()
    }
}
