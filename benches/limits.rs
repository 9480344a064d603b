//! What criterion does not fit: throughput with concurrent callers, the wake-up latency of
//! waiters, memory and disk after many records; then the table of BENCHMARKS.md, with the rows of
//! the last `cargo bench -p idem-benches --bench calls` run and the ratios against the
//! targets.
//!
//! `cargo bench -p idem-benches --bench limits` (after `… --bench calls`). `-- memory N` is the
//! child process that fills a store with N records, reports its RSS and size, then times
//! reopening it and opening an empty store, through idem and through sled alone (idem's open
//! reads only the in-flight index, so what is left is sled's recovery); `-- open N` runs that
//! child and prints only its open rows; `-- syncs N` opens a store and makes N fresh calls, for
//! counting syncs under strace; `-- waiters` prints only the waiters' wake-up rows; `-- fill N
//! DIR` and `-- open-at DIR idem|nosync|sled` are for a profiler.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Call, Durability, Error, SledStore, Store};

use self::common::{dir_bytes, fresh_call, proc_status_kib, temp_store, throughput};

#[path = "common.rs"]
mod common;

const WAITERS: usize = 8;
const WAIT_ROUNDS: usize = 12;
const OWNER_BODY: Duration = Duration::from_millis(50);
const THROUGHPUT_FOR: Duration = Duration::from_secs(4);
/// How many times the memory child reopens the store it filled, and an empty one, timing each
/// open, through idem and through sled alone.
const OPENS: usize = 7;

/// Waiter latencies in µs, measured from the end of the owner's body and from the return of its
/// call (once its result is durable); negative when the waiter returned first.
fn waiters() -> (Vec<f64>, Vec<f64>) {
    let (_dir, store) = temp_store(Durability::Fsync);
    let (mut from_body, mut from_return) = (Vec::new(), Vec::new());
    for round in 0..WAIT_ROUNDS {
        let scope = format!("wake-{round}");
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let owner = {
            let (store, scope) = (store.clone(), scope.clone());
            std::thread::spawn(move || {
                let mut body_end = None;
                let out: Result<u64, Error> =
                    Call::new("charge_card", &scope, &1).unwrap().store(store).run(|| {
                        started_tx.send(()).unwrap();
                        std::thread::sleep(OWNER_BODY);
                        body_end = Some(Instant::now());
                        Ok(7)
                    });
                out.unwrap();
                (body_end.unwrap(), Instant::now())
            })
        };
        started_rx.recv().unwrap();
        let waiting: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (store, scope) = (store.clone(), scope.clone());
                std::thread::spawn(move || {
                    let out: Result<u64, Error> = Call::new("charge_card", &scope, &1)
                        .unwrap()
                        .store(store)
                        .run(|| unreachable!("the owner is alive: a waiter never runs the body"));
                    assert_eq!(out.unwrap(), 7);
                    Instant::now()
                })
            })
            .collect();
        let (body_end, owner_return) = owner.join().unwrap();
        for waiter in waiting {
            let returned = waiter.join().unwrap();
            let signed = |from: Instant| match returned.checked_duration_since(from) {
                Some(after) => after.as_secs_f64() * 1e6,
                None => -(from.duration_since(returned).as_secs_f64() * 1e6),
            };
            from_body.push(signed(body_end));
            from_return.push(signed(owner_return));
        }
    }
    (from_body, from_return)
}

