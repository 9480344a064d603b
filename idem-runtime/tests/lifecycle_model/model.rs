//! The model: every step an actor can take, each made of the lifecycle's own functions. A
//! caller decides with `CallParts::next` (the engine's decision table) and changes the record
//! only through `transition::*`; the store admits a write only by `admits` (the fence), on the
//! writer's reading of its clock, and sets and renews leases as the PostgreSQL store does; the
//! operator resolves through `transition::resolve` after `assess` and
//! `transition::owner_may_resume`; retention removes what `outlived` says.

use std::time::Duration;

use idem_runtime::admin::Decision;
use idem_runtime::for_model::{self, admits, assess, outlived, transition, Assessment, Next};
use idem_runtime::store::{Answer, Liveness, Owner};
use idem_runtime::{Call, Error, Record, Resolution, Status};
use stateright::Model;

use super::scenario::{Mutant, Scenario};
use super::state::{Caller, Effect, Held, Outcome, Phase, Reader, Rec, Slot, State, TxRun};

/// The store's clock when the model starts (ms): above every skew, so no reading underflows.
pub const START: u64 = 10;
const TOOL: &str = "charge";
const SCOPE: &str = "order-1";
const FUNCTION: &str = "shop::charge";
const OPERATOR: &str = "ops@model";
const PERSON: &str = "ann@model";
/// The store instances of the operator's command and of the retainer.
const OPERATOR_INSTANCE: &str = "pg:model:900:0:0";
const RETAINER_INSTANCE: &str = "pg:model:800:0:0";

/// Who writes (`writer`: an owner, an operator, a person, a store instance), on which reading
/// of the store's clock, through which store instance: what the fence asks of a write.
#[derive(Clone, Copy)]
struct Writer<'a> {
    writer: &'a str,
    now: u64,
    instance: &'a str,
}

/// One step of one actor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Caller `i` reads its key, decides over what it found (`CallParts::next`) and makes the
    /// write that says. One step: the write is fenced on what was read (or is an insert if
    /// absent), so a write after a stale read is refused and changes nothing, and the call then
    /// decides again; a stale replay returns a result that was recorded.
    Decide(usize),
    /// Caller `i`'s body starts.
    StartBody(usize),
    /// Caller `i`'s call is dropped before its body started: `undo`.
    Drop(usize),
    /// Caller `i`'s body sends its effect (with its fencing token) to the system of record.
    SendEffect(usize),
    /// Caller `i`'s body returns `Ok`: `complete`.
    ReturnOk(usize),
    /// Caller `i`'s body returns `Err` before its effect could land: `release`.
    ReturnErr(usize),
    /// Caller `i`'s body fails after its effect may have landed, or panics: `leave_in_doubt`.
    Fail(usize),
    /// Caller `i`'s reconciler answers: what the system of record shows, or "cannot tell".
    Answer(usize, bool),
    /// Transactional caller `i` begins (the write lock), reads and decides, and reserves.
    TxBegin(usize),
    /// Its body writes its effect inside the transaction.
    TxEffect(usize),
    /// It commits: record done, effect, together.
    TxCommit(usize),
    /// Its body returns `Err`: rolled back.
    TxRollback(usize),
    Crash(usize),
    Pause(usize),
    Resume(usize),
    Restart(usize),
    /// The operator resolves a key in doubt as the system of record shows (`idem resolve`).
    OperatorResolve,
    /// A person approves or denies a key awaiting approval (`idem approve`, `idem deny`).
    PersonDecide(bool),
    /// A retention pass reads a record it may remove.
    RetentionScan(usize),
    /// It removes it, fenced on what it read.
    RetentionDelete,
    /// The store's clock advances 1 ms; every running owner's heartbeat renews its lease.
    Tick,
}

/// The model of one scenario, with at most one planted bug.
pub struct Lifecycle {
    pub scenario: Scenario,
    pub mutant: Option<Mutant>,
    /// Each caller's call (its key, policy and approval rule).
    calls: Vec<Call>,
    /// Each caller's key, as an index into the state's slots, and the keys.
    key_of: Vec<usize>,
    keys: Vec<String>,
}

