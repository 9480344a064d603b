//! Opening the store that `--store` names. Every backend is chosen here, so that another one is
//! one more arm.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use idem_runtime::{Durability, SledStore, Store};

use crate::failure::Failure;

/// Opens the store `--store` names, else `$IDEM_STORE`, else `./idem.sled` — the same place the
/// process default store is. A store that does not exist is an error: creating an empty one at a
/// mistyped path would make every record look gone.
pub(crate) fn open(store: Option<&OsStr>) -> Result<Box<dyn Store>, Failure> {
    let location: OsString = match store {
        Some(location) => location.to_owned(),
        None => idem_runtime::default_store_path().into_os_string(),
    };
    match location.to_str() {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            open_postgres(url)
        }
        _ => open_sled(Path::new(&location)),
    }
}

fn open_sled(path: &Path) -> Result<Box<dyn Store>, Failure> {
    // Fsync, as for any caller: `resolve` and `purge` change records an agent will replay.
    let store = SledStore::builder(path).create(false).durability(Durability::Fsync).open()?;
    Ok(Box::new(store))
}

fn open_postgres(_url: &str) -> Result<Box<dyn Store>, Failure> {
    Err(Failure::failed(
        "this idem was built without PostgreSQL support (the idem-postgres store is not part \
         of it yet): point --store at a sled directory",
    ))
}
