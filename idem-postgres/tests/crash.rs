//! An owner process killed by SIGKILL mid-body: its record is in doubt for everyone once its
//! lease lapses, `rerun` takes it over, and the dead owner can no longer write or renew.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::block_on;
use idem_runtime::conformance::transition;
use idem_runtime::store::lease;
use idem_runtime::{Call, Error, InDoubtPolicy, Status, Store};

// Long beside the heartbeat (250 ms), so that a child starved of CPU on a loaded machine still
// renews in time and the live owner is not taken for dead.
const LEASE: Duration = Duration::from_secs(3);

fn send_email(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("send_email", scope, &serde_json::json!({ "to": "ada@example.com" }))
        .unwrap()
        .store(Arc::clone(store))
}

fn short_lease_store(url: &str, schema: &str) -> Arc<dyn Store> {
    common::short_lease_store(url, schema, LEASE)
}

/// In a child: start the body, say so, and never finish (the parent kills this process).
#[test]
fn crash_child() {
    if std::env::var(common::CHILD_ROLE).as_deref() != Ok("crash-owner") {
        return;
    }
    let url = std::env::var("DATABASE_URL").unwrap();
    let schema = std::env::var("IDEM_PG_TEST_SCHEMA").unwrap();
    let store = short_lease_store(&url, &schema);
    let _: Result<String, Error> = send_email(&store, "crash").run(|| {
        common::say("in-body");
        std::thread::sleep(Duration::from_secs(120));
        Ok("from the dead owner".to_owned())
    });
}

#[test]
fn killed_owner_is_in_doubt_once_its_lease_lapses() {
    let Some((url, schema, _guard)) = common::scratch_schema("crash") else { return };
    let store = short_lease_store(&url, &schema);
    let key = send_email(&store, "crash").key().clone();

    let mut child = common::spawn_child(
        "crash_child",
        "crash-owner",
        &[("DATABASE_URL", &url), ("IDEM_PG_TEST_SCHEMA", &schema)],
    );
    let lines = common::child_lines(&mut child);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(60)).expect("the child enters the body"),
        "in-body"
    );

    // Alive and renewing: the heartbeat pushes the lease on (seen in the record, not assumed
    // from a sleep), so a caller waits and times out.
    let first = block_on(store.get(key.as_str())).unwrap().and_then(|r| r.lease_until).unwrap();
    assert!(
        common::eventually(Duration::from_secs(30), || {
            block_on(store.get(key.as_str()))
                .unwrap()
                .and_then(|r| r.lease_until)
                .is_some_and(|lease| lease >= first + 1000)
        }),
        "the heartbeat renews the owner's lease"
    );
    let runs = AtomicUsize::new(0);
    let waited: Result<String, Error> =
        send_email(&store, "crash").wait(Duration::from_millis(200)).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok("second".to_owned())
        });
    assert!(
        matches!(waited, Err(Error::InFlight { .. })),
        "a live owner is waited for: {waited:?}"
    );
    let stale = block_on(store.get(key.as_str())).unwrap().expect("the owner's record");
    assert_eq!(stale.status, Status::InFlight);
    assert!(
        lease::holds(&stale, store.clock(), store.instance().id()),
        "the heartbeat keeps the owner's lease"
    );

    child.kill().expect("SIGKILL the owner");
    child.wait().unwrap();

    // A caller already waiting is woken by the lapse of the lease, not by the end of its wait.
    let started = Instant::now();
    let failed: Result<String, Error> =
        send_email(&store, "crash").wait(Duration::from_secs(30)).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok("second".to_owned())
        });
    let took = started.elapsed();
    match failed {
        Err(Error::InDoubt { key: k, tool, .. }) => {
            assert_eq!((k.as_str(), tool.as_str()), (key.as_str(), "send_email"))
        }
        other => panic!("expected InDoubt once the lease lapsed, got {other:?}"),
    }
    assert!(took <= LEASE + Duration::from_secs(1), "woken when the lease lapsed ({took:?})");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "in doubt under `fail` runs nothing");

    // The dead owner's heartbeat cannot revive the lapsed lease.
    let pg = PgStore::builder(&url).schema(&schema).connect().unwrap();
    assert!(!common::renew(&pg, &stale), "a lapsed lease is not renewed");

    let rerun: String = send_email(&store, "crash")
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("rerun".to_owned())
        })
        .unwrap();
    assert_eq!(
        (rerun.as_str(), runs.load(Ordering::SeqCst)),
        ("rerun", 1),
        "`rerun` takes over and runs once"
    );

    // The dead owner's late writes are refused, and its heartbeat cannot touch the new record.
    let late = transition::complete(&stale, r#""from the dead owner""#.into(), None, 0);
    assert!(common::swap(store.as_ref(), &stale, late).is_none(), "a stale write is refused");
    let late = transition::release(&stale);
    assert!(common::swap(store.as_ref(), &stale, late).is_none(), "a stale release is refused");
    assert!(!common::renew(&pg, &stale), "a stale heartbeat is refused");
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Done, 2));
    assert_eq!(record.result.as_deref(), Some(r#""rerun""#), "the new owner's result stands");
}
