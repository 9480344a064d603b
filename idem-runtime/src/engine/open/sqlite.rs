//! Opening a SQLite store: its file (`store/sqlite/open.rs`), then beside it the retention
//! passes its builder's policy asks for.

use std::path::Path;

use super::{policy, start_retainer};
use crate::error::{Error, StoreError};
use crate::lifecycle::retention::RetentionStatus;
use crate::store::sqlite::{SqliteStore, SqliteStoreBuilder};

impl SqliteStoreBuilder {
    /// Opens the store, with the retention passes its options ask for.
    pub fn open(self) -> Result<SqliteStore, Error> {
        open(self).map_err(|source| Error::store(None, None, source))
    }
}

impl SqliteStore {
    /// Opens (or creates) the store in the file `path` with the default options.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        SqliteStore::builder(path).open()
    }

    /// The retention policy run beside this store, and what its passes removed so far; `None`
    /// when none runs.
    pub fn retention(&self) -> Option<RetentionStatus> {
        self.beside.retention()
    }
}

fn open(options: SqliteStoreBuilder) -> Result<SqliteStore, StoreError> {
    let policy = policy(&options.common)?;
    let mut store = SqliteStore::open_storage(options)?;
    if let Some(retainer) = start_retainer(policy, || store.handle())? {
        store.beside.keep(retainer);
    }
    Ok(store)
}
