//! Stores by name, with every kind this build has: `sqlite:PATH` (feature `sqlite`),
//! `postgres://…` (feature `postgres`, through `idem-postgres`, which the runtime cannot depend
//! on), and a sled directory. The runtime reads the names ([`crate::StoreName`]); the facade
//! tells it how to open a PostgreSQL one before it opens anything.

use std::sync::Arc;

use crate::{Error, Store};

/// Lets the runtime open `postgres://` names, when this build can.
fn register() {
    #[cfg(feature = "postgres")]
    idem_runtime::store::name::register_postgres(|url| {
        Ok(Arc::new(idem_postgres::PgStore::connect(url)?) as Arc<dyn Store>)
    });
}

/// Opens (creating it if missing) the store named `name`: `sqlite:PATH` (a SQLite file, which
/// several processes share; feature `sqlite`), `postgres://…` (a PostgreSQL database; feature
/// `postgres`) or a plain path (a sled directory). `$IDEM_STORE` and the `idem` command's
/// `--store` read names the same way.
///
/// ```
/// # fn main() -> Result<(), idem::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = idem::open_store(dir.path().join("idem.sled").to_str().unwrap())?;
/// # drop(store);
/// # Ok(()) }
/// ```
pub fn open_store(name: &str) -> Result<Arc<dyn Store>, Error> {
    register();
    idem_runtime::open_store(name)
}

/// Opens the store named `name` (as [`open_store`] reads it) and installs it as the process
/// default store: [`set_default_store`](crate::set_default_store) for a name from
/// configuration. Returns the store.
pub fn set_default_store_named(name: &str) -> Result<Arc<dyn Store>, Error> {
    register();
    idem_runtime::set_default_store_named(name)
}

/// The process default store: the one installed with
/// [`set_default_store`](crate::set_default_store), else the one `$IDEM_STORE` names (see
/// [`open_store`]), else a sled store at [`default_store_path`](crate::default_store_path),
/// opened on first use.
pub fn default_store() -> Result<Arc<dyn Store>, Error> {
    register();
    idem_runtime::default_store()
}

/// Opens the process default store now, as the first idempotent call would, and returns it.
/// Call it at start-up, so that a server whose store cannot be opened exits with the reason
/// before it serves; with `$IDEM_STORE` naming a PostgreSQL database, it is what connects it
/// (the first call alone cannot: see the README's "Naming a store").
pub fn open_default_store() -> Result<Arc<dyn Store>, Error> {
    register();
    idem_runtime::open_default_store()
}
