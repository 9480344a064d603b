//! Group commit against its limit on sled: fresh-call throughput with concurrent callers, with
//! and without the store's wait for the writes it expects, beside the disk's own durable point.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem::Durability;

use crate::common::{process_cpu, temp_store, throughput, Throughput};
use crate::{charge, percentile, sorted, us, Curve, RAW_SAMPLES, THROUGHPUT_FOR};

/// Callers for the group-commit curve.
const CALLERS: [usize; 4] = [1, 2, 8, 32];

/// The section "Group commit against its limit"; returns sled's points of the chart, as
/// (callers, fresh calls/s, the limit two durable points a call set).
pub(crate) fn report() -> Curve {
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
    let (work_one, work_eight) = (raw_sled_work(1), raw_sled_work(8));
    println!(
        "sled's own work of a fresh call, nothing of idem's and no sync (three reads, the \
         in-flight index's insert and remove, two record swaps), CPU per call: {} with one \
         thread, {} with 8.\n",
        us(work_one),
        us(work_eight)
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
    CALLERS.into_iter().map(|callers| row(callers, raw, cores)).collect()
}

/// One row of the table: `callers` with the wait (the default) and without it, back to back.
fn row(callers: usize, raw: f64, cores: usize) -> (usize, f64, f64) {
    let busy = |t: &Throughput| 100.0 * 2.0 * t.rate / t.writes_per_sync * t.sync;
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
    (callers, on.rate, limit)
}

/// The CPU time a fresh call takes with one caller under `durability`.
pub(crate) fn cpu_per_call(durability: Durability, calls: usize) -> f64 {
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
    raw_sled_durable_point_and_cpu().0
}

/// The CPU time, all threads of the process, of the sled work a fresh call does with nothing of
/// idem's and no sync, each of `threads` threads on keys of its own for [`THROUGHPUT_FOR`]: the
/// peek, the reservation's look under the key's lock, the in-flight index's entry, the
/// reservation's swap, the `Done`'s look, its swap and the index entry's removal (the store's
/// three reads and four writes of a fresh call, DESIGN.md).
pub(crate) fn raw_sled_work(threads: usize) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::Config::new().path(dir.path().join("raw.sled")).open().expect("sled opens");
    let tree = db.open_tree("idem.records").expect("a tree");
    let index = db.open_tree("idem.in_flight").expect("a tree");
    // About the sizes of a record in flight and of one done with its history.
    let (in_flight, done) = (vec![b'i'; 330], vec![b'd'; 430]);
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (tree, index, start) = (tree.clone(), index.clone(), Arc::clone(&start));
            let (in_flight, done) = (in_flight.clone(), done.clone());
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                let mut n = 0u64;
                while began.elapsed() < THROUGHPUT_FOR {
                    let key = format!("{t:02x}{n:062x}");
                    let key = key.as_bytes();
                    let none = None as Option<&[u8]>;
                    assert!(tree.get(key).expect("sled reads").is_none());
                    assert!(tree.get(key).expect("sled reads").is_none());
                    index.insert(key, &[][..]).expect("sled writes");
                    tree.compare_and_swap(key, none, Some(&in_flight[..]))
                        .expect("sled writes")
                        .expect("a new key");
                    let held = tree.get(key).expect("sled reads");
                    tree.compare_and_swap(key, held, Some(&done[..]))
                        .expect("sled writes")
                        .expect("the record read");
                    index.remove(key).expect("sled writes");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let before = process_cpu();
    start.wait();
    let calls: u64 = workers.into_iter().map(|w| w.join().expect("a worker")).sum();
    (process_cpu() - before).as_secs_f64() / calls.max(1) as f64
}

/// [`raw_sled_durable_point`]'s median, and the CPU time of the process per point.
pub(crate) fn raw_sled_durable_point_and_cpu() -> (f64, f64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::Config::new().path(dir.path().join("raw.sled")).open().expect("sled opens");
    let tree = db.open_tree("idem.records").expect("a tree");
    let data = std::fs::File::open(dir.path().join("raw.sled").join("db")).expect("sled's file");
    // About the size of a finished record.
    let value = vec![b'x'; 330];
    let mut times = Vec::with_capacity(RAW_SAMPLES);
    let mut cpu_from = process_cpu();
    for n in 0..RAW_SAMPLES + RAW_SAMPLES / 10 {
        if n == RAW_SAMPLES / 10 {
            cpu_from = process_cpu();
        }
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
    let cpu = (process_cpu() - cpu_from).as_secs_f64() / RAW_SAMPLES as f64;
    (percentile(&sorted(times), 0.5), cpu)
}
