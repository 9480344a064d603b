//! Every transition of a record, written once. Each returns the record it makes (or `None` for
//! a record deleted) with the history [`Change`] that goes with it, as one [`Step`], for the
//! caller to write with the store's compare-and-swap. The engine, the operator interface and a
//! store's open-time clean-up all change records through these and nothing else.
//!
//! ```text
//! absent ──reserve──▶ in-flight ──complete──▶ done ──(ttl passes)──▶ take_over ──▶ in-flight
//!                        │  ▲
//!           release ◀────┤  └──take_over (in_doubt = "rerun")── in-doubt
//!   undo (the call ended │
//!   before its body)     └──leave_in_doubt──▶ in-doubt ◀──mark_died (sled, at open)
//!
//! in-doubt ──take_over_to_reconcile──▶ in-flight (same attempts; the reconciler runs)
//!                                        ├─ landed ──settle_landed──▶ done
//!                                        ├─ not landed ──settle_not_landed──▶ absent
//!                                        └─ cannot tell, an error ──settle_cannot_tell──▶ in-doubt
//! in-doubt ──resolve (an operator)──▶ done or absent
//! done ──purge (an operator)──▶ absent, with its history
//!
//! a tool that needs approval, instead of reserve (and of taking over an expired result):
//! absent, done (expired) ──request_approval(_again)──▶ awaiting-approval
//! awaiting-approval ──decide (a person)──▶ approved or denied
//! approved ──take_over──▶ in-flight (the body runs once, as above)
//! approved (past the call's approval_ttl) ──request_approval_again──▶ awaiting-approval
//! denied ──purge (an operator)──▶ absent, with its history
//! ```

use std::borrow::Cow;
use std::time::Duration;

use super::lease::Lease;
use super::owner::{Liveness, Owner};
use super::record::Record;
use super::status::Status;
use crate::lifecycle::history::{Answer, Change, Event};

/// A transition: the record it leaves (`None`: deleted) and the change the history records.
#[derive(Debug)]
pub struct Step<'a> {
    /// The record the transition leaves; `None` when it deletes the record.
    pub new: Option<Record>,
    /// What the key's history records of it.
    pub change: Change<'a>,
}

/// Why an interrupted call leaves its key in doubt, as its history says.
pub const DROPPED: &str =
    "the body panicked, its future was dropped, or its result could not be stored";

/// Why the open of a single-process store marks a record in doubt.
pub const DIED: &str = "left in flight by a process that died; marked when the store opened";

/// A record of a new call, in flight (for [`reserve`], and for tests that need a record).
pub fn reserve_record(
    key: &str,
    tool: &str,
    scope: &str,
    function: Option<&str>,
    owner: &Owner,
    now: u64,
) -> Record {
    let mut record = Record::reserve(key, tool, scope, owner, now);
    record.function = function.map(str::to_owned);
    record
}

/// The lease a record left in flight at `now` carries, on the store's `terms`
/// ([`Instance::lease`](crate::store::Instance::lease)): until [`Lease::until`] `now`, or none
/// for a store whose records carry no lease. Every transition into in-flight stamps it, so that
/// the engine, not the store, sets every lease; a store stores it as given.
fn stamp(mut record: Record, terms: Option<Lease>, now: u64) -> Record {
    record.lease_until = terms.map(|terms| terms.until(now));
    record
}

/// absent → in-flight: a call reserves its key, at `now` on the store's clock, with a lease on
/// the store's `lease` terms.
pub fn reserve<'a>(
    key: &str,
    tool: &str,
    scope: &str,
    function: Option<&str>,
    owner: &'a Owner,
    now: u64,
    lease: Option<Lease>,
) -> Step<'a> {
    Step {
        new: Some(stamp(reserve_record(key, tool, scope, function, owner, now), lease, now)),
        change: Change::new(Event::Reserved, owner.as_str()),
    }
}

/// done (expired) or in-doubt → in-flight: a call takes the record over to run the body again,
/// with a new lease on the store's `lease` terms. `function` is the calling function's path,
/// when the call names one.
pub fn take_over<'a>(
    found: &Record,
    owner: &'a Owner,
    function: Option<&str>,
    now: u64,
    lease: Option<Lease>,
) -> Step<'a> {
    let mut new = stamp(found.taken_over(owner, now), lease, now);
    if let Some(function) = function {
        new.function = Some(function.to_owned());
    }
    let why = match found.status {
        Status::Done => "its result expired",
        Status::Approved => "approved by a person: the call runs it",
        _ => "in doubt, and the call reruns it (in_doubt = \"rerun\")",
    };
    Step { new: Some(new), change: Change::new(Event::TookOver, owner.as_str()).with_note(why) }
}

