//! How the cost of a call grows with the store, how close group commit comes to the disk's limit,
//! and what a fleet of processes sustains on PostgreSQL; then the tables of BENCHMARKS.md's
//! "At scale" and the chart `benches/throughput.svg`.
//!
//! ```text
//! cargo bench -p idem-benches --bench scale               # 10 k and 100 k records, callers, fleet
//! cargo bench -p idem-benches --bench scale -- million    # also 1 M records (a few minutes more)
//! ```
//!
//! With `DATABASE_URL` set, the PostgreSQL fleet runs against that server (in the schema
//! `idem_fleet`, emptied before each run); without it those rows are skipped. The store sizes
//! and the fleet's processes run as child processes of this binary (`grow N`, `fleet …`), so
//! that each one's memory is its own and the fleet's processes are real ones. `-- callers N`
//! runs one point of the group-commit curve alone, for a profiler.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem::{Call, Durability, Error, SledStore, Store};

use self::common::{dir_bytes, proc_status_kib, process_cpu, temp_store, throughput, Throughput};

#[path = "common.rs"]
mod common;

/// How long each throughput point runs.
const THROUGHPUT_FOR: Duration = Duration::from_secs(3);
/// Fresh `Fsync` calls timed one by one at each store size.
const FRESH_SAMPLES: usize = 400;
/// Replays timed one by one at each store size and for each kind of key.
const REPLAY_SAMPLES: usize = 40_000;
/// The recent keys: a retry comes soon after its call, so the keys a running agent replays are
/// among the last it wrote. As many as the smallest store holds, so that every size replays a
/// working set of the same size.
const RECENT: u64 = 10_000;
/// Raw durable points timed for the limit.
const RAW_SAMPLES: usize = 400;
/// The sled store's default cache, and one that holds a million records.
const DEFAULT_CACHE_MIB: u64 = 64;
const BIG_CACHE_MIB: u64 = 1024;
/// Callers for the group-commit curve.
const CALLERS: [usize; 4] = [1, 2, 8, 32];
/// The fleet: processes × callers in each.
const FLEET: [(usize, usize); 4] = [(1, 1), (1, 8), (4, 1), (4, 8)];
/// Records each fleet caller writes before it replays them.
const REPLAY_KEYS: usize = 200;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["grow", records, cache_mib] => grow_child(
            records.parse().expect("a record count"),
            cache_mib.parse().expect("a cache size in MiB"),
        ),
        // One point of the group-commit curve alone, for a profiler; with a second argument,
        // the store's `group_commit_wait` in µs (0: none).
        ["callers", callers, wait @ ..] if wait.len() <= 1 => {
            let wait = wait.first().map(|us| Duration::from_micros(us.parse().expect("µs")));
            let callers = callers.parse().expect("a caller count");
            let t = throughput(callers, THROUGHPUT_FOR, wait);
            println!(
                "{:.0} calls/s, {} of CPU a call, {:.1} writes a durable point of {}",
                t.rate,
                us(t.cpu),
                t.writes_per_sync,
                us(t.sync)
            );
        }
        ["fleet", url, callers, seconds, mode, prefix] => fleet_child(
            url,
            callers.parse().expect("a caller count"),
            Duration::from_secs(seconds.parse().expect("seconds")),
            mode,
            prefix,
        ),
        rest => run(rest.contains(&"million")),
    }
}

