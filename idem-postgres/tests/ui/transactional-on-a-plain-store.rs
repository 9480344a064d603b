// An async transactional tool on a store with no database of the tool's (sled's, behind
// `Arc<dyn Store>`): the store named is the error.

fn main() {}

fn plain() -> std::sync::Arc<dyn idem::Store> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = plain)]
async fn refund(
    order_id: i64,
    tx: &mut tokio_postgres::Transaction<'_>,
) -> Result<u64, String> {
    tx.execute("INSERT INTO refunds (order_id) VALUES ($1)", &[&order_id])
        .await
        .map_err(|e| e.to_string())
}