impl Lifecycle {
    pub fn new(scenario: Scenario, mutant: Option<Mutant>) -> Lifecycle {
        let ms = Duration::from_millis;
        let mut keys: Vec<String> = Vec::new();
        let mut key_of = Vec::new();
        let calls: Vec<Call> = scenario
            .callers
            .iter()
            .map(|role| {
                let args = if mutant == Some(Mutant::ApprovalIgnoresArguments) {
                    serde_json::json!({})
                } else {
                    serde_json::json!({ "amount": role.amount })
                };
                let mut call = Call::new(TOOL, SCOPE, &args)
                    .expect("the arguments are JSON")
                    .function(FUNCTION)
                    .in_doubt(role.policy)
                    .approve(role.approval);
                if let Some(ttl) = scenario.ttl {
                    call = call.ttl(ms(ttl));
                }
                if let (true, Some(ttl)) = (role.approval, scenario.approval_ttl) {
                    call = call.approval_ttl(ms(ttl));
                }
                let key = call.key().as_str().to_owned();
                let index = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                    keys.push(key);
                    keys.len() - 1
                });
                key_of.push(index);
                call
            })
            .collect();
        Lifecycle { scenario, mutant, calls, key_of, keys }
    }

    fn is(&self, mutant: Mutant) -> bool {
        self.mutant == Some(mutant)
    }

    /// How far caller `i`'s reading of the store's clock is off: the first ahead, the second
    /// behind, the third exact (and so on), the widest spread the bound allows.
    pub fn offset(&self, i: usize) -> i64 {
        let skew = self.scenario.bounds.skew as i64;
        [skew, -skew, 0][i % 3]
    }

    pub fn clock(&self, s: &State, i: usize) -> u64 {
        s.now.saturating_add_signed(self.offset(i))
    }

    /// The store instance of caller `i`'s current process.
    pub fn instance(&self, s: &State, i: usize) -> String {
        format!("pg:model:{}:0:0", pid(i, s.callers[i].generation))
    }

    pub fn key_index(&self, i: usize) -> usize {
        self.key_of[i]
    }

    /// What caller `i` does about `found`: the engine's decision table, through a planted bug
    /// when there is one.
    pub fn next(
        &self,
        s: &State,
        i: usize,
        found: Option<&Record>,
        reconciler: bool,
    ) -> Result<Next, Error> {
        let (now, instance) = (self.clock(s, i), self.instance(s, i));
        let next = for_model::next(&self.calls[i], found, now, &instance, reconciler)?;
        let in_flight = found.is_some_and(|r| r.status == Status::InFlight);
        Ok(match next {
            Next::RefuseInDoubt if self.is(Mutant::RerunUnderFail) => Next::Claim,
            Next::RefuseInDoubt | Next::Claim | Next::Reconcile
                if in_flight && self.is(Mutant::LeaseHoldsForever) =>
            {
                Next::Wait
            }
            Next::AskApproval if self.is(Mutant::ApprovalNotAsked) => Next::Claim,
            next => next,
        })
    }

    /// The fence, through a planted bug when there is one.
    fn admits(
        &self,
        expected: &Record,
        stored: &Record,
        writer: &str,
        now: u64,
        instance: &str,
    ) -> bool {
        admits(expected.fence(), stored, writer, now, instance)
            || (self.is(Mutant::FenceAdmitsStaleWriter) && expected.owner.as_str() == writer)
    }

    fn outlived(&self, record: &Record, bound: u64, now: u64) -> bool {
        outlived(record, Duration::from_millis(bound), now)
            || (self.is(Mutant::RetentionRemovesInDoubt) && record.status == Status::InDoubt)
    }

    /// What this machine tells of `owner`'s process: alive (running or stopped) or gone.
    fn liveness(&self, s: &State, owner: &Owner) -> Liveness {
        let (_, pid_of) = owner.process().expect("the model's owners name a process");
        let alive =
            s.callers.iter().enumerate().any(|(i, c)| pid(i, c.generation) == pid_of && c.alive());
        if alive {
            Liveness::Alive { pid: pid_of }
        } else {
            Liveness::Gone { pid: pid_of }
        }
    }

    fn ttl(&self) -> Option<Duration> {
        self.scenario.ttl.map(Duration::from_millis)
    }

    // --- the store -------------------------------------------------------------------------

    /// What the store writes of `new` at `now`: an in-flight record with a lease from the
    /// writer's reading of the clock, any other without one (as the PostgreSQL store does).
    fn leased(&self, mut new: Record, now: u64) -> Record {
        new.lease_until =
            (new.status == Status::InFlight).then(|| now + self.scenario.bounds.lease);
        new
    }

    /// `insert_if_absent`: the token, or `Err` when a record is there.
    fn insert(&self, s: &mut State, k: usize, new: Record, now: u64) -> Result<u64, ()> {
        if s.keys[k].record.is_some() {
            return Err(());
        }
        Ok(self.land(s, k, Some(new), now))
    }

    /// `compare_and_swap`, fenced by `admits` on the writer's clock and instance: the token, or
    /// `None` when refused.
    fn swap(
        &self,
        s: &mut State,
        k: usize,
        expected: &Record,
        new: Option<Record>,
        by: Writer<'_>,
    ) -> Option<u64> {
        let Writer { writer, now, instance } = by;
        let stored = s.keys[k].record.clone()?;
        if !self.admits(expected, &stored.0, writer, now, instance) {
            return None;
        }
        // An owner's own write (a settling write) must find its own record as it left it.
        if expected.owner.as_str() == writer && stored.0.fence() != expected.fence() {
            s.broken.stale_write = true;
        }
        Some(self.land(s, k, new, now))
    }

    fn land(&self, s: &mut State, k: usize, new: Option<Record>, now: u64) -> u64 {
        s.seq += 1;
        let new = new.map(|r| self.leased(r, now));
        let slot = &mut s.keys[k];
        if let Some(done) = new.as_ref().filter(|r| r.status == Status::Done) {
            slot.recorded.insert(done.result.clone().unwrap_or_default());
        }
        slot.record = new.map(Rec);
        s.seq
    }

    /// The system of record takes the effect of the run with `token`; one that deduplicates the
    /// key answers a repeat with the first answer, and no second effect.
    fn send_effect(&self, slot: &mut Slot, token: u64) -> Effect {
        if let (true, Some(first)) = (self.scenario.keyed_vendor, &slot.landed) {
            return Effect::Landed(first.clone());
        }
        slot.effects += 1;
        slot.landed = Some(result_of(token));
        Effect::Landed(result_of(token))
    }

    // --- a caller's steps ------------------------------------------------------------------

    fn owner(&self, s: &State, i: usize) -> Owner {
        Owner::from(format!("{}#{}", self.instance(s, i), s.callers[i].claims))
    }

    fn end(s: &mut State, i: usize, outcome: Outcome) {
        s.callers[i].phase = Phase::Ended;
        s.callers[i].outcome = Some(outcome);
    }

    /// The caller decides over `found` and makes the write the decision says.
    fn decide(&self, s: &mut State, i: usize, found: Option<Rec>) {
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
                let step =
                    transition::take_over_to_reconcile(&found.0, &owner, Some(FUNCTION), now);
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
            Next::AskApproval => {
                s.callers[i].claims += 1;
                let owner = self.owner(s, i);
                match &found {
                    None => {
                        let step = transition::request_approval(
                            &self.keys[k],
                            TOOL,
                            SCOPE,
                            Some(FUNCTION),
                            &owner,
                            now,
                        );
                        if self
                            .insert(s, k, step.new.expect("a request leaves a record"), now)
                            .is_ok()
                        {
                            s.keys[k].requested = Some(role.amount);
                        }
                    }
                    Some(found) => {
                        let step = transition::request_approval_again(
                            &found.0,
                            &owner,
                            Some(FUNCTION),
                            now,
                        );
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
            Next::Claim => self.claim(s, i, found),
        }
    }

    /// Makes the key caller `i`'s: a reservation, or a takeover of `found`.
    fn claim(&self, s: &mut State, i: usize, found: Option<Rec>) {
        let k = self.key_of[i];
        let now = self.clock(s, i);
        s.callers[i].claims += 1;
        let owner = self.owner(s, i);
        let taken = match &found {
            None => {
                let step =
                    transition::reserve(&self.keys[k], TOOL, SCOPE, Some(FUNCTION), &owner, now);
                self.insert(s, k, step.new.expect("a reservation leaves a record"), now)
            }
            Some(found) => {
                let step = transition::take_over(&found.0, &owner, Some(FUNCTION), now);
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
    fn start_body(&self, s: &mut State, i: usize) {
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
    fn settle(&self, s: &mut State, i: usize, held: &Record, new: Option<Record>) -> bool {
        let (k, now, instance) = (self.key_of[i], self.clock(s, i), self.instance(s, i));
        self.swap(s, k, held, new, Writer { writer: held.owner.as_str(), now, instance: &instance })
            .is_some()
    }

    fn held(s: &State, i: usize) -> Held {
        match &s.callers[i].phase {
            Phase::Owned(held) => held.clone(),
            phase => unreachable!("caller {i} owns nothing: {phase:?}"),
        }
    }

    fn return_ok(&self, s: &mut State, i: usize) {
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

    fn return_err(&self, s: &mut State, i: usize) {
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

    fn answer(&self, s: &mut State, i: usize, truthful: bool) {
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

    fn tx_begin(&self, s: &mut State, i: usize) {
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
                    None => {
                        transition::reserve(&self.keys[k], TOOL, SCOPE, Some(FUNCTION), &owner, now)
                    }
                    Some(found) => transition::take_over(&found.0, &owner, Some(FUNCTION), now),
                };
                let pending = Rec(self.leased(step.new.expect("a claim leaves a record"), now));
                let token = s.seq + 1;
                s.callers[i].phase = Phase::Tx(TxRun { found, pending, token, effect: false });
            }
            Ok(Next::RefuseInDoubt) => done(s, Outcome::Err("in-doubt")),
            Ok(Next::Denied) => done(s, Outcome::Err("denied")),
            Ok(Next::AwaitDecision) => done(s, Outcome::Err("awaiting-approval")),
            Ok(next) => unreachable!("a transactional call has no {next:?}"),
            Err(_) => done(s, Outcome::Err("shared-tool-name")),
        }
    }

    fn tx_commit(&self, s: &mut State, i: usize) {
        let Phase::Tx(run) = s.callers[i].phase.clone() else { unreachable!() };
        let k = self.key_of[i];
        let value = result_of(run.token);
        let step =
            transition::complete(&run.pending.0, value.clone(), self.ttl(), self.clock(s, i));
        // Under the write lock nothing changed since the transaction read the key.
        assert_eq!(s.keys[k].record, run.found, "the write lock keeps the key as read");
        let now = self.clock(s, i);
        // The reservation and the completion are one commit: two writes, one token.
        self.land(s, k, step.new, now);
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
        s.lock = None;
        Self::end(s, i, Outcome::Ok(value));
    }

    // --- the other actors ------------------------------------------------------------------

    fn operator_may_read(&self, s: &State) -> Option<usize> {
        let now = s.now + self.scenario.bounds.skew;
        (0..self.keys.len()).find(|&k| {
            let record = s.keys[k].record.as_ref().map(|r| &r.0);
            record.is_some() && assess(record, now, OPERATOR_INSTANCE) == Assessment::InDoubt
        })
    }

    fn operator_resolve(&self, s: &mut State) {
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

    fn person_decide(&self, s: &mut State, approve: bool) {
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

    fn retention_delete(&self, s: &mut State) {
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

    fn tick(&self, s: &mut State) {
        s.now += 1;
        // Each running owner's heartbeat renews its lease, as the PostgreSQL store's renewal
        // does: only a lease that has not lapsed, on the owner's reading of the clock.
        for k in 0..s.keys.len() {
            let Some(Rec(record)) = &s.keys[k].record else { continue };
            if record.status != Status::InFlight {
                continue;
            }
            let owner = s.callers.iter().enumerate().find(|(i, c)| {
                c.alive() && !c.paused && self.instance(s, *i) == record.owner.instance()
            });
            if let Some((i, _)) = owner {
                let now = self.clock(s, i);
                if record.lease_until.is_some_and(|until| until > now) {
                    let renewed = now + self.scenario.bounds.lease;
                    if let Some(Rec(r)) = &mut s.keys[k].record {
                        r.lease_until = Some(renewed);
                    }
                }
            }
        }
    }
}

/// The process id of caller `i`'s `generation`-th process.
fn pid(i: usize, generation: u8) -> u32 {
    1 + 10 * i as u32 + u32::from(generation)
}

/// The result a run with fencing token `token` returns, as JSON text.
fn result_of(token: u64) -> String {
    token.to_string()
}

/// The key starts afresh: its result was removed or expired, so a new run is a new effect.
fn fresh_epoch(slot: &mut Slot) {
    slot.effects = 0;
    slot.reruns = 0;
}

impl Model for Lifecycle {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: START,
            seq: 0,
            keys: vec![Slot::default(); self.keys.len()],
            callers: vec![Caller::new(); self.scenario.callers.len()],
            operator: Reader::default(),
            person: Reader::default(),
            retention: Reader::default(),
            lock: None,
            crashes: 0,
            restarts: 0,
            pauses: 0,
            broken: Default::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.scenario.bounds;
        let locked = |i: usize| s.lock.is_some_and(|holder| holder != i);
        for (i, c) in s.callers.iter().enumerate() {
            let role = self.scenario.callers[i];
            if c.active() && !locked(i) {
                match &c.phase {
                    Phase::Idle if role.transactional => actions.push(Action::TxBegin(i)),
                    Phase::Idle => actions.push(Action::Decide(i)),
                    Phase::Owned(held) if !held.started => {
                        actions.push(Action::StartBody(i));
                        actions.push(Action::Drop(i));
                    }
                    Phase::Owned(held) => {
                        match &held.effect {
                            Effect::NotYet => {
                                actions.push(Action::SendEffect(i));
                                actions.push(Action::ReturnErr(i));
                            }
                            Effect::Landed(_) => actions.push(Action::ReturnOk(i)),
                        }
                        actions.push(Action::Fail(i));
                    }
                    Phase::Reconciling(_) => {
                        actions.push(Action::Answer(i, true));
                        actions.push(Action::Answer(i, false));
                    }
                    // The body writes its effect, then returns `Ok` (commit) or `Err`.
                    Phase::Tx(run) => {
                        match run.effect {
                            false => actions.push(Action::TxEffect(i)),
                            true => actions.push(Action::TxCommit(i)),
                        }
                        actions.push(Action::TxRollback(i));
                    }
                    Phase::Ended | Phase::Crashed => {}
                }
            }
            let holds = matches!(c.phase, Phase::Owned(_) | Phase::Reconciling(_));
            // A crash matters where the caller holds something: elsewhere it is a caller that
            // takes no more steps, which the exploration already has.
            let holding = holds || matches!(c.phase, Phase::Tx(_));
            if holding && s.crashes < b.crashes {
                actions.push(Action::Crash(i));
            }
            if holds && !c.paused && s.pauses < b.pauses {
                actions.push(Action::Pause(i));
            }
            if c.paused {
                actions.push(Action::Resume(i));
            }
            if c.phase == Phase::Crashed && s.restarts < b.restarts {
                actions.push(Action::Restart(i));
            }
        }
        if s.lock.is_none() {
            let operator = self.scenario.operator && s.operator.acts < b.resolves;
            if operator && self.operator_may_read(s).is_some() {
                actions.push(Action::OperatorResolve);
            }
            if s.person.acts < b.decisions && awaiting(s).is_some() {
                actions.push(Action::PersonDecide(true));
                actions.push(Action::PersonDecide(false));
            }
            if let Some(bound) = self.scenario.retention {
                match s.retention.read {
                    None => {
                        let now = s.now + b.skew;
                        for (k, slot) in s.keys.iter().enumerate() {
                            if slot.record.as_ref().is_some_and(|r| self.outlived(&r.0, bound, now))
                            {
                                actions.push(Action::RetentionScan(k));
                            }
                        }
                    }
                    Some(_) => actions.push(Action::RetentionDelete),
                }
            }
        }
        // Time matters to a lease, a ttl, an approval's ttl and retention: it advances only
        // while one of them can see it.
        let timed = self.scenario.ttl.is_some()
            || self.scenario.approval_ttl.is_some()
            || self.scenario.retention.is_some();
        let watched = s.keys.iter().any(|slot| match &slot.record {
            Some(r) => timed || r.0.status == Status::InFlight,
            None => false,
        });
        if s.now < START + b.ticks && watched {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Decide(i) => {
                let found = s.keys[self.key_of[i]].record.clone();
                self.decide(&mut s, i, found);
            }
            Action::StartBody(i) => self.start_body(&mut s, i),
            Action::Drop(i) => {
                let held = Self::held(&s, i);
                let step = transition::undo(
                    &held.record.0,
                    held.before.as_ref().map(|b| &b.0),
                    self.clock(&s, i),
                );
                self.settle(&mut s, i, &held.record.0, step.new);
                Self::end(&mut s, i, Outcome::Err("dropped"));
            }
            Action::SendEffect(i) => {
                let held = Self::held(&s, i);
                let effect = self.send_effect(&mut s.keys[self.key_of[i]], held.token);
                if let Phase::Owned(held) = &mut s.callers[i].phase {
                    held.effect = effect;
                }
            }
            Action::ReturnOk(i) => self.return_ok(&mut s, i),
            Action::ReturnErr(i) => self.return_err(&mut s, i),
            Action::Fail(i) => {
                let held = Self::held(&s, i);
                let step = transition::leave_in_doubt(
                    &held.record.0,
                    transition::DROPPED,
                    self.clock(&s, i),
                );
                self.settle(&mut s, i, &held.record.0, step.new);
                Self::end(&mut s, i, Outcome::Err("body"));
            }
            Action::Answer(i, truthful) => self.answer(&mut s, i, truthful),
            Action::TxBegin(i) => self.tx_begin(&mut s, i),
            Action::TxEffect(i) => {
                let k = self.key_of[i];
                if let Phase::Tx(run) = &mut s.callers[i].phase {
                    run.effect = true;
                    if self.is(Mutant::TransactionCommitsEffectEarly) {
                        let slot = &mut s.keys[k];
                        slot.tx_effects.insert(run.token);
                        slot.effects += 1;
                    }
                }
            }
            Action::TxCommit(i) => self.tx_commit(&mut s, i),
            Action::TxRollback(i) => {
                s.lock = None;
                Self::end(&mut s, i, Outcome::Err("body"));
            }
            Action::Crash(i) => {
                s.crashes += 1;
                s.callers[i].phase = Phase::Crashed;
                s.callers[i].paused = false;
                if s.lock == Some(i) {
                    // The kernel lets go of its lock; nothing it wrote in the transaction stays.
                    s.lock = None;
                }
            }
            Action::Pause(i) => {
                s.pauses += 1;
                s.callers[i].paused = true;
            }
            Action::Resume(i) => s.callers[i].paused = false,
            Action::Restart(i) => {
                s.restarts += 1;
                let c = &mut s.callers[i];
                *c = Caller { generation: c.generation + 1, claims: 0, ..Caller::new() };
            }
            Action::OperatorResolve => self.operator_resolve(&mut s),
            Action::PersonDecide(approve) => self.person_decide(&mut s, approve),
            Action::RetentionScan(k) => {
                s.retention.read = Some((k, s.keys[k].record.clone().expect("a record")));
            }
            Action::RetentionDelete => self.retention_delete(&mut s),
            Action::Tick => self.tick(&mut s),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        super::properties::all()
    }
}

/// A key awaiting a person's decision.
fn awaiting(s: &State) -> Option<usize> {
    s.keys.iter().position(|slot| {
        slot.record.as_ref().is_some_and(|r| r.0.status == Status::AwaitingApproval)
    })
}
