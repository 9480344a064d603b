//! Reconcilers: asking the target system whether an effect left in doubt landed. What a
//! reconciler answers ([`Reconciled`]) and how it is asked (a panic is an answer too). The
//! transitions an answer causes are the lifecycle's; `machine` decides which, and `sweep` asks
//! about every key in doubt at start-up.

use std::any::Any;
use std::fmt::Display;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::task::Poll;

use crate::key::Key;

/// What a reconciler found out about an effect whose call was interrupted (a crash, a panic, a
/// lost answer), asked by its key: the key the call sent the vendor with
/// [`current_key`](crate::current_key).
///
/// ```
/// use idem_runtime::{Key, Reconciled};
///
/// # struct Vendor;
/// # impl Vendor { fn charge_by_idempotency_key(&self, _: &str) -> Result<Option<String>, String> { Ok(None) } }
/// # let vendor = Vendor;
/// // A reconciler of `charge_card`, whose body sent the vendor its key.
/// fn find_charge(vendor: &Vendor, key: &Key) -> Result<Reconciled<String>, String> {
///     Ok(match vendor.charge_by_idempotency_key(key.as_str())? {
///         Some(charge_id) => Reconciled::Landed(charge_id),
///         None => Reconciled::NotLanded,
///     })
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reconciled<T> {
    /// The effect landed, with this result: the key is recorded `Done` with it, and every call
    /// replays it.
    Landed(T),
    /// The effect did not land: the key is released, and the call that asked runs the body with
    /// the same key.
    NotLanded,
    /// The reconciler cannot tell (the vendor does not know yet, or cannot be reached for an
    /// answer that means anything): the key stays in doubt.
    CannotTell,
}

impl<T> Reconciled<T> {
    /// The answer with a landed result mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reconciled<U> {
        match self {
            Reconciled::Landed(value) => Reconciled::Landed(f(value)),
            Reconciled::NotLanded => Reconciled::NotLanded,
            Reconciled::CannotTell => Reconciled::CannotTell,
        }
    }
}

/// Asks `reconcile` about `key`: calls it, and polls the future it returns, catching a panic of
/// either, which is then an answer that settles nothing (`Err`, saying so).
pub(super) async fn ask<T, Rf, Fut>(reconcile: Rf, key: Key) -> Result<Reconciled<T>, String>
where
    Rf: FnOnce(Key) -> Fut,
    Fut: Future<Output = Result<Reconciled<T>, String>>,
{
    // A sync reconciler does its work here, in the call.
    let future = match catch_unwind(AssertUnwindSafe(move || reconcile(key))) {
        Ok(future) => future,
        Err(panic) => return Err(panicked(panic)),
    };
    let mut future = pin!(future);
    poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
        Ok(poll) => poll,
        Err(panic) => Poll::Ready(Err(panicked(panic))),
    })
    .await
}

fn panicked(panic: Box<dyn Any + Send>) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("it panicked: {message}")
}

/// A reconciler's error, as the reason the key stays in doubt.
pub(crate) fn erred(error: impl Display) -> String {
    format!("it failed: {error}")
}
