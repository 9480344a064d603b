//! Opening the store that `--store` names. Every backend is chosen here, so that another one is
//! one more arm; what is chosen is where the admin operations run: on a store this command opens
//! ([`Local`]), or, when another process holds a sled store, in that process through its admin
//! socket ([`idem_runtime::remote::Remote`]). Both give the same values and errors, so every
//! subcommand prints the same either way.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{Admin, Local};
use idem_runtime::{Durability, SledStore, Store};

use crate::failure::Failure;

/// How long to wait for a sled store's lock: sled releases it a moment after its holder closes
/// the store, so an operator who runs `idem` as the agent exits should not see it as held.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(1);

/// Opens the store `--store` names, else the process default store's place
/// (`idem_runtime::default_store_path`: `$IDEM_STORE`, else the data directory's). A store that does not exist is an error: creating an empty one at a
/// mistyped path would make every record look gone.
pub(crate) fn open(store: Option<&OsStr>) -> Result<Box<dyn Admin>, Failure> {
    let location: OsString = match store {
        Some(location) => location.to_owned(),
        None => idem_runtime::default_store_path().into_os_string(),
    };
    match location.to_str() {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            open_postgres(url).map(local)
        }
        _ => open_sled(Path::new(&location)),
    }
}

/// A sled store that a running process holds is reached through that process's admin socket;
/// otherwise this command opens it.
fn open_sled(path: &Path) -> Result<Box<dyn Admin>, Failure> {
    #[cfg(unix)]
    if let Some(remote) = idem_runtime::remote::Remote::connect(path)? {
        return Ok(Box::new(remote));
    }
    // Fsync, as for any caller: `resolve` and `purge` change records an agent will replay.
    let store = SledStore::builder(path)
        .create(false)
        .durability(Durability::Fsync)
        .lock_wait(SLED_LOCK_WAIT)
        // A command that runs for a moment serves no one, and removes nothing behind the
        // operator's back: retention belongs to the processes that hold the store.
        .admin_socket(false)
        .retention(None)
        .open()?;
    Ok(local(Arc::new(store)))
}

fn local(store: Arc<dyn Store>) -> Box<dyn Admin> {
    Box::new(Local::new(store))
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Arc<dyn Store>, Failure> {
    // One command needs few connections; `create(false)`: a mistyped database is an error.
    // No retention: it belongs to the fleet's processes, not to a command run for a moment.
    let store = idem_postgres::PgStore::builder(url)
        .pool_size(2)
        .create(false)
        .retention(None)
        .connect()?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str) -> Result<Arc<dyn Store>, Failure> {
    Err(Failure::failed(
        "this idem was built without PostgreSQL support: rebuild it with the `postgres` \
         feature, or point --store at a sled directory",
    ))
}
