// A plain `fn` is the SQLite store's transactional tool: on a PostgreSQL store, whose driver is
// async, the tool is an `async fn`.

fn main() {}

fn shop() -> std::sync::Arc<idem_postgres::PgStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
fn refund(order_id: i64, tx: &mut tokio_postgres::Transaction<'_>) -> Result<u64, String> {
    let _ = tx;
    Ok(order_id as u64)
}
