//! A key's history across crashes, with real processes: a child (this test binary re-run in
//! child mode) makes a call or a purge against a sled store, is stopped at an exact point by a
//! fail point, and is killed with SIGKILL. The history read afterwards holds every change that
//! landed and none that did not, and the open's in-doubt mark is in it.

mod children;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::admin::{self, Purge};
use idem_runtime::history::{Entry, Event};
use idem_runtime::{Call, Error, InDoubtPolicy, Key, SledStore, Status, Store};

use self::children::start;

const CHILD: &str = "IDEM_HISTORY_CHILD";

fn call() -> Call {
    Call::new("charge_card", "order-7", &serde_json::json!({ "amount": 4200 })).unwrap()
}

fn key() -> Key {
    call().key().clone()
}

fn open(path: &Path) -> Arc<dyn Store> {
    Arc::new(SledStore::builder(path).lock_wait(Duration::from_secs(5)).open().unwrap())
}

/// A tool's own failure: the call releases its key.
#[derive(Debug)]
struct Declined;

impl From<Error> for Declined {
    fn from(e: Error) -> Declined {
        panic!("the store failed: {e}")
    }
}

/// Child mode: `IDEM_ACTION=call` makes the call, `release` makes it fail (its key is released),
/// `purge` purges every finished record and every released key's history.
#[test]
fn history_child() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let store = open(&PathBuf::from(dir).join("store"));
    match std::env::var("IDEM_ACTION").as_deref() {
        Ok("purge") => {
            let removed = admin::purge(store.as_ref(), Purge::OlderThan(Duration::ZERO), "ann@ops");
            println!("OUTCOME purged {removed:?}");
        }
        Ok("release") => {
            let got: Result<String, Declined> = call().store(store).run(|| Err(Declined));
            assert!(got.is_err(), "the body failed");
            println!("OUTCOME Ok(released)");
        }
        _ => {
            let got: Result<String, Error> = call().store(store).run(|| Ok("ch_1".to_owned()));
            println!("OUTCOME {got:?}");
        }
    }
}

/// Runs a child doing `action`; with `point`, SIGKILLs it there.
fn child(dir: &Path, action: &str, point: Option<&str>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "history_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir)
        .env("IDEM_ACTION", action)
        .env_remove("IDEM_FAILPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(point) = point {
        command.env("IDEM_FAILPOINT", point);
    }
    let mut process = start(&mut command);
    match point {
        Some(point) => {
            process.until_line(&format!("IDEM_FAILPOINT_REACHED {point}"));
            process.kill(); // SIGKILL on Unix
        }
        None => {
            let seen = process.until_line("OUTCOME ");
            let line = seen.last().unwrap();
            assert!(line.contains("Ok("), "the child's {action} failed: {line}");
            process.finish();
        }
    }
}

fn history(store: &Arc<dyn Store>) -> Vec<Entry> {
    admin::history(store.as_ref(), &key()).unwrap()
}

fn steps(entries: &[Entry]) -> Vec<(Event, Option<Status>)> {
    entries.iter().map(|entry| (entry.event, entry.status)).collect()
}

/// sled itself: how many history entries the key has on disk, shown or not. sled lets go of
/// its lock a moment after the store closes, so this waits for the lock as the store's open does.
fn entries_on_disk(store: &Path) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    let db = loop {
        match sled::open(store) {
            Ok(db) => break db,
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("cannot open {}: {e}", store.display()),
        }
    };
    let mut prefix = key().as_str().as_bytes().to_vec();
    prefix.push(0);
    db.open_tree("idem.history").unwrap().scan_prefix(prefix).count()
}

#[test]
fn the_in_doubt_mark_at_open_is_in_the_history_and_the_rerun_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    child(dir.path(), "call", Some("after_reserve"));
    let store = open(&dir.path().join("store"));
    let entries = history(&store);
    assert_eq!(
        steps(&entries),
        [(Event::Reserved, Some(Status::InFlight)), (Event::InDoubt, Some(Status::InDoubt))],
        "{entries:?}"
    );
    assert_ne!(entries[0].by, entries[1].by, "the dead call reserved, the open marked");
    assert_eq!(entries[1].by, store.instance().id(), "the store that opened marked it");
    assert!(entries[1].note.as_deref().is_some_and(|n| n.contains("died")), "{entries:?}");

    let rerun: String = call()
        .store(Arc::clone(&store))
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| Ok::<_, Error>("ch_2".into()))
        .unwrap();
    let replayed: String =
        call().store(Arc::clone(&store)).run(|| Ok::<_, Error>("ch_3".into())).unwrap();
    assert_eq!((rerun.as_str(), replayed.as_str()), ("ch_2", "ch_2"));
    assert_eq!(
        steps(&history(&store)),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
        ]
    );
    drop(store);
    // The history survives the store being closed and opened again, unchanged.
    let store = open(&dir.path().join("store"));
    assert_eq!(history(&store).len(), 4);
}

