//! The runtime of [idem](https://docs.rs/idem): intent keys, canonical JSON, the [`Store`]
//! interface with its sled implementation, and the engine that generated code calls.
//!
//! Users depend on the `idem` facade; this crate is its engine room. How it is laid out (which
//! module owns which rule, and which way calls go) is the "Architecture" section of DESIGN.md:
//!
//! - `lifecycle/`: what a record means and every rule that changes it (status, owner, fence,
//!   lease, transitions, assessment);
//! - `store/`: the storage interface a backend implements, the default store, and sled;
//! - `engine/`: one run path for every call, over the lifecycle and a store;
//! - `admin.rs` and `remote/`: the operator interface, locally and over the admin socket;
//! - `for_macros.rs`: the contract with generated code.

#![warn(missing_docs)]

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
    pub use crate::engine::retention::{
        PassReport, Removed, Retainer, RetainerView, Retention, RetentionPass, RetentionStatus,
        RETAIN_ENV,
    };
}
pub mod store;
mod time;

pub use canonical::canonical_json;
pub use classify::{Annotations, Kind, ToolInfo};
pub use engine::retention::Retention;
pub use engine::{
    current_key, fencing_token, may_have_landed, try_current_key, try_fencing_token, Args, Call,
    InDoubtPolicy, Reconciled, Sweep, SweepOutcome, SweepReport, Swept,
};
pub use error::{Error, StoreError};
pub use key::Key;
pub use lifecycle::{Record, Resolution, Status};
pub use retry::Backoff;
pub use store::default::{
    default_store, default_store_path, open_default_store, set_default_store,
};
pub use store::sled::{SledStore, SledStoreBuilder};
pub use store::{Durability, Store, StoreFuture, DEFAULT_WAIT};
pub use time::utc_timestamp;

/// What the store crates of this workspace (idem-postgres) need from the runtime beyond the
/// [`Store`] interface. Not a public API: it may change in any release.
#[doc(hidden)]
pub mod for_stores {
    pub use crate::engine::waiting;
    pub use crate::exec::block_on;
    pub use crate::time::deadline_after;
}
