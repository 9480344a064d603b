//! The process default store: installed by the caller, or opened by its name on first use,
//! with what runs beside it (see `open/`). Where it lives when no one says is the store's
//! naming (`store/default.rs`).

use std::sync::{Arc, RwLock};

use crate::error::Error;
use crate::store::default::default_store_name;
use crate::store::name::StoreName;
use crate::store::Store;

static DEFAULT: RwLock<Option<Arc<dyn Store>>> = RwLock::new(None);

/// Installs the store that idempotent calls use when they name none. The store is opened by the
/// caller, so a store that cannot be opened fails here, at start-up, not at the first call.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// idem_runtime::set_default_store(std::sync::Arc::new(idem_runtime::SledStore::open(dir.path())?));
/// # Ok(()) }
/// ```
pub fn set_default_store(store: Arc<dyn Store>) {
    *DEFAULT.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
}

/// Opens the store `name` gives and installs it as the process default store: the named
/// companion of [`set_default_store`], for a name taken from configuration. Returns the store.
pub fn set_default_store_named(name: &str) -> Result<Arc<dyn Store>, Error> {
    let store = StoreName::parse(name)?.open()?;
    set_default_store(Arc::clone(&store));
    Ok(store)
}

/// The process default store: the one installed with [`set_default_store`], else a sled store
/// opened at [`default_store_path`](crate::store::default::default_store_path) on first use (creating its parent directories).
pub fn default_store() -> Result<Arc<dyn Store>, Error> {
    if let Some(store) = DEFAULT.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(Arc::clone(store));
    }
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = slot.as_ref() {
        return Ok(Arc::clone(store));
    }
    let name = default_store_name()?;
    let store = name.open()?;
    *slot = Some(Arc::clone(&store));
    #[cfg(unix)]
    if let StoreName::Sled(path) = &name {
        socket_at_exit::remove_at_exit(path);
    }
    Ok(store)
}

/// Opens the process default store now, as the first idempotent call would, and returns it.
/// Call it at start-up so that a server whose store cannot be opened (a path it may not
/// create, a sled store another process holds) exits with the reason before it serves, rather
/// than fail its first tool call:
///
/// ```no_run
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let store = idem_runtime::open_default_store()?;
/// // … serve; every idempotent call uses `store`.
/// # Ok(()) }
/// ```
pub fn open_default_store() -> Result<Arc<dyn Store>, Error> {
    default_store()
}

/// The default store lives in a static, which Rust never drops, so the removal of its admin
/// socket that closing a store does never runs: a process that exits cleanly removes it here
/// instead, as `exit` runs (`atexit`), so that no socket is left behind to look as if the store
/// were still served. Only the socket the store made is removed (the file's device and inode
/// are checked), and nothing else of the store is touched: every write it acknowledged is
/// already as durable as its durability says, and sled's lock goes with the process. A store
/// installed with [`set_default_store`] is the caller's to close.
#[cfg(unix)]
mod socket_at_exit {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, Once};

    /// The socket to remove at exit, with its device and inode.
    static SOCKET: Mutex<Option<(PathBuf, (u64, u64))>> = Mutex::new(None);

    /// Removes the admin socket of the store in `dir`, as it is now, when the process exits.
    pub(super) fn remove_at_exit(dir: &Path) {
        let path = dir.join(crate::remote::wire::SOCKET_FILE);
        let Ok(meta) = std::fs::symlink_metadata(&path) else { return };
        if !meta.file_type().is_socket() {
            return;
        }
        *SOCKET.lock().unwrap_or_else(|e| e.into_inner()) = Some((path, (meta.dev(), meta.ino())));
        static REGISTERED: Once = Once::new();
        REGISTERED.call_once(|| {
            // SAFETY: `remove` is an `extern "C" fn()` that never unwinds (it neither panics
            // nor blocks: `try_lock`, and file-system calls that return errors).
            unsafe { libc::atexit(remove) };
        });
    }

    extern "C" fn remove() {
        // Another thread may hold the lock as the process exits: leave the socket then, as a
        // killed process would (the next open replaces it).
        let Ok(mut slot) = SOCKET.try_lock() else { return };
        let Some((path, identity)) = slot.take() else { return };
        let ours =
            std::fs::symlink_metadata(&path).is_ok_and(|meta| (meta.dev(), meta.ino()) == identity);
        if ours {
            let _ = std::fs::remove_file(&path);
        }
    }
}
