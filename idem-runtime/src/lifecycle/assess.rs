//! What a caller that finds a record must do with it, written once: the engine's state machine
//! and the operator interface both decide by [`assess`].

use super::lease;
use super::record::Record;
use super::status::Status;

/// What a caller must do about the record it found under its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Assessment {
    /// No record: reserve the key.
    Absent,
    /// A finished result still within its `ttl`: replay it.
    Replay,
    /// A finished result past its `ttl`: take the key over and run again.
    Expired,
    /// An owner that still holds the key runs the body: wait for it.
    Running,
    /// The effect may or may not have landed: an in-doubt record, or an in-flight one whose
    /// owner no longer holds it. The caller's in-doubt policy (or an operator) decides.
    InDoubt,
    /// The key waits for a person to approve or deny it: the body must not run.
    AwaitingApproval,
    /// A person approved the key: a call runs the body once (unless the approval expired for
    /// it, see [`Record::approval_expired`]).
    Approved,
    /// A person denied the key: no call runs the body.
    Denied,
}

/// Assesses `found` at `now` (milliseconds on the store's clock), seen from the store instance
/// `instance`.
pub fn assess(found: Option<&Record>, now: u64, instance: &str) -> Assessment {
    match found {
        None => Assessment::Absent,
        Some(record) => match record.status {
            Status::Done if record.is_expired(now) => Assessment::Expired,
            Status::Done => Assessment::Replay,
            Status::InFlight if lease::holds(record, now, instance) => Assessment::Running,
            Status::InFlight | Status::InDoubt => Assessment::InDoubt,
            Status::AwaitingApproval => Assessment::AwaitingApproval,
            Status::Approved => Assessment::Approved,
            Status::Denied => Assessment::Denied,
        },
    }
}

/// Whether `record` is in doubt at `now`, seen from `instance`: marked so, or in flight with an
/// owner that no longer holds it. What a sweep picks to reconcile and what the operator's
/// listing shows as in doubt, as [`assess`] says.
pub fn in_doubt(record: &Record, now: u64, instance: &str) -> bool {
    assess(Some(record), now, instance) == Assessment::InDoubt
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::transition::{self, reserve_record};
    use crate::lifecycle::Owner;

    #[test]
    fn a_found_record_is_assessed_by_status_time_and_owner() {
        let me = "sled:h:1:0:0";
        let held = reserve_record("k", "t", "s", None, &Owner::new_call(me), 10);
        assert_eq!(assess(None, 10, me), Assessment::Absent);
        assert_eq!(assess(Some(&held), 10, me), Assessment::Running);
        assert_eq!(assess(Some(&held), 10, "sled:h:2:0:0"), Assessment::InDoubt);
        let doubt = transition::leave_in_doubt(&held, "why", 11).new.unwrap();
        assert_eq!(assess(Some(&doubt), 11, me), Assessment::InDoubt);
        let ttl = Some(std::time::Duration::from_millis(5));
        let done = transition::complete(&held, "1".into(), ttl, 12).new.unwrap();
        assert_eq!(assess(Some(&done), 16, me), Assessment::Replay);
        assert_eq!(assess(Some(&done), 17, me), Assessment::Expired);
        // In doubt: marked so, or held by an instance that is not this one.
        assert!(in_doubt(&doubt, 11, me));
        assert!(in_doubt(&held, 10, "sled:h:2:0:0"));
        assert!(!in_doubt(&held, 10, me));
        assert!(!in_doubt(&done, 17, me));
    }
}