fn run(million: bool) {
    let started = Instant::now();
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
    let mut grown = Vec::new();
    for &records in &sizes {
        match grow(records, DEFAULT_CACHE_MIB) {
            Some(g) => {
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
                grown.push((records, g));
            }
            None => println!("| {records} | the child process failed | | | | | | | | | | | | | |"),
        }
    }
    if let (Some((small, first)), Some((large, last))) = (grown.first(), grown.last()) {
        let doublings = (*large as f64 / *small as f64).log2();
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
        // The same largest store with a cache that holds it, every key replayed once first:
        // what a replay of any key costs once sled has every page in memory.
        if let Some(big) = grow(*large, BIG_CACHE_MIB) {
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
    }

    println!("\n## Group commit against its limit (sled, `Durability::Fsync`)\n");
    let raw = raw_sled_durable_point();
    println!(
        "Raw sled durable point (compare-and-swap + flush + fdatasync), median of {RAW_SAMPLES}: {}.",
        us(raw)
    );
    let cpu_none = cpu_per_call(Durability::None, 20_000);
    println!(
        "CPU time per fresh call with `Durability::None`, one caller: {} (all threads of the \
         process: {:.0} calls/s would take both cores).\n",
        us(cpu_none),
        2.0 / cpu_none
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "Each row: the store's default (a durable point waits a little for the writes it \
         expects), then the same with `group_commit_wait(Duration::ZERO)`, as before that option \
         existed, run back to back. Writes per durable point and its time come from the store's \
         own metrics (`idem_syncs_total`, `idem_sync_duration_seconds`); busy is the share of \
         the run the sync thread spent in a durable point; CPU bound is the rate at which the \
         CPU per call would take all {cores} cores, as a fraction of the limit.\n"
    );
    println!(
        "| callers | fresh calls/s | limit | fraction | writes / durable point | durable point | \
         busy | CPU per call | CPU bound | without the wait: calls/s | fraction | writes / \
         durable point | busy |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let busy = |t: &Throughput| 100.0 * 2.0 * t.rate / t.writes_per_sync * t.sync;
    let mut sled_curve = Vec::new();
    for callers in CALLERS {
        let on = throughput(callers, THROUGHPUT_FOR, None);
        let off = throughput(callers, THROUGHPUT_FOR, Some(Duration::ZERO));
        let limit = callers as f64 / (2.0 * raw);
        println!(
            "| {callers} | {:.0} | {limit:.0} | {:.0} % | {:.1} | {} | {:.0} % | {} | {:.0} % | \
             {:.0} | {:.0} % | {:.1} | {:.0} % |",
            on.rate,
            100.0 * on.rate / limit,
            on.writes_per_sync,
            us(on.sync),
            busy(&on),
            us(on.cpu),
            100.0 * (cores as f64 / on.cpu) / limit,
            off.rate,
            100.0 * off.rate / limit,
            off.writes_per_sync,
            busy(&off),
        );
        sled_curve.push((callers, on.rate, limit));
    }

    let mut pg_curve = Vec::new();
    match std::env::var("DATABASE_URL") {
        Ok(url) => {
            println!("\n## A PostgreSQL fleet (local server, default settings)\n");
            let raw_pg = raw_pg_durable_point(&url);
            println!(
                "Raw PostgreSQL durable point (one autocommitted single-row INSERT), median of \
                 {RAW_SAMPLES}: {}. CPU per fresh call is the whole machine's busy CPU time \
                 during the run (the server's backends, the fleet's processes) ÷ the calls; the \
                 CPU bound is the rate at which that would take every core, ÷ one caller's.\n",
                us(raw_pg)
            );
            println!(
                "| processes × callers | fresh calls/s | fresh p50 | fresh p99 | CPU per fresh \
                 call (machine) | cores busy | CPU bound, ÷ one caller | replays/s | replay p50 | \
                 replay p99 |"
            );
            println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let mut one_caller = None;
            for (processes, callers) in FLEET {
                let fresh = fleet(&url, processes, callers, "fresh", false);
                let replay = fleet(&url, processes, callers, "replay", false);
                match (fresh, replay) {
                    (Some(fresh), Some(replay)) => {
                        let one = *one_caller.get_or_insert(fresh.rate);
                        println!(
                            "| {processes} × {callers} | {:.0} | {} | {} | {} | {:.0} % | {:.1} | \
                             {:.0} | {} | {} |",
                            fresh.rate,
                            us(fresh.p50),
                            us(fresh.p99),
                            us(fresh.cpu),
                            100.0 * fresh.busy,
                            cores / fresh.cpu / one,
                            replay.rate,
                            us(replay.p50),
                            us(replay.p99)
                        );
                        let all = processes * callers;
                        pg_curve.push((all, fresh.rate, all as f64 / (2.0 * raw_pg)));
                    }
                    _ => println!(
                        "| {processes} × {callers} | a fleet process failed | | | | | | | | |"
                    ),
                }
            }
            if let (Some(one), Some((_, all, _))) = (one_caller, pg_curve.last()) {
                println!("\n32 callers ÷ 1 caller, fresh calls: {:.2} (goal ≥ 8).", all / one);
                // What the server itself sustains on this machine: a fresh call needs two
                // commits that wait for their WAL flush, so half its commit rate bounds them.
                let ceiling = pg_commit_ceiling(&url, 32);
                println!(
                    "\nThe server alone, 32 connections each committing single-row INSERTs \
                     (autocommit, as pgbench's simplest script) for {} s: {ceiling:.0} commits/s, \
                     so at most {:.0} fresh calls/s (two commits each), {:.2}× one caller's rate; \
                     the fleet's 32 callers reached {:.0}% of that bound.",
                    THROUGHPUT_FOR.as_secs(),
                    ceiling / 2.0,
                    ceiling / 2.0 / one,
                    100.0 * all / (ceiling / 2.0)
                );
            }
            println!(
                "\nBefore and after announcing changes after the commit: fresh calls/s with the \
                 earlier release's notify trigger put back on the table (each write then also \
                 notifies inside its own transaction), and without it.\n"
            );
            println!("| processes × callers | with the trigger | without (this release) |");
            println!("| --- | --- | --- |");
            for (processes, callers) in FLEET {
                let before = fleet(&url, processes, callers, "fresh", true);
                let after = fleet(&url, processes, callers, "fresh", false);
                match (before, after) {
                    (Some(before), Some(after)) => println!(
                        "| {processes} × {callers} | {:.0} | {:.0} |",
                        before.rate, after.rate
                    ),
                    _ => println!("| {processes} × {callers} | a fleet process failed | |"),
                }
            }
        }
        Err(_) => eprintln!("DATABASE_URL is not set: skipping the PostgreSQL fleet"),
    }

    // By callers in all: the fleet runs 1 × 8 before 4 × 1.
    pg_curve.sort_by_key(|&(callers, _, _)| callers);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("throughput.svg");
    match draw(&chart, &sled_curve, &pg_curve) {
        Ok(()) => println!("\nThe chart: {}", chart.display()),
        Err(e) => eprintln!("cannot draw the chart: {e}"),
    }
    println!("\nThis run took {:.0} s.", started.elapsed().as_secs_f64());
}

/// Seconds, as µs or ms for the tables.
fn us(seconds: f64) -> String {
    if seconds >= 1e-3 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{:.1} µs", seconds * 1e6)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// The call every measurement makes: the same tool and arguments, the scope telling keys apart.
fn charge(store: &Arc<dyn Store>, scope: &str) -> u64 {
    let out: Result<u64, Error> = Call::new("charge_card", scope, &("cus_123", 4200))
        .expect("a key")
        .store(store.clone())
        .run(|| Ok(4200));
    out.expect("a call")
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
fn grow_child(records: u64, cache_mib: u64) {
    let dir = tempfile::Builder::new().prefix("idem-scale").tempdir().expect("temp dir");
    let path = dir.path().join("idem.sled");
    {
        let store: Arc<dyn Store> =
            Arc::new(SledStore::builder(&path).durability(Durability::None).open().expect("open"));
        for n in 0..records {
            charge(&store, &format!("g{n}"));
        }
    }
    // The fill wrote without syncs: write its pages out now, so that the kernel's writeback of
    // them does not compete with the durable points timed below, as it never would in a store
    // written with `Fsync`.
    sync_files(&path);
    let mut opens = Vec::new();
    for _ in 0..3 {
        let began = Instant::now();
        let store = SledStore::builder(&path)
            .cache_capacity(cache_mib << 20)
            .lock_wait(Duration::from_secs(5))
            .open();
        opens.push(began.elapsed().as_secs_f64() * 1e3);
        drop(store.expect("reopen"));
    }
    let open_ms = sorted(opens)[1];
    let open = |recent: Option<u64>| -> Arc<dyn Store> {
        let builder = SledStore::builder(&path)
            .durability(Durability::Fsync)
            .cache_capacity(cache_mib << 20)
            .lock_wait(Duration::from_secs(5));
        let builder = match recent {
            Some(bytes) => builder.recent_records(bytes),
            None => builder,
        };
        Arc::new(builder.open().expect("reopen"))
    };
    // xorshift: keys spread over their range, so the replays do not sit in one warm leaf.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let replays = |store: &Arc<dyn Store>, draw: &mut dyn FnMut() -> u64| {
        let mut times = Vec::with_capacity(REPLAY_SAMPLES);
        for _ in 0..REPLAY_SAMPLES {
            let scope = format!("g{}", draw());
            let began = Instant::now();
            charge(store, &scope);
            times.push(began.elapsed().as_secs_f64());
        }
        let times = sorted(times);
        (percentile(&times, 0.5), percentile(&times, 0.99))
    };
    let recent_from = records.saturating_sub(RECENT);
    let warm_recent = |store: &Arc<dyn Store>| {
        for n in recent_from..records {
            charge(store, &format!("g{n}"));
        }
    };

    let store = open(Some(0));
    warm_recent(&store);
    let uncached_recent = replays(&store, &mut || recent_from + draw(records - recent_from));
    let uncached_any = replays(&store, &mut || draw(records));
    drop(store);

    let store = open(None);
    let syncs = common::syncs::install();
    let (syncs_before, nanos_before) = syncs.read();
    let mut fresh = Vec::with_capacity(FRESH_SAMPLES);
    for n in 0..FRESH_SAMPLES {
        let scope = format!("f{n}");
        let began = Instant::now();
        charge(&store, &scope);
        fresh.push(began.elapsed().as_secs_f64());
    }
    let (syncs_after, nanos_after) = syncs.read();
    let durable_point =
        (nanos_after - nanos_before) as f64 / 1e9 / (syncs_after - syncs_before).max(1) as f64;
    warm_recent(&store);
    let recent = replays(&store, &mut || recent_from + draw(records - recent_from));
    let any = replays(&store, &mut || draw(records));
    let warm = (cache_mib >= BIG_CACHE_MIB).then(|| {
        for n in 0..records {
            charge(&store, &format!("g{n}"));
        }
        replays(&store, &mut || draw(records))
    });
    let rss_mib = proc_status_kib("VmRSS:") as f64 / 1024.0;
    let bytes = dir_bytes(&path) as f64 / records as f64;
    let fresh = sorted(fresh);
    let warm = warm.map_or(String::new(), |(p50, p99)| format!(" warm_p50={p50} warm_p99={p99}"));
    println!(
        "grown records={records} fresh_p50={} fresh_p99={} recent_p50={} recent_p99={} \
         any_p50={} any_p99={} uncached_recent_p50={} uncached_recent_p99={} \
         uncached_any_p50={} uncached_any_p99={}{warm} open_ms={open_ms} rss_mib={rss_mib} \
         bytes_per_record={bytes} durable_point={durable_point}",
        percentile(&fresh, 0.5),
        percentile(&fresh, 0.99),
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

/// The CPU time a fresh call takes with one caller under `durability`.
fn cpu_per_call(durability: Durability, calls: usize) -> f64 {
    let (_dir, store) = temp_store(durability);
    for n in 0..calls / 10 {
        charge(&store, &format!("w{n}"));
    }
    let before = process_cpu();
    for n in 0..calls {
        charge(&store, &format!("c{n}"));
    }
    (process_cpu() - before).as_secs_f64() / calls as f64
}

/// The disk's own limit on sled: one compare-and-swap, sled's flush and a data sync of its file,
/// what each of a call's two durable points is at the least.
fn raw_sled_durable_point() -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::Config::new().path(dir.path().join("raw.sled")).open().expect("sled opens");
    let tree = db.open_tree("idem.records").expect("a tree");
    let data = std::fs::File::open(dir.path().join("raw.sled").join("db")).expect("sled's file");
    // About the size of a finished record.
    let value = vec![b'x'; 330];
    let mut times = Vec::with_capacity(RAW_SAMPLES);
    for n in 0..RAW_SAMPLES + RAW_SAMPLES / 10 {
        let key = format!("{n:032x}");
        let began = Instant::now();
        tree.compare_and_swap(key.as_bytes(), None as Option<&[u8]>, Some(&value[..]))
            .expect("sled writes")
            .expect("a new key");
        db.flush().expect("sled flushes");
        data.sync_data().expect("the file syncs");
        if n >= RAW_SAMPLES / 10 {
            times.push(began.elapsed().as_secs_f64());
        }
    }
    percentile(&sorted(times), 0.5)
}

/// A runtime for the benchmark's own PostgreSQL statements.
fn pg_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("PostgreSQL connects");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Creates the empty scratch table `idem_fleet.<name>`, a key and a value, for the server's own
/// figures.
async fn scratch_table(client: &tokio_postgres::Client, name: &str) {
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS idem_fleet; DROP TABLE IF EXISTS idem_fleet.{name}; \
             CREATE TABLE idem_fleet.{name} (key text PRIMARY KEY, value text)"
        ))
        .await
        .expect("the scratch table");
}

/// The server's own limit: one autocommitted single-row INSERT, what each of a call's two
/// durable points is at the least (`synchronous_commit = on`: the commit waits for its WAL flush).
fn raw_pg_durable_point(url: &str) -> f64 {
    pg_runtime().block_on(async {
        let client = pg_client(url).await;
        scratch_table(&client, "raw").await;
        let insert =
            client.prepare("INSERT INTO idem_fleet.raw VALUES ($1, $2)").await.expect("prepare");
        let value = "x".repeat(330);
        let mut times = Vec::with_capacity(RAW_SAMPLES);
        for n in 0..RAW_SAMPLES + RAW_SAMPLES / 10 {
            let key = format!("{n:032x}");
            let began = Instant::now();
            client.execute(&insert, &[&key, &value]).await.expect("an insert");
            if n >= RAW_SAMPLES / 10 {
                times.push(began.elapsed().as_secs_f64());
            }
        }
        client.batch_execute("DROP TABLE idem_fleet.raw").await.expect("drop the scratch table");
        percentile(&sorted(times), 0.5)
    })
}

/// Commits per second that `connections` connections reach together, each committing
/// single-row INSERTs one after another for [`THROUGHPUT_FOR`]: the server's own ceiling on
/// this machine, with nothing of idem's in the way.
fn pg_commit_ceiling(url: &str, connections: usize) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let setup = pg_client(url).await;
        scratch_table(&setup, "ceiling").await;
        let mut clients = Vec::new();
        for _ in 0..connections {
            clients.push(pg_client(url).await);
        }
        let start = Arc::new(tokio::sync::Barrier::new(connections));
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(c, client)| {
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    let insert = client
                        .prepare("INSERT INTO idem_fleet.ceiling VALUES ($1, $2)")
                        .await
                        .expect("prepare");
                    let value = "x".repeat(330);
                    start.wait().await;
                    let began = Instant::now();
                    let mut n = 0u64;
                    while began.elapsed() < THROUGHPUT_FOR {
                        let key = format!("{c}-{n}");
                        client.execute(&insert, &[&key, &value]).await.expect("an insert");
                        n += 1;
                    }
                    n as f64 / began.elapsed().as_secs_f64()
                })
            })
            .collect();
        let mut rate = 0.0;
        for task in tasks {
            rate += task.await.expect("a connection's task");
        }
        setup.batch_execute("DROP TABLE idem_fleet.ceiling").await.expect("drop the scratch table");
        rate
    })
}

