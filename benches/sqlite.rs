//! The SQLite store beside sled and the raw SQLite commit, in one run (a plain binary: it
//! starts processes of its own). Prints the table of BENCHMARKS.md's "The SQLite store".
//!
//! `cargo bench -p idem-benches --bench sqlite`

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::{Call, Durability, Error, SledStore, Store};
use idem_runtime::SqliteStore;

const CHILD: &str = "IDEM_SQLITE_BENCH_CHILD";
/// Fresh calls each caller makes in the throughput runs.
const CALLS: usize = 200;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn fresh_call(store: &Arc<dyn Store>, prefix: &str) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let scope = format!("{prefix}-{}-{n}", std::process::id());
    let args = serde_json::json!({ "customer": "cus_123", "amount": 4200 });
    let out: Result<String, Error> = Call::new("charge_card", scope, &args)
        .unwrap()
        .store(Arc::clone(store))
        .run(|| Ok("ch_1".into()));
    out.unwrap();
}

fn sqlite(dir: &Path) -> Arc<dyn Store> {
    Arc::new(
        SqliteStore::builder(dir.join("idem.sqlite")).durability(Durability::Fsync).open().unwrap(),
    )
}

fn sled(dir: &Path) -> Arc<dyn Store> {
    Arc::new(
        SledStore::builder(dir.join("idem.sled")).durability(Durability::Fsync).open().unwrap(),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn timed(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times
}

fn show(d: Duration) -> String {
    if d < Duration::from_micros(10) {
        format!("{:.2} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

/// One raw SQLite commit as the store makes them: a one-row insert in WAL with
/// `synchronous = FULL`, in its own `BEGIN IMMEDIATE` transaction.
fn raw_commits(dir: &Path, n: usize) -> Vec<Duration> {
    let conn = rusqlite::Connection::open(dir.join("raw.sqlite")).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;",
    )
    .unwrap();
    let mut i = 0;
    timed(n, || {
        i += 1;
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.execute("INSERT INTO t VALUES (?1, 'x')", [format!("k{i}")]).unwrap();
        conn.execute_batch("COMMIT").unwrap();
    })
}

/// Fresh calls per second with `threads` callers in this process.
fn callers(store: &Arc<dyn Store>, threads: usize) -> f64 {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (store, barrier) = (Arc::clone(store), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                (0..CALLS).for_each(|_| fresh_call(&store, "threads"));
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    workers.into_iter().for_each(|w| w.join().unwrap());
    (threads * CALLS) as f64 / start.elapsed().as_secs_f64()
}

fn me() -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    command
}

/// Fresh calls per second with `processes` processes of one caller each on one SQLite file.
fn processes(dir: &Path, processes: usize) -> f64 {
    let mut children: Vec<_> = (0..processes)
        .map(|_| me().env(CHILD, "calls").env("IDEM_BENCH_DIR", dir).spawn().unwrap())
        .collect();
    let mut outs: Vec<_> =
        children.iter_mut().map(|c| BufReader::new(c.stdout.take().unwrap())).collect();
    for out in &mut outs {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "READY");
    }
    let start = Instant::now();
    for child in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    children.into_iter().for_each(|mut c| assert!(c.wait().unwrap().success()));
    (processes * CALLS) as f64 / start.elapsed().as_secs_f64()
}

fn calls_child(dir: &Path) {
    let store = sqlite(dir);
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    (0..CALLS).for_each(|_| fresh_call(&store, "processes"));
}

fn micros_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

fn wake_call(store: &Arc<dyn Store>, i: usize) -> Call {
    // A scope of its own per run and round: a key of an earlier run would replay.
    Call::new("wake", format!("wake-{i}"), &serde_json::json!({ "i": i }))
        .unwrap()
        .store(Arc::clone(store))
        .wait(Duration::from_secs(30))
}

/// Waits for round `i`'s key, which another caller owns; returns when it woke (µs).
fn wait_for(store: &Arc<dyn Store>, i: usize, waiting: impl FnOnce() + Send + 'static) -> u64 {
    let call = wake_call(store, i);
    let key = call.key().to_string();
    let watcher = std::thread::spawn(move || {
        while idem_runtime::waiting(&key) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        waiting();
    });
    let _: String = call.run(|| -> Result<String, Error> { panic!("the owner runs it") }).unwrap();
    let woke = micros_now();
    watcher.join().unwrap();
    woke
}

/// Child mode `waiter`: for each line on stdin, waits for that round's key; prints when it
/// started waiting and when it woke.
fn waiter_child(dir: &Path) {
    let store = sqlite(dir);
    let stdin = BufReader::new(std::io::stdin());
    for line in stdin.lines() {
        let i: usize = line.unwrap().trim().parse().unwrap();
        let woke = wait_for(&store, i, || {
            println!("WAITING");
            std::io::stdout().flush().unwrap();
        });
        println!("WOKE {woke}");
        std::io::stdout().flush().unwrap();
    }
}

/// How long after the owner's body returned a waiter in another process (`other_process`) or
/// in a thread of the owner's process returns with its result: the owner's durable write of
/// the result, then the wake-up.
fn wakeups(
    dir: &Path,
    store: &Arc<dyn Store>,
    rounds: usize,
    other_process: bool,
) -> Vec<Duration> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let base = RUN.fetch_add(1, Ordering::Relaxed) as usize * 1_000_000;
    let mut child = other_process.then(|| {
        let mut child = me().env(CHILD, "waiter").env("IDEM_BENCH_DIR", dir).spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        (child, out)
    });
    let mut latencies = Vec::new();
    for i in (0..rounds).map(|round| base + round) {
        let (in_body, finish) = (mpsc::channel::<()>(), mpsc::channel::<()>());
        let owner = {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                let mut returned = 0;
                let _: String = wake_call(&store, i)
                    .run(|| {
                        in_body.0.send(()).unwrap();
                        finish.1.recv().unwrap();
                        returned = micros_now();
                        Ok::<_, Error>("done".into())
                    })
                    .unwrap();
                returned
            })
        };
        in_body.1.recv().unwrap();
        let woke = match &mut child {
            Some((process, out)) => {
                writeln!(process.stdin.as_mut().unwrap(), "{i}").unwrap();
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                assert_eq!(line.trim(), "WAITING");
                finish.0.send(()).unwrap();
                line.clear();
                out.read_line(&mut line).unwrap();
                line.trim().strip_prefix("WOKE ").unwrap().parse::<u64>().unwrap()
            }
            None => {
                let (waiting, waited) = mpsc::channel::<()>();
                let waiter = {
                    let store = Arc::clone(store);
                    std::thread::spawn(move || {
                        wait_for(&store, i, move || waiting.send(()).unwrap())
                    })
                };
                waited.recv().unwrap();
                finish.0.send(()).unwrap();
                waiter.join().unwrap()
            }
        };
        let returned = owner.join().unwrap();
        latencies.push(Duration::from_micros(woke.saturating_sub(returned)));
    }
    if let Some((mut process, _)) = child {
        drop(process.stdin.take());
        process.wait().unwrap();
    }
    latencies.sort();
    latencies
}

