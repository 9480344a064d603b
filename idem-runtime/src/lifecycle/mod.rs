//! A record's lifecycle: what its state means and every rule that changes it, one file a rule.
//!
//! - [`status`]: how a status is spelled.
//! - [`owner`]: the owner and instance strings, and an operator's `user@host`.
//! - [`fence`]: which writes may replace a record.
//! - [`lease`]: whether an owner still holds its in-flight record.
//! - [`transition`]: every change of state, with its history entry.
//! - [`assess`]: what a caller that finds a record must do with it.
//! - [`retention`]: what may be removed without a person asking (finished records and
//!   released keys' histories, past a bound).
//!
//! The engine (`engine/`), the operator interface (`admin.rs`) and the stores' open-time
//! clean-up call these; a store adds storage, never semantics.

pub(crate) mod assess;
pub(crate) mod fence;
pub mod history;
pub mod lease;
pub(crate) mod owner;
pub(crate) mod record;
pub mod retention;
pub(crate) mod status;
pub mod transition;

pub use self::assess::{assess, in_doubt, Assessment};
pub use self::fence::{admits, Fence, Guard};
pub use self::owner::{Liveness, Owner};
pub use self::record::{now_ms, Record, RecordParts};
pub use self::status::Status;
pub use self::transition::Resolution;
