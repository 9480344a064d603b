//! `IDEM_RETAIN` sets the retention of a PostgreSQL store whose builder sets none, as it does
//! for sled and SQLite: the engine's opener reads it for every backend. One test in a binary of
//! its own: it changes the process's environment, which every store opened here would read.

mod common;

use std::time::Duration;

use idem_postgres::PgStore;

#[test]
fn idem_retain_sets_the_retention_a_builder_leaves_unset() {
    let Some((url, schema, _guard)) = common::scratch_schema("renv") else { return };
    let open = || PgStore::builder(&url).schema(&schema).connect();

    std::env::set_var("IDEM_RETAIN", "30d");
    let store = open().expect("a duration connects");
    let status = store.retention().expect("30d from the environment");
    assert_eq!(status.keep_ms, 30 * 86_400_000);
    drop(store);

    let given =
        PgStore::builder(&url).schema(&schema).retain(Duration::from_secs(60)).connect().unwrap();
    let status = given.retention().expect("the builder's bound");
    assert_eq!(status.keep_ms, 60_000, "the builder wins over the environment");
    drop(given);

    std::env::set_var("IDEM_RETAIN", "off");
    let store = open().expect("off connects");
    assert_eq!(store.retention(), None);
    drop(store);

    std::env::set_var("IDEM_RETAIN", "a month");
    let error = open().expect_err("not a duration").to_string();
    assert!(error.contains("$IDEM_RETAIN") && error.contains("`a month`"), "{error}");
    std::env::remove_var("IDEM_RETAIN");
}
