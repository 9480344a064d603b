//! Transactional calls: the body's writes and the call's record commit together or not at all;
//! duplicates wait for the first transaction and replay it; failures the database says to retry
//! run the transaction again with the same key. Through tokio-postgres and sqlx.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::admin::{self, Decision};
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, InDoubtPolicy, Key, Status, Store};
use tokio_postgres::types::Type;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A store on a schema of its own, with the application's `refunds` table beside idem's.
struct Shop {
    url: String,
    schema: String,
    store: Arc<PgStore>,
    guard: Option<common::DropSchema>,
}

impl Drop for Shop {
    fn drop(&mut self) {
        // The schema is dropped from a plain thread: the tests run inside a runtime.
        let guard = self.guard.take();
        let _ = std::thread::spawn(move || drop(guard)).join();
    }
}

impl Shop {
    async fn open(prefix: &str) -> Option<Shop> {
        let (url, schema, guard) = common::scratch_schema(prefix)?;
        let store = PgStore::builder(&url).schema(&schema).pool_size(20).connect_async().await;
        let store = Arc::new(store.expect("the store connects"));
        let shop = Shop { url, schema, store, guard: Some(guard) };
        shop.sql(&format!(
            "CREATE TABLE \"{0}\".refunds (id bigserial PRIMARY KEY, order_id bigint NOT NULL, \
             cents bigint NOT NULL); \
             CREATE TABLE \"{0}\".accounts (id bigint PRIMARY KEY, balance bigint NOT NULL); \
             INSERT INTO \"{0}\".accounts VALUES (1, 0), (2, 0);",
            shop.schema
        ))
        .await;
        Some(shop)
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn sql(&self, sql: &str) {
        self.client().await.batch_execute(sql).await.unwrap();
    }

    async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}\".{table}", self.schema);
        // Unnamed statements: a pooler in transaction mode may run a named one's parse and
        // its execution on two server connections.
        self.client().await.query_typed(&sql, &[]).await.unwrap()[0].get(0)
    }

    fn refunds(&self) -> String {
        format!("\"{}\".refunds", self.schema)
    }

    fn call(&self, order: i64) -> Call {
        Call::new("refund", format!("order-{order}"), &serde_json::json!({ "order": order }))
            .unwrap()
    }

    async fn record(&self, call: &Call) -> Option<idem_runtime::Record> {
        self.store.get(call.key().as_str()).await.unwrap()
    }

    /// A refund of `order` through tokio-postgres, counting the body's runs in `runs`.
    async fn refund(&self, order: i64, runs: &AtomicUsize) -> Result<i64, BoxError> {
        let sql = format!(
            "INSERT INTO {} (order_id, cents) VALUES ($1, 1250) RETURNING id",
            self.refunds()
        );
        self.store
            .transactional(self.call(order))
            .run(async |tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                let row = tx.query_typed_one(&sql, &[(&order, Type::INT8)]).await?;
                Ok::<i64, BoxError>(row.get(0))
            })
            .await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_call_commits_its_writes_with_its_record_and_a_repeat_replays() {
    let Some(shop) = Shop::open("tx0").await else { return };
    let runs = AtomicUsize::new(0);
    let first = shop.refund(17, &runs).await.unwrap();
    let seen: Result<(String, u64), BoxError> = shop
        .store
        .transactional(shop.call(18))
        .run(async |_tx| {
            Ok((idem_runtime::current_key().to_string(), idem_runtime::fencing_token()))
        })
        .await;
    let (key, token) = seen.unwrap();
    assert_eq!(key, shop.call(18).key().to_string(), "the body runs as its call");
    assert!(token > 0, "with its owner's fencing token");
    let again = shop.refund(17, &runs).await.unwrap();
    assert_eq!((first, again), (first, first), "the repeat replays the committed result");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(shop.count("refunds").await, 1, "one refund row");
    let record = shop.record(&shop.call(17)).await.expect("the record committed");
    assert_eq!(record.status, Status::Done);
    assert_eq!(record.result.as_deref(), Some(first.to_string().as_str()));
    let events: Vec<_> = shop
        .store
        .history(shop.call(17).key().as_str())
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.event.as_str())
        .collect();
    assert_eq!(events, ["reserved", "done"], "its history, committed with it");
}