/// The child process: `records` finished records through the engine, in a store opened with
/// the default cache (64 MiB). Filled with `Durability::None`: the syncs change the time taken,
/// not what is kept in memory or on disk.
fn memory_child(records: u64) {
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().expect("temp dir");
    let sled = SledStore::builder(dir.path().join("idem.sled")).durability(Durability::None);
    let sled = Arc::new(sled.open().expect("open the sled store"));
    let store: Arc<dyn Store> = Arc::clone(&sled) as Arc<dyn Store>;
    fill(&store, records);
    // Let sled's flusher write what it holds before measuring.
    std::thread::sleep(Duration::from_secs(1));
    let (rss, peak) = (proc_status_kib("VmRSS:"), proc_status_kib("VmHWM:"));
    let sled_size = sled.size_on_disk().unwrap_or(0);
    let files = dir_bytes(dir.path());
    println!("rss_kib={rss} peak_kib={peak} size_on_disk={sled_size} dir_bytes={files}");
    // Then how long opening that store takes, against an empty one, through idem and through
    // sled alone with the same options: idem's open reads the index of in-flight records, not
    // the records, so what is left is sled's recovery. The files are in the page cache, as
    // after an agent's restart. The first open replays the whole log the fill wrote (sled 0.34
    // takes its snapshot only when it opens a store); the others, what the previous open and
    // close wrote. They are interleaved, so that the machine's load weighs on each alike.
    drop(store);
    let full = dir.path().join("idem.sled");
    let empty = tempfile::Builder::new().prefix("idem-limits").tempdir().expect("temp dir");
    let empty = empty.path().join("idem.sled");
    drop(SledStore::open(&empty).expect("create an empty store"));
    settle_lock();
    println!("open_first_ms={:.1}", time_open(&full, Opener::Idem));
    let mut times: [Vec<String>; 6] = Default::default();
    for _ in 0..OPENS {
        for (i, (path, opener)) in [
            (&full, Opener::Idem),
            (&full, Opener::IdemNoSync),
            (&full, Opener::Sled),
            (&empty, Opener::Idem),
            (&empty, Opener::IdemNoSync),
            (&empty, Opener::Sled),
        ]
        .into_iter()
        .enumerate()
        {
            times[i].push(format!("{:.2}", time_open(path, opener)));
        }
    }
    let names = [
        "open_ms",
        "nosync_open_ms",
        "sled_open_ms",
        "open_empty_ms",
        "nosync_open_empty_ms",
        "sled_open_empty_ms",
    ];
    for (name, times) in names.into_iter().zip(&times) {
        println!("{name}={}", times.join(","));
    }
}

/// `records` finished records through the engine.
fn fill(store: &Arc<dyn Store>, records: u64) {
    for n in 0..records {
        let out: Result<String, Error> = Call::new("charge_card", n, &("cus_123", 4200))
            .unwrap()
            .store(store.clone())
            .run(|| Ok(format!("ch_{n:08}")));
        out.unwrap();
    }
}

#[derive(Clone, Copy)]
enum Opener {
    /// `SledStore::open`, idem's defaults.
    Idem,
    /// `SledStore::open` without what costs the same on any store: the syncs of the files sled
    /// made (`Durability::Flush`) and the admin socket. What is left is sled's open and idem's
    /// settling of the in-flight index.
    IdemNoSync,
    /// `sled::Config::open` with the options `SledStore::open` gives sled (with `Fsync`), and
    /// the three trees opened.
    Sled,
}

/// The time (ms) of opening the store at `path` once; the handle is dropped after, untimed.
fn time_open(path: &Path, opener: Opener) -> f64 {
    let began = Instant::now();
    let took = match opener {
        Opener::Idem => {
            let store = SledStore::builder(path)
                .lock_wait(Duration::from_secs(5))
                .open()
                .expect("reopen the store");
            let took = began.elapsed();
            drop(store);
            took
        }
        Opener::IdemNoSync => {
            let store = SledStore::builder(path)
                .durability(Durability::Flush)
                .admin_socket(false)
                .lock_wait(Duration::from_secs(5))
                .open()
                .expect("reopen the store");
            let took = began.elapsed();
            drop(store);
            took
        }
        Opener::Sled => {
            let config = sled::Config::new()
                .path(path)
                .cache_capacity(64 * 1024 * 1024)
                .flush_every_ms(None);
            // As `lock_wait` does for the others: the pause after the last close makes a wait
            // rare.
            let db = loop {
                match config.open() {
                    Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    opened => break opened.expect("sled opens the store"),
                }
            };
            for tree in ["idem.records", "idem.chunks", "idem.in-flight"] {
                db.open_tree(tree).expect("sled opens a tree");
            }
            let took = began.elapsed();
            drop(db);
            took
        }
    };
    settle_lock();
    took.as_secs_f64() * 1e3
}

/// sled 0.34 releases a store's lock a moment after its handle is dropped (its threads close
/// the file): wait out that moment, untimed, rather than time an open that waits for it.
fn settle_lock() {
    std::thread::sleep(Duration::from_millis(200));
}

