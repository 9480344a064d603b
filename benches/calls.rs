//! What one call costs: key derivation, canonical JSON, replay (sync, async, through the macro),
//! a fresh call for each `Durability`, and in the same run the disk's limits (a raw sled durable
//! point, a 64-byte write + fdatasync) and the PostgreSQL store.
//!
//! `cargo bench -p idem-benches --bench calls`; then `cargo bench -p idem-benches --bench
//! limits` prints the table of BENCHMARKS.md from this run's results. Set `DATABASE_URL` for the
//! PostgreSQL rows.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use idem::{Call, Durability, Error, Key, SledStore, Store};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct Charge<'a> {
    customer: &'a str,
    amount: u64,
}

/// A wide tool: 20 parameters of the usual kinds.
#[derive(Serialize)]
struct Booking<'a> {
    guest: &'a str,
    email: &'a str,
    phone: &'a str,
    hotel: &'a str,
    city: &'a str,
    country: &'a str,
    check_in: &'a str,
    check_out: &'a str,
    room: &'a str,
    currency: &'a str,
    nights: u32,
    adults: u32,
    children: u32,
    rate: f64,
    total: f64,
    breakfast: bool,
    refundable: bool,
    loyalty: Option<&'a str>,
    notes: &'a str,
    tags: [&'a str; 3],
}

const BOOKING: Booking<'static> = Booking {
    guest: "Zoë Martin",
    email: "zoe@example.com",
    phone: "+33 6 12 34 56 78",
    hotel: "Hôtel des Arts",
    city: "Paris",
    country: "FR",
    check_in: "2026-03-14",
    check_out: "2026-03-17",
    room: "double-superior",
    currency: "EUR",
    nights: 3,
    adults: 2,
    children: 0,
    rate: 189.5,
    total: 568.5,
    breakfast: true,
    refundable: false,
    loyalty: Some("GOLD-88231"),
    notes: "late arrival, around 23:00",
    tags: ["business", "repeat", "quiet-room"],
};

/// What the benchmarked tools return and replay.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    id: String,
    amount: u64,
}

fn receipt() -> Receipt {
    Receipt { id: "ch_3PqLx2".to_owned(), amount: 4200 }
}

fn open(durability: Durability) -> Arc<dyn Store> {
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().expect("temp dir").keep();
    Arc::new(SledStore::builder(dir).durability(durability).open().expect("open the sled store"))
}

static MACRO_STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| open(Durability::Fsync));

#[idem::idempotent(scope = "order_id", store = MACRO_STORE)]
fn charge_card(amount: u64, customer: &str, order_id: &str) -> Result<Receipt, Error> {
    let _ = (amount, customer, order_id);
    Ok(receipt())
}

#[idem::idempotent(scope = "order_id", store = MACRO_STORE, tool = "charge_card_async")]
async fn charge_card_async(amount: u64, customer: &str, order_id: &str) -> Result<Receipt, Error> {
    let _ = (amount, customer, order_id);
    Ok(receipt())
}

fn keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let charge = Charge { customer: "cus_123", amount: 4200 };
    group.bench_function("derive_2_fields", |b| {
        b.iter(|| Key::derive(black_box("charge_card"), black_box("order-17"), black_box(&charge)))
    });
    group.bench_function("derive_20_fields", |b| {
        b.iter(|| Key::derive(black_box("book_room"), black_box("trip-9"), black_box(&BOOKING)))
    });
    group.bench_function("canonical_json_2_fields", |b| {
        b.iter(|| idem_runtime::canonical_json(black_box(&charge)))
    });
    group.bench_function("canonical_json_20_fields", |b| {
        b.iter(|| idem_runtime::canonical_json(black_box(&BOOKING)))
    });
    group.finish();
}

fn replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    let store = open(Durability::Fsync);
    let charge = Charge { customer: "cus_123", amount: 4200 };
    let first: Result<Receipt, Error> = Call::new("charge_card", "order-17", &charge)
        .unwrap()
        .store(store.clone())
        .run(|| Ok(receipt()));
    assert_eq!(first.unwrap(), receipt());
    group.bench_function("sync", |b| {
        b.iter(|| {
            let out: Result<Receipt, Error> =
                Call::new("charge_card", "order-17", black_box(&charge))
                    .unwrap()
                    .store(store.clone())
                    .run(|| unreachable!("a replay runs no body"));
            out.unwrap()
        })
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    group.bench_function("async", |b| {
        b.to_async(&runtime).iter(|| async {
            let out: Result<Receipt, Error> =
                Call::new("charge_card", "order-17", black_box(&charge))
                    .unwrap()
                    .store(store.clone())
                    .run_async(|| async { unreachable!("a replay runs no body") })
                    .await;
            out.unwrap()
        })
    });

    // Through the macro, as a user writes the tool: the first call runs the body, every later
    // one replays.
    charge_card(4200, "cus_123", "order-18").unwrap();
    runtime.block_on(charge_card_async(4200, "cus_123", "order-18")).unwrap();
    group.bench_function("macro_sync", |b| {
        b.iter(|| {
            charge_card(black_box(4200), black_box("cus_123"), black_box("order-18")).unwrap()
        })
    });
    group.bench_function("macro_async", |b| {
        b.to_async(&runtime).iter(|| async {
            charge_card_async(black_box(4200), black_box("cus_123"), black_box("order-18"))
                .await
                .unwrap()
        })
    });
    group.finish();
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh scope each time, so that every call reserves, runs and records.
fn fresh_call(store: &Arc<dyn Store>) -> Receipt {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let charge = Charge { customer: "cus_123", amount: 4200 };
    let out: Result<Receipt, Error> =
        Call::new("charge_card", n, &charge).unwrap().store(store.clone()).run(|| Ok(receipt()));
    out.unwrap()
}

fn slow_group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(30);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(6));
    group
}

