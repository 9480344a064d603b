//! `#[idem::idempotent(…, transactional = "tx")]`: a tool whose writes go through the
//! transaction idem lends it, on a real SQLite store's file. Its rows and its one record
//! commit together, a retry replays, an error or a commit of the body's own keeps nothing,
//! inside `#[idem::tools]` the transaction parameter is not one a caller passes, and a tool
//! that needs a person's approval waits for it, runs once approved, and is refused if denied. Needs the
//! `sqlite` feature (`cargo test --workspace --features idem/rmcp,idem/sqlite`, as `.ci/run`
//! does).

#[cfg(not(feature = "sqlite"))]
#[test]
fn transactional_tools_need_the_sqlite_feature() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/transactional_tools.rs with `--features idem/sqlite`"
    );
    eprintln!(
        "NOTICE: tests/transactional_tools.rs did not run: it needs the `sqlite` feature; run \
         `cargo test --workspace --features idem/rmcp,idem/sqlite`"
    );
}

#[cfg(feature = "sqlite")]
mod on_sqlite {
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, LazyLock, Mutex};
    use std::time::{Duration, Instant};

    use idem::admin::{self, Decision};
    use idem::history::Event;
    use idem::{rusqlite, Error, Key, SqliteStore, Status, Store};

    /// One store for the file's tests (each uses its own orders), its file holding the shop's table.
    static SHOP: LazyLock<Arc<SqliteStore>> = LazyLock::new(|| {
        let dir = tempfile::tempdir().expect("a temp dir").keep();
        let store = SqliteStore::open(dir.join("shop.sqlite")).expect("the store opens");
        let conn = rusqlite::Connection::open(store.path()).expect("the file opens");
        conn.execute_batch("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id, cents)")
            .expect("the table is made");
        Arc::new(store)
    });

    fn shop() -> Arc<SqliteStore> {
        Arc::clone(&SHOP)
    }

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    /// Refunds an order: one row in the store's own file, written through idem's transaction.
    #[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
    fn refund(tx: &rusqlite::Transaction<'_>, order_id: u64, cents: i64) -> Result<i64, String> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, ?2)", (order_id, cents))
            .map_err(|e| e.to_string())?;
        if cents < 0 {
            return Err(format!("a refund of {cents} cents is refused"));
        }
        Ok(tx.last_insert_rowid())
    }

    /// A careless body that commits idem's transaction itself before it writes.
    #[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
    fn refund_and_commit(tx: &rusqlite::Transaction<'_>, order_id: u64) -> Result<i64, String> {
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1)", [order_id])
            .map_err(|e| e.to_string())?;
        let _ = tx.execute_batch("COMMIT; BEGIN");
        Ok(tx.last_insert_rowid())
    }

    fn rows(path: &Path, order_id: u64) -> i64 {
        let conn = rusqlite::Connection::open(path).expect("the file opens");
        conn.query_row("SELECT count(*) FROM refunds WHERE order_id = ?1", [order_id], |row| {
            row.get(0)
        })
        .expect("the count reads")
    }

    /// The records of the store whose tool is `tool` and scope `scope`.
    fn records(store: &SqliteStore, tool: &str, scope: &str) -> usize {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let scanned = runtime.block_on(store.scan_page(None, usize::MAX)).expect("the store scans");
        scanned
            .into_records()
            .filter_map(Result::ok)
            .filter(|record| record.tool == tool && record.scope == scope)
            .count()
    }

    #[test]
    fn the_rows_and_one_record_commit_together_and_a_retry_replays() {
        let before = RUNS.load(Ordering::SeqCst);
        let first = refund(17, 1250).expect("the refund is made");
        let again = refund(17, 1250).expect("the retry is answered");
        assert_eq!(again, first, "the retry gets the first refund's row id");
        assert_eq!(rows(SHOP.path(), 17), 1, "one row");
        assert_eq!(records(&SHOP, "refund", "17"), 1, "one record per intent");
        assert!(RUNS.load(Ordering::SeqCst) > before, "the body ran");
    }

    #[test]
    fn an_error_keeps_no_row_and_leaves_the_key_free() {
        let refused = refund(18, -5).expect_err("a negative refund fails");
        assert!(refused.contains("refused"), "the body's own error: {refused}");
        assert_eq!(rows(SHOP.path(), 18), 0, "the row went with the rollback");
        assert_eq!(records(&SHOP, "refund", "18"), 0, "and the record with it: the key is free");
    }

    #[test]
    fn a_body_that_commits_by_itself_keeps_nothing_and_says_so() {
        let refused = refund_and_commit(19).expect_err("the call is refused");
        assert!(refused.contains("ended the transaction itself"), "{refused}");
        assert_eq!(rows(SHOP.path(), 19), 0, "nothing the body wrote was kept");
        assert_eq!(records(&SHOP, "refund_and_commit", "19"), 0, "the key is free");
    }

    static UNRECORDABLE_RUNS: AtomicUsize = AtomicUsize::new(0);

    /// A refund made by hand with `SqliteStore::transactional`, whose body runs on a thread of
    /// its own, and whose result cannot be recorded (JSON writes NaN as `null`, which does not
    /// read back as a number): idem refuses it, and no attempt can do better. Its one write is
    /// keyed, so calling it again is safe: classified as a read for `retry!`.
    #[idem::read]
    async fn refund_unrecordable(order_id: u64) -> Result<f64, Error> {
        let call = idem::Call::new("refund_unrecordable", order_id, &order_id)?;
        SHOP.transactional(call)
            .run(|_tx: &rusqlite::Transaction<'_>| {
                UNRECORDABLE_RUNS.fetch_add(1, Ordering::SeqCst);
                Ok(f64::NAN)
            })
            .await
    }

    #[tokio::test]
    async fn retry_stops_at_an_error_the_engine_raised_on_the_transactions_thread() {
        let quick = idem::Backoff::default().min_delay(Duration::from_millis(1)).without_jitter();
        let outcome = idem::retry!(refund_unrecordable(20).await, backoff = quick);
        assert!(matches!(outcome, Err(Error::Result { .. })), "{outcome:?}");
        assert_eq!(
            UNRECORDABLE_RUNS.load(Ordering::SeqCst),
            1,
            "retry! returned the unrecordable result's error at once, as for a call on its own \
             thread, rather than running the body again"
        );
        let page = SHOP.scan_page(None, usize::MAX).await.expect("the store scans");
        let kept = page.into_records().filter_map(Result::ok);
        assert_eq!(kept.filter(|r| r.tool == "refund_unrecordable").count(), 0, "nothing was kept");
    }

    static NAN_RUNS: AtomicUsize = AtomicUsize::new(0);

    /// A transactional tool on the caller's thread whose result cannot be recorded.
    #[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
    fn refund_nan(tx: &rusqlite::Transaction<'_>, order_id: u64) -> Result<f64, String> {
        NAN_RUNS.fetch_add(1, Ordering::SeqCst);
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1)", [order_id])
            .map_err(|e| e.to_string())?;
        Ok(f64::NAN)
    }

    #[test]
    fn retry_stops_at_an_error_the_engine_raised_inside_a_transactional_attempt() {
        let quick = idem::Backoff::default().min_delay(Duration::from_millis(1)).without_jitter();
        let outcome = idem::retry!(refund_nan(21), backoff = quick);
        let refused = outcome.expect_err("the result cannot be recorded");
        assert!(refused.contains("result"), "{refused}");
        assert_eq!(NAN_RUNS.load(Ordering::SeqCst), 1, "one run: no attempt can record NaN");
        assert_eq!(rows(SHOP.path(), 21), 0, "its row rolled back");
    }

    /// The orders the approved refunds' bodies ran for, one entry per run.
    static APPROVED_RUNS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

    fn approved_runs(order_id: u64) -> usize {
        APPROVED_RUNS.lock().unwrap().iter().filter(|ran| **ran == order_id).count()
    }

    /// Why an approved refund did not happen: idem's answer (awaiting approval, denied), or the
    /// body's own refusal.
    #[derive(Debug)]
    enum NotRefunded {
        Idem(Error),
        Refused(String),
    }

    impl From<Error> for NotRefunded {
        fn from(error: Error) -> Self {
            NotRefunded::Idem(error)
        }
    }

    /// A refund a person approves first, for exactly its order and amount; a negative amount
    /// is refused by the body, after its insert.
    #[idem::idempotent(scope = "order_id", transactional = "tx", store = shop, approve)]
    fn approved_refund(
        tx: &rusqlite::Transaction<'_>,
        order_id: u64,
        cents: i64,
    ) -> Result<i64, NotRefunded> {
        APPROVED_RUNS.lock().unwrap().push(order_id);
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, ?2)", (order_id, cents))
            .map_err(|e| NotRefunded::Refused(e.to_string()))?;
        if cents < 0 {
            return Err(NotRefunded::Refused(format!("a refund of {cents} cents is refused")));
        }
        Ok(tx.last_insert_rowid())
    }

    /// The same refund, whose call waits for the person's decision.
    #[idem::idempotent(
        scope = "order_id",
        transactional = "tx",
        store = shop,
        approve,
        approve_wait = "60s"
    )]
    fn patient_refund(tx: &rusqlite::Transaction<'_>, order_id: u64) -> Result<i64, Error> {
        APPROVED_RUNS.lock().unwrap().push(order_id);
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1)", [order_id])
            .expect("the refund is written");
        Ok(tx.last_insert_rowid())
    }

    /// The key an approved refund awaits approval under.
    fn awaiting(answer: Result<i64, NotRefunded>) -> Key {
        match answer {
            Err(NotRefunded::Idem(Error::AwaitingApproval { key, .. })) => {
                key.parse().expect("a key")
            }
            other => panic!("expected AwaitingApproval, got {other:?}"),
        }
    }

    fn events(key: &Key) -> Vec<Event> {
        let history = admin::history(SHOP.as_ref(), key).expect("the history reads");
        history.into_iter().map(|entry| entry.event).collect()
    }

    #[test]
    fn an_approved_refund_runs_once_in_its_transaction_and_replays() {
        let key = awaiting(approved_refund(30, 5000));
        assert_eq!(awaiting(approved_refund(30, 5000)), key, "every call awaits the person");
        assert_eq!(approved_runs(30), 0, "nothing of the body ran");
        assert_eq!(rows(SHOP.path(), 30), 0, "no row");
        let shown = admin::show(SHOP.as_ref(), &key).expect("idem show finds the key");
        assert_eq!(shown.status, Status::AwaitingApproval);

        admin::decide(SHOP.as_ref(), &key, Decision::Approve, "ann@ops", Some("ok"))
            .expect("the approval is recorded");
        let first = approved_refund(30, 5000).expect("the approved refund is made");
        assert_eq!(approved_refund(30, 5000).expect("the retry is answered"), first, "replayed");
        assert_eq!(approved_runs(30), 1, "the body ran once");
        assert_eq!(rows(SHOP.path(), 30), 1, "one row");
        assert_eq!(admin::show(SHOP.as_ref(), &key).unwrap().status, Status::Done);
        assert_eq!(
            events(&key),
            [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done],
            "the approval, then the run that committed with the row"
        );

        // Another amount is another key: the approval does not cover it.
        let changed = awaiting(approved_refund(30, 6000));
        assert_ne!(changed, key);
        assert_eq!((approved_runs(30), rows(SHOP.path(), 30)), (1, 1));
    }

    #[test]
    fn a_denied_refund_is_refused_with_the_note_and_writes_nothing() {
        let key = awaiting(approved_refund(31, 5000));
        admin::decide(SHOP.as_ref(), &key, Decision::Deny, "ann@ops", Some("over the limit"))
            .expect("the denial is recorded");
        for _ in 0..2 {
            match approved_refund(31, 5000) {
                Err(NotRefunded::Idem(Error::Denied { key: denied, by, note, .. })) => {
                    assert_eq!(denied, key.to_string());
                    assert_eq!((by.as_str(), note.as_deref()), ("ann@ops", Some("over the limit")));
                }
                other => panic!("expected Denied, got {other:?}"),
            }
        }
        assert_eq!(approved_runs(31), 0, "nothing of the body ran");
        assert_eq!(rows(SHOP.path(), 31), 0, "no row");
    }

    #[test]
    fn an_approved_run_that_fails_keeps_no_row_and_the_next_call_asks_again() {
        let key = awaiting(approved_refund(32, -5));
        admin::decide(SHOP.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
        match approved_refund(32, -5) {
            Err(NotRefunded::Refused(reason)) => assert!(reason.contains("refused"), "{reason}"),
            other => panic!("expected the body's own error, got {other:?}"),
        }
        assert_eq!(rows(SHOP.path(), 32), 0, "the row went with the rollback");
        assert_eq!(approved_runs(32), 1);
        // As a plain tool's failed run, it used the approval: the next call asks again.
        assert_eq!(awaiting(approved_refund(32, -5)), key);
        assert_eq!(approved_runs(32), 1, "and runs nothing");
        assert_eq!(
            events(&key),
            [Event::ApprovalRequested, Event::Approved, Event::Released, Event::ApprovalRequested]
        );
    }

    #[test]
    fn a_call_waiting_for_the_decision_runs_once_it_is_approved() {
        // The scope's parameter is the scope, not an argument: no other argument is left.
        let key = Key::derive("patient_refund", "33", &serde_json::json!({})).expect("a key");
        let waiter = std::thread::spawn(|| patient_refund(33));
        let deadline = Instant::now() + Duration::from_secs(30);
        while idem_runtime::waiting(key.as_str()) == 0 {
            if waiter.is_finished() {
                panic!("the call did not wait: {:?}", waiter.join());
            }
            assert!(Instant::now() < deadline, "the call never waited for the decision");
            std::thread::yield_now();
        }
        assert_eq!(approved_runs(33), 0, "nothing ran before the decision");
        admin::decide(SHOP.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
        let id = waiter.join().unwrap().expect("the waiting call ran once approved");
        assert_eq!(patient_refund(33).unwrap(), id, "replayed");
        assert_eq!((approved_runs(33), rows(SHOP.path(), 33)), (1, 1));
    }

    /// A help desk's tools in an `#[idem::tools]` block: the transaction parameter is taken out of
    /// the method's signature, so the method is called with its arguments only.
    struct Desk;

    #[idem::tools]
    impl Desk {
        #[idem::idempotent(scope = "request_id", transactional = "tx", store = shop)]
        fn open_ticket(
            &self,
            tx: &rusqlite::Transaction<'_>,
            request_id: String,
            cents: i64,
        ) -> Result<i64, String> {
            tx.execute(
                "INSERT INTO refunds (order_id, cents) VALUES (?1, ?2)",
                (&request_id, cents),
            )
            .map_err(|e| e.to_string())?;
            Ok(tx.last_insert_rowid())
        }
    }

    #[test]
    fn a_method_in_a_tools_block_is_called_without_the_transaction() {
        let desk = Desk;
        let first = desk.open_ticket("req-1".to_owned(), 7).expect("the ticket opens");
        assert_eq!(desk.open_ticket("req-1".to_owned(), 7), Ok(first), "replayed");
        assert_eq!(records(&SHOP, "open_ticket", "req-1"), 1);
        let listed = Desk::idem_tools();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "open_ticket");
        assert!(listed[0].annotations().idempotent_hint, "classified idempotent for MCP");
    }
}