fn row(what: &str, sorted: &[Duration]) {
    println!("| {what} | {} | {} |", show(percentile(sorted, 0.5)), show(percentile(sorted, 0.99)));
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        let dir = PathBuf::from(std::env::var("IDEM_BENCH_DIR").unwrap());
        match mode.as_str() {
            "calls" => calls_child(&dir),
            _ => waiter_child(&dir),
        }
        return;
    }
    let base = tempfile::Builder::new().prefix("idem-sqlite-bench").tempdir().unwrap();
    let at = |name: &str| {
        let dir = base.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let (lite_dir, sled_dir) = (at("sqlite"), at("sled"));
    let (lite, sled) = (sqlite(&lite_dir), sled(&sled_dir));
    let started = Instant::now();

    if std::env::var_os("IDEM_BENCH_FRESH_ONLY").is_some() {
        // For strace: the fresh calls alone.
        let fresh = timed(300, || fresh_call(&lite, "fresh"));
        row("fresh call, SQLite", &fresh);
        return;
    }
    println!("| what (`Durability::Fsync`) | p50 | p99 |");
    println!("| --- | --- | --- |");
    let raw = raw_commits(&at("raw"), 300);
    row("raw SQLite commit (WAL, `synchronous = FULL`, one-row insert)", &raw);
    let fresh_lite = timed(300, || fresh_call(&lite, "fresh"));
    row("fresh call, SQLite", &fresh_lite);
    let fresh_sled = timed(300, || fresh_call(&sled, "fresh"));
    row("fresh call, sled", &fresh_sled);
    for (name, store) in [("SQLite", &lite), ("sled", &sled)] {
        let args = serde_json::json!({ "customer": "cus_123", "amount": 4200 });
        let call = Call::new("charge_card", "replayed", &args).unwrap().store(Arc::clone(store));
        let _: String = call.clone().run(|| Ok::<_, Error>("ch_1".into())).unwrap();
        let replays = timed(20_000, || {
            let _: String =
                call.clone().run(|| -> Result<String, Error> { unreachable!() }).unwrap();
        });
        row(&format!("replay, {name}"), &replays);
    }
    let woke = wakeups(&lite_dir, &lite, 200, true);
    row("waiter in another process: owner's body returns → waiter has the result, SQLite", &woke);
    let woke = wakeups(&lite_dir, &lite, 200, false);
    row("waiter in the owner's process, SQLite", &woke);
    let woke = wakeups(&sled_dir, &sled, 200, false);
    row("waiter in the owner's process, sled", &woke);
    let ratio =
        percentile(&fresh_lite, 0.5).as_secs_f64() / (2.0 * percentile(&raw, 0.5).as_secs_f64());
    println!();
    println!("fresh SQLite p50 ÷ two raw commits' p50: {ratio:.2}");
    println!();
    println!("| fresh calls/s | SQLite | sled |");
    println!("| --- | --- | --- |");
    println!("| 1 process × 1 caller | {:.0} | {:.0} |", callers(&lite, 1), callers(&sled, 1));
    println!("| 1 process × 8 callers | {:.0} | {:.0} |", callers(&lite, 8), callers(&sled, 8));
    println!("| 8 processes × 1 caller | {:.0} | (one process only) |", processes(&at("fleet"), 8));
    eprintln!("took {:.0} s", started.elapsed().as_secs_f64());
}
