//! Associated functions (no `self`, no `Self`) under each attribute in an inherent `impl`, of
//! a plain and a generic type: they compile, and are classified through the type.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Server;

impl Server {
    #[idem::read]
    pub fn ping(x: u32) -> Result<u32, PayError> {
        Ok(x)
    }

    #[idem::write]
    fn reset(x: u32) -> Result<(), PayError> {
        let _ = x;
        Ok(())
    }

    #[idem::idempotent(scope = "order_id")]
    pub(crate) fn charge(amount: u64, order_id: &str) -> Result<u64, PayError> {
        let _ = order_id;
        Ok(amount)
    }

    #[idem::idempotent(scope = "order_id")]
    pub async fn charge_async(amount: u64, order_id: String) -> Result<u64, PayError> {
        let _ = order_id;
        Ok(amount)
    }

    fn calls() -> Result<(), PayError> {
        Self::reset(1)?;
        let _ = idem::retry!(Server::ping(1))?;
        Ok(())
    }
}

pub struct Typed<T>(pub T);

impl<T> Typed<T> {
    #[idem::read]
    pub fn lookup(id: u32) -> Result<u32, PayError> {
        Ok(id)
    }
}

async fn callers() -> Result<(), PayError> {
    let _ = idem::retry!(Server::ping(1))?;
    let _ = idem::retry!(Server::charge(1, "o-1"))?;
    let _ = idem::retry!(Server::charge_async(1, "o-1".to_owned()).await)?;
    Server::calls()?;
    Typed::<u8>::lookup(1)?;
    Ok(())
}

fn main() {
    let _ = callers();
    const PING: idem::ToolInfo = idem::tool_info!(Server::ping);
    const RESET: idem::ToolInfo = idem::tool_info!(Server::reset);
    let _ = (PING, RESET);
}
