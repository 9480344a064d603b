//! `idem stats` says the same of a store whether the process that holds it answers (through its
//! admin socket) or the store is closed and opened to ask: its size on disk included, though
//! opening a sled store writes to its files.

#![cfg(unix)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{Admin, Local, Stats};
use idem_runtime::remote::Remote;
use idem_runtime::{Call, Error, SledStore, Store};

fn open(dir: &Path) -> Arc<SledStore> {
    Arc::new(SledStore::builder(dir).lock_wait(Duration::from_secs(5)).open().unwrap())
}

/// The stats `idem stats` prints of a store it opened itself: its size as the store reads it.
fn stats_of(store: &Arc<SledStore>) -> Stats {
    let sized = Arc::clone(store);
    let local = Local::new(Arc::clone(store) as Arc<dyn Store>);
    local.with_size(Arc::new(move || sized.size_on_disk())).stats().unwrap()
}

/// Stats of a store holding `calls` records, asked through the holder's socket, of the holder
/// itself, and of the store closed and opened again, three times.
fn check_stats_agree(calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let calling: Arc<dyn Store> = Arc::clone(&store) as Arc<dyn Store>;
    for i in 0..calls {
        let call = Call::new("send_invoice", format!("inv-{i}"), &i).unwrap();
        call.store(Arc::clone(&calling)).run(|| Ok::<_, Error>("x".repeat(i % 100 * 40))).unwrap();
    }
    let live = Remote::connect(dir.path()).unwrap().expect("the store serves its socket");
    let live = { live }.stats().unwrap();
    assert!(live.size_on_disk.is_some_and(|bytes| bytes > 0), "{live:?}");
    assert_eq!(stats_of(&store), live, "the holder and its socket disagree");
    drop((calling, store));
    for reopening in 1..=3 {
        let store = open(dir.path());
        let closed = stats_of(&store);
        assert_eq!(closed, live, "{calls} records, reopened {reopening} time(s)");
    }
}

#[test]
fn stats_report_one_size_on_disk_for_a_live_store_and_the_same_store_reopened() {
    for calls in [1, 3, 40, 600] {
        check_stats_agree(calls);
    }
}
