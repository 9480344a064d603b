//! The runtime of [idem](https://docs.rs/idem-agent): intent keys, canonical JSON, the [`Store`]
//! interface with its stores (sled; SQLite, feature `sqlite`; [`MemoryStore`], the reference in
//! memory), and the engine that generated code calls.
//!
//! Users depend on the facade (the package `idem-agent`, whose library is `idem`); this crate
//! is its engine room. How it is laid out (which module owns which rule, and which way calls
//! go) is the "Architecture" section of DESIGN.md:
//!
//! - `lifecycle/`: what a record means and every rule that changes it (status, owner, fence,
//!   lease, transitions, assessment);
//! - `store/`: the storage interface a backend implements, the default store, store names, and
//!   the backends: the reference store in memory ([`MemoryStore`]), sled and SQLite;
//! - `engine/`: one run path for every call, over the lifecycle and a store;
//! - `admin.rs` and `remote/`: the operator interface, locally and over the admin socket;
//! - `for_macros.rs`: the contract with generated code.

#![warn(missing_docs)]
// docs.rs (`--cfg docsrs`, nightly) marks each item that a feature gates with that feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The crate's own name, so that the docs `store_options!` writes link by one path
// (`idem_runtime::…`) in this crate's builders and in another crate's.
extern crate self as idem_runtime;

pub mod admin;
mod canonical;
mod classify;
#[cfg(feature = "conformance")]
#[doc(hidden)]
pub mod conformance;
mod engine;
mod error;
mod exec;
mod failpoint;
#[doc(hidden)]
pub mod for_macros;
pub mod history;
mod key;
mod lifecycle;
mod loom;
#[cfg(feature = "rmcp")]
pub mod mcp;
mod meter;
#[cfg(unix)]
pub mod remote;
mod retry;
/// Retention: a store's background removal of finished records and released keys' histories
/// past a bound (see [`Retention`]).
pub mod retention {
    pub use crate::engine::retention::{Retainer, RetainerView, RetentionPass};
    pub use crate::lifecycle::retention::{
        PassReport, Removed, Retention, RetentionStatus, RETAIN_ENV,
    };
}
pub mod store;
mod time;

pub use canonical::canonical_json;
pub use classify::{Annotations, Kind, ToolInfo};
#[cfg(feature = "sqlite")]
pub use engine::transact_sqlite::SqliteTransactional;
pub use engine::{
    current_key, fencing_token, may_have_landed, try_current_key, try_fencing_token, Args, Call,
    InDoubtPolicy, Reconciled, Sweep, SweepOutcome, SweepReport, Swept, DEFAULT_WAIT,
};
pub use lifecycle::retention::Retention;
// What a store crate's transactional API runs a call with (idem-postgres's): not for users.
pub use engine::open::default::{
    default_store, open_default_store, set_default_store, set_default_store_named,
};
pub use engine::open::open_store;
#[doc(hidden)]
pub use engine::{Attempt, Codec, Retries, Site};
pub use error::{Error, StoreError};
pub use key::Key;
pub use lifecycle::{Record, Resolution, Status};
pub use retry::Backoff;
/// The rusqlite this crate is built with: a transactional call's body gets its
/// `rusqlite::Transaction` ([`SqliteStore::transactional`]).
#[cfg(feature = "sqlite")]
pub use rusqlite;
pub use store::default::{default_store_name, default_store_path};
pub use store::memory::MemoryStore;
pub use store::name::StoreName;
pub use store::sled::{SledStore, SledStoreBuilder};
#[cfg(feature = "sqlite")]
pub use store::sqlite::{SqliteStore, SqliteStoreBuilder};
pub use store::{Durability, Store, StoreFuture};
pub use time::utc_timestamp;

/// What the model checker of the lifecycle (`idem-runtime/tests/lifecycle_model.rs`) calls: the
/// engine's decision table and the lifecycle's own rules, by name, so that the model explores
/// the code rather than a copy of it. Not a public API: it may change in any release.
#[doc(hidden)]
pub mod for_model {
    pub use crate::engine::Next;
    pub use crate::lifecycle::retention::outlived;
    pub use crate::lifecycle::{admits, assess, transition, Assessment};

    /// Lease terms of `length` milliseconds, renewed every millisecond: the model's clock
    /// ticks in single milliseconds, so its leases are shorter than the 100 ms `Lease::new`
    /// asks of a store.
    pub fn lease(length: u64) -> crate::lifecycle::lease::Lease {
        let every = std::time::Duration::from_millis(1);
        crate::lifecycle::lease::Lease {
            length: std::time::Duration::from_millis(length),
            renew_every: every,
        }
    }

    /// What `call` does about `found` (`None`: absent) at `now` on the store's clock, seen from
    /// the store instance `instance`, with a reconciler to ask or not: the engine's decision
    /// table (`CallParts::next`) itself.
    pub fn next(
        call: &crate::engine::Call,
        found: Option<&crate::lifecycle::Record>,
        now: u64,
        instance: &str,
        reconciler: bool,
    ) -> Result<Next, crate::error::Error> {
        call.parts().next(found, now, instance, reconciler)
    }
}

// What idem-postgres and the tests need beyond the `Store` interface: not a public API.
#[doc(hidden)]
pub use engine::waiting;
pub use exec::block_on;
#[doc(hidden)]
pub use time::deadline_after;