/// in-doubt → in-flight, same attempts: a call or a sweep takes the record over to ask the
/// tool's reconciler, with a new lease on the store's `lease` terms. A sweep names no function
/// and keeps the record's.
pub fn take_over_to_reconcile<'a>(
    found: &Record,
    owner: &'a Owner,
    function: Option<&str>,
    now: u64,
    lease: Option<Lease>,
) -> Step<'a> {
    let mut new = stamp(found.reconciling(owner, now), lease, now);
    if let Some(function) = function {
        new.function = Some(function.to_owned());
    }
    let change = Change::new(Event::TookOver, owner.as_str())
        .with_note("to ask the tool's reconciler whether the effect landed");
    Step { new: Some(new), change }
}

/// in-flight → done: the body returned `Ok(json)`.
pub fn complete(held: &Record, json: String, ttl: Option<Duration>, now: u64) -> Step<'_> {
    Step {
        new: Some(held.done_json(json, now, ttl)),
        change: Change::new(Event::Done, held.owner.as_str()),
    }
}

/// in-flight → absent: the body returned `Err` before its effect could land.
pub fn release(held: &Record) -> Step<'_> {
    Step { new: None, change: Change::new(Event::Released, held.owner.as_str()) }
}

/// approved → absent: the run an approval let through failed inside a transaction, whose
/// rollback put the record back approved (`owner` is the run's). The approval is used, as a
/// plain call's failed run uses it (its [`release`]), and the next call asks again.
pub fn spend_approval(owner: &Owner) -> Step<'_> {
    let note = "the approved run failed, and its transaction rolled back";
    Step { new: None, change: Change::new(Event::Released, owner.as_str()).with_note(note) }
}

/// in-flight → in-doubt: the effect may have landed, for the reason `why`.
pub fn leave_in_doubt<'a>(held: &'a Record, why: impl Into<Cow<'a, str>>, now: u64) -> Step<'a> {
    Step {
        new: Some(held.in_doubt(now)),
        change: Change::new(Event::InDoubt, held.owner.as_str()).with_note(why),
    }
}

/// in-flight → as before the call: its body never started, so nothing landed. A first
/// reservation (`before` is `None`) is deleted; a takeover puts back what it replaced (an
/// in-doubt key stays in doubt, an expired result stays expired, and a record in flight under
/// an owner that no longer held it is put back in doubt), written as the call's own write (on a
/// store with leases only the owner replaces an in-flight record while its lease holds, and the
/// call's lease holds until this lands).
pub fn undo<'a>(held: &'a Record, before: Option<&Record>, now: u64) -> Step<'a> {
    let new = before.map(|before| {
        let back = Record { owner: held.owner.clone(), ..before.clone() };
        match back.status {
            Status::InFlight => back.in_doubt(now),
            _ => back,
        }
    });
    let change = Change::new(Event::Undone, held.owner.as_str())
        .with_note("the call ended before its body started");
    Step { new, change }
}

/// in-flight (reconciling) → done: the reconciler found the effect landed, with `json`.
pub fn settle_landed(held: &Record, json: String, ttl: Option<Duration>, now: u64) -> Step<'_> {
    let change = Change::new(Event::Reconciled { answer: Answer::Landed }, held.owner.as_str());
    Step { new: Some(held.done_json(json, now, ttl)), change }
}

/// in-flight (reconciling) → absent: the reconciler found the effect did not land.
pub fn settle_not_landed(held: &Record) -> Step<'_> {
    let change = Change::new(Event::Reconciled { answer: Answer::NotLanded }, held.owner.as_str());
    Step { new: None, change }
}

/// in-flight (reconciling) → in-doubt: the reconciler could not tell or erred, for `reason`.
pub fn settle_cannot_tell<'a>(
    held: &'a Record,
    answer: Answer,
    reason: &'a str,
    now: u64,
) -> Step<'a> {
    let change = Change::new(Event::Reconciled { answer }, held.owner.as_str()).with_note(reason);
    Step { new: Some(held.in_doubt(now)), change }
}

