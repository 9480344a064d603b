//! The PostgreSQL store through a pooler in transaction mode, beside the same server reached
//! directly, in one run: a fresh call and a replay (medians), and how long after an owner's body
//! ends a waiter in another store instance has its result (p50, p99), directly, through the
//! pooler alone (waiters re-read, since `LISTEN` hears nothing there) and through the pooler
//! with a direct `listen_url`.
//!
//! `DATABASE_URL=… IDEM_TEST_POOLER_URL=… cargo bench -p idem-benches --bench pooler`
//! (`bash .ci/pgbouncer DIR` starts a PgBouncer in transaction mode and prints its URL).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Call, Error, Store};
use idem_postgres::PgStore;

const SCHEMA: &str = "idem_bench_pooler";
/// Rounds of each measure; every round measures every path in turn, so that the load of a
/// shared machine, which drifts, falls on all of them alike.
const ROUNDS: usize = 10;
const FRESH: usize = 30;
const REPLAYS: usize = 100;
const WAITS: usize = 10;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// How a store reaches the server.
struct Path {
    name: &'static str,
    url: String,
    listen: Option<String>,
}

impl Path {
    fn store(&self) -> Arc<dyn Store> {
        let mut builder = PgStore::builder(&self.url).schema(SCHEMA).pool_size(8);
        if let Some(listen) = &self.listen {
            builder = builder.listen_url(listen);
        }
        Arc::new(builder.connect().expect("the store connects"))
    }
}

fn main() {
    let (Ok(direct), Ok(pooled)) =
        (std::env::var("DATABASE_URL"), std::env::var("IDEM_TEST_POOLER_URL"))
    else {
        eprintln!("set DATABASE_URL (the server) and IDEM_TEST_POOLER_URL (a transaction-mode pooler in front of it)");
        return;
    };
    let paths = [
        Path { name: "direct", url: direct.clone(), listen: None },
        // A listen URL of its own keeps the store's statements unnamed: the same server, the
        // same path, only the statements differ.
        Path {
            name: "direct, unnamed statements",
            url: direct.clone(),
            listen: Some(direct.clone()),
        },
        Path { name: "pooler", url: pooled.clone(), listen: None },
        Path { name: "pooler + listen_url", url: pooled, listen: Some(direct) },
    ];
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let run = format!("{}-{}", std::process::id(), started.as_millis());
    // An owner and a waiter store per path, as two processes would have.
    let stores: Vec<_> = paths.iter().map(|path| (path.store(), path.store())).collect();
    // The listening connection's probe comes back within moments where it can.
    std::thread::sleep(Duration::from_secs(3));
    let mut samples: Vec<[Vec<Duration>; 3]> = paths.iter().map(|_| Default::default()).collect();
    for _ in 0..ROUNDS {
        for ((owner, waiter), [fresh, replay, woken]) in stores.iter().zip(&mut samples) {
            fresh.extend(fresh_calls(owner, &run));
            replay.extend(replays(owner, &run));
            woken.extend(waits(owner, waiter, &run));
        }
    }
    println!("| path | fresh call: median (mean) | replay: median (mean) | waiter woken after the body: p50 / p99 |");
    println!("|---|---|---|---|");
    for (path, [fresh, replay, woken]) in paths.iter().zip(samples) {
        let woken = sorted(woken);
        let (p50, p99) = (woken[woken.len() / 2], woken[woken.len() * 99 / 100]);
        println!(
            "| {} | {:.0} µs (mean {:.0}) | {:.0} µs (mean {:.0}) | {:.1} / {:.1} ms |",
            path.name,
            micros(sorted(fresh.clone())[FRESH * ROUNDS / 2]),
            micros(mean(&fresh)),
            micros(sorted(replay.clone())[REPLAYS * ROUNDS / 2]),
            micros(mean(&replay)),
            micros(p50) / 1000.0,
            micros(p99) / 1000.0
        );
    }
    for (owner, _) in &stores {
        let _ = idem::admin::purge(
            owner.as_ref(),
            idem::admin::Purge::OlderThan(Duration::ZERO),
            "bench",
        );
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len() as u32
}

fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

fn call(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("charge_card", scope, &1).unwrap().store(Arc::clone(store))
}

fn fresh_calls(store: &Arc<dyn Store>, run: &str) -> Vec<Duration> {
    (0..FRESH)
        .map(|_| {
            let scope = format!("{run}-{}", SEQ.fetch_add(1, Ordering::Relaxed));
            let began = Instant::now();
            let out: Result<String, Error> = call(store, &scope).run(|| Ok("ch_1".to_owned()));
            out.unwrap();
            began.elapsed()
        })
        .collect()
}

fn replays(store: &Arc<dyn Store>, run: &str) -> Vec<Duration> {
    let scope = format!("{run}-replay-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let first: Result<String, Error> = call(store, &scope).run(|| Ok("ch_1".to_owned()));
    first.unwrap();
    (0..REPLAYS)
        .map(|_| {
            let began = Instant::now();
            let out: Result<String, Error> =
                call(store, &scope).run(|| unreachable!("a replay runs no body"));
            out.unwrap();
            began.elapsed()
        })
        .collect()
}

/// For each round: the owner's body starts, a waiter of another store instance calls the same
/// key and waits, the body ends; the time from the body's end to the waiter's answer.
fn waits(owner: &Arc<dyn Store>, waiter: &Arc<dyn Store>, run: &str) -> Vec<Duration> {
    (0..WAITS)
        .map(|_| {
            let scope = format!("{run}-wait-{}", SEQ.fetch_add(1, Ordering::Relaxed));
            let (started_tx, started) = mpsc::channel();
            let (go, go_rx) = mpsc::channel::<()>();
            let owning = {
                let call = call(owner, &scope);
                std::thread::spawn(move || {
                    let mut ended = None;
                    let out: Result<String, Error> = call.run(|| {
                        started_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                        ended = Some(Instant::now());
                        Ok("ch_1".to_owned())
                    });
                    out.unwrap();
                    ended.expect("the owner ran the body")
                })
            };
            started.recv().unwrap();
            let waiting = {
                let call = call(waiter, &scope).wait(Duration::from_secs(30));
                std::thread::spawn(move || {
                    let out: Result<String, Error> = call.run(|| unreachable!("the owner runs"));
                    out.unwrap();
                    Instant::now()
                })
            };
            // A bench may sleep: the waiter is waiting by now.
            std::thread::sleep(Duration::from_millis(100));
            go.send(()).unwrap();
            let ended = owning.join().unwrap();
            waiting.join().unwrap().saturating_duration_since(ended)
        })
        .collect()
}