fn fresh(c: &mut Criterion) {
    {
        let mut group = c.benchmark_group("fresh");
        let store = open(Durability::None);
        group.bench_function("none", |b| b.iter(|| fresh_call(&store)));
        group.finish();
    }
    let mut group = slow_group(c, "fresh");
    for (name, durability) in [("flush", Durability::Flush), ("fsync", Durability::Fsync)] {
        let store = open(durability);
        group.bench_function(name, |b| b.iter(|| fresh_call(&store)));
    }
    group.finish();
}

/// The disk's limits, measured beside the fresh calls: what one durable point of raw sled costs
/// (compare_and_swap, flush, fdatasync of its data file, as the store does it), and what the
/// smallest durable write costs on this disk.
fn limits(c: &mut Criterion) {
    let mut group = slow_group(c, "limit");
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path().join("raw.sled"))
        .cache_capacity(64 * 1024 * 1024)
        .flush_every_ms(None)
        .open()
        .unwrap();
    let tree = db.open_tree("idem.records").unwrap();
    let data = File::open(dir.path().join("raw.sled").join("db")).unwrap();
    // About the size of a finished record.
    let value = vec![b'x'; 330];
    let mut n = 0u64;
    group.bench_function("sled_durable_point", |b| {
        b.iter(|| {
            n += 1;
            let key = format!("{n:032x}");
            tree.compare_and_swap(key.as_bytes(), None as Option<&[u8]>, Some(&value[..]))
                .unwrap()
                .unwrap();
            db.flush().unwrap();
            data.sync_data().unwrap();
        })
    });
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.path().join("plain"))
        .unwrap();
    file.write_all_at(&[0u8; 64], 0).unwrap();
    file.sync_all().unwrap();
    group.bench_function("write_64b_fdatasync", |b| {
        b.iter(|| {
            // Overwriting in place: the file's size never changes, so no metadata is synced.
            file.write_all_at(&[7u8; 64], 0).unwrap();
            file.sync_data().unwrap();
        })
    });
    group.finish();
}

/// The PostgreSQL store against the local server, when `DATABASE_URL` names one.
fn postgres(c: &mut Criterion) {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("DATABASE_URL is not set: skipping the PostgreSQL rows");
        return;
    };
    let pg = idem_postgres::PgStore::builder(&url)
        .schema("idem_bench")
        .pool_size(8)
        .connect()
        .expect("the benchmark database connects");
    let store: Arc<dyn Store> = Arc::new(pg);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let run = format!("{}-{}", std::process::id(), started.as_millis());
    let mut group = slow_group(c, "postgres");
    group.bench_function("fresh", |b| {
        b.iter(|| {
            let n = SEQ.fetch_add(1, Ordering::Relaxed);
            let out: Result<Receipt, Error> = Call::new("charge_card", format!("{run}-{n}"), &1)
                .unwrap()
                .store(store.clone())
                .run(|| Ok(receipt()));
            out.unwrap()
        })
    });
    let scope = format!("{run}-replay");
    let first: Result<Receipt, Error> =
        Call::new("charge_card", &scope, &1).unwrap().store(store.clone()).run(|| Ok(receipt()));
    first.unwrap();
    group.bench_function("replay", |b| {
        b.iter(|| {
            let out: Result<Receipt, Error> = Call::new("charge_card", &scope, &1)
                .unwrap()
                .store(store.clone())
                .run(|| unreachable!("a replay runs no body"));
            out.unwrap()
        })
    });
    group.finish();
    // Leave the table as it was found.
    let removed =
        idem::admin::purge(store.as_ref(), idem::admin::Purge::OlderThan(Duration::ZERO), "bench");
    if let Err(e) = removed {
        eprintln!("could not purge the benchmark's records: {e}");
    }
}

fn remove_temp_stores() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with("idem-bench") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn cleanup(_: &mut Criterion) {
    remove_temp_stores();
}

criterion_group!(benches, keys, replay, fresh, limits, postgres, cleanup);
criterion_main!(benches);
