//! An owner process killed by SIGKILL after its charge landed: once its lease lapses, the first
//! call of another process finds the key in doubt, asks the tool's reconciler, which finds the
//! charge in the vendor's ledger under the key, and records and returns it. One charge.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::block_on;
use idem_runtime::{Call, Error, Key, Reconciled, Status, Store};

const LEASE: Duration = Duration::from_secs(1);

fn charge_card(store: &Arc<dyn Store>) -> Call {
    Call::new("charge_card", "o-17", &serde_json::json!({ "amount": 4200 }))
        .unwrap()
        .store(Arc::clone(store))
}

fn short_lease_store(url: &str, schema: &str) -> Arc<dyn Store> {
    common::short_lease_store(url, schema, LEASE)
}

/// The vendor: an append-only ledger file of `key charge` lines, synced before a charge is
/// reported.
fn charge_in(ledger: &Path, key: &Key) -> String {
    let id = format!("ch_{}", lines(ledger).len() + 1);
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(ledger).unwrap();
    writeln!(file, "{key} {id}").unwrap();
    file.sync_all().unwrap();
    id
}

fn lines(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The reconciler: the charge under `key` in the ledger, if any.
fn find_charge(ledger: &Path, key: &Key) -> Reconciled<String> {
    let found = lines(ledger).into_iter().find_map(|line| {
        let (k, id) = line.split_once(' ')?;
        (k == key.as_str()).then(|| id.to_owned())
    });
    found.map_or(Reconciled::NotLanded, Reconciled::Landed)
}

/// In a child: charge, say so, and never return (the parent kills this process).
#[test]
fn reconcile_crash_child() {
    if std::env::var(common::CHILD_ROLE).as_deref() != Ok("charge-then-hang") {
        return;
    }
    let url = std::env::var("DATABASE_URL").unwrap();
    let schema = std::env::var("IDEM_PG_TEST_SCHEMA").unwrap();
    let ledger = PathBuf::from(std::env::var("IDEM_TEST_LEDGER").unwrap());
    let store = short_lease_store(&url, &schema);
    let _: Result<String, Error> = charge_card(&store).run(|| {
        let id = charge_in(&ledger, &idem_runtime::current_key());
        common::say(&format!("charged {id}"));
        std::thread::sleep(Duration::from_secs(120));
        Ok(id)
    });
}

#[test]
fn killed_owner_s_charge_is_reconciled_by_the_next_process() {
    let Some((url, schema, _guard)) = common::scratch_schema("rc") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let ledger_text = ledger.to_str().unwrap().to_owned();
    let store = short_lease_store(&url, &schema);
    let key = charge_card(&store).key().clone();

    let mut child = common::spawn_child(
        "reconcile_crash_child",
        "charge-then-hang",
        &[
            ("DATABASE_URL", &url),
            ("IDEM_PG_TEST_SCHEMA", &schema),
            ("IDEM_TEST_LEDGER", &ledger_text),
        ],
    );
    let said = common::child_lines(&mut child);
    assert_eq!(
        said.recv_timeout(Duration::from_secs(60)).expect("the child charges"),
        "charged ch_1"
    );
    child.kill().expect("SIGKILL the owner");
    child.wait().unwrap();
    let left = block_on(store.get(key.as_str())).unwrap().expect("the dead owner's record");
    assert_eq!(left.status, Status::InFlight, "left in flight, under a lease that will lapse");

    // This process's first call waits for the lease to lapse, then asks the reconciler.
    let (asked, runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let got: String = charge_card(&store)
        .wait(Duration::from_secs(30))
        .run_reconciled(
            |k| {
                asked.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(find_charge(&ledger, k))
            },
            || {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(charge_in(&ledger, &idem_runtime::current_key()))
            },
        )
        .expect("reconciled");
    assert_eq!(got, "ch_1", "the vendor's charge comes back");
    assert_eq!((asked.load(Ordering::SeqCst), runs.load(Ordering::SeqCst)), (1, 0));
    assert_eq!(lines(&ledger).len(), 1, "one charge in the ledger: {:?}", lines(&ledger));
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Done, 1));
    assert_eq!(record.result.as_deref(), Some(r#""ch_1""#));

    // Later calls replay it without asking.
    let again: String = charge_card(&store)
        .run_reconciled(
            |_| -> Result<Reconciled<String>, String> { panic!("not asked again") },
            || -> Result<String, Error> { panic!("not run") },
        )
        .unwrap();
    assert_eq!(again, "ch_1");
}
