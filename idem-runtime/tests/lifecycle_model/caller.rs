//! A caller's steps, as the engine's `Call::acquire` and `Call::execute` take them
//! (`engine/machine.rs`): decide over the record with `CallParts::next`, then reserve, take
//! over, ask for approval or a reconciler, run the body and settle the record, each write a
//! `transition::*` step; and a transactional call's run under the store's write lock.

use idem_runtime::for_model::{transition, Next};
use idem_runtime::store::{Answer, Owner};
use idem_runtime::{Record, Status};

use super::model::{fresh_epoch, result_of, Lifecycle, FUNCTION, SCOPE, TOOL};
use super::state::{Effect, Held, Outcome, Phase, Rec, State, TxRun};
use super::store::Writer;
use super::Mutant;

impl Lifecycle {
    pub(crate) fn owner(&self, s: &State, i: usize) -> Owner {
        Owner::from(format!("{}#{}", self.instance(s, i), s.callers[i].claims))
    }

    /// Caller `i`'s call returns `outcome`.
    pub(crate) fn end(s: &mut State, i: usize, outcome: Outcome) {
        s.callers[i].phase = Phase::Ended;
        s.callers[i].outcome = Some(outcome);
    }

    /// The caller decides over `found` and makes the write the decision says.
    pub(crate) fn decide(&self, s: &mut State, i: usize, found: Option<Rec>) {
        let role = self.scenario.callers[i];
        let k = self.key_of[i];
        let reconciler = role.reconciler && !s.callers[i].asked;
        let found_record = found.as_ref().map(|r| &r.0);
        let next = match self.next(s, i, found_record, reconciler) {
            Ok(next) => next,
            Err(_) => return Self::end(s, i, Outcome::Err("shared-tool-name")),
        };
        let now = self.clock(s, i);
        match next {
            Next::Replay => {
                let result = found_record.and_then(|r| r.result.clone()).unwrap_or_default();
                Self::end(s, i, Outcome::Ok(result));
            }
            // A wait for the owner or for a person's decision: the call reads the key again when
            // it changes (a caller that gives up just takes no more steps).
            Next::Wait | Next::AwaitDecision => s.callers[i].phase = Phase::Idle,
            Next::RefuseInDoubt => Self::end(s, i, Outcome::Err("in-doubt")),
            Next::Denied => Self::end(s, i, Outcome::Err("denied")),
            Next::Reconcile => {
                let found = found.expect("a key in doubt has a record");
                s.callers[i].claims += 1;
                s.callers[i].asked = true;
                let owner = self.owner(s, i);
                let step = transition::take_over_to_reconcile(
                    &found.0,
                    &owner,
                    Some(FUNCTION),
                    now,
                    self.lease(),
                );
                let new = step.new.expect("a takeover leaves a record");
                let instance = self.instance(s, i);
                s.callers[i].phase = match self.swap(
                    s,
                    k,
                    &found.0,
                    Some(new),
                    Writer { writer: owner.as_str(), now, instance: &instance },
                ) {
                    Some(_) => Phase::Reconciling(s.keys[k].record.clone().expect("just written")),
                    None => Phase::Idle,
                };
            }
            Next::AskApproval => self.ask_approval(s, i, found.as_ref(), now),
            Next::Claim => self.claim(s, i, found),
        }
    }

    /// Caller `i` records its key as awaiting a person's approval over `found` (absent, an
    /// expired result, or an expired approval), then reads the key again.
    pub(crate) fn ask_approval(&self, s: &mut State, i: usize, found: Option<&Rec>, now: u64) {
        let role = self.scenario.callers[i];
        let k = self.key_of[i];
        s.callers[i].claims += 1;
        let owner = self.owner(s, i);
        match found {
            None => {
                let step = transition::request_approval(
                    &self.keys[k],
                    TOOL,
                    SCOPE,
                    Some(FUNCTION),
                    &owner,
                    now,
                );
                if self.insert(s, k, step.new.expect("a request leaves a record")).is_ok() {
                    s.keys[k].requested = Some(role.amount);
                }
            }
            Some(found) => {
                let step =
                    transition::request_approval_again(&found.0, &owner, Some(FUNCTION), now);
                let new = step.new.expect("a request leaves a record");
                let instance = self.instance(s, i);
                if self
                    .swap(
                        s,
                        k,
                        &found.0,
                        Some(new),
                        Writer { writer: owner.as_str(), now, instance: &instance },
                    )
                    .is_some()
                {
                    let slot = &mut s.keys[k];
                    slot.requested = Some(role.amount);
                    if found.0.status == Status::Done {
                        fresh_epoch(slot);
                    }
                }
            }
        }
        s.callers[i].phase = Phase::Idle;
    }

