//! A model checker of the lifecycle (issue 43): stateright explores every interleaving of the
//! callers of one key, their crashes (the effect landed or not), restarts, pauses past the
//! lease, clock skew, takeovers under `in_doubt = "rerun"` and under a reconciler's answer, an
//! operator's resolve, approvals (ask, approve, deny, expiry), retention, and a transactional
//! call, and checks seven properties in every reachable state (`properties.rs`; DESIGN.md,
//! "The model of the lifecycle"). The model is built from the lifecycle's own functions, called
//! as the engine calls them (`model.rs`).
//!
//! `IDEM_MODEL_MUTANT=<name>` plants one bug and expects a counterexample;
//! `IDEM_MODEL_MUTANT=list` prints the planted bugs (run with `--nocapture`), and
//! `IDEM_MODEL_SCENARIO=<name>` explores one scenario (`scenario.rs`) alone. Without them,
//! `every_schedule_keeps_the_properties` explores every scenario and prints its bounds and the
//! states it visited, and `every_planted_bug_is_found` runs each planted bug in the scenario
//! that exposes it and prints its counterexample.

#[path = "lifecycle_model/admin.rs"]
mod admin;
#[path = "lifecycle_model/caller.rs"]
mod caller;
#[path = "lifecycle_model/model.rs"]
mod model;
#[path = "lifecycle_model/properties.rs"]
mod properties;
#[path = "lifecycle_model/scenario.rs"]
mod scenario;
#[path = "lifecycle_model/state.rs"]
mod state;
#[path = "lifecycle_model/store.rs"]
mod store;

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

use self::model::{Action, Lifecycle};
use self::scenario::Scenario;
use self::state::{Phase, State};

/// The planted bugs: each replaces or wraps the answer of one of the lifecycle's functions
/// inside the model (the library has no switch for it), with the property it breaks and the
/// scenario that shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The fence admits a write from the owner named in what it expects, whatever is stored.
    FenceAdmitsStaleWriter,
    /// An owner whose final write was refused returns its own result anyway.
    LateResultReturned,
    /// A caller reads an in-flight record as running whatever its lease says.
    LeaseHoldsForever,
    /// A call under `in_doubt = "fail"` takes a key in doubt over and runs it again.
    RerunUnderFail,
    /// The operator's resolve ignores that the owner's process still runs.
    OperatorIgnoresLiveOwner,
    /// The key leaves the amount out, so an approval covers other arguments.
    ApprovalIgnoresArguments,
    /// A call of a tool that needs approval runs without asking.
    ApprovalNotAsked,
    /// A run that failed puts its approval back (`undo`) instead of releasing the key.
    ApprovalGivenBack,
    /// Retention takes a record in doubt for a finished one.
    RetentionRemovesInDoubt,
    /// A retention pass deletes the record as it finds it at the delete, not the one it read.
    RetentionDeleteUnfenced,
    /// A transactional body's effect commits on its own, before the record.
    TransactionCommitsEffectEarly,
}

