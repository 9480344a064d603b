//! The model: what each actor may do in a state (`actions`) and what it leaves
//! (`next_state`), each step made of the lifecycle's own functions. A caller decides with
//! `CallParts::next` (the engine's decision table, here through a planted bug when there is
//! one) and changes the record only through `transition::*` (`caller.rs`); the store admits a
//! write only by `admits` (the fence), on the writer's reading of its clock, and sets and renews
//! leases as the PostgreSQL store does (`store.rs`); the operator resolves through
//! `transition::resolve` after `assess` and `transition::owner_may_resume`, a person decides
//! through `transition::decide`, and retention removes what `outlived` says (`admin.rs`).

use std::time::Duration;

use idem_runtime::for_model::{self, admits, outlived, Next};
use idem_runtime::store::lease::Lease;
use idem_runtime::store::{Liveness, Owner};
use idem_runtime::{Call, Error, Record, Status};
use stateright::Model;

use super::scenario::Scenario;
use super::state::{Caller, Effect, Outcome, Phase, Reader, Slot, State};
use super::Mutant;

/// The store's clock when the model starts (ms): above every skew, so no reading underflows.
pub const START: u64 = 10;
pub(crate) const TOOL: &str = "charge";
pub(crate) const SCOPE: &str = "order-1";
pub(crate) const FUNCTION: &str = "shop::charge";
pub(crate) const OPERATOR: &str = "ops@model";
pub(crate) const PERSON: &str = "ann@model";
/// The store instances of the operator's command and of the retainer.
pub(crate) const OPERATOR_INSTANCE: &str = "pg:model:900:0:0";
pub(crate) const RETAINER_INSTANCE: &str = "pg:model:800:0:0";

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
    pub(crate) calls: Vec<Call>,
    /// Each caller's key, as an index into the state's slots, and the keys.
    pub(crate) key_of: Vec<usize>,
    pub(crate) keys: Vec<String>,
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

    /// Whether `mutant` is the bug planted.
    pub(crate) fn is(&self, mutant: Mutant) -> bool {
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

    /// The terms of the leases the model's store gives (`Instance::lease`), which every
    /// transition into in-flight stamps.
    pub fn lease(&self) -> Option<Lease> {
        Some(for_model::lease(self.scenario.bounds.lease))
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
    pub(crate) fn admits(
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

    /// What retention may remove, through a planted bug when there is one.
    pub(crate) fn outlived(&self, record: &Record, bound: u64, now: u64) -> bool {
        outlived(record, Duration::from_millis(bound), now)
            || (self.is(Mutant::RetentionRemovesInDoubt) && record.status == Status::InDoubt)
    }

    /// What this machine tells of `owner`'s process: alive (running or stopped) or gone.
    pub(crate) fn liveness(&self, s: &State, owner: &Owner) -> Liveness {
        let (_, pid_of) = owner.process().expect("the model's owners name a process");
        let alive =
            s.callers.iter().enumerate().any(|(i, c)| pid(i, c.generation) == pid_of && c.alive());
        if alive {
            Liveness::Alive { pid: pid_of }
        } else {
            Liveness::Gone { pid: pid_of }
        }
    }

    /// The callers' `ttl`.
    pub(crate) fn ttl(&self) -> Option<Duration> {
        self.scenario.ttl.map(Duration::from_millis)
    }
}

/// The process id of caller `i`'s `generation`-th process.
pub(crate) fn pid(i: usize, generation: u8) -> u32 {
    1 + 10 * i as u32 + u32::from(generation)
}

/// The result a run with fencing token `token` returns, as JSON text.
pub(crate) fn result_of(token: u64) -> String {
    token.to_string()
}

/// The key starts afresh: its result was removed or expired, so a new run is a new effect.
pub(crate) fn fresh_epoch(slot: &mut Slot) {
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
            Action::Drop(i) => self.drop_before_body(&mut s, i),
            Action::SendEffect(i) => self.send(&mut s, i),
            Action::ReturnOk(i) => self.return_ok(&mut s, i),
            Action::ReturnErr(i) => self.return_err(&mut s, i),
            Action::Fail(i) => self.fail(&mut s, i),
            Action::Answer(i, truthful) => self.answer(&mut s, i, truthful),
            Action::TxBegin(i) => self.tx_begin(&mut s, i),
            Action::TxEffect(i) => self.tx_effect(&mut s, i),
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
pub(crate) fn awaiting(s: &State) -> Option<usize> {
    s.keys.iter().position(|slot| {
        slot.record.as_ref().is_some_and(|r| r.0.status == Status::AwaitingApproval)
    })
}