    /// Makes the key caller `i`'s: a reservation, or a takeover of `found`.
    pub(crate) fn claim(&self, s: &mut State, i: usize, found: Option<Rec>) {
        let k = self.key_of[i];
        let now = self.clock(s, i);
        s.callers[i].claims += 1;
        let owner = self.owner(s, i);
        let taken = match &found {
            None => {
                let step = transition::reserve(
                    &self.keys[k],
                    TOOL,
                    SCOPE,
                    Some(FUNCTION),
                    &owner,
                    now,
                    self.lease(),
                );
                self.insert(s, k, step.new.expect("a reservation leaves a record"))
            }
            Some(found) => {
                let step =
                    transition::take_over(&found.0, &owner, Some(FUNCTION), now, self.lease());
                let new = step.new.expect("a takeover leaves a record");
                let instance = self.instance(s, i);
                self.swap(
                    s,
                    k,
                    &found.0,
                    Some(new),
                    Writer { writer: owner.as_str(), now, instance: &instance },
                )
                .ok_or(())
            }
        };
        let token = match taken {
            Ok(token) => token,
            // The key moved: the call decides again over what it holds now.
            Err(_) => return s.callers[i].phase = Phase::Idle,
        };
        let was = found.as_ref().map(|r| r.0.status);
        let slot = &mut s.keys[k];
        match was {
            Some(Status::Done) => fresh_epoch(slot),
            Some(Status::InDoubt | Status::InFlight) => slot.reruns += 1,
            _ => {}
        }
        let record = s.keys[k].record.clone().expect("just written");
        let approved = was == Some(Status::Approved);
        let (started, effect) = (false, Effect::NotYet);
        let held = Held { record, before: found, token, started, effect, approved };
        s.callers[i].phase = Phase::Owned(held);
    }

    /// Caller `i`'s body starts: from here its effect may land. A run under an approval uses it.
    pub(crate) fn start_body(&self, s: &mut State, i: usize) {
        let role = self.scenario.callers[i];
        let slot = &mut s.keys[self.key_of[i]];
        let Phase::Owned(held) = &mut s.callers[i].phase else { unreachable!() };
        held.started = true;
        if held.approved {
            slot.approved_runs += 1;
            if slot.approved_for != Some(role.amount) {
                s.broken.wrong_intent = true;
            }
        }
        // A rerun of a key in doubt reruns the run its approval let through.
        let rerun = matches!(
            held.before.as_ref().map(|b| b.0.status),
            Some(Status::InDoubt | Status::InFlight)
        );
        if role.approval && !held.approved && !rerun {
            s.broken.unapproved_run = true;
        }
    }

    /// The owner's write of `new` over the record it holds: whether the store took it.
    pub(crate) fn settle(
        &self,
        s: &mut State,
        i: usize,
        held: &Record,
        new: Option<Record>,
    ) -> bool {
        let (k, now, instance) = (self.key_of[i], self.clock(s, i), self.instance(s, i));
        self.swap(s, k, held, new, Writer { writer: held.owner.as_str(), now, instance: &instance })
            .is_some()
    }

    /// What caller `i` holds while it owns the key.
    pub(crate) fn held(s: &State, i: usize) -> Held {
        match &s.callers[i].phase {
            Phase::Owned(held) => held.clone(),
            phase => unreachable!("caller {i} owns nothing: {phase:?}"),
        }
    }