/// The notify trigger of releases before this one, as their migration created it: each insert,
/// delete and update announced from inside its own transaction.
const EARLIER_TRIGGER: &str = r#"
CREATE OR REPLACE FUNCTION idem_fleet.records_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_fleet_earlier', CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END);
    RETURN NULL;
END
$$;
CREATE TRIGGER records_notify_insert_delete AFTER INSERT OR DELETE ON idem_fleet.records
    FOR EACH ROW EXECUTE FUNCTION idem_fleet.records_notify();
CREATE TRIGGER records_notify_update AFTER UPDATE ON idem_fleet.records
    FOR EACH ROW EXECUTE FUNCTION idem_fleet.records_notify();
"#;

const DROP_EARLIER_TRIGGER: &str = "DROP TRIGGER IF EXISTS records_notify_insert_delete ON \
    idem_fleet.records; DROP TRIGGER IF EXISTS records_notify_update ON idem_fleet.records; \
    DROP FUNCTION IF EXISTS idem_fleet.records_notify()";

/// What a fleet run measured, over all its processes.
struct Fleet {
    rate: f64,
    p50: f64,
    p99: f64,
    /// CPU time of the whole machine (the server's backends, the fleet and anything else) per
    /// call, in seconds, and the share of all cores busy.
    cpu: f64,
    busy: f64,
}

