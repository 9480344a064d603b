//! A retention pass over a SQLite store holds one page in memory, not the store: a pass with
//! nothing to remove over records with large results and released keys, and a page of them,
//! each take memory in proportion to the page.
//!
//! Memory is what this binary's allocator hands the test's own thread while the store answers
//! (the store reads on the caller's thread): the results the store decodes are Rust strings, so
//! a store that reads every record for a page shows here as the whole store's results.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::block_on;
use idem_runtime::store::Stored;
use idem_runtime::{Call, Durability, Error, Retention, SqliteStore, Store};
use serde_json::json;

/// Bytes the thread that counts holds beyond what it held when it started counting, and the
/// most it held.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

struct Counting;

fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: every allocation is the system allocator's; the counting only reads sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() && counting() {
            let live = LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
            PEAK.fetch_max(live + layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counting() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returns, and the most memory this thread held beyond what it held before, while
/// `f` ran and with what it returned.
fn peak_while<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, PEAK.load(Ordering::Relaxed).max(0) as usize)
}

/// A tool's error: the call releases its key, which keeps its history.
#[derive(Debug)]
enum Declined {
    Refund,
    #[allow(dead_code)] // read through Debug in failure messages
    Idem(Error),
}

impl From<Error> for Declined {
    fn from(e: Error) -> Self {
        Declined::Idem(e)
    }
}

const RECORDS: usize = 1_000;
const RELEASED: usize = 1_000;
const RESULT_BYTES: usize = 10_000;
const PAGE: usize = 10;

/// A store of `RECORDS` finished calls with results of `RESULT_BYTES` each, and `RELEASED`
/// released keys (calls that failed), none older than an hour.
fn filled(dir: &std::path::Path) -> SqliteStore {
    let store = SqliteStore::builder(dir.join("idem.sqlite"))
        .durability(Durability::None)
        .retention(None)
        .open()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let result = "r".repeat(RESULT_BYTES);
    for n in 0..RECORDS {
        let call = Call::new("export_report", "pages", &json!({ "n": n })).unwrap();
        let got = call.store(Arc::clone(&store)).run(|| Ok::<_, Error>(result.clone()));
        assert_eq!(got.unwrap().len(), RESULT_BYTES);
    }
    for n in 0..RELEASED {
        let call = Call::new("refund", "pages", &json!({ "n": n })).unwrap();
        let failed = call.store(Arc::clone(&store)).run(|| Err::<String, _>(Declined::Refund));
        assert!(matches!(failed, Err(Declined::Refund)), "{failed:?}");
    }
    drop(store);
    SqliteStore::builder(dir.join("idem.sqlite")).retention(None).open().unwrap()
}

#[test]
fn a_retention_pass_and_its_pages_hold_a_page_not_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path());
    // One more than there are keys: a page that comes back full may not be the last.
    let all = block_on(store.scan_page(None, RECORDS + RELEASED + 1)).unwrap();
    assert!(all.next.is_none(), "one page holds every key");
    let records = all.entries.iter().filter(|(_, stored)| matches!(stored, Stored::Record(Ok(_))));
    assert_eq!(records.count(), RECORDS);
    let keys: Vec<String> = all.entries.into_iter().map(|(key, _)| key).collect();
    assert_eq!(keys.len(), RECORDS + RELEASED, "each released key with its history");
    // The store's first read opens its connection and prepares its statements: not a page's.
    block_on(store.scan_page(None, 1)).unwrap();

    let middle = &keys[keys.len() / 2];
    let (page, held) = peak_while(|| block_on(store.scan_page(Some(middle), PAGE)).unwrap());
    let got: Vec<&String> = page.entries.iter().map(|(key, _)| key).collect();
    assert_eq!(got, keys[keys.len() / 2 + 1..][..PAGE].iter().collect::<Vec<_>>());
    let page_bytes = PAGE * RESULT_BYTES;
    assert!(
        held < 2 * page_bytes,
        "a page of {PAGE} keys, records of {RESULT_BYTES} B and released keys, held {held} B: \
         the store's results are {} B",
        RECORDS * RESULT_BYTES
    );

    let policy = Retention::new(Duration::from_secs(3600)).batch(PAGE);
    let (removed, held) = peak_while(|| policy.run(&store).unwrap());
    assert_eq!(removed, Default::default(), "nothing is older than the bound");
    assert!(
        held < 2 * page_bytes,
        "a pass in pages of {PAGE} held {held} B: the store's results are {} B",
        RECORDS * RESULT_BYTES
    );
}
