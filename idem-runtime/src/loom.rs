//! The synchronisation types of the hand-written concurrency (`store/sync.rs`,
//! `store/notify.rs`, `exec.rs`, `remote/seats.rs`, the held leases of `engine/heartbeat.rs`):
//! std's, or loom's under the `loom` feature, so that the `loom_` models beside each of them
//! explore every interleaving, as tokio checks its own primitives. Nothing else in the crate
//! uses these.

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(feature = "loom"))]
pub(crate) use std::thread;

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(feature = "loom")]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(feature = "loom")]
pub(crate) use loom::thread;

/// Runs `model` over the interleavings loom explores, with at most two preemptions per run
/// (as tokio's CI bounds its models): bugs of this kind need few, and the debug build the
/// tests share stays fast enough for CI.
#[cfg(all(test, feature = "loom"))]
pub(crate) fn model(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(model);
}
