//! The store through a pooler in transaction mode (the PgBouncer `.ci/run` starts, at
//! `IDEM_TEST_POOLER_URL`): one body for a crowd of callers, waiters woken without
//! notifications or through a listen URL, and errors that name the pooler. The rest of the suite
//! runs through the same pooler too (CI runs it a second time with `DATABASE_URL` at it).

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::waiting;
use idem_runtime::{Call, Error, Store};

/// The pooler's URL and a schema of the test's own, or `None` when no pooler runs here.
fn pooled(prefix: &str) -> Option<(String, String, common::DropSchema)> {
    common::pooler_url().map(|url| common::with_schema(url, prefix))
}

/// Eight callers of one key at once: the owner's body runs, the seven others wait for it. Their
/// wait (10 s) is shorter than the owner's lease (30 s): a waiter that heard of the result only
/// when the lease lapsed, as when notifications are lost in the pooler, would give up instead.
fn eight_callers_get_one_result(store: Arc<dyn Store>) {
    let runs = Arc::new(AtomicU32::new(0));
    let started = Arc::new(Barrier::new(2));
    let call = || {
        Call::new("charge_card", "pooled", &serde_json::json!({ "amount": 42 }))
            .unwrap()
            .store(Arc::clone(&store))
            .wait(Duration::from_secs(10))
    };
    let key = call().key().clone();
    let owner = {
        let (call, runs, started) = (call(), Arc::clone(&runs), Arc::clone(&started));
        std::thread::spawn(move || {
            call.run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                started.wait();
                // The body ends only once the seven below are all waiting for it, so that each
                // is woken by its result through the pooler, not handed a replay.
                let deadline = Instant::now() + Duration::from_secs(60);
                while waiting(key.as_str()) < 7 {
                    assert!(Instant::now() < deadline, "the seven callers never all waited");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok::<_, Error>("ch_1".to_owned())
            })
        })
    };
    started.wait();
    let waiters: Vec<_> = (0..7)
        .map(|_| {
            let (call, runs) = (call(), Arc::clone(&runs));
            std::thread::spawn(move || {
                call.run(|| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>("ch_again".to_owned())
                })
            })
        })
        .collect();
    assert_eq!(owner.join().unwrap().expect("the owner's call"), "ch_1");
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap().expect("a waiter gets the owner's result"), "ch_1");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[test]
fn eight_callers_through_the_pooler_run_the_body_once() {
    let Some((url, schema, _guard)) = pooled("p8") else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(
        PgStore::builder(&url)
            .schema(&schema)
            .lease(Duration::from_secs(30))
            .connect()
            .expect("the store connects through the pooler"),
    );
    eight_callers_get_one_result(store);
}

#[test]
fn a_listen_url_beside_the_pooler_hears_notifications() {
    let Some((url, schema, _guard)) = pooled("plisten") else {
        return;
    };
    let server = common::server_url(common::database_url().as_deref().unwrap_or(&url));
    if server == url {
        eprintln!("SKIPPED: no direct server URL beside the pooler (DATABASE_URL)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI must set DATABASE_URL");
        return;
    }
    let name = format!("idem_{schema}");
    let store: Arc<dyn Store> = Arc::new(
        PgStore::builder(&url)
            .listen_url(&common::with_param(&server, "application_name", &name))
            .schema(&schema)
            .lease(Duration::from_secs(30))
            .connect()
            .expect("the store connects through the pooler, listening directly"),
    );
    // The listening session turns its idle timeout off once its probe came back, which proves
    // notifications arrive on it.
    let heard = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' \
         AND query LIKE '%idle_session_timeout%'"
    );
    assert!(
        common::eventually(Duration::from_secs(10), || common::query_i64(&server, &heard) == 1),
        "the listening session never heard its probe"
    );
    eight_callers_get_one_result(store);
}

/// A named prepared statement that is missing on the server connection (SQLSTATE 26000), as a
/// pooler in transaction mode makes it when something else on the connection prepares
/// statements: the error says so, and names the setting. A trigger on the records table runs
/// such a statement, so the server itself raises the error.
#[test]
fn a_missing_prepared_statement_is_reported_as_a_pooler_symptom() {
    let Some((url, schema, _guard)) = pooled("p26") else {
        return;
    };
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).connect().expect("the store connects"));
    common::run_sql(
        &url,
        &format!(
            "CREATE FUNCTION \"{schema}\".lost() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN EXECUTE 'EXECUTE idem_lost_statement'; RETURN NEW; END $$; \
             CREATE TRIGGER lost BEFORE INSERT ON \"{schema}\".records \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".lost();"
        ),
    )
    .unwrap();
    let got: Result<u32, Error> =
        Call::new("lost", "p", &1).unwrap().store(store).run(|| Ok::<_, Error>(1));
    let message = got.expect_err("the reservation failed").to_string();
    assert!(message.contains("26000"), "the SQLSTATE is in the text: {message}");
    assert!(message.contains("transaction mode"), "the advice names the pooler: {message}");
    assert!(message.contains("pool_mode"), "and the setting: {message}");
}
