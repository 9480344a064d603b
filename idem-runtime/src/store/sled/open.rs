//! Opening the sled store's storage: its options, the lock, the files sled creates, and the
//! clean-up of what a dead process left (records in flight, chunks no record points to). What
//! runs beside it (the retention passes, the admin socket) is started by its opener,
//! `SledStoreBuilder::open` in the engine's `open/sled.rs`, which reads the options for them
//! here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::chunks::Chunks;
use super::encoding::view::decode;
use super::files::Files;
use super::history::History;
use super::{io_error, SledStore, CHUNKS, HISTORY, INDEXED, IN_FLIGHT, TREE};
use crate::error::StoreError;
use crate::lifecycle::now_ms;
use crate::lifecycle::owner::MAX_INSTANCE;
use crate::lifecycle::transition;
use crate::lifecycle::Status;
use crate::loom::Arc;
use crate::store::beside::Beside;
use crate::store::notify::Notifier;
use crate::store::sync::{Gather, Syncer};
use crate::store::{CommonOptions, Durability, Instance};

/// Options for [`SledStore`]: durability, cache size, locking, the admin socket, retention.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct SledStoreBuilder {
    pub(super) path: PathBuf,
    /// The options every store's builder has (durability, create, group access, retention).
    pub(crate) common: CommonOptions,
    pub(super) cache_bytes: u64,
    pub(super) lock_wait: Duration,
    pub(crate) admin_socket: bool,
    pub(super) gather: Gather,
    pub(super) recent_bytes: u64,
}

crate::store_options! {
    SledStoreBuilder {
        durability,
        create,
        /// sled creates the files in the store's directory itself, with the umask's mode (it
        /// lets no one choose another): for the group to write them too, the processes need a
        /// umask that leaves it write (`umask 007`). The admin socket stays its user's alone.
        group_access,
        retention,
    }
}

impl SledStoreBuilder {
    pub(super) fn new(path: &Path) -> SledStoreBuilder {
        SledStoreBuilder {
            path: path.to_owned(),
            common: CommonOptions::default(),
            cache_bytes: 64 * 1024 * 1024,
            lock_wait: Duration::ZERO,
            admin_socket: true,
            gather: Gather::Adaptive,
            recent_bytes: 16 * 1024 * 1024,
        }
    }

    /// sled's page cache, in bytes; 64 MiB by default (sled's own default is 1 GiB).
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
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

    /// Memory for the finished records this process wrote or read lately, so that replaying
    /// one (a retry soon after its call, the commonest replay) costs the same in a store of a
    /// million records as in a small one; 16 MiB by default, 0 for none. The cache holds only
    /// what sled holds (every write of a key updates it under the key's lock) and gives up
    /// nothing of durability: a replay from it still waits for the store's durable point.
    pub fn recent_records(mut self, bytes: u64) -> Self {
        self.recent_bytes = bytes;
        self
    }

    /// The longest a durable point waits, before it starts, for the writes of callers it
    /// expects to share it; `Duration::ZERO` starts every durable point on the first write that
    /// asks for one. By default it adapts: a durable point about to start for fewer writes than
    /// the last one answered waits for the rest, for up to a quarter of the time the last one
    /// took (at most 1 ms), and one caller writing alone never waits. Callers answered by one
    /// durable point come back together, microseconds apart; one that starts on the first of
    /// them makes the others wait for a whole second one. See BENCHMARKS.md, "Group commit
    /// against its limit", for what it gains and where it stops.
    pub fn group_commit_wait(mut self, wait: Duration) -> Self {
        self.gather = if wait.is_zero() { Gather::Off } else { Gather::UpTo(wait) };
        self
    }
}

impl SledStore {
    /// Opens the storage `options` give, and settles what a dead process left in it: nothing
    /// runs beside it yet.
    pub(crate) fn open_storage(options: &SledStoreBuilder) -> Result<SledStore, StoreError> {
        check_path(options)?;
        // sled would create the directory with the umask's mode, and every file in it so too:
        // the directory, made first with the store's access, is what keeps other users out.
        if options.common.create && !options.path.exists() {
            let path = &options.path;
            options
                .common
                .access()
                .create_dirs(path)
                .map_err(|e| io_error(path, "cannot create", e))?;
        }
        let path = options.path.clone();
        let db = open_db(options)?;
        let trees = Trees::open(&db, &path)?;
        let owner = instance()?;
        let syncer = start_syncer(&db, &path, options)?;
        let store = SledStore {
            beside: Beside::default(),
            tree: trees.records,
            index: trees.index,
            chunks: trees.chunks,
            history: trees.history,
            db,
            path,
            owner,
            durability: options.common.durability,
            syncer,
            notifier: Arc::new(Notifier::default()),
            key_locks: (0..64).map(|_| std::sync::Mutex::new(())).collect(),
            recent: std::sync::Arc::new(super::recent::Recent::new(options.recent_bytes)),
        };
        store.settle_orphans()?;
        Ok(store)
    }

