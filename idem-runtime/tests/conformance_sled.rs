//! The store conformance suite against real sled stores, each in its own temp dir.

use std::sync::Arc;

use idem_runtime::{SledStore, Store};

fn sled_store() -> Option<(Arc<dyn Store>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SledStore::open(dir.path().join("idem.sled")).expect("a fresh store opens");
    Some((Arc::new(store), dir))
}

idem_runtime::conformance_suite!(sled_store);
