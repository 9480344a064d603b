//! The process default store.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::error::Error;
use crate::store::sled::SledStore;
use crate::store::Store;

static DEFAULT: RwLock<Option<Arc<dyn Store>>> = RwLock::new(None);

/// Installs the store that idempotent calls use when they name none.
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

/// Where the default store lives when none is installed: `$IDEM_STORE`, else `./idem.sled`.
pub fn default_store_path() -> PathBuf {
    std::env::var_os("IDEM_STORE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("idem.sled"))
}

/// The process default store: the one installed with [`set_default_store`], else a sled store
/// opened at [`default_store_path`] on first use.
pub fn default_store() -> Result<Arc<dyn Store>, Error> {
    if let Some(store) = DEFAULT.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(Arc::clone(store));
    }
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = slot.as_ref() {
        return Ok(Arc::clone(store));
    }
    let store: Arc<dyn Store> = Arc::new(SledStore::open(default_store_path())?);
    *slot = Some(Arc::clone(&store));
    Ok(store)
}
