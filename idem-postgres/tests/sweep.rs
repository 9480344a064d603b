//! A sweep over a shared table meets rows that no call of idem wrote: any writer of the database
//! can insert one, with a key that is not 32 lower-case hex digits. The sweep logs and skips
//! such a row, and still settles every key of its tools that is in doubt.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_postgres::PgStore;
use idem_runtime::{may_have_landed, Call, Error, Key, Reconciled, Status, Store, Sweep};

fn leave_in_doubt(store: &Arc<dyn Store>, scope: &str) -> Key {
    let call = || Call::new("charge_card", scope, &1).unwrap().store(Arc::clone(store));
    let lost = call().run(|| {
        may_have_landed();
        Err::<String, _>(Error::Key { tool: "charge_card".into(), reason: "timed out".into() })
    });
    assert!(lost.is_err());
    call().key().clone()
}

fn status(store: &Arc<dyn Store>, key: &str) -> Option<Status> {
    idem_runtime::block_on(store.get(key)).unwrap().map(|record| record.status)
}

#[test]
fn a_sweep_skips_rows_whose_key_is_not_a_key_and_settles_the_rest() {
    let Some((url, schema, _guard)) = common::scratch_schema("sweep") else { return };
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).connect().expect("the store connects"));
    let landed = leave_in_doubt(&store, "order-1");
    let not_landed = leave_in_doubt(&store, "order-2");
    let bad_keys = ["not-a-key", "ABCDEF0123456789ABCDEF0123456789", "abc", "ключ"];
    for bad in bad_keys {
        common::run_sql(
            &url,
            &format!(
                "INSERT INTO \"{schema}\".records (key, status, tool, scope, owner, attempts, \
                 created_at, updated_at, args_fingerprint) VALUES ('{bad}', 'in-doubt', \
                 'charge_card', 'by hand', 'someone', 1, 1, 1, '')"
            ),
        )
        .unwrap();
    }

    let asked = AtomicUsize::new(0);
    let sweep = Sweep::new().store(Arc::clone(&store)).tool("charge_card", |key: &Key| {
        asked.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(if *key == landed {
            Reconciled::Landed("ch_1".to_owned())
        } else {
            Reconciled::NotLanded
        })
    });
    let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sweep.run()))
        .expect("the sweep does not panic")
        .expect("the sweep lists the store");

    assert_eq!(asked.load(Ordering::SeqCst), 2, "asked about the two keys only: {report:?}");
    assert_eq!(report.settled().count(), 2, "{report:?}");
    assert_eq!(status(&store, landed.as_str()), Some(Status::Done));
    assert_eq!(status(&store, not_landed.as_str()), None, "released");
    for bad in bad_keys {
        assert!(report.keys.iter().all(|swept| swept.key != bad), "{bad} in {report:?}");
        assert_eq!(status(&store, bad), Some(Status::InDoubt), "the row {bad} is left as it was");
    }
}