/// The machine's busy and total CPU time so far, in seconds, from `/proc/stat` (all cores; idle
/// and I/O wait are not busy).
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    // USER_HZ: 100 a second on Linux.
    ((total - idle) / 100.0, total / 100.0)
}

/// `processes` child processes of `callers` threads each, making fresh calls (`mode` "fresh")
/// or replaying the keys they wrote ("replay") for the same stretch of time, started together
/// once every process says it is ready.
fn fleet(
    url: &str,
    processes: usize,
    callers: usize,
    mode: &str,
    triggered: bool,
) -> Option<Fleet> {
    // The table, created (and any trigger left behind dropped) by a store's migration; the
    // fleet's processes connect without migrating, so that a trigger put back stays.
    drop(idem_postgres::PgStore::builder(url).schema("idem_fleet").connect().ok()?);
    pg_runtime().block_on(async {
        let client = pg_client(url).await;
        // Each run on an empty table: the same store size for every row of the table.
        let _ = client.batch_execute("TRUNCATE idem_fleet.records").await;
        if triggered {
            client.batch_execute(EARLIER_TRIGGER).await.expect("the earlier trigger");
        }
    });
    let exe = std::env::current_exe().ok()?;
    let seconds = THROUGHPUT_FOR.as_secs().to_string();
    let mut children = Vec::new();
    for p in 0..processes {
        let prefix = format!("{mode}-{processes}x{callers}-{p}");
        let child = Command::new(&exe)
            .args(["fleet", url, &callers.to_string(), &seconds, mode, &prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        children.push(child);
    }
    let mut readers = Vec::new();
    for child in &mut children {
        let mut reader = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if line.trim() != "ready" {
            return None;
        }
        readers.push(reader);
    }
    let cpu_before = machine_cpu();
    for child in &mut children {
        writeln!(child.stdin.as_mut()?, "go").ok()?;
    }
    let (mut calls, mut latencies, mut took) = (0u64, Vec::new(), 0f64);
    for (child, mut reader) in children.iter_mut().zip(readers) {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let mut fields = line.trim().split(' ');
        calls += fields.next()?.parse::<u64>().ok()?;
        took = took.max(fields.next()?.parse::<f64>().ok()?);
        latencies.extend(fields.filter_map(|f| f.parse::<f64>().ok()));
        child.wait().ok()?;
    }
    let cpu_after = machine_cpu();
    if triggered {
        pg_runtime().block_on(async {
            let client = pg_client(url).await;
            let _ = client.batch_execute(DROP_EARLIER_TRIGGER).await;
        });
    }
    let latencies = sorted(latencies);
    Some(Fleet {
        rate: calls as f64 / took,
        cpu: (cpu_after.0 - cpu_before.0) / calls.max(1) as f64,
        busy: (cpu_after.0 - cpu_before.0) / (cpu_after.1 - cpu_before.1).max(0.01),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    })
}

/// One process of the fleet: `callers` threads on one store instance. It prints `ready`, waits
/// for `go` on its input, runs for `run_for`, then prints the calls made, the seconds taken and
/// every call's latency.
fn fleet_child(url: &str, callers: usize, run_for: Duration, mode: &str, prefix: &str) {
    let store: Arc<dyn Store> = Arc::new(
        idem_postgres::PgStore::builder(url)
            .schema("idem_fleet")
            .pool_size(callers + 1)
            .create(false)
            .connect()
            .expect("the fleet's store connects"),
    );
    let replaying = mode == "replay";
    if replaying {
        for caller in 0..callers {
            for n in 0..REPLAY_KEYS {
                charge(&store, &format!("{prefix}-{caller}-{n}"));
            }
        }
    }
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("the parent says go");
    let start = Arc::new(Barrier::new(callers));
    let threads: Vec<_> = (0..callers)
        .map(|caller| {
            let (store, start, prefix) = (store.clone(), start.clone(), prefix.to_owned());
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                let mut latencies = Vec::new();
                let mut n = 0usize;
                while began.elapsed() < run_for {
                    let scope = if replaying {
                        format!("{prefix}-{caller}-{}", n % REPLAY_KEYS)
                    } else {
                        format!("{prefix}-{caller}-{n}")
                    };
                    let call = Instant::now();
                    charge(&store, &scope);
                    latencies.push(call.elapsed().as_secs_f64());
                    n += 1;
                }
                (latencies, began.elapsed().as_secs_f64())
            })
        })
        .collect();
    let mut line = String::new();
    let (mut calls, mut took) = (0usize, 0f64);
    let mut all = Vec::new();
    for thread in threads {
        let (latencies, seconds) = thread.join().expect("a caller");
        calls += latencies.len();
        took = took.max(seconds);
        all.extend(latencies);
    }
    line.push_str(&format!("{calls} {took}"));
    for latency in all {
        line.push_str(&format!(" {latency}"));
    }
    println!("{line}");
}