/// absent → awaiting-approval: a call of a tool that needs approval records its key for a
/// person to decide; the body does not run.
pub fn request_approval<'a>(
    key: &str,
    tool: &str,
    scope: &str,
    function: Option<&str>,
    owner: &'a Owner,
    now: u64,
) -> Step<'a> {
    let mut new = Record::awaiting_approval(key, tool, scope, owner, now);
    new.function = function.map(str::to_owned);
    Step { new: Some(new), change: Change::new(Event::ApprovalRequested, owner.as_str()) }
}

/// done (past its `ttl`) or approved (past the call's `approval_ttl`) → awaiting-approval: the
/// call asks a person again, as for a new key.
pub fn request_approval_again<'a>(
    found: &Record,
    owner: &'a Owner,
    function: Option<&str>,
    now: u64,
) -> Step<'a> {
    let mut new = found.approval_asked_again(owner, now);
    new.function = function.map(str::to_owned).or_else(|| found.function.clone());
    let why = match found.status {
        Status::Approved => "its approval expired before a call used it",
        _ => "its result expired",
    };
    let change = Change::new(Event::ApprovalRequested, owner.as_str()).with_note(why);
    Step { new: Some(new), change }
}

/// How a person decides a key that awaits approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Let the next call run the body, once.
    Approve,
    /// Refuse it: every call returns `Error::Denied`, with the note.
    Deny,
}

impl Decision {
    /// The one spelling of the decision: `approve`, `deny`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        }
    }
}

/// awaiting-approval → approved or denied: a person (`by`, their `user@host`) decides, with
/// `note`. Only a key that awaits approval is decided: the fence makes one of two racing
/// decisions win, and the other finds the key decided.
pub fn decide<'a>(
    current: &Record,
    decision: Decision,
    by: &'a str,
    note: Option<&'a str>,
    now: u64,
) -> Step<'a> {
    let (status, event) = match decision {
        Decision::Approve => (Status::Approved, Event::Approved),
        Decision::Deny => (Status::Denied, Event::Denied),
    };
    let mut change = Change::new(event, by);
    if let Some(note) = note {
        change = change.with_note(note);
    }
    Step { new: Some(current.decided(status, now)), change }
}

/// How an operator settles a record in doubt.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Resolution {
    /// The effect did not land: delete the record, so that the next call runs the body.
    Release,
    /// The effect landed: record this result, which later calls replay.
    Done(serde_json::Value),
}

/// in-doubt → done or absent: an operator (`by`, their `user@host`) settles it, with `note`.
pub fn resolve<'a>(
    current: &Record,
    resolution: &Resolution,
    by: &'a str,
    note: Option<&'a str>,
    now: u64,
) -> Step<'a> {
    let new = match resolution {
        Resolution::Release => None,
        Resolution::Done(result) => Some(current.done(result.clone(), now, None)),
    };
    let mut change = Change::new(Event::Resolved, by);
    if let Some(note) = note {
        change = change.with_note(note);
    }
    Step { new, change }
}

/// Whether an operator's [`resolve`] of `current` must be refused because its owner may still
/// run the body: the record is still in flight (its lease ran out, or it was found so) and its
/// owner's process runs on this host (`liveness`, from [`Owner::liveness`]), stopped or slow.
/// Settling it then could let the effect happen twice when the owner resumes. The owner's pid
/// when refused; an operator may still force it.
pub fn owner_may_resume(current: &Record, liveness: &Liveness) -> Option<u32> {
    match (current.status, liveness) {
        (Status::InFlight, Liveness::Alive { pid }) => Some(*pid),
        _ => None,
    }
}

/// done or denied → absent, with the key's history: an operator (`by`) purges a finished record.
pub fn purge(by: &str) -> Step<'_> {
    Step { new: None, change: Change::new(Event::Purged, by) }
}

/// No transition: what the history records when the fence refused `held`'s owner its final
/// write (its result, or its word that the key is in doubt) because the key moved on while the
/// body ran, so that an operator sees a stale owner came back after its effect ran. The store
/// appends it without changing the record (`Store::append_history`).
pub fn refuse_late_write(held: &Record) -> Change<'_> {
    Change::new(Event::LateWriteRefused, held.owner.as_str()).with_note(
        "its body finished after the key moved on (taken over or settled while it ran): its \
         effect ran, its write was refused",
    )
}

/// in-flight → in-doubt at the open of a single-process store: the record was left by a
/// process that died. `instance` is the store instance that opens it.
pub fn mark_died<'a>(record: &Record, instance: &'a str, now: u64) -> Step<'a> {
    Step {
        new: Some(record.in_doubt(now)),
        change: Change::new(Event::InDoubt, instance).with_note(DIED),
    }
}
