//! Opening the store that `--store` names. Every backend is chosen here, so that another one is
//! one more arm; what is chosen is where the admin operations run: on a store this command opens
//! ([`Local`]), or, when another process holds a sled store, in that process through its admin
//! socket ([`idem_runtime::remote::Remote`]). Both give the same values and errors, so every
//! subcommand prints the same either way.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{Admin, Local};
use idem_runtime::{Durability, SledStore, Store, StoreName};

use crate::failure::Failure;

/// How long to wait for a sled store's lock: sled releases it a moment after its holder closes
/// the store, so an operator who runs `idem` as the agent exits should not see it as held.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(1);

/// Opens the store `--store` names, else the process default store
/// (`idem_runtime::default_store_name`: `$IDEM_STORE`, else the data directory's), both read as
/// every name is (`StoreName`: `sqlite:PATH`, `postgres://…`, or a sled directory). A store
/// that does not exist is an error: creating an empty one at a mistyped path would make every
/// record look gone.
pub(crate) fn open(store: Option<&OsStr>) -> Result<Box<dyn Admin>, Failure> {
    let name = match store {
        Some(name) => StoreName::parse(name)?,
        None => idem_runtime::default_store_name()?,
    };
    match &name {
        StoreName::Postgres(url) => open_postgres(url),
        StoreName::Sqlite(path) => open_sqlite(path),
        StoreName::Sled(path) => {
            name.check_kind()?;
            open_sled(path)
        }
        _ => Err(Failure::failed(format!("this idem cannot open the store {name}"))),
    }
}

/// Opens the store `--store` names (or the default one, read as [`open`] reads it) for a command
/// that makes calls and keeps running, `idem mcp-proxy`: as an agent opens its store, creating it
/// when missing (its first run has no records yet), with a sled store's admin socket and the
/// backend's default retention, so that `idem ls` and `idem resolve` reach it while it serves.
pub(crate) fn open_for_calls(store: Option<&OsStr>) -> Result<Arc<dyn Store>, Failure> {
    let name = match store {
        Some(name) => StoreName::parse(name)?,
        None => idem_runtime::default_store_name()?,
    };
    match &name {
        StoreName::Postgres(url) => connect_postgres(url),
        // sled and SQLite (or the refusal of a build without it) exactly as an agent's.
        _ => Ok(name.open()?),
    }
}

#[cfg(feature = "postgres")]
fn connect_postgres(url: &str) -> Result<Arc<dyn Store>, Failure> {
    Ok(Arc::new(idem_postgres::PgStore::connect(url)?))
}

#[cfg(not(feature = "postgres"))]
fn connect_postgres(_url: &str) -> Result<Arc<dyn Store>, Failure> {
    Err(no_postgres())
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
    Ok(local(store, SledStore::size_on_disk))
}

/// The admin operations on `store`, opened by this command, which knows where the store keeps
/// its bytes: `stats` reports what `size` reads.
fn local<S: Store>(store: S, size: fn(&S) -> Option<u64>) -> Box<dyn Admin> {
    let store = Arc::new(store);
    let sized = Arc::clone(&store);
    Box::new(Local::new(store).with_size(Arc::new(move || size(&sized))))
}

/// A SQLite store is opened directly even while agents use it: SQLite lets several processes
/// share the file, and the command's resolve or purge is fenced like any write.
#[cfg(feature = "sqlite")]
fn open_sqlite(path: &Path) -> Result<Box<dyn Admin>, Failure> {
    // Fsync, `create(false)` and no retention passes, as for sled.
    let store = idem_runtime::SqliteStore::builder(path)
        .create(false)
        .durability(Durability::Fsync)
        .retention(None)
        .open()?;
    Ok(local(store, idem_runtime::SqliteStore::size_on_disk))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(_path: &Path) -> Result<Box<dyn Admin>, Failure> {
    Err(Failure::failed(
        "this idem was built without SQLite support: rebuild it with the `sqlite` feature",
    ))
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Box<dyn Admin>, Failure> {
    // One command needs few connections; `create(false)`: a mistyped database is an error.
    // No retention: it belongs to the fleet's processes, not to a command run for a moment.
    let store = idem_postgres::PgStore::builder(url)
        .pool_size(2)
        .create(false)
        .retention(None)
        .connect()?;
    Ok(local(store, idem_postgres::PgStore::size_on_disk))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str) -> Result<Box<dyn Admin>, Failure> {
    Err(no_postgres())
}

#[cfg(not(feature = "postgres"))]
fn no_postgres() -> Failure {
    Failure::failed(
        "this idem was built without PostgreSQL support: rebuild it with the `postgres` \
         feature",
    )
}
