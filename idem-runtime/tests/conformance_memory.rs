//! The store conformance suite against the reference store in memory, a fresh one per check.

use std::sync::Arc;

use idem_runtime::{MemoryStore, Store};

fn memory_store() -> Option<Arc<dyn Store>> {
    Some(Arc::new(MemoryStore::new()))
}

idem_runtime::conformance_suite!(memory_store);
