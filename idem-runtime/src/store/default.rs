//! The process default store, and where it lives when no one says.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::error::Error;
use crate::store::name::{in_home, StoreName};
use crate::store::Store;

static DEFAULT: RwLock<Option<Arc<dyn Store>>> = RwLock::new(None);

/// The store directory's name, under the data directory or in the working directory.
const STORE_DIR: &str = "idem.sled";

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

/// Where the default store lives when none is installed:
///
/// 1. `$IDEM_STORE`;
/// 2. else `./idem.sled` if a store is already there (where idem put it before it used the
///    data directory: its records, some perhaps in doubt, stay in use);
/// 3. else the user's data directory: `$XDG_DATA_HOME/idem/idem.sled`, else
///    `~/.local/share/idem/idem.sled` (`%LOCALAPPDATA%\idem\idem.sled` on Windows);
/// 4. else, with no home directory known, `./idem.sled`.
///
/// So a server that an MCP host starts in a directory the user did not choose finds the same
/// store on every start, and so does the `idem` command run from anywhere.
pub fn default_store_path() -> PathBuf {
    let here_has_a_store = Path::new(STORE_DIR).join("conf").exists();
    store_path(|name| std::env::var_os(name), here_has_a_store)
}

/// The default store, named: `$IDEM_STORE` read as [`StoreName::parse`] reads any name
/// (`sqlite:PATH`, `postgres://…`, or a sled directory), else the sled store at
/// [`default_store_path`].
pub fn default_store_name() -> Result<StoreName, Error> {
    match std::env::var_os("IDEM_STORE").filter(|name| !name.is_empty()) {
        Some(name) => StoreName::parse(name),
        None => Ok(StoreName::Sled(default_store_path())),
    }
}

/// Opens the store `name` gives and installs it as the process default store: the named
/// companion of [`set_default_store`], for a name taken from configuration. Returns the store.
pub fn set_default_store_named(name: &str) -> Result<Arc<dyn Store>, Error> {
    let store = StoreName::parse(name)?.open()?;
    set_default_store(Arc::clone(&store));
    Ok(store)
}

/// [`default_store_path`] over the environment `env` and whether `./idem.sled` holds a store.
fn store_path(env: impl Fn(&str) -> Option<OsString>, here_has_a_store: bool) -> PathBuf {
    if let Some(path) = env("IDEM_STORE").filter(|path| !path.is_empty()) {
        // A `~` is the home, as in every store name; one that names none is left as written,
        // for the open to refuse with its reason.
        let home = env("HOME");
        return in_home(&path, home.as_deref(), &path).unwrap_or_else(|_| PathBuf::from(path));
    }
    if here_has_a_store {
        return PathBuf::from(STORE_DIR);
    }
    // Relative values are ignored, as the XDG base directory specification asks.
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|path| path.is_absolute());
    let data_dir = if cfg!(windows) {
        absolute("LOCALAPPDATA")
    } else {
        absolute("XDG_DATA_HOME").or_else(|| absolute("HOME").map(|home| home.join(".local/share")))
    };
    match data_dir {
        Some(dir) => dir.join("idem").join(STORE_DIR),
        None => PathBuf::from(STORE_DIR),
    }
}

/// The process default store: the one installed with [`set_default_store`], else a sled store
/// opened at [`default_store_path`] on first use (creating its parent directories).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, value)| value.into())
    }

    #[test]
    #[cfg(not(windows))]
    fn the_default_store_is_in_the_data_directory_unless_told_or_already_here() {
        let home = [("HOME", "/home/ann")];
        assert_eq!(
            store_path(env(&home), false),
            Path::new("/home/ann/.local/share/idem/idem.sled")
        );
        let xdg = [("HOME", "/home/ann"), ("XDG_DATA_HOME", "/data")];
        assert_eq!(store_path(env(&xdg), false), Path::new("/data/idem/idem.sled"));
        let relative = [("HOME", "/home/ann"), ("XDG_DATA_HOME", "data")];
        assert_eq!(
            store_path(env(&relative), false),
            Path::new("/home/ann/.local/share/idem/idem.sled"),
            "a relative XDG_DATA_HOME is ignored"
        );
        assert_eq!(store_path(env(&home), true), Path::new("idem.sled"), "an existing store");
        let told = [("HOME", "/home/ann"), ("IDEM_STORE", "/srv/agent.sled")];
        assert_eq!(store_path(env(&told), true), Path::new("/srv/agent.sled"));
        let tilde = [("HOME", "/home/ann"), ("IDEM_STORE", "~/agent.sled")];
        assert_eq!(store_path(env(&tilde), false), Path::new("/home/ann/agent.sled"));
        assert_eq!(store_path(env(&[]), false), Path::new("idem.sled"), "no home known");
    }
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
