//! Opening a sled store reads only the records in flight, through an index kept in the same
//! atomic writes as the records: every orphan of a killed process is still found, and a store
//! written before the index existed is migrated once.

mod children;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::admin;
use idem_runtime::store::now_ms;
use idem_runtime::{Call, Error, Key, SledStore, Status, Store};
use serde_json::json;

use self::children::start;

const CHILD: &str = "IDEM_INDEX_CHILD";
const IN_FLIGHT: usize = 40;
const FINISHED: usize = 200;

fn open(path: &Path) -> Arc<dyn Store> {
    Arc::new(SledStore::builder(path).lock_wait(Duration::from_secs(5)).open().unwrap())
}

/// sled itself, as an earlier idem (or a damaged disk) left the files. sled lets go of its lock
/// a moment after the store closes, so this waits for the lock as the store's open does.
fn raw_sled(path: &Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("cannot open {}: {e}", path.display()),
        }
    }
}

fn charge(order: usize) -> Call {
    Call::new("charge_card", format!("order-{order}"), &json!({"amount": 4200})).unwrap()
}

/// The statuses as stored (in flight, done, in doubt), not as `idem ls` assesses them: what an
/// open wrote, or left.
fn statuses(store: &dyn Store) -> (usize, usize, usize) {
    let scanned = idem_runtime::block_on(store.scan_page(None, usize::MAX)).unwrap();
    let records: Vec<_> = scanned.into_records().map(Result::unwrap).collect();
    let count = |status| records.iter().filter(|r| r.status == status).count();
    (count(Status::InFlight), count(Status::Done), count(Status::InDoubt))
}

/// Child mode: finishes FINISHED charges, then starts IN_FLIGHT more whose bodies never
/// return, says so, and waits to be killed.
#[test]
fn index_child() {
    let Ok(path) = std::env::var(CHILD) else { return };
    let store = open(Path::new(&path));
    for order in 0..FINISHED {
        let got: Result<String, Error> =
            charge(order).store(Arc::clone(&store)).run(|| Ok(format!("ch_{order}")));
        got.unwrap();
    }
    let (started, running) = std::sync::mpsc::channel();
    for order in FINISHED..FINISHED + IN_FLIGHT {
        let store = Arc::clone(&store);
        let started = started.clone();
        std::thread::spawn(move || {
            let _: Result<String, Error> = charge(order).store(store).run(|| {
                started.send(()).unwrap();
                loop {
                    std::thread::park();
                }
            });
        });
    }
    for _ in 0..IN_FLIGHT {
        running.recv().unwrap();
    }
    println!("IN_FLIGHT");
    loop {
        std::thread::park();
    }
}

#[test]
fn every_orphan_of_a_killed_process_is_found_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let mut child = start(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "index_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, &path)
            .stdout(Stdio::piped()),
    );
    child.until_line("IN_FLIGHT"); // the child got its bodies running
    child.kill(); // SIGKILL

    let store = open(&path);
    assert_eq!(statuses(store.as_ref()), (0, FINISHED, IN_FLIGHT), "every orphan is in doubt");
    let got: Result<String, Error> =
        charge(FINISHED).store(Arc::clone(&store)).run(|| Ok("ran again".to_owned()));
    assert!(matches!(got, Err(Error::InDoubt { .. })), "{got:?}");
    drop(store);
    // Settled at the first open: the next finds nothing to do and changes nothing.
    let store = open(&path);
    assert_eq!(statuses(store.as_ref()), (0, FINISHED, IN_FLIGHT));
}

/// A record as the first (JSON) format of the sled store laid it out.
fn old_record(order: usize, status: Status) -> (Key, Vec<u8>) {
    let call = charge(order);
    let key = call.key().clone();
    let now = now_ms();
    let done = status == Status::Done;
    // That format also kept a fingerprint of the arguments, which the store now skips.
    let value = json!({
        "key": key.as_str(), "status": status.as_str(), "tool": "charge_card",
        "scope": format!("order-{order}"), "owner": "sled:1:1:0#1", "attempts": 1,
        "created_at": now, "updated_at": now, "completed_at": if done { Some(now) } else { None },
        "expires_at": null, "result": if done { Some(format!("ch_{order}")) } else { None },
        "fingerprint": "00",
    });
    (key, serde_json::to_vec(&value).unwrap())
}

#[test]
fn a_store_written_before_the_index_is_migrated_once_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let (orphan, _) = old_record(1, Status::InFlight);
    {
        // The layout before the index: one tree of records, nothing else.
        let db = raw_sled(&path);
        let records = db.open_tree("idem.records").unwrap();
        for (order, status) in [(1, Status::InFlight), (2, Status::Done), (3, Status::InDoubt)] {
            let (key, bytes) = old_record(order, status);
            records.insert(key.as_str(), bytes).unwrap();
        }
        db.flush().unwrap();
    }

    let store = open(&path);
    assert_eq!(admin::show(store.as_ref(), &orphan).unwrap().status, Status::InDoubt);
    assert_eq!(statuses(store.as_ref()), (0, 1, 2));
    let mut runs = 0;
    let got: Result<String, Error> = charge(2).store(Arc::clone(&store)).run(|| {
        runs += 1;
        Ok("ran again".to_owned())
    });
    assert_eq!((got.unwrap(), runs), ("ch_2".to_owned(), 0), "the old result replays");
    drop(store);
    let store = open(&path);
    assert_eq!(statuses(store.as_ref()), (0, 1, 2), "the second open changes nothing");
}

#[test]
fn a_migrated_store_is_not_scanned_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    let got: Result<String, Error> = charge(1).store(Arc::clone(&store)).run(|| Ok("ch_1".into()));
    got.unwrap();
    drop(store);
    {
        // An in-flight record that reached the records but not the index: only a writer that
        // bypassed the store (an earlier idem on a migrated store) could leave one.
        let db = raw_sled(&path);
        let (key, bytes) = old_record(2, Status::InFlight);
        db.open_tree("idem.records").unwrap().insert(key.as_str(), bytes).unwrap();
        db.flush().unwrap();
    }
    let store = open(&path);
    // The open read the index only, so it did not see that record: proof that the rest of the
    // store was not read.
    assert_eq!(statuses(store.as_ref()), (1, 1, 0));
}