impl Mutant {
    pub const ALL: [Mutant; 11] = [
        Mutant::FenceAdmitsStaleWriter,
        Mutant::LateResultReturned,
        Mutant::LeaseHoldsForever,
        Mutant::RerunUnderFail,
        Mutant::OperatorIgnoresLiveOwner,
        Mutant::ApprovalIgnoresArguments,
        Mutant::ApprovalNotAsked,
        Mutant::ApprovalGivenBack,
        Mutant::RetentionRemovesInDoubt,
        Mutant::RetentionDeleteUnfenced,
        Mutant::TransactionCommitsEffectEarly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutant::FenceAdmitsStaleWriter => "fence-admits-stale-writer",
            Mutant::LateResultReturned => "late-result-returned",
            Mutant::LeaseHoldsForever => "lease-holds-forever",
            Mutant::RerunUnderFail => "rerun-under-fail",
            Mutant::OperatorIgnoresLiveOwner => "operator-ignores-live-owner",
            Mutant::ApprovalIgnoresArguments => "approval-ignores-arguments",
            Mutant::ApprovalNotAsked => "approval-not-asked",
            Mutant::ApprovalGivenBack => "approval-given-back",
            Mutant::RetentionRemovesInDoubt => "retention-removes-in-doubt",
            Mutant::RetentionDeleteUnfenced => "retention-delete-unfenced",
            Mutant::TransactionCommitsEffectEarly => "transaction-commits-effect-early",
        }
    }

    /// The scenario that exposes it.
    pub fn scenario(self) -> &'static str {
        match self {
            // Under `fail` no one moves a paused owner's key on: a rerun does.
            Mutant::FenceAdmitsStaleWriter | Mutant::LateResultReturned => "rerun",
            Mutant::LeaseHoldsForever
            | Mutant::RerunUnderFail
            | Mutant::OperatorIgnoresLiveOwner => "fail",
            Mutant::ApprovalIgnoresArguments
            | Mutant::ApprovalNotAsked
            | Mutant::ApprovalGivenBack => "approval",
            Mutant::RetentionRemovesInDoubt | Mutant::RetentionDeleteUnfenced => "retention",
            Mutant::TransactionCommitsEffectEarly => "transactional",
        }
    }

    /// The property it breaks.
    pub fn breaks(self) -> &'static str {
        match self {
            Mutant::FenceAdmitsStaleWriter => properties::FENCED_WRITE,
            Mutant::LateResultReturned => properties::RECORDED_RESULT,
            Mutant::LeaseHoldsForever => properties::NOT_IN_FLIGHT_FOREVER,
            Mutant::RerunUnderFail | Mutant::OperatorIgnoresLiveOwner => properties::AT_MOST_ONCE,
            Mutant::ApprovalIgnoresArguments
            | Mutant::ApprovalNotAsked
            | Mutant::ApprovalGivenBack => properties::APPROVAL_ONCE,
            Mutant::RetentionRemovesInDoubt | Mutant::RetentionDeleteUnfenced => {
                properties::RETENTION_KEEPS
            }
            Mutant::TransactionCommitsEffectEarly => properties::TX_TOGETHER,
        }
    }

    pub fn named(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// What one exploration found: the states visited, and each broken property with its trace.
struct Explored {
    states: usize,
    broken: Vec<(&'static str, String)>,
}

/// Explores `scenario` with `mutant` planted. Looking for a counterexample, it goes breadth
/// first (the shortest trace) and stops at the first; otherwise depth first, which holds fewer
/// states in memory, through every reachable state.
fn explore(scenario: Scenario, mutant: Option<Mutant>, counterexample: bool) -> Explored {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Lifecycle::new(scenario, mutant);
    let builder = model.checker().threads(threads);
    if counterexample {
        found(builder.finish_when(HasDiscoveries::AnyFailures).spawn_bfs().join())
    } else {
        found(builder.spawn_dfs().join())
    }
}

fn found(checker: impl Checker<Lifecycle>) -> Explored {
    let mut broken: Vec<(&'static str, String)> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, trace(checker.model(), path.into_vec())))
        .collect();
    broken.sort_by_key(|(name, _)| *name);
    Explored { states: checker.unique_state_count(), broken }
}

/// A counterexample as a person reads it: one line per step, with what it left.
fn trace(model: &Lifecycle, steps: Vec<(State, Option<Action>)>) -> String {
    let mut out = String::new();
    if let Some((first, _)) = steps.first() {
        out.push_str(&format!("  start: {}\n", summary(model, first)));
    }
    for window in steps.windows(2) {
        let (_, action) = &window[0];
        let (after, _) = &window[1];
        let action = action.as_ref().map_or_else(String::new, |a| format!("{a:?}"));
        out.push_str(&format!("  {action:<22} -> {}\n", summary(model, after)));
    }
    out
}

/// A state in one line: the clock, each key's record and ghost counts, and each caller.
fn summary(model: &Lifecycle, s: &State) -> String {
    let keys: Vec<String> = s
        .keys
        .iter()
        .map(|k| {
            let record = match &k.record {
                None => "absent".to_owned(),
                Some(r) => {
                    let r = &r.0;
                    let mut text = format!("{} by {}", r.status, r.owner);
                    if let Some(until) = r.lease_until {
                        text.push_str(&format!(" lease<{until}"));
                    }
                    if let Some(result) = &r.result {
                        text.push_str(&format!(" result {result}"));
                    }
                    text
                }
            };
            format!("[{record}; effects {}]", k.effects)
        })
        .collect();
    let callers: Vec<String> = s
        .callers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let phase = match &c.phase {
                Phase::Idle => "idle".to_owned(),
                Phase::Owned(h) => format!("owns(token {}, {:?})", h.token, h.effect),
                Phase::Reconciling(_) => "reconciling".to_owned(),
                Phase::Tx(run) => format!("in transaction(token {})", run.token),
                Phase::Ended => format!("returned {:?}", c.outcome.as_ref().expect("an outcome")),
                Phase::Crashed => "crashed".to_owned(),
            };
            let paused = if c.paused { ", paused" } else { "" };
            format!("c{i}@{} {phase}{paused}", model.clock(s, i))
        })
        .collect();
    format!("t={} {} | {}", s.now, keys.join(" "), callers.join("; "))
}

fn planted() -> Option<String> {
    std::env::var("IDEM_MODEL_MUTANT").ok().filter(|name| !name.is_empty())
}

/// Runs `mutant` in its scenario; the property it broke, printed with its trace.
fn counterexample(mutant: Mutant) -> Vec<&'static str> {
    let scenario = Scenario::named(mutant.scenario());
    let started = Instant::now();
    let explored = explore(scenario, Some(mutant), true);
    println!(
        "mutant {} in scenario {}: {} states, {:.1} s",
        mutant.name(),
        mutant.scenario(),
        explored.states,
        started.elapsed().as_secs_f64()
    );
    for (property, trace) in &explored.broken {
        println!("  broken: {property}\n{trace}");
    }
    explored.broken.iter().map(|(property, _)| *property).collect()
}