/// What the memory child measured: RSS, peak RSS, sled's size on disk and the files' size
/// after `records` finished records, and the times (ms) of opening that store and an empty one.
struct Filled {
    sizes: [u64; 4],
    first_open: f64,
    opens: Vec<f64>,
    nosync_opens: Vec<f64>,
    sled_opens: Vec<f64>,
    empty_opens: Vec<f64>,
    nosync_empty_opens: Vec<f64>,
    sled_empty_opens: Vec<f64>,
}

fn memory(records: u64) -> Option<Filled> {
    let exe = std::env::current_exe().ok()?;
    let out =
        std::process::Command::new(exe).args(["memory", &records.to_string()]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("rss_kib="))?;
    let mut values = line.split(' ').filter_map(|kv| kv.split_once('=')?.1.parse().ok());
    let sizes = [values.next()?, values.next()?, values.next()?, values.next()?];
    let times = |name: &str| -> Option<Vec<f64>> {
        let prefix = format!("{name}=");
        let line = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))?;
        Some(line.split(',').filter_map(|ms| ms.parse().ok()).collect())
    };
    Some(Filled {
        sizes,
        first_open: *times("open_first_ms")?.first()?,
        opens: times("open_ms")?,
        nosync_opens: times("nosync_open_ms")?,
        sled_opens: times("sled_open_ms")?,
        empty_opens: times("open_empty_ms")?,
        nosync_empty_opens: times("nosync_open_empty_ms")?,
        sled_empty_opens: times("sled_open_empty_ms")?,
    })
}

/// One criterion result: median and min–max over its samples, in ns per iteration.
struct Measured {
    median: f64,
    min: f64,
    max: f64,
}

fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    // This binary is target/<profile>/deps/limits-…; criterion writes to target/criterion.
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors().nth(3).map(|t| t.join("criterion")).unwrap_or_default()
}

fn criterion(id: &str) -> Option<Measured> {
    let dir = criterion_dir().join(id).join("new");
    let read = |name: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
    };
    let estimates = read("estimates.json")?;
    let sample = read("sample.json")?;
    let median = estimates["median"]["point_estimate"].as_f64()?;
    let iters = sample["iters"].as_array()?;
    let times = sample["times"].as_array()?;
    let per_iter: Vec<f64> =
        iters.iter().zip(times).filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()?)).collect();
    let min = per_iter.iter().copied().fold(f64::INFINITY, f64::min);
    let max = per_iter.iter().copied().fold(0.0, f64::max);
    Some(Measured { median, min, max })
}

fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The rows of the open times of a store of `records` finished records; the ratios of its
/// median open to an empty store's: through idem, through idem without its syncs and socket,
/// and through sled alone.
fn open_rows(
    records: u64,
    filled: &mut Filled,
    row: &mut impl FnMut(&str, String),
) -> (f64, f64, f64) {
    let spread = |times: &mut Vec<f64>| {
        let m = median(times);
        format!("{m:.1} ms ({:.1} – {:.1} ms)", times[0], times[times.len() - 1])
    };
    row(
        &format!("{records} finished records: first `SledStore::open` after the fill"),
        format!("{:.0} ms (sled replays the fill's whole log)", filled.first_open),
    );
    let openers = ["`SledStore::open`", "the same, `Flush` and no socket", "sled alone"];
    for (what, times) in
        openers.iter().zip([&mut filled.opens, &mut filled.nosync_opens, &mut filled.sled_opens])
    {
        row(&format!("{records} finished records: {what} ({OPENS} opens, warm)"), spread(times));
    }
    for (what, times) in openers.iter().zip([
        &mut filled.empty_opens,
        &mut filled.nosync_empty_opens,
        &mut filled.sled_empty_opens,
    ]) {
        row(&format!("empty store: {what} ({OPENS} opens, interleaved)"), spread(times));
    }
    (
        median(&mut filled.opens) / median(&mut filled.empty_opens),
        median(&mut filled.nosync_opens) / median(&mut filled.nosync_empty_opens),
        median(&mut filled.sled_opens) / median(&mut filled.sled_empty_opens),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if !one_part(&args) {
        report();
    }
}

/// Runs the part `args` names (a child, or a step for a profiler or strace), if they name one.
fn one_part(args: &[String]) -> bool {
    match args {
        // For a profiler: `fill N DIR` leaves a store of N finished records in DIR (as the
        // memory child fills it); `open-at DIR idem|nosync|sled` opens it once.
        [mode, n, dir] if mode == "fill" => {
            let store: Arc<dyn Store> = Arc::new(
                SledStore::builder(dir).durability(Durability::None).open().expect("a new store"),
            );
            fill(&store, n.parse().expect("a record count"));
        }
        [mode, dir, how] if mode == "open-at" => {
            let opener = match how.as_str() {
                "sled" => Opener::Sled,
                "nosync" => Opener::IdemNoSync,
                _ => Opener::Idem,
            };
            println!("{:.2} ms", time_open(Path::new(dir), opener));
        }
        [mode, n] if mode == "memory" => memory_child(n.parse().expect("a record count")),
        [mode, n] if mode == "open" => only_open_rows(n.parse().expect("a record count")),
        // Only the waiters' wake-up rows (issue 28: woken within 0.5 ms of the owner's result).
        [mode] if mode == "waiters" => {
            waiter_rows(&mut |what: &str, figure: String| println!("| {what} | {figure} |"));
        }
        [mode, n] if mode == "syncs" => {
            // For strace: open a new store and make `n` fresh calls, nothing else. The syncs of
            // `syncs 1` less those of `syncs 0` are one call's.
            let (_dir, store) = temp_store(Durability::Fsync);
            for _ in 0..n.parse().expect("a call count") {
                fresh_call(&store);
            }
        }
        _ => return false,
    }
    true
}

/// Only the open rows: fill a store of `records` records in the child, time its opens.
fn only_open_rows(records: u64) {
    let began = Instant::now();
    let mut filled = memory(records).expect("the memory child");
    let mut row = |what: &str, figure: String| println!("| {what} | {figure} |");
    let (idem, nosync, sled) = open_rows(records, &mut filled, &mut row);
    println!(
        "- open at {records} / empty: {idem:.2} through idem, {nosync:.2} without its \
         syncs and socket, {sled:.2} sled alone"
    );
    println!("- the run took {:.0} s", began.elapsed().as_secs_f64());
}

/// The whole run: every row of the table, each also on stderr as it is measured, then the table
/// and the ratios against the targets.
fn report() {
    let mut table = String::new();
    let mut row = |what: &str, figure: String| {
        let _ = writeln!(table, "| {what} | {figure} |");
        eprintln!("{what}: {figure}");
    };
    let found = criterion_rows(&mut row);
    let rates = throughput_rows(&mut row);
    let mut from_return = waiter_rows(&mut row);
    let (rss_1m, open_ratio_1m) = memory_rows(&mut row);

    println!("\n| what | median (min – max) |\n| --- | --- |\n{table}");
    println!("ratios against the targets, from this run:");
    let ratio = |a: &str, b: &str| Some(found.get(a)? / found.get(b)?);
    if let Some(r) = ratio("fresh/fsync", "limit/sled_durable_point") {
        println!(
            "- fresh Fsync call / one raw sled durable point = {r:.2} (target ≤ 2 × 1.1 = 2.2)"
        );
    }
    let rate = |n| rates.iter().find(|(c, _)| *c == n).map(|(_, r)| *r);
    if let (Some(one), Some(eight)) = (rate(1), rate(8)) {
        println!("- 8 callers' throughput / 1 caller's = {:.2} (target ≥ 4)", eight / one);
    }
    for (id, target) in [
        ("replay/sync", 1500.0),
        ("replay/async", 1500.0),
        ("replay/macro_sync", 1500.0),
        ("key/derive_2_fields", 400.0),
    ] {
        if let Some(m) = found.get(id) {
            println!(
                "- {id} = {} (target ≤ {}): {:.2} of it",
                human(*m),
                human(target),
                m / target
            );
        }
    }
    println!(
        "- waiter wake-up median from the owner's return = {:.0} µs (target ≤ 1000 µs)",
        median(&mut from_return)
    );
    if let Some(rss) = rss_1m {
        println!("- 1 M records RSS = {rss:.1} MiB (target ≤ 128 MiB)");
    }
    if let Some(ratio) = open_ratio_1m {
        println!(
            "- SledStore::open at 1 M finished records / on an empty store = {:.2} (target ≤ 2); \
             without its syncs and socket {:.2}; sled's own open of the same stores: {:.2}",
            ratio.0, ratio.1, ratio.2
        );
    }
}

/// The rows of the last criterion run of `calls`; returns the medians found, by benchmark id.
fn criterion_rows(row: &mut impl FnMut(&str, String)) -> HashMap<&'static str, f64> {
    let rows = [
        ("key derivation, 2 fields", "key/derive_2_fields"),
        ("key derivation, 20 fields", "key/derive_20_fields"),
        ("canonical JSON alone, 2 fields", "key/canonical_json_2_fields"),
        ("canonical JSON alone, 20 fields", "key/canonical_json_20_fields"),
        ("replay, sync (`Call::run`)", "replay/sync"),
        ("replay, async (`Call::run_async`)", "replay/async"),
        ("replay through `#[idempotent]`, sync", "replay/macro_sync"),
        ("replay through `#[idempotent]`, async", "replay/macro_async"),
        ("fresh call, `Durability::None`", "fresh/none"),
        ("fresh call, `Durability::Flush`", "fresh/flush"),
        ("fresh call, `Durability::Fsync`", "fresh/fsync"),
        ("limit: raw sled durable point (CAS + flush + fdatasync)", "limit/sled_durable_point"),
        ("limit: 64-byte write + fdatasync", "limit/write_64b_fdatasync"),
        ("PostgreSQL store: fresh call", "postgres/fresh"),
        ("PostgreSQL store: replay", "postgres/replay"),
    ];
    let mut found = HashMap::new();
    for (what, id) in rows {
        match criterion(id) {
            Some(m) => {
                row(what, format!("{} ({} – {})", human(m.median), human(m.min), human(m.max)));
                found.insert(id, m.median);
            }
            None => row(
                what,
                "not measured (run `cargo bench -p idem-benches --bench calls` first)".into(),
            ),
        }
    }
    found
}

