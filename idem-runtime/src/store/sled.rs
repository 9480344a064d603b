//! The embedded store: sled 0.34, one process at a time.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::encoding::{decode, encode};
use super::notify::Hub;
use super::sync::{Syncer, Ticket};
use super::{Durability, Reserved, Store, StoreFuture, DEFAULT_WAIT};
use crate::error::StoreError;
use crate::protocol::Status;
use crate::record::{now_ms, Record};

mod encoding;
#[cfg(unix)]
mod peer;
#[cfg(unix)]
mod serve;

const TREE: &str = "idem.records";

/// The keys of the records that are `InFlight` (a superset of them, at any point a crash can stop
/// at), so that opening a store reads only what a dead process may have left in flight.
const IN_FLIGHT: &str = "idem.in-flight";

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
/// an `fdatasync` of sled's data file: sled 0.34's flush ends in `sync_file_range`, which does
/// not flush the device's write cache. Concurrent calls share those syncs (group commit).
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
    db: sled::Db,
    path: PathBuf,
    owner: String,
    durability: Durability,
    default_wait: Duration,
    syncer: Option<Arc<Syncer>>,
    hub: Arc<Hub>,
    /// Serialise the writes of one key that touch the in-flight index (see `swap_indexed`);
    /// striped, since contention on a key is rare.
    key_locks: Arc<[std::sync::Mutex<()>]>,
}

/// Options for [`SledStore`]: durability, cache size and the default wait.
#[derive(Clone, Debug)]
pub struct SledStoreBuilder {
    path: PathBuf,
    durability: Durability,
    cache_bytes: u64,
    default_wait: Duration,
    create: bool,
    lock_wait: Duration,
    admin_socket: bool,
}

impl SledStoreBuilder {
    /// How far a write goes before it is reported done; [`Durability::Fsync`] by default.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// sled's page cache, in bytes; 64 MiB by default (sled's own default is 1 GiB).
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// How long a caller waits for an in-flight owner when the call sets no `wait`; 30 s.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Whether to create the store when the directory holds none (true by default; the `idem`
    /// command opens with `false`, so that a mistyped path is an error, not a new empty store).
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// How long to wait for the directory's lock when another holder has it; zero by default.
    /// sled 0.34 releases its lock a moment after the last handle is dropped (its I/O threads
    /// close the file), so reopening right after a close, or after an agent exits, can find it
    /// briefly held; the `idem` command waits a little rather than fail.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Whether the process answers the `idem` command on a Unix socket in the store directory,
    /// `admin.sock` (true by default; Unix only). sled lets one process hold a store, so this is
    /// how an operator lists and settles the records of an agent that is running. The socket is
    /// the user's alone (mode 0600, and the peer's user is checked on every connection), and it
    /// is removed when the store closes; one left by a process that died is replaced at open.
    /// When it cannot be made (a path too long for a socket, a read-only directory), the store
    /// opens without it and logs a warning.
    pub fn admin_socket(mut self, serve: bool) -> Self {
        self.admin_socket = serve;
        self
    }

    /// Opens the store.
    pub fn open(self) -> Result<SledStore, crate::Error> {
        SledStore::open_with(self).map_err(|source| crate::Error::store(None, None, source))
    }
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

fn io_error(
    path: &Path,
    what: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::with_source(format!("{what} {}", path.display()), e)
}

impl SledStore {
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

