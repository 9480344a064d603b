//! The store conformance suite against real SQLite stores, each in a file of its own temp dir.

use std::sync::Arc;

use idem_runtime::{SqliteStore, Store};

fn sqlite_store() -> Option<(Arc<dyn Store>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SqliteStore::open(dir.path().join("idem.sqlite")).expect("a fresh store opens");
    Some((Arc::new(store), dir))
}

idem_runtime::conformance_suite!(sqlite_store);
