//! Results up to the sled store's documented maximum are kept whole and replayed; a larger one
//! is refused before anything is recorded and leaves the key in doubt; sled never writes a
//! value to a blob file of its own (which it would not sync); removing a record removes the
//! chunks of its result.

mod children;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{self, Purge, Resolution};
use idem_runtime::{Call, Error, SledStore, Status, Store};

use self::children::start;

fn open(dir: &Path) -> Arc<dyn Store> {
    Arc::new(SledStore::builder(dir).lock_wait(Duration::from_secs(5)).open().unwrap())
}

fn call(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("export_report", scope, &serde_json::json!({ "format": "csv" }))
        .unwrap()
        .store(Arc::clone(store))
}

/// A result whose JSON text is exactly `len` bytes (a string and its two quotes).
fn result_of(len: usize) -> String {
    (0..len - 2).map(|i| char::from(b'a' + (i % 26) as u8)).collect()
}

/// The chunks the store keeps, read with sled directly once the store is closed.
fn chunk_count(dir: &Path) -> usize {
    // sled lets go of its lock a moment after the store is dropped.
    let db = loop {
        match sled::open(dir) {
            Ok(db) => break db,
            Err(e) if e.to_string().contains("lock") => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    };
    db.open_tree("idem.chunks").unwrap().len()
}

fn blob_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("blobs")).map_or(0, |entries| entries.count())
}

#[test]
fn results_up_to_the_maximum_replay_whole_and_never_become_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [2, 4096, 4097, 300_000, 1 << 20, SledStore::MAX_RESULT];
    {
        let store = open(dir.path());
        for (i, &len) in sizes.iter().enumerate() {
            let got = call(&store, &format!("report-{i}")).run(|| Ok::<_, Error>(result_of(len)));
            assert_eq!(got.unwrap().len(), len - 2);
        }
    }
    assert_eq!(blob_files(dir.path()), 0, "sled wrote a value to a blob file");
    let store = open(dir.path());
    let runs = AtomicUsize::new(0);
    for (i, &len) in sizes.iter().enumerate() {
        let got = call(&store, &format!("report-{i}")).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(String::new())
        });
        assert_eq!(got.unwrap(), result_of(len), "the result of {len} bytes replays whole");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "every result replayed after a reopen");
}

#[test]
fn a_result_past_the_maximum_is_refused_and_leaves_the_key_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let runs = AtomicUsize::new(0);
    let too_large = call(&store, "report-big").run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(result_of(SledStore::MAX_RESULT + 1))
    });
    let error = too_large.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, Error::Store { .. }), "{error:?}");
    assert!(message.contains(call(&store, "report-big").key().as_str()), "{message}");
    assert!(message.contains(&SledStore::MAX_RESULT.to_string()), "{message}");
    let again = call(&store, "report-big").run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(String::new())
    });
    assert!(matches!(again, Err(Error::InDoubt { .. })), "the body ran, so the key is in doubt");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(store);
    assert_eq!(chunk_count(dir.path()), 0, "nothing of the refused result was kept");
}

#[test]
fn a_scope_too_long_for_a_record_is_refused_before_the_body_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let scope = "s".repeat(5000);
    let runs = AtomicUsize::new(0);
    let refused = call(&store, &scope).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(1)
    });
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("shorter scope"), "{message}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert!(admin::list(&*store, &Default::default()).unwrap().is_empty(), "nothing stored");
}

#[test]
fn purging_a_record_removes_its_results_chunks() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        call(&store, "purged").run(|| Ok::<_, Error>(result_of(100_000))).unwrap();
        while admin::purge(&*store, Purge::OlderThan(Duration::ZERO), "ann@ops").unwrap().records
            == 0
        {
            std::thread::yield_now(); // until a millisecond has passed since it finished
        }
    }
    assert_eq!(chunk_count(dir.path()), 0, "a purged record leaves no chunks");
}

#[test]
fn a_new_run_over_an_expired_record_removes_its_results_chunks() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let expiring = || call(&store, "expired").ttl(Duration::from_millis(1));
        expiring().run(|| Ok::<_, Error>(result_of(100_000))).unwrap();
        while !admin::show(&*store, expiring().key())
            .unwrap()
            .is_expired(idem_runtime::store::now_ms())
        {
            std::thread::yield_now();
        }
        let small = expiring().run(|| Ok::<_, Error>("small".to_owned()));
        assert_eq!(small.unwrap(), "small", "the expired record ran again");
    }
    assert_eq!(chunk_count(dir.path()), 0, "the expired result's chunks went with it");
}

#[test]
fn an_operator_can_resolve_a_key_with_a_large_result() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let failed = call(&store, "resolved").run(|| {
        idem_runtime::may_have_landed();
        Err::<String, Error>(Error::NotFound { key: "the vendor timed out".into() })
    });
    assert!(failed.is_err());
    let key = call(&store, "resolved").key().clone();
    assert_eq!(admin::show(&*store, &key).unwrap().status, Status::InDoubt);
    let big = result_of(200_000);
    admin::resolve(&*store, &key, Resolution::Done(serde_json::json!(big)), "ann@ops", None, false)
        .unwrap();
    let runs = AtomicUsize::new(0);
    let replayed = call(&store, "resolved").run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(String::new())
    });
    assert_eq!(replayed.unwrap(), big, "the operator's result replays");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

const CHILD: &str = "IDEM_LARGE_RESULTS_CHILD";

/// Child mode: a call with a large result, stopped by a fail point once its chunks are on disk
/// and before the record that points to them is written.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let store = open(Path::new(&dir));
    let _ = call(&store, "crashed").run(|| Ok::<_, Error>(result_of(100_000)));
    panic!("the fail point after_chunks was never reached");
}

#[test]
fn chunks_left_by_a_crash_before_their_record_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir.path())
            .env("IDEM_FAILPOINT", "after_chunks")
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    child.until_line("IDEM_FAILPOINT_REACHED after_chunks");
    child.kill(); // SIGKILL
    assert!(chunk_count(dir.path()) > 0, "the crash left the result's chunks on disk");
    {
        let store = open(dir.path());
        let again = call(&store, "crashed").run(|| Ok::<_, Error>(String::new()));
        assert!(matches!(again, Err(Error::InDoubt { .. })), "the body ran: {again:?}");
    }
    assert_eq!(chunk_count(dir.path()), 0, "opening the store removed the orphaned chunks");
}
