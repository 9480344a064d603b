//! `#[idem::idempotent(…, transactional = "tx")]`: a tool whose writes go through the
//! transaction idem lends it, on a real SQLite store's file. Its rows and its one record
//! commit together, a retry replays, an error or a commit of the body's own keeps nothing, and
//! inside `#[idem::tools]` the transaction parameter is not one a caller passes. Needs the
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
    use std::sync::{Arc, LazyLock};

    use idem::{rusqlite, SqliteStore, Store};

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
