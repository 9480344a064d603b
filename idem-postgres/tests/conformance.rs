//! The runtime's store conformance suite against PostgreSQL, each check on a table of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::Store;

fn pg_store() -> Option<(Arc<dyn Store>, common::DropSchema)> {
    let (url, schema, guard) = common::scratch_schema("conf")?;
    // A lease longer than the suite's 20 s waits: a waiter that missed the owner's announcement
    // would otherwise still wake in time, at the lease's end, and the suite's checks that a
    // waiter wakes on the change could not fail.
    let store = PgStore::builder(&url)
        .schema(&schema)
        .lease(Duration::from_secs(60))
        .pool_size(8)
        .connect()
        .expect("the test database connects");
    Some((Arc::new(store), guard))
}

idem_runtime::conformance_suite!(pg_store);
