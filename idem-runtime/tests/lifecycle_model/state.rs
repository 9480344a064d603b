//! What the model's state holds: the key's record as the store keeps it, each actor's place in
//! its steps, and the ghost counters the properties read (what happened, which the record alone
//! does not say: how many effects landed, which results were ever recorded, who approved what).

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

use idem_runtime::Record;

/// A record, compared and hashed by every field (the lifecycle's `Record` is not `Hash`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec(pub Record);

impl Hash for Rec {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let r = &self.0;
        (&r.key, r.status, &r.tool, &r.function, &r.scope, r.owner.as_str()).hash(h);
        (r.attempts, r.created_at, r.updated_at, r.completed_at, r.expires_at).hash(h);
        (r.lease_until, &r.result).hash(h);
    }
}

/// One key: its record, and what the properties need to know of its past.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The record the store holds (`None`: absent).
    pub record: Option<Rec>,
    /// Effects that landed in the system of record since the key last started afresh (a
    /// finished record removed, or an expired result run or asked for again).
    pub effects: u8,
    /// Recorded takeovers of the key in doubt (`in_doubt = "rerun"`) since then.
    pub reruns: u8,
    /// The result of the last effect that landed: what a reconciler or an operator finds there.
    pub landed: Option<String>,
    /// Every result a `done` record of this key ever held.
    pub recorded: BTreeSet<String>,
    /// The intent (the amount) of the last request for approval, and of the approved one.
    pub requested: Option<u8>,
    pub approved_for: Option<u8>,
    /// Approvals given, and runs that used one.
    pub approvals: u8,
    pub approved_runs: u8,
    /// Tokens of transactional calls whose effect, and whose record, committed.
    pub tx_effects: BTreeSet<u64>,
    pub tx_records: BTreeSet<u64>,
}

/// What a caller got back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `Ok`, with the result as JSON text.
    Ok(String),
    /// An error, by its kind.
    Err(&'static str),
}

/// Where the body's effect stands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    NotYet,
    /// It landed (or the system of record answered it as a repeat of one that had): the
    /// result the body returns.
    Landed(String),
}

/// What a call holds while it owns the key (the engine's `Reservation`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    pub record: Rec,
    /// What the claim replaced (`None`: a first reservation), for `undo`.
    pub before: Option<Rec>,
    pub token: u64,
    pub started: bool,
    pub effect: Effect,
    /// Whether the claim took over an approved record: the body runs under that approval.
    pub approved: bool,
}

/// A transactional call's run, under the store's write lock: nothing of it is visible to
/// others until it commits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TxRun {
    /// The record found when the transaction began.
    pub found: Option<Rec>,
    /// The record reserved (or taken over) inside the transaction.
    pub pending: Rec,
    pub token: u64,
    pub effect: bool,
}

/// A caller's place in its call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to read the key and decide (a call begins, a wait ends, or a write was refused).
    Idle,
    /// Owns the key: the body may run.
    Owned(Held),
    /// Took the key over to ask the reconciler.
    Reconciling(Rec),
    /// A transactional call inside its transaction.
    Tx(TxRun),
    /// The call returned.
    Ended,
    /// Its process died (SIGKILL): no `Drop`, no settling write.
    Crashed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// How many times its process restarted: each restart is a new store instance.
    pub generation: u8,
    /// How many times it claimed the key (its owners are numbered by it).
    pub claims: u8,
    pub phase: Phase,
    /// Stopped (SIGSTOP, a long pause): it renews no lease and takes no step until resumed.
    pub paused: bool,
    /// Whether the call asked its reconciler (a call asks once).
    pub asked: bool,
    pub outcome: Option<Outcome>,
}

/// What the person deciding approvals, the operator and retention are doing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reader {
    /// The key and the record a retention pass read, before it deletes it.
    pub read: Option<(usize, Rec)>,
    /// How many writes it made (or tried).
    pub acts: u8,
}

/// Whether a property broke at a step: set where the break happens, read by the properties.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Broken {
    /// The store accepted an owner's write over a record that had moved on.
    pub stale_write: bool,
    /// A run used an approval given for another intent.
    pub wrong_intent: bool,
    /// A call of a tool that needs approval ran its body without one.
    pub unapproved_run: bool,
    /// Retention removed a record that was not finished (its status then).
    pub removed_unfinished: Option<idem_runtime::Status>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The store's clock (milliseconds); each actor reads it with its own skew.
    pub now: u64,
    /// The store's write counter: every write that lands takes the next number, and an
    /// in-flight record's is its owner's fencing token.
    pub seq: u64,
    pub keys: Vec<Slot>,
    pub callers: Vec<Caller>,
    pub operator: Reader,
    pub person: Reader,
    pub retention: Reader,
    /// The transactional caller that holds the store's write lock.
    pub lock: Option<usize>,
    pub crashes: u8,
    pub restarts: u8,
    pub pauses: u8,
    pub broken: Broken,
}

impl Caller {
    pub fn new() -> Caller {
        Caller {
            generation: 0,
            claims: 0,
            phase: Phase::Idle,
            paused: false,
            asked: false,
            outcome: None,
        }
    }

    /// Whether its process runs (it may be stopped).
    pub fn alive(&self) -> bool {
        self.phase != Phase::Crashed
    }

    /// Whether it can take a step of its call.
    pub fn active(&self) -> bool {
        !self.paused && !matches!(self.phase, Phase::Ended | Phase::Crashed)
    }
}