/// A change that leaves no record (a release) writes the record's entries and its own to the
/// history tree before it deletes the record: killed between the two, the entries it left are
/// not shown, the record's own history goes on, and a later release writes over them.
#[test]
fn entries_of_a_release_that_never_landed_are_not_shown_and_a_later_one_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    // Killed with the entries in the tree and the record still in flight.
    child(dir.path(), "release", Some("after_entry_released"));
    assert_eq!(entries_on_disk(&dir.path().join("store")), 2, "reserved, and the release");
    let store = open(&dir.path().join("store"));
    let entries = history(&store);
    assert_eq!(
        steps(&entries),
        [(Event::Reserved, Some(Status::InFlight)), (Event::InDoubt, Some(Status::InDoubt))],
        "the release that never landed is not in the history: {entries:?}"
    );
    let got: Result<String, Declined> =
        call().store(Arc::clone(&store)).in_doubt(InDoubtPolicy::Rerun).run(|| Err(Declined));
    assert!(got.is_err(), "the body failed");
    let entries = history(&store);
    assert_eq!(
        steps(&entries),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Released, None),
        ],
        "{entries:?}"
    );
    drop(store);
    assert_eq!(entries_on_disk(&dir.path().join("store")), 4, "the release wrote over them");
}

#[test]
fn a_first_reservation_that_never_landed_leaves_no_history() {
    let dir = tempfile::tempdir().unwrap();
    child(dir.path(), "call", Some("after_entry_reserved"));
    let store = open(&dir.path().join("store"));
    assert!(block_on_get(&store).is_none(), "the reservation never landed");
    assert!(history(&store).is_empty(), "nor is it in the history");
    let got: String =
        call().store(Arc::clone(&store)).run(|| Ok::<_, Error>("ch_1".into())).unwrap();
    assert_eq!(got, "ch_1");
    assert_eq!(
        steps(&history(&store)),
        [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))]
    );
    drop(store);
    // The record holds its own entries: none is in the history tree.
    assert_eq!(entries_on_disk(&dir.path().join("store")), 0, "a finished call's history");
}

#[test]
fn a_purge_cut_short_shows_no_history_and_the_open_removes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    child(dir.path(), "call", None);
    // Killed with the record deleted and its history (reserved, done, purged) still on disk.
    child(dir.path(), "purge", Some("after_purge_swap"));
    assert_eq!(entries_on_disk(&dir.path().join("store")), 3);
    let store = open(&dir.path().join("store"));
    assert!(block_on_get(&store).is_none(), "the purge landed");
    assert!(history(&store).is_empty(), "and took the history with it");
    drop(store);
    assert_eq!(entries_on_disk(&dir.path().join("store")), 0, "the open removed what was left");
}

/// A released key has no record, so its history goes by a purge of histories, on the path of a
/// record's purge: killed there, the key shows no history, and the open removes the rest.
#[test]
fn a_purge_of_a_released_history_cut_short_shows_nothing_and_the_open_removes_the_rest() {
    for point in ["after_entry_purged", "after_purge_swap"] {
        let dir = tempfile::tempdir().unwrap();
        child(dir.path(), "release", None);
        assert_eq!(entries_on_disk(&dir.path().join("store")), 2, "reserved, released");
        child(dir.path(), "purge", Some(point));
        // Reserved, released, and the purge's own entry.
        assert_eq!(entries_on_disk(&dir.path().join("store")), 3, "{point}");
        let store = open(&dir.path().join("store"));
        assert!(history(&store).is_empty(), "{point}: no part of the history is shown");
        drop(store);
        assert_eq!(entries_on_disk(&dir.path().join("store")), 0, "{point}: the open removed it");
        let store = open(&dir.path().join("store"));
        let got: String =
            call().store(Arc::clone(&store)).run(|| Ok::<_, Error>("ch_1".into())).unwrap();
        assert_eq!(got, "ch_1");
        assert_eq!(
            steps(&history(&store)),
            [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))],
            "{point}: the next call starts a new history"
        );
    }
}

fn block_on_get(store: &Arc<dyn Store>) -> Option<idem_runtime::Record> {
    admin::show(store.as_ref(), &key()).ok()
}