    /// A second handle to this store: the same trees, owner, sync thread, notifications, key
    /// locks and cache, so that its writes are fenced, durable and seen by waiters like any
    /// write here, and refused once a failed sync has poisoned the store. Nothing runs beside
    /// it: it is what the opener runs the retention passes and the admin socket on.
    pub(crate) fn handle(&self) -> SledStore {
        SledStore {
            beside: Beside::default(),
            tree: self.tree.clone(),
            index: self.index.clone(),
            chunks: self.chunks.clone(),
            history: self.history.clone(),
            db: self.db.clone(),
            path: self.path.clone(),
            owner: self.owner.clone(),
            durability: self.durability,
            syncer: self.syncer.clone(),
            notifier: Arc::clone(&self.notifier),
            key_locks: std::sync::Arc::clone(&self.key_locks),
            recent: std::sync::Arc::clone(&self.recent),
        }
    }

    /// Settles what a dead process left: any `InFlight` record (it died mid-call) is marked in
    /// doubt, and chunks no record points to are removed. The index names the keys to look at;
    /// a store written before the index existed is scanned whole, once, and then marked as
    /// indexed (after it is settled, so a crash mid-way scans again).
    fn settle_orphans(&self) -> Result<(), StoreError> {
        let read_error = |e| io_error(&self.path, "cannot read", e);
        let write_error = |e| io_error(&self.path, "cannot write to", e);
        let indexed = self.db.get(INDEXED).map_err(read_error)?.is_some();
        let mut marked = 0usize;
        if indexed {
            for entry in self.index.iter() {
                let (key, _) = entry.map_err(read_error)?;
                let bytes = self.tree.get(&key).map_err(read_error)?;
                let view = bytes.as_ref().and_then(|bytes| decode(&key, bytes).ok());
                // A damaged record's chunks are left alone: they may be all that is left of it.
                if bytes.is_none() || view.is_some() {
                    let keep = view.as_ref().and_then(|view| view.spilled).map(|s| s.id);
                    self.chunks.remove_orphans_of(&key, keep).map_err(write_error)?;
                }
                // A purge that stopped after deleting its record left some of the history it
                // ends.
                if bytes.is_none() {
                    self.history.finish_purge(&key).map_err(write_error)?;
                }
                let in_flight = match &bytes {
                    Some(bytes) => self.mark_if_in_flight(&key, bytes)?,
                    None => false,
                };
                marked += usize::from(in_flight);
                // Marking in doubt drops the entry itself; every other key is settled now.
                if !in_flight {
                    self.index.remove(&key).map_err(write_error)?;
                }
            }
        } else {
            for entry in self.tree.iter() {
                let (key, bytes) = entry.map_err(read_error)?;
                marked += usize::from(self.mark_if_in_flight(&key, &bytes)?);
            }
            self.chunks.remove_orphans(&self.tree)?;
            self.db.insert(INDEXED, &[1u8][..]).map_err(write_error)?;
            tracing::info!(store = %self.path.display(), "idem: indexed the in-flight records of a store written by an earlier idem (once)");
        }
        if marked > 0 || !indexed {
            match &self.syncer {
                Some(_) => crate::exec::block_on(self.durable())?,
                // No sync thread, but the one-time migration is worth keeping.
                None => {
                    self.db.flush().map_err(write_error)?;
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
        tracing::warn!(key = %record.key, tool = %record.tool, "idem: in doubt: left in flight by a process that died");
        let step = transition::mark_died(&record, self.owner.id(), now_ms());
        Ok(self.cas(key, Some(bytes), step.new.as_ref(), step.change)?.is_ok())
    }
}

/// Refuses a path that holds no store when the options say not to create one, and a path that
/// is a file.
fn check_path(options: &SledStoreBuilder) -> Result<(), StoreError> {
    let path = &options.path;
    if !options.common.create && !path.join("conf").exists() {
        return Err(StoreError::new(format!(
            "no idem store at {}: check the path (or $IDEM_STORE); it is created by the first \
             idempotent call",
            path.display()
        )));
    }
    if path.exists() && !path.is_dir() {
        return Err(StoreError::new(format!(
            "{} is a file, not a store directory: point the store at a directory",
            path.display()
        )));
    }
    Ok(())
}

/// Opens sled's database, waiting up to the options' `lock_wait` for another holder's lock,
/// with an error that says what to do for each way it fails.
fn open_db(options: &SledStoreBuilder) -> Result<sled::Db, StoreError> {
    let path = &options.path;
    let config = sled::Config::new().path(path).cache_capacity(options.cache_bytes).flush_every_ms(
        match options.common.durability {
            // With no durable points of its own, let sled's background flusher write.
            Durability::None => Some(500),
            _ => None,
        },
    );
    // sled 0.34 can panic on some damaged files instead of returning an error: never let that
    // reach the caller as a panic.
    let lock_deadline = crate::time::deadline_after(Instant::now(), options.lock_wait);
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
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(sled::Error::Io(e))) if e.to_string().contains("could not acquire lock") => {
            Err(held_elsewhere(path))
        }
        Ok(Err(e)) => Err(StoreError::with_source(
            format!(
                "cannot open the store at {}: it may be damaged or not an idem store; move it \
                 aside and inspect it",
                path.display()
            ),
            e,
        )),
        Err(_) => Err(StoreError::new(format!(
            "cannot open the store at {}: sled failed reading it, so it is likely damaged; move \
             it aside and inspect it",
            path.display()
        ))),
    }
}

/// The trees the store keeps in sled's database.
struct Trees {
    records: sled::Tree,
    chunks: Chunks,
    history: History,
    index: sled::Tree,
}

impl Trees {
    fn open(db: &sled::Db, path: &Path) -> Result<Trees, StoreError> {
        let open = |name: &str, what: &str| {
            db.open_tree(name).map_err(|e| io_error(path, &format!("cannot open {what} in"), e))
        };
        Ok(Trees {
            records: open(TREE, "records")?,
            chunks: Chunks { tree: open(CHUNKS, "result chunks")? },
            history: History::new(open(HISTORY, "histories")?),
            index: open(IN_FLIGHT, "the in-flight index")?,
        })
    }
}

/// This open's store instance, which every record its calls own names.
fn instance() -> Result<Instance, StoreError> {
    let owner = Instance::new("sled");
    // A record reserves room for an owner of at most MAX_OWNER bytes (see `lifetime_len`).
    if owner.id().len() > MAX_INSTANCE {
        return Err(StoreError::new(format!(
            "the store instance {} is longer than the {MAX_INSTANCE} bytes a sled record \
             leaves for it: give the machine a shorter host name",
            owner.id()
        )));
    }
    Ok(owner)
}

/// The sync thread that makes writes durable (group commit), unless the store keeps nothing
/// durable: sled's flush, then with `Fsync` an `fdatasync` of its files.
fn start_syncer(
    db: &sled::Db,
    path: &Path,
    options: &SledStoreBuilder,
) -> Result<Option<std::sync::Arc<Syncer>>, StoreError> {
    let durability = options.common.durability;
    if durability == Durability::None {
        return Ok(None);
    }
    let mut files = match durability {
        Durability::Fsync => {
            Some(Files::open(path).map_err(|e| io_error(path, "cannot sync the files of", e))?)
        }
        _ => None,
    };
    let db = db.clone();
    let sync = Box::new(move || {
        db.flush().map_err(|e| e.to_string())?;
        if let Some(files) = &mut files {
            files.sync().map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let syncer = Syncer::start("idem-sled-sync", options.gather, sync)
        .map_err(|e| io_error(path, "cannot start the sync thread for", e))?;
    Ok(Some(std::sync::Arc::new(syncer)))
}

/// The error for a store that another process holds: what is happening, and which stores
/// several processes can share.
fn held_elsewhere(path: &std::path::Path) -> StoreError {
    StoreError::new(format!(
        "the sled store at {} is open in another process, which holds it: sled lets one \
         process open a store at a time; stop that process, give this one a store of its own \
         ($IDEM_STORE), or, for several processes on one store, use the SQLite store \
         ($IDEM_STORE=sqlite:PATH, one machine) or the PostgreSQL store (idem-postgres). The \
         `idem` command reaches a held store's records through the \
         holder's admin socket, when it serves one (the default)",
        path.display()
    ))
}
