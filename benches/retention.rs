//! Retention under a steady load: does a sled store's size, and the time to open it, stay flat
//! while the load writes ten times the records the bound retains? The same run without
//! retention is the contrast.
//!
//! ```text
//! cargo bench -p idem-benches --bench retention                 # keep 10 s, 1000 calls/s, 10×
//! cargo bench -p idem-benches --bench retention -- 20 500 10    # keep (s), calls/s, multiple
//! ```
//!
//! The bound is scaled down: an hour at 1000 calls/s would take ten hours to write ten times
//! what it retains. Nothing in a pass depends on the bound's length but how many records it
//! retains (what a page holds, how many pages a pass walks, how many go per pass), so the
//! run keeps `keep` seconds of load (10 000 records by default) instead of an hour's, and a
//! pass runs every second (the default `every` for a bound that short, as for any bound up to
//! 24 s). Every tenth call fails, so that released keys' histories accumulate too.
//!
//! At each checkpoint (after every `keep` seconds' worth of calls at the asked rate) the load stops, the records and released
//! histories are counted and the store's size read, the store is closed, and opened five times
//! without retention (the median is reported, page cache warm, after a 200 ms rest so that
//! sled's lock is free and no wait for it is timed); then the load goes on on a store opened
//! with retention again.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::retention::Retention;
use idem::{Call, SledStore, Store};
use idem_runtime::store::Stored;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .map(|a| a.parse().expect("numbers: keep seconds, calls a second, multiple"))
        .collect();
    let keep = Duration::from_secs(args.first().copied().unwrap_or(10));
    let rate = args.get(1).copied().unwrap_or(1000);
    let multiple = args.get(2).copied().unwrap_or(10);
    println!(
        "## Retention under a steady load (sled, `Durability::Fsync`)\n\nKeep {} s, {rate} calls \
         a second (one in ten fails), {multiple}× the retained records written: {} calls. \
         A checkpoint after every {} s' worth of calls at that rate.\n",
        keep.as_secs(),
        rate * keep.as_secs() * multiple,
        keep.as_secs()
    );
    for retained in [true, false] {
        run(keep, rate, multiple, retained);
    }
}

/// One run: `multiple` spans of `keep` seconds of load, a checkpoint after each.
fn run(keep: Duration, rate: u64, multiple: u64, retained: bool) {
    let dir = tempfile::Builder::new().prefix("idem-retention").tempdir().expect("temp dir");
    let path = dir.path().join("idem.sled");
    let policy = retained.then(|| Retention::new(keep));
    println!(
        "{}\n\n| checkpoint | load time | calls written | records | released histories | size on disk | \
         files | open p50 | calls/s reached | passes | removed records | removed histories |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        if retained { "### With `retain` of the bound" } else { "### Without retention" }
    );
    let mut written = 0u64;
    let mut loaded = Duration::ZERO;
    for span in 1..=multiple {
        let store = open(&path, policy.clone());
        let started = Instant::now();
        let reached = load(&(store.clone() as Arc<dyn Store>), keep, rate, &mut written);
        loaded += started.elapsed();
        let status = store.retention().unwrap_or_default();
        let stats = idem::admin::stats(store.as_ref()).expect("stats");
        let records: u64 = stats.by_status.values().sum();
        let page = block_on(store.scan_page(None, usize::MAX)).expect("the store's keys");
        let released = page.entries.iter().filter(|(_, s)| matches!(s, Stored::History { .. }));
        let released = released.count();
        let size = store.size_on_disk().unwrap_or(0);
        drop(store);
        let open_ms = median_open_ms(&path);
        println!(
            "| {span}/{multiple} | {:.0} s | {written} | {records} | {released} | {:.1} MiB | {:.1} MiB | {open_ms:.1} \
             ms | {reached:.0} | {} | {} | {} |",
            loaded.as_secs_f64(),
            size as f64 / 1048576.0,
            dir_bytes(&path) as f64 / 1048576.0,
            status.passes,
            status.removed.records,
            status.removed.histories,
        );
    }
    println!();
}

fn open(path: &Path, retention: Option<Retention>) -> Arc<SledStore> {
    Arc::new(
        SledStore::builder(path)
            .admin_socket(false)
            .lock_wait(Duration::from_secs(5))
            .retention(retention)
            .open()
            .expect("the store opens"),
    )
}

/// `rate` calls a second for `span`, each a new key, one in ten failing; the rate reached.
fn load(store: &Arc<dyn Store>, span: Duration, rate: u64, written: &mut u64) -> f64 {
    let start = Instant::now();
    let calls = rate * span.as_secs();
    for n in 0..calls {
        let slot = start + Duration::from_secs_f64(n as f64 / rate as f64);
        if let Some(wait) = slot.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let id = *written;
        *written += 1;
        let call = Call::new("charge", "bench", &serde_json::json!({ "n": id }))
            .expect("a key")
            .store(Arc::clone(store));
        let _: Result<u64, String> =
            call.run(|| if id % 10 == 9 { Err("declined".to_owned()) } else { Ok(id) });
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

/// The median of five opens of the store without retention, in ms.
fn median_open_ms(path: &Path) -> f64 {
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            let start = Instant::now();
            let store = SledStore::builder(path)
                .admin_socket(false)
                .retention(None)
                .open()
                .expect("the store opens");
            let took = start.elapsed().as_secs_f64() * 1e3;
            drop(store);
            took
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[2]
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().expect("a runtime").block_on(future)
}

/// The bytes of every file below `path`.
fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
