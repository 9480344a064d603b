//! What the rig tests share.

use std::sync::{Arc, OnceLock};

/// One sled store for the whole test binary: the default store is set once per process.
pub fn store() -> Arc<dyn idem::Store> {
    static STORE: OnceLock<(tempfile::TempDir, Arc<dyn idem::Store>)> = OnceLock::new();
    let (_, store) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store: Arc<dyn idem::Store> =
            Arc::new(idem::SledStore::open(dir.path().join("idem.sled")).expect("sled opens"));
        idem::set_default_store(store.clone());
        (dir, store)
    });
    store.clone()
}
