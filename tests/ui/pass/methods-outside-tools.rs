//! Methods classified in blocks without `#[idem::tools]` that are no rmcp `#[tool]`: their
//! attribute checks that they are not (it cannot see a `#[tool]` that expanded above it), and
//! the check passes in every kind of block: generic, a trait impl, a trait's own default
//! method, an impl on an unsized type, a `const fn`, a raw name, and beside items named like
//! the ones the check declares.
#![deny(warnings)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Vault<T> {
    pub items: Vec<T>,
}

impl<T: Clone + Send + Sync + 'static> Vault<T> {
    #[idem::read]
    pub fn count(&self) -> Result<usize, PayError> {
        Ok(self.items.len())
    }

    #[idem::idempotent(scope = "order_id")]
    pub async fn store(&self, order_id: String) -> Result<usize, PayError> {
        Ok(order_id.len() + self.items.len())
    }

    #[idem::read]
    pub const fn capacity(&self) -> Result<usize, PayError> {
        Ok(8)
    }

    #[idem::read]
    pub fn r#match(&self, r#type: &str) -> Result<usize, PayError> {
        Ok(r#type.len())
    }
}

/// A tool trait such as rig's, implemented without `#[idem::tools]`.
pub trait Tool {
    fn call(&self, order_id: &str) -> Result<u64, PayError>;

    #[idem::write]
    fn describe(&self) -> Result<String, PayError> {
        Ok("a tool".to_owned())
    }
}

pub struct Adder;

impl Tool for Adder {
    #[idem::idempotent(scope = "order_id")]
    fn call(&self, order_id: &str) -> Result<u64, PayError> {
        Ok(order_id.len() as u64)
    }
}

pub trait Named {
    fn name(&self) -> String;
}

impl dyn Named {
    #[idem::read]
    pub fn shout(&self) -> Result<String, PayError> {
        Ok(self.name().to_uppercase())
    }
}

/// Items named like the check's own, which it must neither take nor hide.
pub struct Fallback;
pub struct NoToolAttr;

pub struct Desk;

impl Desk {
    #[idem::read]
    pub fn count(&self, left: u32) -> Result<u32, PayError> {
        let _ = (Fallback, NoToolAttr);
        Ok(left)
    }
}

impl Named for Desk {
    fn name(&self) -> String {
        "desk".to_owned()
    }
}

fn main() {
    let vault = Vault { items: vec![1u8] };
    assert_eq!(vault.count().unwrap(), 1);
    assert_eq!(vault.capacity().unwrap(), 8);
    assert_eq!(vault.r#match("ab").unwrap(), 2);
    let _ = vault.store("o-1".to_owned());
    assert!(Adder.describe().is_ok());
    let named: &dyn Named = &Desk;
    assert_eq!(named.shout().unwrap(), "DESK");
    assert_eq!(Desk.count(3).unwrap(), 3);
}