    fn open_with(options: SledStoreBuilder) -> Result<SledStore, StoreError> {
        let path = options.path.clone();
        if !options.create && !path.join("conf").exists() {
            return Err(StoreError::new(format!(
                "no idem store at {}: check the path (or $IDEM_STORE); it is created by the \
                 first idempotent call",
                path.display()
            )));
        }
        if path.exists() && !path.is_dir() {
            return Err(StoreError::new(format!(
                "{} is a file, not a store directory: point the store at a directory",
                path.display()
            )));
        }
        let config = sled::Config::new()
            .path(&path)
            .cache_capacity(options.cache_bytes)
            .flush_every_ms(match options.durability {
                // With no durable points of its own, let sled's background flusher write.
                Durability::None => Some(500),
                _ => None,
            });
        // sled 0.34 can panic on some damaged files instead of returning an error: never let
        // that reach the caller as a panic.
        let lock_deadline = Instant::now() + options.lock_wait;
        let opened = loop {
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
            match &opened {
                Ok(Err(sled::Error::Io(e)))
                    if e.to_string().contains("could not acquire lock")
                        && Instant::now() < lock_deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break opened,
            }
        };
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(sled::Error::Io(e))) if e.to_string().contains("could not acquire lock") => {
                return Err(StoreError::new(format!(
                    "the store at {} is open in another process (sled takes an exclusive \
                     lock), which does not serve the `idem` command on its admin socket: stop \
                     that process, or open the store there with the admin socket on (the \
                     default), or use the PostgreSQL store to share one store between processes",
                    path.display()
                )))
            }
            Ok(Err(e)) => {
                return Err(StoreError::with_source(
                    format!(
                        "cannot open the store at {}: it may be damaged or not an idem store; \
                         move it aside and inspect it",
                        path.display()
                    ),
                    e,
                ))
            }
            Err(_) => {
                return Err(StoreError::new(format!(
                    "cannot open the store at {}: sled failed reading it, so it is likely \
                     damaged; move it aside and inspect it",
                    path.display()
                )))
            }
        };
        let tree = db.open_tree(TREE).map_err(|e| io_error(&path, "cannot open records in", e))?;
        let index = db
            .open_tree(IN_FLIGHT)
            .map_err(|e| io_error(&path, "cannot open the in-flight index in", e))?;
        let owner = format!(
            "sled:{}:{}:{}",
            std::process::id(),
            now_ms(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        );
        let syncer = match options.durability {
            Durability::None => None,
            durability => {
                let db = db.clone();
                let data_file = match durability {
                    Durability::Fsync => Some(
                        File::open(path.join("db"))
                            .map_err(|e| io_error(&path, "cannot open the data file of", e))?,
                    ),
                    _ => None,
                };
                let sync = Box::new(move || {
                    db.flush().map_err(|e| e.to_string())?;
                    if let Some(file) = &data_file {
                        file.sync_data().map_err(|e| e.to_string())?;
                    }
                    Ok(())
                });
                Some(Arc::new(
                    Syncer::start("idem-sled-sync", sync)
                        .map_err(|e| io_error(&path, "cannot start the sync thread for", e))?,
                ))
            }
        };
        #[cfg_attr(not(unix), allow(unused_mut))]
        let mut store = SledStore {
            #[cfg(unix)]
            admin: None,
            tree,
            index,
            db,
            path,
            owner,
            durability: options.durability,
            default_wait: options.default_wait,
            syncer,
            hub: Arc::default(),
            key_locks: (0..64).map(|_| std::sync::Mutex::new(())).collect(),
        };
        store.mark_orphans_in_doubt()?;
        #[cfg(unix)]
        if options.admin_socket {
            store.admin = store.serve_admin();
        }
        Ok(store)
    }

