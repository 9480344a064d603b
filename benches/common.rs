//! What the plain benchmark binaries (`limits`, `scale`) share: a store in a temporary
//! directory, the fresh call they time, fresh-call throughput with concurrent callers, and
//! what the process takes in memory, CPU and disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem::{Call, Durability, Error, SledStore, Store};

/// A new sled store under `durability`, in a temporary directory dropped with it.
pub fn temp_store(durability: Durability) -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().expect("temp dir");
    let store = SledStore::builder(dir.path().join("idem.sled"))
        .durability(durability)
        .open()
        .expect("open the sled store");
    (dir, Arc::new(store))
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// One call of a key no call has used: the same tool and arguments every time, the scope
/// telling keys apart.
pub fn fresh_call(store: &Arc<dyn Store>) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let out: Result<u64, Error> = Call::new("charge_card", n, &("cus_123", 4200))
        .expect("a key")
        .store(store.clone())
        .run(|| Ok(n));
    out.expect("a fresh call");
}

/// Fresh `Fsync` calls per second with `callers` threads on distinct keys for `run_for`, and
/// the CPU time of the whole process per call meanwhile.
pub fn throughput(callers: usize, run_for: Duration) -> (f64, f64) {
    let (_dir, store) = temp_store(Durability::Fsync);
    let start = Arc::new(Barrier::new(callers + 1));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let store = store.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                let mut calls = 0u64;
                while began.elapsed() < run_for {
                    fresh_call(&store);
                    calls += 1;
                }
                (calls, began.elapsed())
            })
        })
        .collect();
    let cpu_before = process_cpu();
    start.wait();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().expect("a caller")).collect();
    let cpu = (process_cpu() - cpu_before).as_secs_f64();
    let calls: u64 = results.iter().map(|(calls, _)| calls).sum();
    let rate = results.iter().map(|(calls, took)| *calls as f64 / took.as_secs_f64()).sum();
    (rate, cpu / calls.max(1) as f64)
}

/// A field of `/proc/self/status` in KiB (`VmRSS:`, `VmHWM:`), 0 when it cannot be read.
pub fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The bytes of every file below `path`.
pub fn dir_bytes(path: &Path) -> u64 {
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

/// CPU time this process has used, all threads (user and system), from `/proc/self/stat`.
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state;
    // the kernel counts them in USER_HZ, 100 a second on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