/// Throughput against callers, with each store's limit, on log–log axes.
fn draw(
    path: &Path,
    sled: &[(usize, f64, f64)],
    pg: &[(usize, f64, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let points = sled.iter().chain(pg);
    let top = points.clone().map(|&(_, rate, limit)| rate.max(limit)).fold(1.0, f64::max) * 1.5;
    let bottom = points.map(|&(_, rate, limit)| rate.min(limit)).fold(f64::MAX, f64::min) / 1.5;
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Fresh calls per second against concurrent callers", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((0.8f64..40.0).log_scale(), (bottom.max(1.0)..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent callers")
        .y_desc("calls/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let series = [
        ("sled, measured", sled, false, RGBColor(30, 80, 200)),
        ("sled, limit: callers ÷ 2 durable points", sled, true, RGBColor(130, 160, 240)),
        ("PostgreSQL fleet, measured", pg, false, RGBColor(200, 40, 40)),
        ("PostgreSQL, limit: callers ÷ 2 commits", pg, true, RGBColor(240, 140, 140)),
    ];
    for (label, curve, limit, color) in series {
        if curve.is_empty() {
            continue;
        }
        let line: Vec<(f64, f64)> = curve
            .iter()
            .map(|&(callers, rate, bound)| (callers as f64, if limit { bound } else { rate }))
            .collect();
        let style = if limit { color.stroke_width(1) } else { color.stroke_width(3) };
        chart
            .draw_series(LineSeries::new(line.clone(), style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
