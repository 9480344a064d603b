//! The runtime of [idem](https://docs.rs/idem): intent keys, canonical JSON, the [`Store`]
//! interface with its sled implementation, and the engine that generated code calls.
//!
//! Users depend on the `idem` facade; this crate is its engine room.

#![warn(missing_docs)]

pub mod admin;
#[doc(hidden)]
pub mod bounds;
mod canonical;
mod classify;
#[cfg(feature = "conformance")]
#[doc(hidden)]
pub mod conformance;
mod default;
mod engine;
mod error;
mod exec;
mod failpoint;
pub mod history;
mod key;
mod loom;
#[cfg(feature = "rmcp")]
pub mod mcp;
mod meter;
mod protocol;
mod record;
#[cfg(unix)]
pub mod remote;
mod retry;
mod store;
mod time;

pub use canonical::canonical_json;
pub use classify::{Annotations, Kind, ToolInfo};
pub use default::{default_store, default_store_path, set_default_store};
pub use engine::{
    current_key, may_have_landed, try_current_key, Args, Call, InDoubtPolicy, Reconciled, Sweep,
    SweepOutcome, SweepReport, Swept,
};
pub use error::{Error, StoreError};
pub use key::Key;
pub use protocol::{assess, Assessment, Fence, Owner, Status};
pub use record::{now_ms, Record};
pub use retry::Backoff;
pub use store::sled::{SledStore, SledStoreBuilder};
pub use store::{Durability, Reserved, Store, StoreFuture, DEFAULT_WAIT};
pub use time::utc_timestamp;

/// What the store crates of this workspace (idem-postgres) need from the runtime beyond the
/// [`Store`] interface. Not a public API: it may change in any release.
#[doc(hidden)]
pub mod for_stores {
    pub use crate::exec::block_on;
    pub use crate::time::deadline_after;
}
