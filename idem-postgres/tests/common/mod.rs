//! What the PostgreSQL tests share: the database URL (or a skip), and a schema of their own
//! that is dropped when the test ends.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The database under test, or `None` (with a notice) when `DATABASE_URL` is not set.
pub fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipped: DATABASE_URL is not set, so the PostgreSQL store tests do not run");
            None
        }
    }
}

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A schema name no other test or run uses.
pub fn unique_schema(prefix: &str) -> String {
    format!(
        "t_{prefix}_{}_{}_{}",
        std::process::id(),
        idem_runtime::now_ms() % 1_000_000_000,
        NONCE.fetch_add(1, Ordering::Relaxed)
    )
}

/// Drops its schema (and so the test's records) when it goes.
pub struct DropSchema {
    pub url: String,
    pub schema: String,
}

impl Drop for DropSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        let _ = run_sql(&self.url, &sql);
    }
}

/// Runs `sql` on a connection of its own (from a plain thread).
pub fn run_sql(url: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let outcome = client.batch_execute(sql).await;
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(5), driver).await;
        outcome
    })
}
