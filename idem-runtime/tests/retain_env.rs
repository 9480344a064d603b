//! `IDEM_RETAIN` sets the retention of a store whose builder sets none. One test in a binary of
//! its own: it changes the process's environment, which every store opened here would read.

use std::time::Duration;

use idem_runtime::SledStore;

#[test]
fn idem_retain_sets_the_retention_a_builder_leaves_unset() {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| SledStore::builder(dir.path().join(name)).admin_socket(false).open();

    std::env::set_var("IDEM_RETAIN", "30d");
    let store = open("a").expect("a duration opens");
    let status = store.retention().expect("30d from the environment");
    assert_eq!(status.keep_ms, 30 * 86_400_000);
    assert_eq!(status.every_ms, 3_600_000, "a pass an hour for a bound of 30 days");
    drop(store);

    let given = SledStore::builder(dir.path().join("b"))
        .admin_socket(false)
        .retain(Duration::from_secs(60))
        .open()
        .unwrap();
    let status = given.retention().expect("the builder's bound");
    assert_eq!(status.keep_ms, 60_000, "the builder wins over the environment");
    drop(given);

    std::env::set_var("IDEM_RETAIN", "off");
    let store = open("c").expect("off opens");
    assert_eq!(store.retention(), None);
    drop(store);

    std::env::set_var("IDEM_RETAIN", "a month");
    let error = open("d").expect_err("not a duration").to_string();
    assert!(error.contains("$IDEM_RETAIN") && error.contains("`a month`"), "{error}");
    assert!(error.contains("30d"), "the message says what to write: {error}");
    std::env::remove_var("IDEM_RETAIN");
}
