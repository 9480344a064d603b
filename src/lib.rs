//! # idem: tool calls that are safe to retry
//!
//! An agent retries its tools twice over: the orchestration loop on errors, and the model when
//! it reads a timeout. A write that cannot tell it already ran then runs twice. `idem` gives every
//! intended effect a stable key derived from the intent (tool, arguments, scope), reserves it
//! atomically in a durable store, runs the effect once, records the result and replays it to
//! every later attempt. Where a crash leaves it unknown whether an effect landed, the key is
//! reported in doubt instead of guessed.

pub use idem_macros::{idempotent, read, retry, write};
pub use idem_runtime::{
    admin, canonical_json, current_key, default_store, default_store_path, fingerprint,
    set_default_store, try_current_key, Annotations, Args, Backoff, Call, Classified, Durability,
    Error, InDoubtPolicy, Key, Kind, Record, RetrySafe, SledStore, SledStoreBuilder, Status, Store,
    StoreError, StoreFuture, ToolInfo,
};

/// The only contract between the macros and the runtime: generated code names these items by
/// absolute path. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::bounds::*;
    pub use idem_runtime::*;
}

/// The compile-time classification ([`ToolInfo`]) of a function marked `#[idem::read]`,
/// `#[idem::idempotent]` or `#[idem::write]`, named by its path. A constant expression.
///
/// ```
/// #[idem::read]
/// fn get_balance(customer: &str) -> Result<u64, idem::Error> {
///     Ok(customer.len() as u64)
/// }
///
/// const INFO: idem::ToolInfo = idem::tool_info!(get_balance);
/// assert_eq!(INFO.name, "get_balance");
/// assert_eq!(INFO.kind, idem::Kind::Read);
/// assert!(INFO.annotations().read_only_hint);
/// ```
///
/// It reads a hidden companion type that the attribute declares beside the function, with the
/// same name and visibility; methods have none (see the crate docs).
#[macro_export]
macro_rules! tool_info {
    ($tool:path) => {
        <$tool as $crate::Classified>::INFO
    };
}
