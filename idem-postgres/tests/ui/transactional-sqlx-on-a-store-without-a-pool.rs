// An async transactional tool whose body takes sqlx's connection, on a `PgStore` alone: a
// sqlx transaction is begun on the application's pool, which the store must carry
// (`SqlxStore`), so the store named is the error.

fn main() {}

fn shop() -> std::sync::Arc<idem_postgres::PgStore> {
    unimplemented!()
}

#[idem::idempotent(scope = "order_id", transactional = "tx", store = shop)]
async fn refund(order_id: i64, tx: &mut sqlx::PgConnection) -> Result<i64, String> {
    sqlx::query_scalar("INSERT INTO refunds (order_id) VALUES ($1) RETURNING id")
        .bind(order_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())
}
