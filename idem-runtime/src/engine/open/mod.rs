//! Opening a store: the storage a backend opens, and what the engine and the operator
//! interface run beside it (the retention passes, a sled store's admin socket), started here
//! and kept with the store so that they stop before it closes. Every way a store is opened
//! comes through here: a builder's `open` (`sled.rs`, `sqlite.rs`; a backend of another crate
//! calls [`Beside::start`] once its storage is open), a name ([`open_store`],
//! [`StoreName::open`]) and the process default store (`default.rs`). A backend opens its
//! storage and knows nothing of what runs beside it.

use std::path::Path;
use std::sync::Arc;

use super::retention::Retainer;
use crate::admin::RetentionReport;
use crate::error::{Error, StoreError};
use crate::lifecycle::retention::{Retention, RetentionStatus};
use crate::store::beside::Beside;
use crate::store::name::{postgres_opener, StoreName};
use crate::store::sled::SledStore;
use crate::store::{CommonOptions, Store};

pub(crate) mod default;
mod sled;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The retention a builder's options give: its `retain` or `retention`, or else
/// `$IDEM_RETAIN`.
fn policy(options: &CommonOptions) -> Result<Option<Retention>, StoreError> {
    match &options.retention {
        Some(policy) => Ok(policy.clone()),
        None => Retention::from_env(),
    }
}

/// Starts the passes `policy` asks for, on the handle of the store `handle` makes.
fn start_retainer<S: Store>(
    policy: Option<Retention>,
    handle: impl FnOnce() -> S,
) -> Result<Option<Retainer>, StoreError> {
    policy.map(|policy| Retainer::start(Arc::new(handle()), policy)).transpose()
}

impl Beside {
    /// Starts what the engine runs beside a store that a backend outside this crate opened
    /// (PostgreSQL's `PgStoreBuilder::connect` calls it once its storage is ready), as it does
    /// for sled and SQLite: the retention passes its builder's `options` ask for (or
    /// `$IDEM_RETAIN`, when they set none), on the second handle of the store that `handle`
    /// makes. The store keeps what this returns as its first field, so that the passes stop
    /// before the rest of it closes.
    pub fn start<S: Store>(
        options: &CommonOptions,
        handle: impl FnOnce() -> S,
    ) -> Result<Beside, StoreError> {
        let mut beside = Beside::default();
        if let Some(retainer) = start_retainer(policy(options)?, handle)? {
            beside.keep(retainer);
        }
        Ok(beside)
    }

    /// The retention policy run beside the store, and what its passes removed so far; `None`
    /// when none runs.
    pub fn retention(&self) -> Option<RetentionStatus> {
        self.find::<Retainer>().map(Retainer::status)
    }
}

/// What `idem stats` reads of `retainer`'s passes.
#[cfg(unix)]
fn report(retainer: &Retainer) -> RetentionReport {
    let view = retainer.view();
    Arc::new(move || view.status())
}

/// Opens (creating it if missing, with its parent directories, which are the user's alone) the
/// store named `name`, read
/// as [`StoreName::parse`] reads it: `sqlite:PATH`, `postgres://…`, or a sled directory.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("idem.sled");
/// let store = idem_runtime::open_store(path.to_str().unwrap())?;
/// # drop(store);
/// # Ok(()) }
/// ```
pub fn open_store(name: &str) -> Result<Arc<dyn Store>, Error> {
    StoreName::parse(name)?.open()
}

impl StoreName {
    /// Opens (creating it if missing, with its parent directories) the store this name gives.
    pub fn open(&self) -> Result<Arc<dyn Store>, Error> {
        open_named(self)
    }
}

fn open_named(name: &StoreName) -> Result<Arc<dyn Store>, Error> {
    match name {
        StoreName::Sled(path) => {
            name.check_kind()?;
            Ok(Arc::new(open_sled_at(path)?))
        }
        StoreName::Sqlite(path) => open_sqlite(path),
        StoreName::Postgres(url) => match postgres_opener() {
            Some(open) => open(url),
            None => Err(Error::store(
                None,
                None,
                StoreError::new(format!(
                    "the store {name} is a PostgreSQL database, which this program opens \
                         only through idem's `postgres` feature: turn it on and call \
                         idem::open_default_store() (or idem::open_store) at start-up"
                ))
                .lasting(),
            )),
        },
    }
}

#[cfg(feature = "sqlite")]
fn open_sqlite(path: &Path) -> Result<Arc<dyn Store>, Error> {
    // The builder's defaults create the file and its missing parent directories, and say why
    // when they cannot.
    Ok(Arc::new(crate::store::sqlite::SqliteStore::open(path)?))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(path: &Path) -> Result<Arc<dyn Store>, Error> {
    let message = format!(
        "the store {}{} is a SQLite file, and this program was built without \
         idem's `sqlite` feature: turn it on in Cargo.toml",
        crate::store::name::SQLITE_PREFIX,
        path.display()
    );
    Err(Error::store(None, None, StoreError::new(message).lasting()))
}

/// Opens (or creates) the sled store at `path`: the builder's defaults create it with its
/// missing parent directories (each the user's alone, as the store's files: see
/// `store/access.rs`). A store that cannot be created is reported as such, naming the path and
/// the cause, and is not retryable: calling again fails the same way until someone changes the
/// path or its permissions.
fn open_sled_at(path: &Path) -> Result<SledStore, Error> {
    SledStore::open(path).map_err(|error| {
        // With no `conf` file, sled never wrote the store: it could not be created (a read-only
        // directory); a store that exists failed for another reason, reported as it is.
        if path.join("conf").exists() {
            error
        } else {
            cannot_create(path, &error)
        }
    })
}

/// The error for a store that cannot be created at `path`, for the deepest reason in `cause`.
fn cannot_create(path: &Path, cause: &(dyn std::error::Error + 'static)) -> Error {
    let mut root = cause;
    while let Some(source) = root.source() {
        root = source;
    }
    let message = format!(
        "cannot create the idem store at {} ({root}): set $IDEM_STORE to a directory this \
         process may create and write, or install a store with set_default_store",
        path.display()
    );
    Error::store(None, None, StoreError::new(message).lasting())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_is_created_with_its_parent_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/idem/idem.sled");
        drop(open_sled_at(&path).expect("the store and its parents are created"));
        assert!(path.join("conf").exists());
    }

    #[test]
    fn a_store_that_cannot_be_created_names_the_path_and_cause_and_is_not_retryable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "not a directory").unwrap();
        let path = file.join("idem.sled");
        let Err(error) = open_sled_at(&path) else { panic!("a store under a file opened") };
        let message = error.to_string();
        assert!(message.contains(&format!("cannot create the idem store at {}", path.display())));
        assert!(message.contains("os error 20"), "the cause (ENOTDIR): {message}");
        assert!(!error.is_retryable(), "nothing changes by calling again");
        assert_eq!(error.kind(), "store");
    }
}
