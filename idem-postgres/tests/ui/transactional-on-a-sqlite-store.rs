// An async tool taking a tokio-postgres transaction, on a store that lends none (SQLite's):
// the store named is the error, in our words.

fn main() {}

fn desk() -> std::sync::Arc<idem::SqliteStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = desk)]
async fn refund(
    order_id: i64,
    tx: &mut tokio_postgres::Transaction<'_>,
) -> Result<u64, String> {
    tx.execute("INSERT INTO refunds (order_id) VALUES ($1)", &[&order_id])
        .await
        .map_err(|e| e.to_string())
}
