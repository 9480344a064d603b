//! The actors beside the callers: an operator who resolves a key in doubt (`admin::resolve`), a
//! person who approves or denies (`admin::decide`), and a retention pass.

use idem_runtime::admin::Decision;
use idem_runtime::for_model::{assess, transition, Assessment};
use idem_runtime::Resolution;

use super::model::RETAINER_INSTANCE;
use super::model::{awaiting, fresh_epoch, Lifecycle, OPERATOR, OPERATOR_INSTANCE, PERSON};
use super::state::State;
use super::store::Writer;
use super::Mutant;

impl Lifecycle {
    /// A key the operator would find in doubt (`idem ls --status in-doubt`, on its clock).
    pub(crate) fn operator_may_read(&self, s: &State) -> Option<usize> {
        let now = s.now + self.scenario.bounds.skew;
        (0..self.keys.len()).find(|&k| {
            let record = s.keys[k].record.as_ref().map(|r| &r.0);
            record.is_some() && assess(record, now, OPERATOR_INSTANCE) == Assessment::InDoubt
        })
    }

    /// The operator resolves a key in doubt as the system of record shows.
    pub(crate) fn operator_resolve(&self, s: &mut State) {
        // `admin::resolve`: read the key, then refuse it or write over what was read. A write
        // refused because the record moved between the two changes nothing: one step.
        let k = self.operator_may_read(s).expect("a key in doubt");
        let read = s.keys[k].record.clone().expect("a record");
        s.operator.acts += 1;
        let now = s.now + self.scenario.bounds.skew;
        if assess(Some(&read.0), now, OPERATOR_INSTANCE) != Assessment::InDoubt {
            return;
        }
        let liveness = self.liveness(s, &read.0.owner);
        let may_resume = transition::owner_may_resume(&read.0, &liveness);
        if may_resume.is_some() && !self.is(Mutant::OperatorIgnoresLiveOwner) {
            return;
        }
        // The operator looks at the system of record and says what it shows.
        let resolution = match &s.keys[k].landed {
            Some(result) => Resolution::Done(serde_json::from_str(result).expect("a JSON result")),
            None => Resolution::Release,
        };
        let step = transition::resolve(&read.0, &resolution, OPERATOR, None, now);
        self.swap(
            s,
            k,
            &read.0,
            step.new,
            Writer { writer: OPERATOR, now, instance: OPERATOR_INSTANCE },
        );
    }

    /// A person approves or denies a key awaiting approval.
    pub(crate) fn person_decide(&self, s: &mut State, approve: bool) {
        // `admin::decide`: read the key and write over what was read, again until it lands or
        // the key no longer awaits a decision: one step.
        let k = awaiting(s).expect("a key awaiting approval");
        let read = s.keys[k].record.clone().expect("a record");
        s.person.acts += 1;
        let decision = if approve { Decision::Approve } else { Decision::Deny };
        let step = transition::decide(&read.0, decision, PERSON, None, s.now);
        let decided = step.new.expect("a decision leaves a record");
        if self
            .swap(
                s,
                k,
                &read.0,
                Some(decided),
                Writer { writer: PERSON, now: s.now, instance: OPERATOR_INSTANCE },
            )
            .is_some()
            && approve
        {
            let slot = &mut s.keys[k];
            slot.approvals += 1;
            slot.approved_for = slot.requested;
        }
    }

    /// The pass deletes the record it read, fenced on it (with the store instance as writer).
    pub(crate) fn retention_delete(&self, s: &mut State) {
        let (k, read) = s.retention.read.take().expect("the pass read a record");
        let now = s.now + self.scenario.bounds.skew;
        let expected = match (&s.keys[k].record, self.is(Mutant::RetentionDeleteUnfenced)) {
            (Some(stored), true) => stored.clone(),
            _ => read,
        };
        let removed = s.keys[k].record.clone();
        let step = transition::purge(RETAINER_INSTANCE);
        if self
            .swap(
                s,
                k,
                &expected.0,
                step.new,
                Writer { writer: RETAINER_INSTANCE, now, instance: RETAINER_INSTANCE },
            )
            .is_some()
        {
            let status = removed.expect("a record was removed").0.status;
            if !status.is_finished() {
                s.broken.removed_unfinished = Some(status);
            }
            fresh_epoch(&mut s.keys[k]);
        }
    }
}