    /// The body returns `Ok`: `complete`, or, refused, what the key records.
    pub(crate) fn return_ok(&self, s: &mut State, i: usize) {
        let held = Self::held(s, i);
        let Effect::Landed(value) = held.effect.clone() else { unreachable!("no effect yet") };
        let step =
            transition::complete(&held.record.0, value.clone(), self.ttl(), self.clock(s, i));
        if self.settle(s, i, &held.record.0, step.new) {
            return Self::end(s, i, Outcome::Ok(value));
        }
        // Refused: the key moved on while the body ran. The caller gets what is recorded.
        if self.is(Mutant::LateResultReturned) {
            return Self::end(s, i, Outcome::Ok(value));
        }
        let now = s.keys[self.key_of[i]].record.clone();
        let outcome = match now {
            Some(Rec(r)) if r.status == Status::Done => Outcome::Ok(r.result.unwrap_or_default()),
            _ => Outcome::Err("superseded"),
        };
        Self::end(s, i, outcome);
    }

    /// The call is dropped before its body started: nothing landed, `undo`.
    pub(crate) fn drop_before_body(&self, s: &mut State, i: usize) {
        let held = Self::held(s, i);
        let before = held.before.as_ref().map(|b| &b.0);
        let step = transition::undo(&held.record.0, before, self.clock(s, i));
        self.settle(s, i, &held.record.0, step.new);
        Self::end(s, i, Outcome::Err("dropped"));
    }

    /// The body sends its effect, with its fencing token, to the system of record.
    pub(crate) fn send(&self, s: &mut State, i: usize) {
        let token = Self::held(s, i).token;
        let effect = self.send_effect(&mut s.keys[self.key_of[i]], token);
        if let Phase::Owned(held) = &mut s.callers[i].phase {
            held.effect = effect;
        }
    }

    /// The body fails after its effect may have landed, or panics: `leave_in_doubt`.
    pub(crate) fn fail(&self, s: &mut State, i: usize) {
        let held = Self::held(s, i);
        let step =
            transition::leave_in_doubt(&held.record.0, transition::DROPPED, self.clock(s, i));
        self.settle(s, i, &held.record.0, step.new);
        Self::end(s, i, Outcome::Err("body"));
    }

    /// The body returns `Err` before its effect could land: `release`.
    pub(crate) fn return_err(&self, s: &mut State, i: usize) {
        let held = Self::held(s, i);
        let gave_back = self.is(Mutant::ApprovalGivenBack)
            && held.before.as_ref().is_some_and(|b| b.0.status == Status::Approved);
        let step = if gave_back {
            transition::undo(&held.record.0, held.before.as_ref().map(|b| &b.0), self.clock(s, i))
        } else {
            transition::release(&held.record.0)
        };
        self.settle(s, i, &held.record.0, step.new);
        Self::end(s, i, Outcome::Err("body"));
    }

    /// The reconciler answers (`truthful`: what the system of record shows; else "cannot
    /// tell") and the call settles the key by the answer.
    pub(crate) fn answer(&self, s: &mut State, i: usize, truthful: bool) {
        let Phase::Reconciling(held) = s.callers[i].phase.clone() else { unreachable!() };
        let k = self.key_of[i];
        let now = self.clock(s, i);
        match (truthful, s.keys[k].landed.clone()) {
            (true, Some(result)) => {
                let step = transition::settle_landed(&held.0, result.clone(), self.ttl(), now);
                if self.settle(s, i, &held.0, step.new) {
                    return Self::end(s, i, Outcome::Ok(result));
                }
                // Refused: the call decides again over what the key holds now.
                s.callers[i].phase = Phase::Idle;
            }
            (true, None) => {
                let step = transition::settle_not_landed(&held.0);
                self.settle(s, i, &held.0, step.new);
                s.callers[i].phase = Phase::Idle;
            }
            (false, _) => {
                let step = transition::settle_cannot_tell(
                    &held.0,
                    Answer::CannotTell,
                    "it could not tell",
                    now,
                );
                self.settle(s, i, &held.0, step.new);
                s.callers[i].phase = Phase::Idle;
            }
        }
    }