/// A replay is decided by the record read with its `BEGIN`: it tries no insert (a trigger counts
/// every attempt with a sequence, which no rollback takes back), and a large result comes back
/// whole from that read.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_is_read_with_the_begin_and_tries_no_insert() {
    let Some(shop) = Shop::open("tx_read").await else { return };
    shop.sql(&format!(
        "CREATE SEQUENCE \"{0}\".inserts; \
         CREATE FUNCTION \"{0}\".count_insert() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM nextval('\"{0}\".inserts'); RETURN NEW; END $$; \
         CREATE TRIGGER count_insert BEFORE INSERT ON \"{0}\".records \
         FOR EACH ROW EXECUTE FUNCTION \"{0}\".count_insert();",
        shop.schema
    ))
    .await;
    let inserts = async || -> i64 {
        let sql = format!("SELECT last_value FROM \"{}\".inserts", shop.schema);
        shop.client().await.query_typed(&sql, &[]).await.unwrap()[0].get(0)
    };
    let runs = AtomicUsize::new(0);
    let large = async || {
        shop.store
            .transactional(shop.call(17))
            .run(async |_tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>("x".repeat(4 << 20))
            })
            .await
    };
    let first = large().await.unwrap();
    assert_eq!(inserts().await, 1, "the fresh call inserted its record");
    let again = tokio::time::timeout(Duration::from_secs(60), large()).await;
    let again = again.expect("the replay ends").unwrap();
    assert_eq!((again.len(), &again), (4 << 20, &first), "the repeat replays the whole result");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(inserts().await, 1, "the replay tried no insert");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_err_rolls_back_the_writes_and_frees_the_key() {
    let Some(shop) = Shop::open("tx1").await else { return };
    let sql = format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250)", shop.refunds());
    let failed: Result<i64, BoxError> = shop
        .store
        .transactional(shop.call(17))
        .run(async |tx| {
            tx.execute_typed(&sql, &[]).await?;
            Err::<i64, BoxError>("the payment provider said no".into())
        })
        .await;
    assert_eq!(failed.unwrap_err().to_string(), "the payment provider said no");
    assert_eq!(shop.count("refunds").await, 0, "the body's write rolled back");
    assert!(shop.record(&shop.call(17)).await.is_none(), "no record: the key is free");
    let runs = AtomicUsize::new(0);
    shop.refund(17, &runs).await.unwrap();
    assert_eq!((runs.load(Ordering::SeqCst), shop.count("refunds").await), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_or_a_dropped_call_rolls_back_and_frees_the_key() {
    let Some(shop) = Shop::open("tx2").await else { return };
    let sql = format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250)", shop.refunds());
    let (store, call, panicking) = (Arc::clone(&shop.store), shop.call(17), sql.clone());
    let panicked = tokio::spawn(async move {
        let _: Result<i64, BoxError> = store
            .transactional(call)
            .run(async |tx| {
                tx.execute_typed(&panicking, &[]).await?;
                panic!("the body panics after its write");
            })
            .await;
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());

    // Dropped while the body waits, after its write.
    let (wrote, written) = tokio::sync::oneshot::channel::<()>();
    let (store, call) = (Arc::clone(&shop.store), shop.call(17));
    let task = tokio::spawn(async move {
        let wrote = std::sync::Mutex::new(Some(wrote));
        let _: Result<i64, BoxError> = store
            .transactional(call)
            .run(async |tx| {
                tx.execute_typed(&sql, &[]).await?;
                let _ = wrote.lock().unwrap().take().map(|w| w.send(()));
                std::future::pending::<()>().await;
                Ok(0)
            })
            .await;
    });
    written.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    let runs = AtomicUsize::new(0);
    let id = shop.refund(17, &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the key was free: the next call ran the body");
    assert_eq!(shop.count("refunds").await, 1, "only the last call's write is there");
    assert_eq!(shop.record(&shop.call(17)).await.unwrap().result, Some(id.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_duplicates_wait_for_the_first_transaction_and_replay_it() {
    let Some(shop) = Shop::open("tx3").await else { return };
    let shop = Arc::new(shop);
    let runs = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let (shop, runs) = (Arc::clone(&shop), Arc::clone(&runs));
            tokio::spawn(async move { shop.refund(17, &runs).await.unwrap() })
        })
        .collect();
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one body ran");
    assert!(ids.iter().all(|id| *id == ids[0]), "every caller got its result: {ids:?}");
    assert_eq!(shop.count("refunds").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_serialization_failure_runs_the_transaction_again_with_the_same_key() {
    let Some(shop) = Shop::open("tx4").await else { return };
    let runs = AtomicUsize::new(0);
    let insert = format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250)", shop.refunds());
    // The server refuses the first run as it would a serializable transaction's conflict.
    let refuse = "DO $$ BEGIN RAISE EXCEPTION 'conflict with a concurrent update' \
                  USING ERRCODE = 'serialization_failure'; END $$";
    let value: Result<String, BoxError> = shop
        .store
        .transactional(shop.call(17))
        .run(async |tx| {
            tx.execute_typed(&insert, &[]).await?;
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                tx.batch_execute(refuse).await?;
            }
            Ok("refunded".to_owned())
        })
        .await;
    assert_eq!(value.unwrap(), "refunded");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the body ran again after the failure");
    assert_eq!(shop.count("refunds").await, 1, "the first run's write rolled back");

    // Never getting through: the bound stops it, and nothing is left behind.
    let runs = AtomicUsize::new(0);
    let refused: Result<String, BoxError> = shop
        .store
        .transactional(shop.call(18))
        .attempts(3)
        .run(async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            tx.batch_execute(refuse).await?;
            Ok("never".to_owned())
        })
        .await;
    let error = refused.unwrap_err();
    assert_eq!(idem_postgres::TransactionError::sqlstate(&error), Some("40001"), "{error}");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "three runs, as bounded");
    assert!(shop.record(&shop.call(18)).await.is_none(), "the key is free");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_between_two_calls_runs_the_victim_again() {
    let Some(shop) = Shop::open("tx5").await else { return };
    let shop = Arc::new(shop);
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let runs = Arc::new(AtomicUsize::new(0));
    let transfer = |order: i64, from: i64, to: i64| {
        let (shop, barrier, runs) = (Arc::clone(&shop), Arc::clone(&barrier), Arc::clone(&runs));
        tokio::spawn(async move {
            let update = format!(
                "UPDATE \"{}\".accounts SET balance = balance + $2 WHERE id = $1",
                shop.schema
            );
            let first = std::sync::atomic::AtomicBool::new(true);
            shop.store
                .transactional(shop.call(order))
                .run(async |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tx.execute_typed(&update, &[(&from, Type::INT8), (&-5i64, Type::INT8)]).await?;
                    if first.swap(false, Ordering::SeqCst) {
                        // Both hold their first row before either asks for the other's.
                        barrier.wait().await;
                    }
                    tx.execute_typed(&update, &[(&to, Type::INT8), (&5i64, Type::INT8)]).await?;
                    Ok::<_, BoxError>(order)
                })
                .await
                .unwrap()
        })
    };
    let (a, b) = (transfer(1, 1, 2), transfer(2, 2, 1));
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (1, 2), "both calls got through");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "the deadlock's victim ran once more");
    let client = shop.client().await;
    let sql = format!("SELECT count(*) FROM \"{}\".accounts WHERE balance = 0", shop.schema);
    let rows = client.query_typed(&sql, &[]).await.unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 2, "each transfer applied once: balances are back to 0");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_that_cannot_be_stored_rolls_back_its_writes() {
    let Some(shop) = Shop::open("tx6").await else { return };
    let sql = format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250)", shop.refunds());
    let stored: Result<f64, BoxError> = shop
        .store
        .transactional(shop.call(17))
        .run(async |tx| {
            tx.execute_typed(&sql, &[]).await?;
            Ok(f64::NAN)
        })
        .await;
    let error = stored.unwrap_err();
    assert!(matches!(error.downcast_ref::<Error>(), Some(Error::Result { .. })), "{error}");
    assert_eq!(shop.count("refunds").await, 0, "nothing committed");
    assert!(shop.record(&shop.call(17)).await.is_none(), "the key is free");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_result_is_taken_over_inside_the_transaction() {
    let Some(shop) = Shop::open("tx7").await else { return };
    let runs = AtomicUsize::new(0);
    let sql =
        format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250) RETURNING id", shop.refunds());
    let refund = || {
        shop.store.transactional(shop.call(17).ttl(Duration::from_millis(1))).run(async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<i64, BoxError>(tx.query_typed_one(&sql, &[]).await?.get(0))
        })
    };
    let first = refund().await.unwrap();
    let expires = shop.record(&shop.call(17)).await.unwrap().expires_at.unwrap();
    // The ttl is measured on the store's clock: wait until that clock is past it.
    assert!(common::eventually(Duration::from_secs(5), || shop.store.clock() > expires));
    let second = refund().await.unwrap();
    assert_ne!(first, second, "the body ran again for an expired result");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let record = shop.record(&shop.call(17)).await.unwrap();
    assert_eq!((record.attempts, record.result), (2, Some(second.to_string())));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_a_plain_call_left_in_doubt_is_not_run_unless_rerun() {
    let Some(shop) = Shop::open("tx8").await else { return };
    let store: Arc<dyn Store> = Arc::clone(&shop.store) as Arc<dyn Store>;
    let lost: Result<i64, Error> = shop
        .call(17)
        .store(store)
        .run_async(|| async {
            idem_runtime::may_have_landed();
            Err(Error::Key { tool: "refund".into(), reason: "the answer was lost".into() })
        })
        .await;
    assert!(lost.is_err());
    let runs = AtomicUsize::new(0);
    let refused = shop.refund(17, &runs).await.unwrap_err();
    assert!(matches!(refused.downcast_ref::<Error>(), Some(Error::InDoubt { .. })), "{refused}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");

    let sql =
        format!("INSERT INTO {} (order_id, cents) VALUES (17, 1250) RETURNING id", shop.refunds());
    let rerun: i64 = shop
        .store
        .transactional(shop.call(17).in_doubt(InDoubtPolicy::Rerun))
        .run(async |tx| Ok::<i64, BoxError>(tx.query_typed_one(&sql, &[]).await?.get(0)))
        .await
        .unwrap();
    let record = shop.record(&shop.call(17)).await.unwrap();
    assert_eq!((record.status, record.result), (Status::Done, Some(rerun.to_string())));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transactional_call_waits_for_a_plain_owner_and_replays_its_result() {
    let Some(shop) = Shop::open("tx9").await else { return };
    let store: Arc<dyn Store> = Arc::clone(&shop.store) as Arc<dyn Store>;
    let (entered, in_body) = tokio::sync::oneshot::channel::<()>();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let plain = tokio::spawn(shop.call(17).store(store).run_async(move || async move {
        entered.send(()).unwrap();
        finished.await.unwrap();
        Ok::<i64, Error>(99)
    }));
    in_body.await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (store, sql, runs) = (Arc::clone(&shop.store), shop.refunds(), Arc::clone(&runs));
        let call = shop.call(17);
        tokio::spawn(async move {
            let sql = format!("INSERT INTO {sql} (order_id, cents) VALUES (17, 1) RETURNING id");
            store
                .transactional(call)
                .run(async |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<i64, BoxError>(tx.query_typed_one(&sql, &[]).await?.get(0))
                })
                .await
                .unwrap()
        })
    };
    let key = shop.call(17).key().clone();
    assert!(
        common::eventually(Duration::from_secs(10), || {
            idem_runtime::waiting(key.as_str()) > 0 || waiter.is_finished()
        }),
        "the transactional call waits"
    );
    finish.send(()).unwrap();
    assert_eq!(plain.await.unwrap().unwrap(), 99);
    assert_eq!(waiter.await.unwrap(), 99, "it replays the plain call's result");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(shop.count("refunds").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn through_sqlx_the_writes_and_the_record_commit_together() {
    let Some(shop) = Shop::open("tx10").await else { return };
    let pool =
        sqlx::postgres::PgPoolOptions::new().max_connections(8).connect(&shop.url).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let sql =
        format!("INSERT INTO {} (order_id, cents) VALUES ($1, 1250) RETURNING id", shop.refunds());
    let refund = |order: i64, fail: bool| {
        let (store, pool, sql, runs, call) = (
            Arc::clone(&shop.store),
            pool.clone(),
            sql.clone(),
            Arc::clone(&runs),
            shop.call(order),
        );
        async move {
            store
                .transactional(call)
                .run_sqlx(&pool, async |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Unnamed, as the README asks of a body's statements: the suite also runs
                    // through a pooler in transaction mode, where a statement sqlx prepared in an
                    // earlier transaction may not be on this one's server connection.
                    let query = sqlx::query_scalar(&sql).persistent(false);
                    let id: i64 = query.bind(order).fetch_one(&mut *tx).await?;
                    if fail {
                        return Err::<i64, BoxError>("refused".into());
                    }
                    Ok(id)
                })
                .await
        }
    };
    assert!(refund(17, true).await.is_err());
    assert_eq!(shop.count("refunds").await, 0, "an Err rolled the write back");
    assert!(shop.record(&shop.call(17)).await.is_none());

    let callers: Vec<_> = (0..16).map(|_| tokio::spawn(refund(17, false))).collect();
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.unwrap().unwrap());
    }
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the failed run and one more");
    assert_eq!(shop.count("refunds").await, 1);
    let record = shop.record(&shop.call(17)).await.unwrap();
    assert_eq!((record.status, record.result), (Status::Done, Some(ids[0].to_string())));
}

