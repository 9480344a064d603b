//! What the engine and the sync thread count, through the `metrics` facade: the application
//! installs the recorder (a Prometheus exporter, say); without one, or without the `metrics`
//! feature, nothing is recorded. The names are listed in the README.
//!
//! The only label with a user's value in it is the tool: never the key or the scope, which
//! would make a series per call.

use std::time::Duration;

/// How a call ended, as counted in `idem_calls_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The body ran and its result was recorded.
    Fresh,
    /// A recorded result was returned without running the body.
    Replay,
    /// A result was returned after waiting for another call that held the key.
    Waited,
    /// The key was in doubt and the tool's reconciler found the effect had landed: its result
    /// was recorded and returned without running the body.
    Reconciled,
    /// The key is in doubt: this call left it so, or refused to run because it was.
    InDoubt,
    /// The body returned `Err` and the key was released.
    Released,
    /// The key awaits a person's approval: the body did not run.
    AwaitingApproval,
    /// A person denied the key: the body did not run.
    Denied,
    /// idem itself failed: the store, the arguments, a result that no longer fits, a wait
    /// that ran out.
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Fresh => "fresh",
            Outcome::Replay => "replay",
            Outcome::Waited => "waited",
            Outcome::Reconciled => "reconciled",
            Outcome::InDoubt => crate::lifecycle::Status::InDoubt.as_str(),
            Outcome::Released => "released",
            Outcome::AwaitingApproval => crate::lifecycle::Status::AwaitingApproval.as_str(),
            Outcome::Denied => crate::lifecycle::Status::Denied.as_str(),
            Outcome::Error => "error",
        }
    }

    /// The outcome of a call that idem ended with `error` before the body ran.
    pub fn of_error(error: &crate::error::Error) -> Outcome {
        match error {
            crate::error::Error::InDoubt { .. } | crate::error::Error::Unrecorded { .. } => {
                Outcome::InDoubt
            }
            crate::error::Error::AwaitingApproval { .. } => Outcome::AwaitingApproval,
            crate::error::Error::Denied { .. } => Outcome::Denied,
            _ => Outcome::Error,
        }
    }
}

/// A call of `tool` ended with `outcome` after `elapsed`; fresh calls and replays also record
/// their latency.
pub fn call(tool: &str, outcome: Outcome, elapsed: Duration) {
    #[cfg(feature = "metrics")]
    {
        let tool = tool.to_owned();
        ::metrics::counter!("idem_calls_total", "tool" => tool.clone(), "outcome" => outcome.as_str())
            .increment(1);
        if matches!(outcome, Outcome::Fresh | Outcome::Replay) {
            ::metrics::histogram!("idem_call_duration_seconds", "tool" => tool, "outcome" => outcome.as_str())
                .record(elapsed);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (tool, outcome.as_str(), elapsed);
}

/// A call of `tool` waited `waited` for another call that held its key.
pub(crate) fn wait(tool: &str, waited: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("idem_wait_duration_seconds", "tool" => tool.to_owned()).record(waited);
    #[cfg(not(feature = "metrics"))]
    let _ = (tool, waited);
}

/// A call of `tool` took over a record: an in-doubt one, rerun, or an expired result.
pub(crate) fn takeover(tool: &str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("idem_takeovers_total", "tool" => tool.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = tool;
}

/// A reconciler of `tool` answered `answer`, spelled as the history spells it (`landed`,
/// `not-landed`, `cannot-tell`, `erred`: it returned an error or panicked, or its answer cannot
/// be recorded), for a call or a sweep.
pub(crate) fn reconciliation(tool: &str, answer: crate::lifecycle::history::Answer) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        "idem_reconciliations_total",
        "tool" => tool.to_owned(),
        "answer" => answer.as_str()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (tool, answer);
}

/// A retention pass ended, having removed `records` finished records (with their histories)
/// and `histories` histories of released keys.
pub(crate) fn retention_pass(records: u64, histories: u64) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!("idem_retention_passes_total").increment(1);
        ::metrics::counter!("idem_retention_removed_total", "what" => "records").increment(records);
        ::metrics::counter!("idem_retention_removed_total", "what" => "histories")
            .increment(histories);
        ::metrics::histogram!("idem_retention_pass_records").record(records as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (records, histories);
}

/// What happened to an approval, as counted in `idem_approvals_total{event}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ApprovalEvent {
    /// A call recorded its key as awaiting approval.
    Requested,
    /// A person approved a key.
    Approved,
    /// A person denied a key.
    Denied,
    /// A call found an approval older than its `approval_ttl`, and asked again.
    Expired,
}

impl ApprovalEvent {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalEvent::Requested => "requested",
            ApprovalEvent::Approved => "approved",
            ApprovalEvent::Denied => "denied",
            ApprovalEvent::Expired => "expired",
        }
    }
}

/// An approval of `tool` was requested, given, refused or found expired.
pub(crate) fn approval(tool: &str, event: ApprovalEvent) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        "idem_approvals_total",
        "tool" => tool.to_owned(),
        "event" => event.as_str()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (tool, event.as_str());
}

/// A store's sync thread made one durable point, taking `elapsed`.
pub(crate) fn sync(elapsed: Duration) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!("idem_syncs_total").increment(1);
        ::metrics::histogram!("idem_sync_duration_seconds").record(elapsed);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = elapsed;
}