    /// A transactional call begins: the write lock, the read, the decision, and the
    /// reservation inside the transaction.
    pub(crate) fn tx_begin(&self, s: &mut State, i: usize) {
        let k = self.key_of[i];
        s.lock = Some(i);
        let found = s.keys[k].record.clone();
        let next = self.next(s, i, found.as_ref().map(|r| &r.0), false);
        let done = |s: &mut State, outcome| {
            s.lock = None;
            Self::end(s, i, outcome);
        };
        match next {
            Ok(Next::Replay) => {
                let result = found.and_then(|r| r.0.result).unwrap_or_default();
                done(s, Outcome::Ok(result));
            }
            // Rolled back; it waits for the owner without the lock, then begins again.
            Ok(Next::Wait) => {
                s.lock = None;
                s.callers[i].phase = Phase::Idle;
            }
            Ok(Next::Claim) => {
                let now = self.clock(s, i);
                s.callers[i].claims += 1;
                let owner = self.owner(s, i);
                let step = match &found {
                    None => transition::reserve(
                        &self.keys[k],
                        TOOL,
                        SCOPE,
                        Some(FUNCTION),
                        &owner,
                        now,
                        self.lease(),
                    ),
                    Some(found) => {
                        transition::take_over(&found.0, &owner, Some(FUNCTION), now, self.lease())
                    }
                };
                let pending = Rec(step.new.expect("a claim leaves a record"));
                let token = s.seq + 1;
                s.callers[i].phase = Phase::Tx(TxRun { found, pending, token, effect: false });
            }
            // Rolled back having written nothing; it asks a person without the lock (a write of
            // its own), or waits for the decision, then begins again.
            Ok(Next::AskApproval) => {
                s.lock = None;
                let now = self.clock(s, i);
                self.ask_approval(s, i, found.as_ref(), now);
            }
            Ok(Next::AwaitDecision) => {
                s.lock = None;
                s.callers[i].phase = Phase::Idle;
            }
            Ok(Next::RefuseInDoubt) => done(s, Outcome::Err("in-doubt")),
            Ok(Next::Denied) => done(s, Outcome::Err("denied")),
            Ok(next) => unreachable!("a transactional call has no {next:?}"),
            Err(_) => done(s, Outcome::Err("shared-tool-name")),
        }
    }

    /// The transactional body writes its effect, inside the transaction.
    pub(crate) fn tx_effect(&self, s: &mut State, i: usize) {
        let k = self.key_of[i];
        let Phase::Tx(run) = &mut s.callers[i].phase else { unreachable!() };
        run.effect = true;
        if self.is(Mutant::TransactionCommitsEffectEarly) {
            let slot = &mut s.keys[k];
            slot.tx_effects.insert(run.token);
            slot.effects += 1;
        }
    }

    /// It commits: the record done and the effect, in one step.
    pub(crate) fn tx_commit(&self, s: &mut State, i: usize) {
        let Phase::Tx(run) = s.callers[i].phase.clone() else { unreachable!() };
        let k = self.key_of[i];
        let value = result_of(run.token);
        let step =
            transition::complete(&run.pending.0, value.clone(), self.ttl(), self.clock(s, i));
        // Under the write lock nothing changed since the transaction read the key.
        assert_eq!(s.keys[k].record, run.found, "the write lock keeps the key as read");
        // The reservation and the completion are one commit: two writes, one token.
        self.land(s, k, step.new);
        let slot = &mut s.keys[k];
        if matches!(&run.found, Some(f) if f.0.status == Status::Done) {
            // An expired result run again: its effects are counted from here.
            fresh_epoch(slot);
        }
        slot.tx_records.insert(run.token);
        if run.effect && !self.is(Mutant::TransactionCommitsEffectEarly) {
            slot.tx_effects.insert(run.token);
            slot.effects += 1;
            slot.landed = Some(value.clone());
        }
        // A run under an approval uses it, as it commits (before, a rollback keeps it).
        let role = self.scenario.callers[i];
        let approved = matches!(&run.found, Some(f) if f.0.status == Status::Approved);
        if approved {
            slot.approved_runs += 1;
            if slot.approved_for != Some(role.amount) {
                s.broken.wrong_intent = true;
            }
        }
        if role.approval && !approved {
            s.broken.unapproved_run = true;
        }
        s.lock = None;
        Self::end(s, i, Outcome::Ok(value));
    }
}
