//! How the cost of a call grows with the store: each size is filled and timed in a child process
//! of its own (`grow N CACHE_MIB`), so that its memory is its own, and reported on one line that
//! the parent reads back.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Durability, SledStore, Store};

use crate::common::{self, dir_bytes, proc_status_kib};
use crate::{charge, percentile, sorted, us};

/// Fresh `Fsync` calls timed one by one at each store size.
const FRESH_SAMPLES: usize = 400;
/// Replays timed one by one at each store size and for each kind of key.
const REPLAY_SAMPLES: usize = 40_000;
/// The recent keys: a retry comes soon after its call, so the keys a running agent replays are
/// among the last it wrote. As many as the smallest store holds, so that every size replays a
/// working set of the same size.
const RECENT: u64 = 10_000;
/// The sled store's default cache, and one that holds a million records.
const DEFAULT_CACHE_MIB: u64 = 64;
const BIG_CACHE_MIB: u64 = 1024;

/// The section "How the cost grows": 10 k and 100 k records, and 1 M with `million`.
pub(crate) fn report(million: bool) {
    let mut sizes = vec![10_000u64, 100_000];
    if million {
        sizes.push(1_000_000);
    }

    println!("## How the cost grows (sled, `Durability::Fsync`)\n");
    println!(
        "Replays of recent keys: drawn from the last {RECENT} written, each replayed once \
         before the timing. Replays of any key: drawn from the whole store, right after, so \
         that at a size past the recent keys most of them read a page sled has not loaded \
         since the open. Each replay is timed with the cache of recent records (the default) \
         and, on an earlier open of the same store, without it (`recent_records(0)`).\n"
    );
    println!(
        "| finished records | fresh call p50 | fresh p99 | durable point | replay p50, recent keys \
         | p99 | \
         without the cache: p50 | p99 | replay p50, any key | p99 | without the cache: p50 | \
         p99 | open | RSS | disk bytes / record |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let grown: Vec<(u64, Grown)> = sizes.into_iter().filter_map(row).collect();
    if let (Some((small, first)), Some((large, last))) = (grown.first(), grown.last()) {
        ratios(*small, first, *large, last);
        big_cache(*small, first, *large);
    }
}

/// One size's row of the table, or a row saying its child failed.
fn row(records: u64) -> Option<(u64, Grown)> {
    let Some(g) = grow(records, DEFAULT_CACHE_MIB) else {
        println!("| {records} | the child process failed | | | | | | | | | | | | | |");
        return None;
    };
    println!(
        "| {records} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} ms \
         | {:.1} MiB | {:.0} |",
        us(g.fresh.0),
        us(g.fresh.1),
        us(g.durable_point),
        us(g.recent.0),
        us(g.recent.1),
        us(g.uncached_recent.0),
        us(g.uncached_recent.1),
        us(g.any.0),
        us(g.any.1),
        us(g.uncached_any.0),
        us(g.uncached_any.1),
        g.open_ms,
        g.rss_mib,
        g.bytes_per_record
    );
    Some((records, g))
}

/// The largest size against the smallest, as a whole and per doubling.
fn ratios(small: u64, first: &Grown, large: u64, last: &Grown) {
    let doublings = (large as f64 / small as f64).log2();
    let slope = |what: &str, a: f64, b: f64| {
        format!("{what} {:.2} (×{:.3} a doubling)", b / a, (b / a).powf(1.0 / doublings))
    };
    println!(
        "\nFrom {small} to {large} records ({doublings:.1} doublings), {large} ÷ {small}: {} \
         ({}), {} ({}), {}, open {:.2}, RSS {:.2}, bytes per record {:.2}. Goal: fresh and replay \
         within 1.3.",
        slope("fresh p50", first.fresh.0, last.fresh.0),
        slope("its durable point", first.durable_point, last.durable_point),
        slope("replay p50 of recent keys", first.recent.0, last.recent.0),
        slope("without the cache", first.uncached_recent.0, last.uncached_recent.0),
        slope("replay p50 of any key", first.any.0, last.any.0),
        last.open_ms / first.open_ms,
        last.rss_mib / first.rss_mib,
        last.bytes_per_record / first.bytes_per_record,
    );
}

/// The same largest store with a cache that holds it, every key replayed once first: what a
/// replay of any key costs once sled has every page in memory.
fn big_cache(small: u64, first: &Grown, large: u64) {
    let Some(big) = grow(large, BIG_CACHE_MIB) else { return };
    let warm = big.warm.unwrap_or((f64::NAN, f64::NAN));
    println!(
        "\nThe {large} records again with `cache_capacity` {BIG_CACHE_MIB} MiB (the default \
         is {DEFAULT_CACHE_MIB} MiB): fresh p50 {} (p99 {}), replay of recent keys p50 {} \
         (p99 {}), of any key p50 {} (p99 {}); then, every key replayed once, of any key \
         p50 {} (p99 {}), ÷ the {small}-record store's any-key p50: {:.2}; RSS {:.1} MiB.",
        us(big.fresh.0),
        us(big.fresh.1),
        us(big.recent.0),
        us(big.recent.1),
        us(big.any.0),
        us(big.any.1),
        us(warm.0),
        us(warm.1),
        warm.0 / first.any.0,
        big.rss_mib,
    );
}

/// What one store size measured; latencies as (p50, p99) in seconds.
struct Grown {
    fresh: (f64, f64),
    /// Replays of keys among the last [`RECENT`] written.
    recent: (f64, f64),
    /// Replays of keys drawn from the whole store.
    any: (f64, f64),
    /// The same two without the cache of recent records.
    uncached_recent: (f64, f64),
    uncached_any: (f64, f64),
    /// Replays of keys drawn from the whole store after every key was replayed once (only with
    /// the cache that holds the store).
    warm: Option<(f64, f64)>,
    open_ms: f64,
    rss_mib: f64,
    bytes_per_record: f64,
    /// How long a durable point took, on average, during the fresh calls.
    durable_point: f64,
}

/// Runs the child of one store size and reads back what it measured.
fn grow(records: u64, cache_mib: u64) -> Option<Grown> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new(exe)
        .args(["grow", &records.to_string(), &cache_mib.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("grown "))?;
    let field = |name: &str| -> Option<f64> {
        line.split(' ').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?.parse().ok()
    };
    let pair = |name: &str| Some((field(&format!("{name}_p50"))?, field(&format!("{name}_p99"))?));
    Some(Grown {
        fresh: pair("fresh")?,
        recent: pair("recent")?,
        any: pair("any")?,
        uncached_recent: pair("uncached_recent")?,
        uncached_any: pair("uncached_any")?,
        warm: pair("warm"),
        open_ms: field("open_ms")?,
        rss_mib: field("rss_mib")?,
        bytes_per_record: field("bytes_per_record")?,
        durable_point: field("durable_point")?,
    })
}

/// The child of one store size: fill it with `records` finished records (without syncs, which
/// change the time taken, not what is stored), reopen it with `Fsync` (the median of three opens,
/// page cache warm), then time fresh calls, replays of recent keys and replays of any key; with
/// a cache of [`BIG_CACHE_MIB`], also replays of any key once every key was replayed. The
/// replays are timed twice, on two opens of the store: without the cache of recent records
/// (`recent_records(0)`, as before it existed), then with it (the default).
pub(crate) fn child(records: u64, cache_mib: u64) {
    let dir = tempfile::Builder::new().prefix("idem-scale").tempdir().expect("temp dir");
    let path = dir.path().join("idem.sled");
    fill(&path, records);
    // The fill wrote without syncs: write its pages out now, so that the kernel's writeback of
    // them does not compete with the durable points timed below, as it never would in a store
    // written with `Fsync`.
    sync_files(&path);
    let open_ms = median_open_ms(&path, cache_mib);
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let recent_from = records.saturating_sub(RECENT);

    let store = open(&path, cache_mib, Some(0));
    replay_range(&store, recent_from..records);
    let uncached_recent = replays(&store, || recent_from + draw.below(records - recent_from));
    let uncached_any = replays(&store, || draw.below(records));
    drop(store);

    let store = open(&path, cache_mib, None);
    let (fresh, durable_point) = fresh_calls(&store);
    replay_range(&store, recent_from..records);
    let recent = replays(&store, || recent_from + draw.below(records - recent_from));
    let any = replays(&store, || draw.below(records));
    let warm = (cache_mib >= BIG_CACHE_MIB).then(|| {
        replay_range(&store, 0..records);
        replays(&store, || draw.below(records))
    });
    let rss_mib = proc_status_kib("VmRSS:") as f64 / 1024.0;
    let bytes = dir_bytes(&path) as f64 / records as f64;
    let warm = warm.map_or(String::new(), |(p50, p99)| format!(" warm_p50={p50} warm_p99={p99}"));
    println!(
        "grown records={records} fresh_p50={} fresh_p99={} recent_p50={} recent_p99={} \
         any_p50={} any_p99={} uncached_recent_p50={} uncached_recent_p99={} \
         uncached_any_p50={} uncached_any_p99={}{warm} open_ms={open_ms} rss_mib={rss_mib} \
         bytes_per_record={bytes} durable_point={durable_point}",
        fresh.0,
        fresh.1,
        recent.0,
        recent.1,
        any.0,
        any.1,
        uncached_recent.0,
        uncached_recent.1,
        uncached_any.0,
        uncached_any.1,
    );
}

/// Writes `records` finished records without syncs.
fn fill(path: &Path, records: u64) {
    let store: Arc<dyn Store> =
        Arc::new(SledStore::builder(path).durability(Durability::None).open().expect("open"));
    for n in 0..records {
        charge(&store, &format!("g{n}"));
    }
}

/// The median of three opens of the store at `path`, in ms.
fn median_open_ms(path: &Path, cache_mib: u64) -> f64 {
    let mut opens = Vec::new();
    for _ in 0..3 {
        let began = Instant::now();
        let store = SledStore::builder(path)
            .cache_capacity(cache_mib << 20)
            .lock_wait(Duration::from_secs(5))
            .open();
        opens.push(began.elapsed().as_secs_f64() * 1e3);
        drop(store.expect("reopen"));
    }
    sorted(opens)[1]
}

/// The store at `path` with `Fsync`, and `recent_records(bytes)` when `recent` is given.
fn open(path: &Path, cache_mib: u64, recent: Option<u64>) -> Arc<dyn Store> {
    let builder = SledStore::builder(path)
        .durability(Durability::Fsync)
        .cache_capacity(cache_mib << 20)
        .lock_wait(Duration::from_secs(5));
    let builder = match recent {
        Some(bytes) => builder.recent_records(bytes),
        None => builder,
    };
    Arc::new(builder.open().expect("reopen"))
}

/// xorshift: keys spread over their range, so the replays do not sit in one warm leaf.
struct Draw(u64);

impl Draw {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// [`FRESH_SAMPLES`] fresh calls timed one by one, as (p50, p99), and the mean durable point
/// meanwhile, from the store's own metrics.
fn fresh_calls(store: &Arc<dyn Store>) -> ((f64, f64), f64) {
    let syncs = common::syncs::install();
    let (syncs_before, nanos_before) = syncs.read();
    let mut fresh = Vec::with_capacity(FRESH_SAMPLES);
    for n in 0..FRESH_SAMPLES {
        let scope = format!("f{n}");
        let began = Instant::now();
        charge(store, &scope);
        fresh.push(began.elapsed().as_secs_f64());
    }
    let (syncs_after, nanos_after) = syncs.read();
    let durable_point =
        (nanos_after - nanos_before) as f64 / 1e9 / (syncs_after - syncs_before).max(1) as f64;
    let fresh = sorted(fresh);
    ((percentile(&fresh, 0.5), percentile(&fresh, 0.99)), durable_point)
}

/// Replays every key of `range` once, untimed.
fn replay_range(store: &Arc<dyn Store>, range: std::ops::Range<u64>) {
    for n in range {
        charge(store, &format!("g{n}"));
    }
}

/// [`REPLAY_SAMPLES`] replays of the keys `draw` picks, timed one by one, as (p50, p99).
fn replays(store: &Arc<dyn Store>, mut draw: impl FnMut() -> u64) -> (f64, f64) {
    let mut times = Vec::with_capacity(REPLAY_SAMPLES);
    for _ in 0..REPLAY_SAMPLES {
        let scope = format!("g{}", draw());
        let began = Instant::now();
        charge(store, &scope);
        times.push(began.elapsed().as_secs_f64());
    }
    let times = sorted(times);
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

/// Syncs every file below `path`.
fn sync_files(path: &Path) {
    let Ok(entries) = std::fs::read_dir(path) else { return };
    for entry in entries.flatten() {
        match entry.metadata() {
            Ok(m) if m.is_dir() => sync_files(&entry.path()),
            Ok(_) => {
                if let Ok(file) = std::fs::File::open(entry.path()) {
                    let _ = file.sync_all();
                }
            }
            Err(_) => {}
        }
    }
}
