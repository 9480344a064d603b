//! Opening the sled store: its options, the lock, the files sled creates, and the clean-up of
//! what a dead process left (records in flight, chunks no record points to).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::chunks::Chunks;
use super::encoding::decode;
use super::files::Files;
use super::{io_error, SledStore, CHUNKS, TREE};
use crate::error::StoreError;
use crate::loom::Arc;
use crate::protocol::Status;
use crate::record::now_ms;
use crate::store::notify::Hub;
use crate::store::sync::Syncer;
use crate::store::Durability;

/// Options for [`SledStore`]: durability, cache size and the default wait.
#[derive(Clone, Debug)]
pub struct SledStoreBuilder {
    pub(super) path: PathBuf,
    pub(super) durability: Durability,
    pub(super) cache_bytes: u64,
    pub(super) default_wait: Duration,
    pub(super) create: bool,
    pub(super) lock_wait: Duration,
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

    /// Opens the store.
    pub fn open(self) -> Result<SledStore, crate::Error> {
        SledStore::open_with(self).map_err(|source| crate::Error::store(None, None, source))
    }
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

impl SledStore {
    pub(super) fn open_with(options: SledStoreBuilder) -> Result<SledStore, StoreError> {
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
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(sled::Error::Io(e))) if e.to_string().contains("could not acquire lock") => {
                return Err(StoreError::new(format!(
                    "the store at {} is open in another process (sled takes an exclusive \
                     lock): stop that process, or use the PostgreSQL store to share one store \
                     between processes",
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
        let chunks = Chunks {
            tree: db
                .open_tree(CHUNKS)
                .map_err(|e| io_error(&path, "cannot open result chunks in", e))?,
        };
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
                let mut files = match durability {
                    Durability::Fsync => Some(
                        Files::open(&path)
                            .map_err(|e| io_error(&path, "cannot sync the files of", e))?,
                    ),
                    _ => None,
                };
                let sync = Box::new(move || {
                    db.flush().map_err(|e| e.to_string())?;
                    if let Some(files) = &mut files {
                        files.sync().map_err(|e| e.to_string())?;
                    }
                    Ok(())
                });
                Some(
                    Syncer::start("idem-sled-sync", sync)
                        .map_err(|e| io_error(&path, "cannot start the sync thread for", e))?,
                )
            }
        };
        let store = SledStore {
            tree,
            chunks,
            db,
            path,
            owner,
            durability: options.durability,
            default_wait: options.default_wait,
            syncer,
            hub: Arc::new(Hub::default()),
        };
        store.mark_orphans_in_doubt()?;
        store.chunks.remove_orphans(&store.tree)?;
        Ok(store)
    }

    /// Any `InFlight` record found at open belongs to a process that died mid-call.
    fn mark_orphans_in_doubt(&self) -> Result<(), StoreError> {
        let mut marked = 0usize;
        for entry in self.tree.iter() {
            let (key, bytes) = entry.map_err(|e| io_error(&self.path, "cannot read", e))?;
            let Ok(view) = decode(&key, &bytes) else { continue };
            if view.status == Status::InFlight {
                let record = view.to_record(&String::from_utf8_lossy(&key));
                let doubt = record.in_doubt(now_ms());
                tracing::warn!(key = %record.key, tool = %record.tool, "idem: in doubt: left in flight by a process that died");
                if self.cas(&key, Some(&bytes), Some(&doubt))?.is_ok() {
                    marked += 1;
                }
            }
        }
        if marked > 0 {
            crate::exec::block_on(self.durable())?;
        }
        Ok(())
    }
}
