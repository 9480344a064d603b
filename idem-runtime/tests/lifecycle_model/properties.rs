//! The seven properties, each checked in every reachable state.

use idem_runtime::for_model::Next;
use idem_runtime::Status;
use stateright::Property;

use super::model::Lifecycle;
use super::state::{Outcome, Phase, State};

pub const AT_MOST_ONCE: &str =
    "1. an effect happens at most once per key (under rerun: once more per recorded takeover)";
pub const RECORDED_RESULT: &str = "2. a caller that gets Ok gets a result the key recorded";
pub const NOT_IN_FLIGHT_FOREVER: &str =
    "3. a record in flight under an owner that is gone is in doubt once its lease lapsed";
pub const FENCED_WRITE: &str = "4. a fenced owner's write is never accepted";
pub const APPROVAL_ONCE: &str = "5. an approval is used only by the intent approved, at most once";
pub const RETENTION_KEEPS: &str = "6. retention removes only finished records";
pub const TX_TOGETHER: &str = "7. a transactional call's effect and record commit together";

pub fn all() -> Vec<Property<Lifecycle>> {
    vec![
        Property::always(AT_MOST_ONCE, at_most_once),
        Property::always(RECORDED_RESULT, recorded_result),
        Property::always(NOT_IN_FLIGHT_FOREVER, not_in_flight_forever),
        Property::always(FENCED_WRITE, |_, s: &State| !s.broken.stale_write),
        Property::always(APPROVAL_ONCE, approval_once),
        Property::always(RETENTION_KEEPS, |_, s: &State| s.broken.removed_unfinished.is_none()),
        Property::always(TX_TOGETHER, |_, s: &State| {
            s.keys.iter().all(|k| k.tx_effects == k.tx_records)
        }),
    ]
}

/// Effects since the key last started afresh: one under `fail`, and one more per recorded
/// takeover of the key in doubt under `rerun`.
fn at_most_once(m: &Lifecycle, s: &State) -> bool {
    let rerun = m.scenario.reruns();
    s.keys.iter().all(|k| k.effects <= 1 + if rerun { k.reruns } else { 0 })
}

/// Every `Ok` a caller got is a result its key recorded `done` (not another key's, and not a
/// result whose write the fence refused).
fn recorded_result(m: &Lifecycle, s: &State) -> bool {
    s.callers.iter().enumerate().all(|(i, c)| match &c.outcome {
        Some(Outcome::Ok(result)) => s.keys[m.key_index(i)].recorded.contains(result),
        _ => true,
    })
}

/// An in-flight record whose owner's process is gone, once its lease lapsed on every reading
/// of the clock, is one that no caller waits for: each decides over it as a key in doubt.
fn not_in_flight_forever(m: &Lifecycle, s: &State) -> bool {
    let skew = m.scenario.bounds.skew;
    s.keys.iter().all(|slot| {
        let Some(record) = slot.record.as_ref().map(|r| &r.0) else { return true };
        if record.status != Status::InFlight {
            return true;
        }
        let owner_gone = !s
            .callers
            .iter()
            .enumerate()
            .any(|(i, c)| c.alive() && m.instance(s, i) == record.owner.instance());
        let lapsed = record.lease_until.is_some_and(|until| s.now >= until + skew);
        if !(owner_gone && lapsed) {
            return true;
        }
        (0..s.callers.len())
            .filter(|&i| s.callers[i].phase != Phase::Crashed)
            .all(|i| !matches!(m.next(s, i, Some(record), false), Ok(Next::Wait)))
    })
}

fn approval_once(_: &Lifecycle, s: &State) -> bool {
    !s.broken.wrong_intent
        && !s.broken.unapproved_run
        && s.keys.iter().all(|k| k.approved_runs <= k.approvals)
}
