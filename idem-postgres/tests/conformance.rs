//! The runtime's store conformance suite against PostgreSQL, each check on a table of its own.

mod common;

use std::sync::Arc;

use idem_postgres::PgStore;
use idem_runtime::Store;

fn pg_store() -> Option<(Arc<dyn Store>, common::DropSchema)> {
    let url = common::database_url()?;
    let schema = common::unique_schema("conf");
    let guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
    let store = PgStore::builder(&url)
        .schema(&schema)
        .pool_size(8)
        .connect()
        .expect("the test database connects");
    Some((Arc::new(store), guard))
}

idem_runtime::conformance_suite!(pg_store);
