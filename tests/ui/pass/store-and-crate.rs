//! `store = …` naming a function (returning an `Arc` or a `Result`) or a `LazyLock` static,
//! and `crate = …` for a renamed facade.
extern crate idem as renamed;

use std::sync::{Arc, LazyLock};

use renamed::{SledStore, Store};
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

static STORE: LazyLock<Arc<dyn Store>> =
    LazyLock::new(|| Arc::new(SledStore::open("unused-in-this-test").unwrap()));

fn store() -> Arc<dyn Store> {
    Arc::clone(&STORE)
}

fn fallible_store() -> Result<Arc<dyn Store>, renamed::Error> {
    Ok(Arc::new(SledStore::open("unused-in-this-test")?))
}

fn concrete_store() -> Arc<SledStore> {
    Arc::new(SledStore::open("unused-in-this-test").unwrap())
}

#[renamed::idempotent(scope = "order_id", store = STORE, crate = "renamed")]
pub fn from_static(order_id: &str) -> Result<(), PayError> {
    let _ = order_id;
    Ok(())
}

#[renamed::idempotent(scope = "order_id", store = store, crate = "renamed")]
pub fn from_fn(order_id: &str) -> Result<(), PayError> {
    let _ = order_id;
    Ok(())
}

#[renamed::idempotent(scope = "order_id", store = fallible_store)]
pub fn from_fallible_fn(order_id: &str) -> Result<(), PayError> {
    let _ = order_id;
    Ok(())
}

#[renamed::idempotent(scope = "order_id", store = concrete_store)]
pub fn from_concrete_fn(order_id: &str) -> Result<(), PayError> {
    let _ = order_id;
    Ok(())
}

#[renamed::read(crate = "renamed")]
pub fn read_it(id: u32) -> Result<u32, PayError> {
    Ok(id)
}

fn main() {
    let _ = renamed::retry!(read_it(1), crate = "renamed");
    const _: renamed::ToolInfo = renamed::tool_info!(read_it);
    imported::calls();
}

/// The facade imported under another name in a module, rather than as an extern crate.
mod imported {
    use idem as facade;

    #[facade::read(crate = "facade")]
    pub fn look(id: u32) -> Result<u32, crate::PayError> {
        Ok(id)
    }

    pub fn calls() {
        let _ = facade::retry!(look(1), crate = "facade");
        let _ = facade::retry!(self::look(1), crate = "facade");
    }
}
