// One transaction per tool: the one `transactional` names. A second is a key parameter, which
// it cannot be.

fn main() {}

fn shop() -> std::sync::Arc<idem_postgres::PgStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
async fn refund(
    order_id: i64,
    tx: &mut tokio_postgres::Transaction<'_>,
    other: &mut tokio_postgres::Transaction<'_>,
) -> Result<u64, String> {
    let _ = (tx, other);
    Ok(order_id as u64)
}