    /// Starts the admin socket on a second handle to this store (same tree, owner, sync thread
    /// and notifications, so a resolve is seen by waiters and fenced like any write here).
    #[cfg(unix)]
    fn serve_admin(&self) -> Option<serve::Server> {
        let handle = SledStore {
            admin: None,
            tree: self.tree.clone(),
            index: self.index.clone(),
            db: self.db.clone(),
            path: self.path.clone(),
            owner: self.owner.clone(),
            durability: self.durability,
            default_wait: self.default_wait,
            syncer: self.syncer.clone(),
            hub: Arc::clone(&self.hub),
            key_locks: Arc::clone(&self.key_locks),
        };
        match serve::Server::start(&self.path, Arc::new(handle)) {
            Ok(server) => Some(server),
            Err(e) => {
                tracing::warn!(store = %self.path.display(), error = %e, "idem: no admin socket: the `idem` command cannot reach this store while this process holds it");
                None
            }
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

    /// Any `InFlight` record found at open belongs to a process that died mid-call. The index
    /// lists them; a store written before the index existed is scanned whole, once, and then
    /// marked as indexed (after its orphans are settled, so a crash mid-way scans again).
    fn mark_orphans_in_doubt(&self) -> Result<(), StoreError> {
        let read_error = |e| io_error(&self.path, "cannot read", e);
        let indexed = self.db.get(INDEXED).map_err(read_error)?.is_some();
        let mut marked = 0usize;
        if indexed {
            for entry in self.index.iter() {
                let (key, _) = entry.map_err(read_error)?;
                match self.tree.get(&key).map_err(read_error)? {
                    Some(bytes) => marked += usize::from(self.mark_if_in_flight(&key, &bytes)?),
                    // Never left by the atomic writes; drop it rather than look again each time.
                    None => {
                        self.index
                            .remove(&key)
                            .map_err(|e| io_error(&self.path, "cannot write to", e))?;
                    }
                }
            }
        } else {
            for entry in self.tree.iter() {
                let (key, bytes) = entry.map_err(read_error)?;
                marked += usize::from(self.mark_if_in_flight(&key, &bytes)?);
            }
            self.db
                .insert(INDEXED, &[1u8][..])
                .map_err(|e| io_error(&self.path, "cannot write to", e))?;
            tracing::info!(store = %self.path.display(), "idem: indexed the in-flight records of a store written by an earlier idem (once)");
        }
        if marked > 0 || !indexed {
            match &self.syncer {
                Some(_) => crate::exec::block_on(self.durable())?,
                // No sync thread, but the one-time migration is worth keeping.
                None => {
                    self.db.flush().map_err(|e| io_error(&self.path, "cannot write to", e))?;
                }
            }
        }
        Ok(())
    }

    /// Marks the record `bytes` under `key` in doubt if it is in flight; whether it did.
    fn mark_if_in_flight(&self, key: &[u8], bytes: &sled::IVec) -> Result<bool, StoreError> {
        let Ok(view) = decode(key, bytes) else { return Ok(false) };
        if view.status != Status::InFlight {
            return Ok(false);
        }
        let record = view.to_record(&String::from_utf8_lossy(key));
        let doubt = record.in_doubt(now_ms());
        tracing::warn!(key = %record.key, tool = %record.tool, "idem: in doubt: left in flight by a process that died");
        Ok(self.cas(key, Some(bytes), Some(&doubt))?.is_ok())
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

    /// sled's compare-and-swap. `Ok(Ok(ticket))` when it happened (the ticket, if any,
    /// completes once it is durable), `Ok(Err(current))` with the stored bytes when they were
    /// not `old`.
    fn cas(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
    ) -> Result<Result<Option<Ticket>, Option<sled::IVec>>, StoreError> {
        let was_in_flight = old
            .is_some_and(|old| decode(key, old).is_ok_and(|view| view.status == Status::InFlight));
        let in_flight = new.is_some_and(|new| new.status == Status::InFlight);
        let new = new.map(encode);
        if let Some(syncer) = &self.syncer {
            syncer.begin_write();
        }
        let swapped = if was_in_flight || in_flight {
            self.swap_indexed(key, old, new, in_flight)
        } else {
            // Neither side is in flight: the index is not concerned.
            self.tree.compare_and_swap(key, old, new).map(|swap| swap.map_err(|c| c.current))
        };
        let won = matches!(swapped, Ok(Ok(())));
        let ticket = self.syncer.as_deref().and_then(|syncer| syncer.end_write(won));
        match swapped {
            Ok(Ok(())) => {
                self.hub.notify(&String::from_utf8_lossy(key));
                Ok(Ok(ticket))
            }
            Ok(Err(current)) => Ok(Err(current)),
            Err(e) => Err(io_error(&self.path, "cannot write to", e)),
        }
    }

    /// A compare-and-swap of the record that keeps the in-flight index a superset of the
    /// in-flight records at every point a crash can stop at: a key is entered before its record
    /// goes in flight and removed after it leaves, and sled recovers a prefix of its writes. The
    /// key's lock keeps another writer of the same key from slipping between the two writes, so
    /// a removal never drops the entry of a newer reservation. (A sled transaction would tie the
    /// two writes too, but it takes sled's global write lock, which waits for every flush: it
    /// made fresh calls on a large store ten times slower.)
    fn swap_indexed(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<Vec<u8>>,
        in_flight: bool,
    ) -> sled::Result<Result<(), Option<sled::IVec>>> {
        let stripe = key.iter().fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b.into()));
        let _key = self.key_locks[stripe % self.key_locks.len()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if in_flight {
            self.index.insert(key, &[][..])?;
        }
        let swapped = self.tree.compare_and_swap(key, old, new)?.map_err(|c| c.current);
        let still_needed = match &swapped {
            Ok(()) => in_flight,
            // Not swapped: the entry stays only for a record that is in flight.
            Err(current) => current.as_deref().is_some_and(|bytes| {
                decode(key, bytes).is_ok_and(|view| view.status == Status::InFlight)
            }),
        };
        if !still_needed {
            self.index.remove(key)?;
        }
        Ok(swapped)
    }

    /// Swaps `current` for `new` if it is still stored; the ticket of the swap, or `None`
    /// when it was not (`Some(None)`: swapped, nothing to wait for).
    fn replace_now(
        &self,
        current: &Record,
        new: Option<&Record>,
    ) -> Result<Option<Option<Ticket>>, StoreError> {
        let key = current.key.as_bytes();
        match self.read(&current.key)? {
            Some(bytes) if current.fence().admits(decode(key, &bytes)?.fence()) => {
                Ok(self.cas(key, Some(&bytes), new)?.ok())
            }
            _ => Ok(None),
        }
    }

    /// The record under `key`, once it is durable.
    async fn read_durable(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let record = match self.read(key)? {
            Some(bytes) => Some(decode(key.as_bytes(), &bytes)?.to_record(key)),
            None => None,
        };
        self.durable().await?;
        Ok(record)
    }
}

impl Store for SledStore {
    fn owner_id(&self) -> &str {
        &self.owner
    }

    fn reserve<'a>(&'a self, record: &'a Record) -> StoreFuture<'a, Reserved> {
        Box::pin(async move {
            let key = record.key.as_bytes();
            // Most calls that find their key are replays: a read answers them without encoding
            // the record or attempting a swap. The insert below stays atomic either way.
            if let Some(bytes) = self.read(&record.key)? {
                let existing = decode(key, &bytes)?.to_record(&record.key);
                self.durable().await?;
                return Ok(Reserved::Taken(existing));
            }
            match self.cas(key, None, Some(record))? {
                Ok(ticket) => {
                    if let Some(ticket) = ticket {
                        ticket.await?;
                    }
                    Ok(Reserved::Mine)
                }
                Err(Some(bytes)) => {
                    let existing = decode(key, &bytes)?.to_record(&record.key);
                    self.durable().await?;
                    Ok(Reserved::Taken(existing))
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
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            match self.replace_now(current, new)? {
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

    fn replace_detached(&self, current: &Record, new: Option<Record>) {
        match self.replace_now(current, new.as_ref()) {
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
            let watch = self.hub.watch(key);
            let current = self.read_durable(key).await?;
            match &current {
                Some(record) if record.fence() == seen.fence() => {}
                _ => return Ok(current),
            }
            let _ = crate::exec::until(watch, deadline).await;
            self.read_durable(key).await
        })
    }

    fn owner_alive(&self, record: &Record) -> bool {
        // sled is single-process: only this instance can be running a body.
        record.owner.is_of(&self.owner)
    }

    fn scan(&self) -> StoreFuture<'_, Vec<Record>> {
        Box::pin(async move {
            let mut records = Vec::new();
            for entry in self.tree.iter() {
                let (key, bytes) = entry.map_err(|e| io_error(&self.path, "cannot read", e))?;
                records.push(decode(&key, &bytes)?.to_record(&String::from_utf8_lossy(&key)));
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
            match self.read(key)? {
                Some(bytes) => {
                    let record = decode(key.as_bytes(), &bytes)?.to_record(key);
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
