//! Opening a sled store: its storage (`store/sled/open.rs`), then beside it the retention
//! passes its builder's policy asks for and, unless the builder says not to, the admin socket
//! through which the `idem` command reaches a store this process holds.

use std::path::Path;

use super::{policy, start_retainer};
use crate::error::{Error, StoreError};
use crate::lifecycle::retention::RetentionStatus;
use crate::store::sled::{SledStore, SledStoreBuilder};

impl SledStoreBuilder {
    /// Opens the store, with the retention passes and the admin socket its options ask for.
    pub fn open(self) -> Result<SledStore, Error> {
        open(&self).map_err(|source| Error::store(None, None, source))
    }
}

impl SledStore {
    /// Opens (or creates) the store in directory `path` with the default options.
    pub fn open(path: impl AsRef<Path>) -> Result<SledStore, Error> {
        SledStore::builder(path).open()
    }

    /// The retention policy run beside this store, and what its passes removed so far; `None`
    /// when none runs.
    pub fn retention(&self) -> Option<RetentionStatus> {
        self.beside.retention()
    }
}

fn open(options: &SledStoreBuilder) -> Result<SledStore, StoreError> {
    let policy = policy(&options.common)?;
    let mut store = SledStore::open_storage(options)?;
    let retainer = start_retainer(policy, || store.handle())?;
    // Kept in this order, so that the socket stops serving before the passes stop.
    #[cfg(unix)]
    if options.admin_socket {
        if let Some(server) = serve_admin(&store, retainer.as_ref().map(super::report)) {
            store.beside.keep(server);
        }
    }
    if let Some(retainer) = retainer {
        store.beside.keep(retainer);
    }
    Ok(store)
}

/// Starts the admin socket on a second handle to `store`; `None`, with a warning, when it
/// cannot be made (the store works without it).
#[cfg(unix)]
fn serve_admin(
    store: &SledStore,
    retention: Option<crate::admin::RetentionReport>,
) -> Option<crate::remote::Server> {
    let handle = std::sync::Arc::new(store.handle());
    match crate::remote::Server::start(store.path(), handle, retention) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!(store = %store.path().display(), error = %e, "idem: no admin socket: the `idem` command cannot reach this store while this process holds it");
            None
        }
    }
}
