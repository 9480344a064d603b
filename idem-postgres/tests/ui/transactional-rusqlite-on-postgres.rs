// An async tool on a PostgreSQL store taking another driver's transaction (rusqlite's).

fn main() {}

fn shop() -> std::sync::Arc<idem_postgres::PgStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
async fn refund(order_id: i64, tx: &idem::rusqlite::Transaction<'_>) -> Result<u64, String> {
    let _ = tx;
    Ok(order_id as u64)
}