/// A person decides `key` (as `idem approve` or `idem deny` would), off the async runtime.
async fn decide(store: &Arc<PgStore>, key: &str, decision: Decision, note: Option<&'static str>) {
    let (store, key) = (Arc::clone(store), key.parse::<Key>().unwrap());
    tokio::task::spawn_blocking(move || {
        admin::decide(store.as_ref(), &key, decision, "ann@ops", note).unwrap();
    })
    .await
    .unwrap();
}

/// The idem error a transactional call returned.
fn idem_error<T: std::fmt::Debug>(answer: Result<T, BoxError>) -> Error {
    *answer.expect_err("an idem error").downcast::<Error>().expect("an idem error")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_needs_approval_awaits_it_then_runs_once_by_both_drivers() {
    let Some(shop) = Shop::open("tx11").await else { return };
    let pool =
        sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&shop.url).await.unwrap();
    let runs = AtomicUsize::new(0);
    let sql =
        format!("INSERT INTO {} (order_id, cents) VALUES ($1, 1250) RETURNING id", shop.refunds());
    let by_tokio = async |order: i64| {
        let call = shop.call(order).approve(true);
        shop.store
            .transactional(call)
            .run(async |tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                let row = tx.query_typed_one(&sql, &[(&order, Type::INT8)]).await?;
                Ok::<i64, BoxError>(row.get(0))
            })
            .await
    };
    let by_sqlx = async |order: i64| {
        let call = shop.call(order).approve(true);
        shop.store
            .transactional(call)
            .run_sqlx(&pool, async |tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                let query = sqlx::query_scalar(&sql).persistent(false);
                Ok::<i64, BoxError>(query.bind(order).fetch_one(&mut *tx).await?)
            })
            .await
    };
    for (order, by_sqlx_too) in [(17, false), (18, true)] {
        let call = async || if by_sqlx_too { by_sqlx(order).await } else { by_tokio(order).await };
        let key = shop.call(order).key().to_string();
        let before = runs.load(Ordering::SeqCst);
        for _ in 0..2 {
            match idem_error(call().await) {
                Error::AwaitingApproval { key: asked, .. } => assert_eq!(asked, key),
                other => panic!("expected AwaitingApproval, got {other:?}"),
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), before, "nothing of the body ran");
        assert_eq!(shop.count(&format!("refunds WHERE order_id = {order}")).await, 0);
        let record = shop.record(&shop.call(order)).await.expect("the request is recorded");
        assert_eq!(record.status, Status::AwaitingApproval);

        decide(&shop.store, &key, Decision::Approve, Some("ok")).await;
        let first = call().await.expect("the approved call runs");
        assert_eq!(call().await.expect("the retry is answered"), first, "replayed");
        assert_eq!(runs.load(Ordering::SeqCst), before + 1, "the body ran once");
        assert_eq!(shop.count(&format!("refunds WHERE order_id = {order}")).await, 1);
        let events: Vec<Event> =
            shop.store.history(&key).await.unwrap().iter().map(|entry| entry.event).collect();
        assert_eq!(
            events,
            [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done]
        );
    }

    // Denied: every call is refused with the note, and nothing is written.
    let key = shop.call(19).key().to_string();
    assert!(matches!(idem_error(by_tokio(19).await), Error::AwaitingApproval { .. }));
    decide(&shop.store, &key, Decision::Deny, Some("over the limit")).await;
    let before = runs.load(Ordering::SeqCst);
    for denied in [idem_error(by_tokio(19).await), idem_error(by_sqlx(19).await)] {
        match denied {
            Error::Denied { by, note, .. } => {
                assert_eq!((by.as_str(), note.as_deref()), ("ann@ops", Some("over the limit")));
            }
            other => panic!("expected Denied, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), before, "a denied key runs nothing");
    assert_eq!(shop.count("refunds WHERE order_id = 19").await, 0);
}

/// A call cancelled wherever it is (before its transaction begins, in its claim, its body, its
/// result's write or its commit): its write and its record commit together or not at all, and
/// the next call replays what committed or runs the body once more.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_cancelled_at_any_point_commits_all_or_nothing() {
    let Some(shop) = Shop::open("tx12").await else { return };
    let shop = Arc::new(shop);
    let (mut committed, mut rolled_back) = (0, 0);
    for order in 0..60_i64 {
        let runs = Arc::new(AtomicUsize::new(0));
        let (task_shop, task_runs) = (Arc::clone(&shop), Arc::clone(&runs));
        // From before the first statement to after the commit, in steps of 50 µs.
        let cancel_after = Duration::from_micros(50 * order as u64);
        let mut task = tokio::spawn(async move { task_shop.refund(order, &task_runs).await.ok() });
        let outcome = match tokio::time::timeout(cancel_after, &mut task).await {
            Ok(joined) => joined.unwrap(),
            Err(_) => {
                task.abort();
                // Cancelled at an await, or finished just before the abort took effect.
                task.await.ok().flatten()
            }
        };
        // A cancelled task's transaction is rolled back as its connection is dropped; the next
        // call of the key waits for that, then finds what committed.
        let again = AtomicUsize::new(0);
        let id = shop.refund(order, &again).await.expect("the next call succeeds");
        let record = shop.record(&shop.call(order)).await.expect("a record");
        assert_eq!((record.status, record.result), (Status::Done, Some(id.to_string())));
        let rows = {
            let sql = format!("SELECT count(*) FROM {} WHERE order_id = {order}", shop.refunds());
            shop.client().await.query_typed(&sql, &[]).await.unwrap()[0].get::<_, i64>(0)
        };
        assert_eq!(rows, 1, "order {order}: one write committed, with the record");
        if let Some(first) = outcome {
            assert_eq!(first, id, "order {order}: the first call's result is the one recorded");
        }
        match again.load(Ordering::SeqCst) {
            0 => committed += 1,
            1 => rolled_back += 1,
            n => panic!("order {order}: the next call ran the body {n} times"),
        }
    }
    eprintln!("cancelled calls: {committed} committed, {rolled_back} rolled back");
    assert!(rolled_back > 0, "some calls were cancelled before their commit");
}

/// A body that ends idem's transaction itself (`COMMIT` or `ROLLBACK`, alone or followed by a
/// `BEGIN`), writes again, then returns `Ok`: the call fails, naming the key, and the key is left
/// in doubt, since what the body wrote may have been kept (a row before a `COMMIT` is, and a row
/// written with no transaction open commits at once); idem records no result behind its back,
/// and what the body wrote in a transaction it began itself is rolled back with the check that
/// caught it. Both drivers.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_ends_the_transaction_itself_leaves_the_key_in_doubt() {
    let Some(shop) = Shop::open("txe").await else { return };
    let pool = sqlx::PgPool::connect(&shop.url).await.unwrap();
    let refunds = shop.refunds();
    // Each own end, and the cents of the rows kept: 1 before it, 2 after.
    let cases: [(&str, &[i64]); 4] = [
        ("COMMIT", &[1, 2]),
        ("COMMIT; BEGIN", &[1]),
        ("ROLLBACK", &[2]),
        ("ROLLBACK; BEGIN", &[]),
    ];
    for (n, (own_end, kept)) in cases.into_iter().enumerate() {
        for sqlx in [false, true] {
            let order = 100 + 10 * n as i64 + i64::from(sqlx);
            let insert = format!("INSERT INTO {refunds} (order_id, cents) VALUES ({order}, 1)");
            let after = format!("INSERT INTO {refunds} (order_id, cents) VALUES ({order}, 2)");
            let ended: Result<i64, BoxError> = if sqlx {
                let statements = [insert.clone(), own_end.to_owned(), after.clone()];
                shop.store
                    .transactional(shop.call(order))
                    .run_sqlx(&pool, async |conn| {
                        for sql in &statements {
                            let _ = sqlx::raw_sql(sql).execute(&mut *conn).await;
                        }
                        Ok::<i64, BoxError>(order)
                    })
                    .await
            } else {
                shop.store
                    .transactional(shop.call(order))
                    .run(async |tx| {
                        for sql in [&insert, own_end, &after] {
                            let _ = tx.batch_execute(sql).await;
                        }
                        Ok::<i64, BoxError>(order)
                    })
                    .await
            };
            let error = ended.expect_err(&format!("{own_end}: the call is refused"));
            let message = error.to_string();
            let key = shop.call(order).key().to_string();
            assert!(message.contains("ended the transaction itself"), "{own_end}: {message}");
            assert!(message.contains(&key), "{own_end}: names the key: {message}");
            let record = shop.record(&shop.call(order)).await;
            let status = record.map(|record| record.status);
            assert_eq!(status, Some(Status::InDoubt), "{own_end} (sqlx: {sqlx}): left in doubt");
            let rows = format!("SELECT cents FROM {refunds} WHERE order_id = {order} ORDER BY id");
            let cents: Vec<i64> = shop
                .client()
                .await
                .query_typed(&rows, &[])
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            assert_eq!(cents, kept, "{own_end} (sqlx: {sqlx}): the rows kept");
            // The next call of the key is refused, not run again.
            let runs = AtomicUsize::new(0);
            let again = shop.refund(order, &runs).await;
            assert_eq!(runs.load(Ordering::SeqCst), 0, "{own_end}: the body does not run again");
            assert!(again.unwrap_err().to_string().contains(&key));
        }
    }
}
