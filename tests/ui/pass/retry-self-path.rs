//! `retry!` and `tool_info!` reach a tool through `Self` inside its `impl`: an associated
//! function the attribute classifies itself, and methods that `#[idem::tools]` classifies, also
//! through a trait's qualified path.
#[derive(Debug, PartialEq)]
pub struct PayError;

pub struct Server;

impl Server {
    #[idem::read]
    pub fn ping(x: u32) -> Result<u32, PayError> {
        Ok(x)
    }

    pub fn ping_hard() -> Result<u32, PayError> {
        idem::retry!(Self::ping(1))
    }
}

pub trait Probe {
    fn probe(&self) -> Result<u32, PayError>;
    fn probe_hard(&self) -> Result<u32, PayError>;
}

pub struct Bank {
    pub balance: u32,
}

#[idem::tools]
impl Bank {
    #[idem::read]
    pub fn balance(&self) -> Result<u32, PayError> {
        Ok(self.balance)
    }

    pub fn balance_hard(&self) -> Result<u32, PayError> {
        assert_eq!(idem::tool_info!(Self::balance).kind, idem::Kind::Read);
        idem::retry!(Self::balance(self))
    }
}

/// A second type: one `#[idem::tools]` block per type lists its tools.
pub struct Teller {
    pub balance: u32,
}

#[idem::tools]
impl Probe for Teller {
    #[idem::read(tool = "probe_bank")]
    fn probe(&self) -> Result<u32, PayError> {
        Ok(self.balance + 1)
    }

    fn probe_hard(&self) -> Result<u32, PayError> {
        assert_eq!(idem::tool_info!(<Self as Probe>::probe).name, "probe_bank");
        idem::retry!(<Self as Probe>::probe(self))
    }
}

fn main() {
    assert_eq!(Server::ping_hard(), Ok(1));
    let bank = Bank { balance: 7 };
    assert_eq!(bank.balance_hard(), Ok(7));
    assert_eq!(Teller { balance: 7 }.probe_hard(), Ok(8));
}