#[test]
fn every_schedule_keeps_the_properties() {
    match planted().as_deref() {
        Some("list") => {
            for mutant in Mutant::ALL {
                println!("mutant: {}", mutant.name());
            }
            return;
        }
        Some(name) => {
            let mutant = Mutant::named(name)
                .unwrap_or_else(|| panic!("no planted bug named {name}: IDEM_MODEL_MUTANT=list"));
            let broken = counterexample(mutant);
            assert!(!broken.is_empty(), "the model found no counterexample for {name}");
            return;
        }
        None => {}
    }
    let (mut total, started) = (0, Instant::now());
    let only = std::env::var("IDEM_MODEL_SCENARIO").ok().filter(|name| !name.is_empty());
    let scenarios = match only.as_deref() {
        Some(name) => vec![Scenario::named(name)],
        None => Scenario::all(),
    };
    for scenario in scenarios {
        println!("bounds: {scenario}");
        let at = Instant::now();
        let explored = explore(scenario, None, false);
        println!("  {} states visited, {:.1} s", explored.states, at.elapsed().as_secs_f64());
        for (property, trace) in &explored.broken {
            println!("  broken: {property}\n{trace}");
        }
        assert!(explored.broken.is_empty(), "a property broke: see the trace above");
        total += explored.states;
    }
    println!("{total} states visited in all, {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn every_planted_bug_is_found() {
    if planted().is_some() {
        return;
    }
    for mutant in Mutant::ALL {
        let broken = counterexample(mutant);
        assert!(
            broken.contains(&mutant.breaks()),
            "{} should break \"{}\", and broke {broken:?}",
            mutant.name(),
            mutant.breaks()
        );
    }
}

/// Not a bug of idem but a limit of reconcilers, which DESIGN.md states: with a system of record
/// that does not deduplicate the key, an owner paused past its lease lands its effect after a
/// reconciler said it had not landed, and the call that asked runs the body again.
#[test]
fn a_paused_owner_can_overtake_a_reconciler_unless_the_key_is_deduplicated() {
    if planted().is_some() {
        return;
    }
    let scenario = Scenario { keyed_vendor: false, ..Scenario::named("reconcile-paused") };
    let explored = explore(scenario, None, true);
    let (property, trace) = explored.broken.first().expect("a counterexample");
    println!("reconcile-paused without deduplication: {property}\n{trace}");
    assert_eq!(*property, properties::AT_MOST_ONCE);
    assert!(trace.contains("Answer("), "a reconciler answered in it:\n{trace}");
    assert!(trace.contains("Pause("), "an owner was paused in it:\n{trace}");
}
