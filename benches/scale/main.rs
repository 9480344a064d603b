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
//! runs one point of the group-commit curve alone, for a profiler, with the floor that sled's own
//! work and its raw durable points set; `-- none` one caller's `Durability::None` call beside
//! sled's own work of it; `-- fleet-only` the PostgreSQL fleet's section alone.
//!
//! The modules are the sections of the run: `growth` (how the cost grows with the store),
//! `group_commit` (sled against its limit), `fleet` (PostgreSQL with real processes), with
//! `pg_server` (the server's own figures) and `chart` (the SVG).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Call, Durability, Error, Store};

use self::common::throughput;

mod chart;
#[path = "../common.rs"]
mod common;
mod fleet;
mod group_commit;
mod growth;
mod pg_server;

/// How long each throughput point runs.
const THROUGHPUT_FOR: Duration = Duration::from_secs(3);
/// Raw durable points timed for the limit.
const RAW_SAMPLES: usize = 400;

/// Points of the chart: (callers, fresh calls/s, the store's limit for that many callers).
type Curve = Vec<(usize, f64, f64)>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["grow", records, cache_mib] => growth::child(
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
            // The same work with nothing of idem's, in the same run: what bounds the CPU a
            // synced call can take from below.
            let work = group_commit::raw_sled_work(callers);
            let (point, point_cpu) = group_commit::raw_sled_durable_point_and_cpu();
            println!(
                "with nothing of idem's: sled's work of a call on {callers} threads, {} of CPU; \
                 a raw durable point of {} takes {} of CPU; so at {:.1} writes a durable point \
                 a synced call takes at least {}, and at least {} were every point to answer \
                 all {callers} callers' writes",
                us(work),
                us(point),
                us(point_cpu),
                t.writes_per_sync,
                us(work + 2.0 * point_cpu / t.writes_per_sync),
                us(work + 2.0 * point_cpu / callers as f64)
            );
        }
        // One caller's `Durability::None` fresh call beside sled's own work of it, in one run.
        ["none"] => {
            let (call, work) = (
                group_commit::cpu_per_call(Durability::None, 20_000),
                group_commit::raw_sled_work(1),
            );
            println!(
                "a fresh `Durability::None` call takes {} of CPU; sled's own work of it, with \
                 nothing of idem's, {} ({:.0} %)",
                us(call),
                us(work),
                100.0 * work / call
            );
        }
        ["fleet", url, callers, seconds, mode, prefix] => fleet::child(
            url,
            callers.parse().expect("a caller count"),
            Duration::from_secs(seconds.parse().expect("seconds")),
            mode,
            prefix,
        ),
        // The PostgreSQL fleet's section alone.
        ["fleet-only"] => match std::env::var("DATABASE_URL") {
            Ok(url) => drop(fleet::report(&url)),
            Err(_) => eprintln!("DATABASE_URL is not set: there is no fleet to run"),
        },
        rest => run(rest.contains(&"million")),
    }
}

/// The whole run: every section in turn, then the chart.
fn run(million: bool) {
    let started = Instant::now();
    growth::report(million);
    let sled_curve = group_commit::report();
    let mut pg_curve = match std::env::var("DATABASE_URL") {
        Ok(url) => fleet::report(&url),
        Err(_) => {
            eprintln!("DATABASE_URL is not set: skipping the PostgreSQL fleet");
            Vec::new()
        }
    };
    // By callers in all: the fleet runs 1 × 8 before 4 × 1.
    pg_curve.sort_by_key(|&(callers, _, _)| callers);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("throughput.svg");
    match chart::draw(&chart, &sled_curve, &pg_curve) {
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

/// The value at fraction `p` of `sorted`, NaN when it is empty.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `values` in ascending order.
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
