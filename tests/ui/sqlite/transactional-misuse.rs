// A transactional tool names the store its tables are in, has the parameter it names, and is a
// plain `fn`: each is a compile error that says what to write.

fn main() {}

#[idem::idempotent(scope = "order_id", transactional = "tx")]
fn no_store(tx: &idem::rusqlite::Transaction<'_>, order_id: u64) -> Result<u64, String> {
    let _ = tx;
    Ok(order_id)
}

fn desk() -> std::sync::Arc<idem::SqliteStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "txn", store = desk)]
fn no_such_parameter(order_id: u64) -> Result<u64, String> {
    Ok(order_id)
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = desk)]
async fn not_sync(tx: &idem::rusqlite::Transaction<'_>, order_id: u64) -> Result<u64, String> {
    let _ = tx;
    Ok(order_id)
}
