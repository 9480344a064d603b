//! What a call does about the record it finds under its key: the decision table over the
//! lifecycle's [`assess`]ment, written once. Every run path acts on its answer (the engine's
//! state machine, and the transactional calls of the SQLite store and of idem-postgres), so a
//! rule added here holds for all of them.

use super::parts::CallParts;
use super::InDoubtPolicy;
use crate::error::Error;
use crate::lifecycle::{assess, Assessment, Record, Status};

/// What a call does next about the record it found (see [`CallParts::next`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Return the recorded result.
    Replay,
    /// Another owner is running the body: wait for the record to change.
    Wait,
    /// The key is in doubt and the call has a reconciler: ask it whether the effect landed.
    Reconcile,
    /// The key is in doubt and the call may not run: fail with [`Error::InDoubt`].
    RefuseInDoubt,
    /// A person denied the key: fail with [`Error::Denied`].
    Denied,
    /// The key waits for a person's decision: wait for it (a call that may not wait fails with
    /// [`Error::AwaitingApproval`]).
    AwaitDecision,
    /// The call needs a person's approval and has none: record the key as awaiting it.
    AskApproval,
    /// Make the key this call's: reserve it when absent, else take the record over.
    Claim,
}

impl CallParts<'_> {
    /// What this call does about `found` (`None`: absent) at `now` on the store's clock, seen
    /// from the store instance `instance`; `reconciler` says whether the call has one to ask.
    /// A record another function wrote is refused ([`Error::SharedToolName`]).
    pub fn next(
        &self,
        found: Option<&Record>,
        now: u64,
        instance: &str,
        reconciler: bool,
    ) -> Result<Next, Error> {
        if let Some(found) = found {
            self.check_function(found)?;
        }
        Ok(match assess(found, now, instance) {
            Assessment::Replay => Next::Replay,
            Assessment::Running => Next::Wait,
            Assessment::InDoubt if reconciler => Next::Reconcile,
            Assessment::InDoubt if self.in_doubt == InDoubtPolicy::Fail => Next::RefuseInDoubt,
            Assessment::Denied => Next::Denied,
            Assessment::AwaitingApproval => Next::AwaitDecision,
            Assessment::Absent | Assessment::Expired | Assessment::Approved
                if self.must_ask(found, now) =>
            {
                Next::AskApproval
            }
            // Absent, expired, approved, or in doubt under `in_doubt = "rerun"`.
            _ => Next::Claim,
        })
    }

    /// Whether this call must ask a person before it runs the body over `found` (absent, an
    /// expired result, or an approval): it requires approval, or the approval it found has
    /// outlived its `approval_ttl`.
    fn must_ask(&self, found: Option<&Record>, now: u64) -> bool {
        match found {
            Some(record) if record.status == Status::Approved => {
                let ttl = self.approval.and_then(|approval| approval.ttl);
                record.approval_expired(ttl, now)
            }
            _ => self.approval.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::Call;
    use crate::lifecycle::transition::{self, reserve_record, Decision};
    use crate::lifecycle::Owner;

    const ME: &str = "sled:h:1:0:0";

    fn call() -> Call {
        Call::from_canonical("charge", "order-1", "{}").function("shop::charge")
    }

    #[test]
    fn each_assessment_has_one_next_step() {
        let (plain, approving) = (call(), call().approve(true));
        let held = reserve_record("k", "charge", "order-1", None, &Owner::new_call(ME), 10);
        let doubt = transition::leave_in_doubt(&held, "why", 11).new.unwrap();
        let done = transition::complete(&held, "1".into(), None, 12).new.unwrap();
        let next = |call: &Call, found: Option<&Record>, reconciler| {
            call.parts().next(found, 20, ME, reconciler).unwrap()
        };
        assert_eq!(next(&plain, None, false), Next::Claim);
        assert_eq!(next(&approving, None, false), Next::AskApproval);
        assert_eq!(next(&plain, Some(&held), false), Next::Wait);
        assert_eq!(next(&plain, Some(&doubt), false), Next::RefuseInDoubt);
        assert_eq!(next(&plain, Some(&doubt), true), Next::Reconcile);
        let rerun = call().in_doubt(InDoubtPolicy::Rerun);
        assert_eq!(next(&rerun, Some(&doubt), false), Next::Claim);
        assert_eq!(next(&plain, Some(&done), false), Next::Replay);
        // Seen from another instance, a record in flight whose owner is gone is in doubt.
        let elsewhere = plain.parts().next(Some(&held), 20, "sled:h:2:0:0", false).unwrap();
        assert_eq!(elsewhere, Next::RefuseInDoubt);
    }

    #[test]
    fn an_approval_is_used_once_and_asked_again_after_its_ttl() {
        let owner = Owner::new_call(ME);
        let asked = transition::request_approval("k", "charge", "order-1", None, &owner, 10);
        let waiting = asked.new.unwrap();
        let approving = call().approve(true).approval_ttl(Duration::from_millis(5));
        assert_eq!(
            approving.parts().next(Some(&waiting), 12, ME, false).unwrap(),
            Next::AwaitDecision
        );
        let approved =
            transition::decide(&waiting, Decision::Approve, "ops", None, 12).new.unwrap();
        assert_eq!(approving.parts().next(Some(&approved), 13, ME, false).unwrap(), Next::Claim);
        let late = approving.parts().next(Some(&approved), 30, ME, false).unwrap();
        assert_eq!(late, Next::AskApproval);
        // A call that needs no approval uses one however old it is.
        assert_eq!(call().parts().next(Some(&approved), 30, ME, false).unwrap(), Next::Claim);
        let denied = transition::decide(&waiting, Decision::Deny, "ops", None, 12).new.unwrap();
        assert_eq!(call().parts().next(Some(&denied), 13, ME, false).unwrap(), Next::Denied);
    }

    #[test]
    fn a_record_of_another_function_is_refused_whatever_its_state() {
        let held = reserve_record(
            "k",
            "charge",
            "order-1",
            Some("other::charge"),
            &Owner::new_call(ME),
            10,
        );
        let refused = call().parts().next(Some(&held), 20, ME, false);
        assert!(matches!(refused, Err(Error::SharedToolName { .. })), "{refused:?}");
    }
}
