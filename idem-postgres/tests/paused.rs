//! An owner paused (SIGSTOP) past its lease, whose key another process takes over and finishes
//! meanwhile: when it resumes, its final write is refused by the fence, and its call returns the
//! result the store holds, never its own as if it were recorded (issue 33, finding 10); the key's
//! history says a stale owner came back, and every later owner holds a greater fencing token
//! (finding 11).

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::block_on;
use idem_runtime::history::Event;
use idem_runtime::store::lease;
use idem_runtime::{Call, Error, InDoubtPolicy, Resolution, Status, Store};

// Long beside the heartbeat (250 ms), so that only the pause lets it lapse.
const LEASE: Duration = Duration::from_secs(2);

fn charge(store: &Arc<dyn Store>) -> Call {
    Call::new("charge_card", "order-paused", &serde_json::json!({ "amount": 4200 }))
        .unwrap()
        .store(Arc::clone(store))
}

fn signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    // SAFETY: sends a signal to the child this test started.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "signal {signal} to {pid}: {}", std::io::Error::last_os_error());
}

/// In a child: enter the body, say so with its fencing token, and return only once the parent's
/// flag file exists (the parent stops this process meanwhile), with a charge, or with an error
/// after its answer timed out (`IDEM_PG_TEST_ENDING=timed-out`); then say what the call returned.
#[test]
fn paused_child() {
    if std::env::var(common::CHILD_ROLE).as_deref() != Ok("paused-owner") {
        return;
    }
    let url = std::env::var("DATABASE_URL").unwrap();
    let schema = std::env::var("IDEM_PG_TEST_SCHEMA").unwrap();
    let flag = std::path::PathBuf::from(std::env::var("IDEM_PG_TEST_FLAG").unwrap());
    let timed_out = std::env::var("IDEM_PG_TEST_ENDING").as_deref() == Ok("timed-out");
    let store = common::short_lease_store(&url, &schema, LEASE);
    let got: Result<String, Error> = charge(&store).run(|| {
        common::say(&format!("in-body {}", idem_runtime::fencing_token()));
        while !flag.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if timed_out {
            // The request went out and its answer timed out: the owner marks the key in doubt.
            idem_runtime::may_have_landed();
            return Err(Error::Key { tool: "charge_card".into(), reason: "timed out".into() });
        }
        Ok("ch_from_the_paused_owner".to_owned())
    });
    match got {
        Ok(charge) => common::say(&format!("returned {charge}")),
        Err(e) => common::say(&format!("failed: {e}")),
    }
}

/// A child in its body, stopped (SIGSTOP) until its lease has lapsed on `store`'s clock.
struct Paused {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    flag: std::path::PathBuf,
    /// The paused owner, and the fencing token its body read.
    owner: String,
    token: u64,
    _dir: tempfile::TempDir,
}

impl Paused {
    /// `ending` is how the body ends once it resumes: `charged`, or `timed-out`.
    fn start(url: &str, schema: &str, store: &Arc<dyn Store>, ending: &str) -> Paused {
        let key = charge(store).key().clone();
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("go");
        let mut child = common::spawn_child(
            "paused_child",
            "paused-owner",
            &[
                ("DATABASE_URL", url),
                ("IDEM_PG_TEST_SCHEMA", schema),
                ("IDEM_PG_TEST_FLAG", flag.to_str().unwrap()),
                ("IDEM_PG_TEST_ENDING", ending),
            ],
        );
        let lines = common::child_lines(&mut child);
        let said = lines.recv_timeout(Duration::from_secs(60)).unwrap();
        let token = said.strip_prefix("in-body ").and_then(|t| t.parse().ok());
        let token = token.unwrap_or_else(|| panic!("the child says its token: {said}"));
        // Paused, its heartbeat stops too: wait until its lease has lapsed.
        signal(child.id(), libc::SIGSTOP);
        let lapsed = common::eventually(Duration::from_secs(30), || {
            let record = block_on(store.get(key.as_str())).unwrap().expect("the owner's record");
            !lease::holds(&record, store.clock(), store.instance().id())
        });
        assert!(lapsed, "the paused owner's lease lapses");
        let owner = block_on(store.get(key.as_str())).unwrap().unwrap().owner.as_str().to_owned();
        Paused { child, lines, flag, owner, token, _dir: dir }
    }

