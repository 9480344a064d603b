// An async transactional tool names its store, and has the parameter `transactional` names.

fn main() {}

#[idem::idempotent(scope = "order_id", transactional = "tx")]
async fn no_store(
    order_id: i64,
    tx: &mut tokio_postgres::Transaction<'_>,
) -> Result<u64, String> {
    let _ = tx;
    Ok(order_id as u64)
}

fn shop() -> std::sync::Arc<idem_postgres::PgStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "txn", store = shop)]
async fn no_such_parameter(order_id: i64) -> Result<u64, String> {
    Ok(order_id as u64)
}
