//! The PostgreSQL store of [idem](https://docs.rs/idem-agent): one store shared by a fleet of agent
//! workers, in several processes or on several machines.
//!
//! sled, the embedded default, takes an exclusive lock on its directory. [`PgStore`] keeps the
//! records in one PostgreSQL table instead, with the same semantics: a key is reserved by one
//! atomic insert, finished results replay, concurrent callers wait for the owner (woken by
//! `LISTEN/NOTIFY`), an owner's lease is renewed by the engine's heartbeat while its body runs, a crashed
//! owner's record is in doubt for everyone once its lease lapses, and a stale owner's late write
//! is refused.
//!
//! When a tool's effect is a write to this same database, [`PgStore::transactional`] runs its
//! body inside one transaction with the call's record, so that the effect and the record commit
//! together or not at all ([`Transactional`]; the README's "Effects in your own database").
//!
//! ```no_run
//! # fn main() -> Result<(), idem_runtime::Error> {
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let store = idem_postgres::PgStore::builder("postgres://agent@db.internal/agents")
//!     .lease(Duration::from_secs(10))
//!     .pool_size(8)
//!     .connect()?;
//! idem_runtime::set_default_store(Arc::new(store));
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod builder;
mod fault;
mod listen;
mod operations;
mod pages;
mod rows;
mod runtime;
mod schema;
mod setup;
mod sql;
mod store;
mod transaction;

pub use builder::{PgStoreBuilder, DEFAULT_LEASE};
pub use store::PgStore;
#[cfg(feature = "sqlx")]
pub use transaction::SqlxStore;
pub use transaction::{tool_info, TransactionError, Transactional, DEFAULT_ATTEMPTS};