    /// Lets the child's body return; what its call then answered.
    fn resume(mut self) -> String {
        std::fs::write(&self.flag, b"").unwrap();
        signal(self.child.id(), libc::SIGCONT);
        let said = self.lines.recv_timeout(Duration::from_secs(60)).expect("the child answers");
        assert!(self.child.wait().unwrap().success());
        said
    }
}

/// The last entry of `key`'s history: the paused owner's refused late write, once it resumed.
fn assert_late_write_recorded(store: &Arc<dyn Store>, key: &idem_runtime::Key, owner: &str) {
    let history = block_on(store.history(key.as_str())).unwrap();
    let last = history.last().expect("the key has a history");
    assert_eq!(last.event, Event::LateWriteRefused, "{history:?}");
    assert_eq!(last.by, owner, "by the stale owner");
}

#[test]
fn a_paused_owner_whose_key_moved_on_returns_what_is_recorded() {
    let Some((url, schema, _guard)) = common::scratch_schema("paused") else { return };
    let store = common::short_lease_store(&url, &schema, LEASE);
    let key = charge(&store).key().clone();
    let paused = Paused::start(&url, &schema, &store, "charged");

    // Another caller takes the key over (in doubt, rerun) and finishes it, with a greater
    // fencing token.
    let mut token = 0;
    let second: String = charge(&store)
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| {
            token = idem_runtime::fencing_token();
            Ok::<_, Error>("ch_from_the_new_owner".to_owned())
        })
        .unwrap();
    assert_eq!(second, "ch_from_the_new_owner");
    assert!(token > paused.token, "the new owner's token {token} > the paused {}", paused.token);
    let stale = paused.owner.clone();

    // The paused owner resumes and its body returns: its write is refused, and its caller is
    // told what every other caller replays.
    let said = paused.resume();
    assert_eq!(said, "returned ch_from_the_new_owner", "never its own result as recorded");
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!(record.status, Status::Done);
    assert_eq!(record.result.as_deref(), Some(r#""ch_from_the_new_owner""#));
    assert_late_write_recorded(&store, &key, &stale);
}

#[test]
fn a_release_is_refused_while_the_owner_runs_and_a_forced_one_supersedes_it() {
    let Some((url, schema, _guard)) = common::scratch_schema("moved") else { return };
    let store = common::short_lease_store(&url, &schema, LEASE);
    let key = charge(&store).key().clone();
    let paused = Paused::start(&url, &schema, &store, "charged");
    // The key is in doubt for everyone now, but its owner's process still runs on this host:
    // an operator's release is refused (it could run the effect twice), and changes nothing.
    let refused =
        idem_runtime::admin::resolve(&*store, &key, Resolution::Release, "ann@ops", None, false);
    match refused {
        Err(Error::OwnerAlive { pid, .. }) => assert_eq!(pid, paused.child.id()),
        other => panic!("a release while the owner's process runs is refused: {other:?}"),
    }
    assert_eq!(block_on(store.get(key.as_str())).unwrap().unwrap().status, Status::InFlight);
    // The operator knows better (say, the process is stuck for good) and forces it.
    let released =
        idem_runtime::admin::resolve(&*store, &key, Resolution::Release, "ann@ops", None, true);
    assert_eq!(released.unwrap(), None);
    let stale = paused.owner.clone();
    let said = paused.resume();
    assert!(said.starts_with("failed: "), "{said}");
    assert!(said.contains("was taken over or settled while it ran"), "{said}");
    assert!(said.contains("the store holds absent"), "{said}");
    assert_eq!(block_on(store.get(key.as_str())).unwrap(), None, "its result was not recorded");
    assert_late_write_recorded(&store, &key, &stale);
}

#[test]
fn a_paused_owner_that_cannot_mark_its_key_in_doubt_is_recorded_too() {
    let Some((url, schema, _guard)) = common::scratch_schema("lated") else { return };
    let store = common::short_lease_store(&url, &schema, LEASE);
    let key = charge(&store).key().clone();
    let paused = Paused::start(&url, &schema, &store, "timed-out");
    let second: String = charge(&store)
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| Ok::<_, Error>("ch_from_the_new_owner".to_owned()))
        .unwrap();
    assert_eq!(second, "ch_from_the_new_owner");
    let stale = paused.owner.clone();
    let said = paused.resume();
    assert!(said.starts_with("failed: "), "{said}");
    // Its word that the key is in doubt was refused: the new owner's result stands.
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!(record.status, Status::Done);
    assert_late_write_recorded(&store, &key, &stale);
}
