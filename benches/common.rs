//! What the plain benchmark binaries (`limits`, `scale`) share: a store in a temporary
//! directory, the fresh call they time, fresh-call throughput with concurrent callers, and
//! what the process takes in memory, CPU and disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem::{Call, Durability, Error, SledStore, SledStoreBuilder, Store};

/// A new sled store under `durability`, in a temporary directory dropped with it.
pub fn temp_store(durability: Durability) -> (tempfile::TempDir, Arc<dyn Store>) {
    temp_store_with(|builder| builder.durability(durability))
}

/// A new sled store with the options `options` sets, in a temporary directory dropped with it.
pub fn temp_store_with(
    options: impl FnOnce(SledStoreBuilder) -> SledStoreBuilder,
) -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().expect("temp dir");
    let store = options(SledStore::builder(dir.path().join("idem.sled")))
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

/// What a throughput run measured.
pub struct Throughput {
    /// Fresh calls a second, all callers together.
    pub rate: f64,
    /// CPU time of the whole process per call, in seconds.
    pub cpu: f64,
    /// Writes answered by each durable point, on average (the store's `idem_syncs_total`).
    pub writes_per_sync: f64,
    /// How long a durable point took, on average, in seconds.
    pub sync: f64,
}

/// Fresh `Fsync` calls per second with `callers` threads on distinct keys for `run_for`, and
/// the CPU time of the whole process per call meanwhile; `group_commit_wait` as the store's
/// option of that name, or its default when `None`.
pub fn throughput(
    callers: usize,
    run_for: Duration,
    group_commit_wait: Option<Duration>,
) -> Throughput {
    let syncs = syncs::install();
    let (_dir, store) = temp_store_with(|builder| {
        let builder = builder.durability(Durability::Fsync);
        match group_commit_wait {
            Some(wait) => builder.group_commit_wait(wait),
            None => builder,
        }
    });
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
    let syncs_before = syncs.read();
    start.wait();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().expect("a caller")).collect();
    let (count, nanos) = syncs.read();
    let (count, nanos) = (count - syncs_before.0, nanos - syncs_before.1);
    let cpu = (process_cpu() - cpu_before).as_secs_f64();
    let calls: u64 = results.iter().map(|(calls, _)| calls).sum();
    Throughput {
        rate: results.iter().map(|(calls, took)| *calls as f64 / took.as_secs_f64()).sum(),
        cpu: cpu / calls.max(1) as f64,
        // Two durable writes a fresh call: the reservation and the result.
        writes_per_sync: 2.0 * calls as f64 / count.max(1) as f64,
        sync: nanos as f64 / 1e9 / count.max(1) as f64,
    }
}

/// A `metrics` recorder that keeps only the store's durable points (`idem_syncs_total` and
/// `idem_sync_duration_seconds`): how many writes each one answered, and how long it took. Every
/// other metric is dropped.
pub mod syncs {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, OnceLock};

    use metrics::{
        Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    #[derive(Default)]
    pub struct Syncs {
        count: AtomicU64,
        nanos: AtomicU64,
    }

    impl Syncs {
        /// Durable points so far, and their time in nanoseconds.
        pub fn read(&self) -> (u64, u64) {
            (self.count.load(Ordering::Relaxed), self.nanos.load(Ordering::Relaxed))
        }
    }

    impl CounterFn for Syncs {
        fn increment(&self, value: u64) {
            self.count.fetch_add(value, Ordering::Relaxed);
        }

        fn absolute(&self, value: u64) {
            self.count.fetch_max(value, Ordering::Relaxed);
        }
    }

    impl HistogramFn for Syncs {
        fn record(&self, seconds: f64) {
            self.nanos.fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
        }
    }

    struct Only(Arc<Syncs>);

    impl Recorder for Only {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            match key.name() {
                "idem_syncs_total" => Counter::from_arc(Arc::clone(&self.0)),
                _ => Counter::noop(),
            }
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            match key.name() {
                "idem_sync_duration_seconds" => Histogram::from_arc(Arc::clone(&self.0)),
                _ => Histogram::noop(),
            }
        }
    }

    /// The process's recorder, installed by the first call.
    pub fn install() -> Arc<Syncs> {
        static SYNCS: OnceLock<Arc<Syncs>> = OnceLock::new();
        Arc::clone(SYNCS.get_or_init(|| {
            let syncs = Arc::new(Syncs::default());
            metrics::set_global_recorder(Only(Arc::clone(&syncs)))
                .expect("no other metrics recorder in the bench");
            syncs
        }))
    }
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

/// CPU time this process has used, all threads (user and system, ended threads too), to the
/// nanosecond: the process's CPU clock. (`/proc/self/stat` counts in 10 ms ticks, too coarse for
/// a few hundred durable points.)
pub fn process_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec, and the clock id is one Linux always has.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if read != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(now.tv_sec).unwrap_or(0), u32::try_from(now.tv_nsec).unwrap_or(0))
}