/// The rows of fresh-call throughput; returns (callers, calls/s) for each.
fn throughput_rows(row: &mut impl FnMut(&str, String)) -> Vec<(usize, f64)> {
    let mut rates = Vec::new();
    for callers in [1, 2, 8, 32] {
        let t = throughput(callers, THROUGHPUT_FOR, None);
        let rate = t.rate;
        row(
            &format!("fresh `Fsync` calls/s, {callers} concurrent callers"),
            format!(
                "{rate:.0} ({:.1} writes a durable point of {:.0} µs, {:.0} µs of CPU a call)",
                t.writes_per_sync,
                t.sync * 1e6,
                t.cpu * 1e6
            ),
        );
        rates.push((callers, rate));
    }
    rates
}

/// The rows of the waiters' wake-up; returns the latencies from the owner's return.
fn waiter_rows(row: &mut impl FnMut(&str, String)) -> Vec<f64> {
    let (mut from_body, mut from_return) = waiters();
    let spread = |v: &mut Vec<f64>| {
        let m = median(v);
        let p90 = v[v.len() * 9 / 10];
        format!("{:.0} µs (p90 {:.0} µs, {:.0} – {:.0} µs)", m, p90, v[0], v[v.len() - 1])
    };
    row(
        "waiter wake-up, from the end of the owner's body (8 waiters × 12 rounds)",
        spread(&mut from_body),
    );
    row("waiter wake-up, from the owner's return (its Done durable)", spread(&mut from_return));
    from_return
}

/// The rows of memory, size and opens at 100 k and 1 M records; returns the RSS in MiB and the
/// open ratios at 1 M.
fn memory_rows(row: &mut impl FnMut(&str, String)) -> (Option<f64>, Option<(f64, f64, f64)>) {
    let mut rss_1m = None;
    let mut open_ratio_1m = None;
    for records in [100_000u64, 1_000_000] {
        match memory(records) {
            Some(mut filled) => {
                let [rss, peak, sled_size, files] = filled.sizes;
                row(
                    &format!("{records} finished records: RSS (peak)"),
                    format!("{:.1} MiB ({:.1} MiB)", rss as f64 / 1024.0, peak as f64 / 1024.0),
                );
                row(
                    &format!("{records} finished records: store size"),
                    format!(
                        "{:.1} MiB (sled's size_on_disk {:.1} MiB)",
                        files as f64 / 1048576.0,
                        sled_size as f64 / 1048576.0
                    ),
                );
                let ratio = open_rows(records, &mut filled, row);
                if records == 1_000_000 {
                    rss_1m = Some(rss as f64 / 1024.0);
                    open_ratio_1m = Some(ratio);
                }
            }
            None => row(&format!("{records} finished records"), "the child process failed".into()),
        }
    }
    (rss_1m, open_ratio_1m)
}
