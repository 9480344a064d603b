//! Sync and async free functions, generics, `#[idem(skip)]`, a field-path scope, every option,
//! docs and attributes kept, and `retry!` over both.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[derive(serde::Serialize)]
pub struct ChargeRequest {
    pub order_id: String,
    pub amount: u64,
}

pub struct Client;

/// Charges a card; these docs stay on the function.
#[idem::idempotent(scope = "order_id", tool = "charge", wait = "500ms", ttl = "7d", in_doubt = "rerun")]
#[inline]
pub fn charge_card(amount: u64, customer: &str, order_id: &str) -> Result<String, PayError> {
    let _ = (amount, customer, order_id);
    Ok(idem::current_key().to_string())
}

#[idem::idempotent(scope = "req.order_id", wait = "30s", ttl = "24h")]
pub async fn charge(#[idem(skip)] client: &Client, req: ChargeRequest) -> Result<u64, PayError> {
    let _ = client;
    if req.amount == 0 {
        return Err(PayError);
    }
    Ok(req.amount)
}

#[idem::idempotent(scope = "scope", ttl = "5m")]
pub fn store_value<T, S>(value: T, scope: S) -> Result<Vec<u8>, PayError>
where
    T: serde::Serialize + Clone,
    S: std::fmt::Display,
{
    serde_json::to_vec(&value).map_err(|_| PayError)
}

#[idem::idempotent(scope = "order_id")]
pub async fn charge_generic<A: serde::Serialize + Send + Sync>(amount: A, order_id: u64) -> Result<(), PayError> {
    let _ = (amount, order_id);
    Ok(())
}

#[idem::read]
pub async fn get_balance(customer: &str) -> Result<u64, PayError> {
    Ok(customer.len() as u64)
}

#[idem::read(tool = "balance_v1")]
pub fn get_balance_sync(customer: &str) -> Result<u64, PayError> {
    Ok(customer.len() as u64)
}

#[idem::write]
pub fn send_fax(to: &str, body: &str) -> Result<(), PayError> {
    let _ = (to, body);
    Ok(())
}

pub(crate) mod nested {
    #[idem::read]
    pub(crate) fn lookup(id: u32) -> Result<u32, crate::PayError> {
        Ok(id)
    }
}

async fn callers() -> Result<(), PayError> {
    let _ = idem::retry!(get_balance("cus_1").await)?;
    let _ = idem::retry!(get_balance_sync("cus_1"))?;
    let _ = idem::retry!(self::get_balance_sync("cus_1"))?;
    let _ = idem::retry!(crate::nested::lookup(7))?;
    let _ = idem::retry!(nested::lookup(7), backoff = idem::Backoff::default().max_retries(2))?;
    let _ = idem::retry!(charge_card(1, "cus_1", "o-1"), when = |_: &PayError| true)?;
    let request = || ChargeRequest { order_id: "o-1".to_owned(), amount: 1 };
    let _ = idem::retry!(charge(&Client, request()).await)?;
    let _ = idem::retry!(charge_generic(1u8, 7).await)?;
    let _ = store_value(vec![1, 2], "s")?;
    send_fax("+1", "hi")?;
    Ok(())
}

fn assert_send<F: std::future::Future + Send>(_: F) {}

fn main() {
    assert_send(callers());
    assert_send(charge(&Client, ChargeRequest { order_id: String::new(), amount: 0 }));
    const _: idem::ToolInfo = idem::tool_info!(nested::lookup);
}
