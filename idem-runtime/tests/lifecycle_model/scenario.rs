//! The scenarios the model explores, each with its bounds, and the planted bugs (mutants),
//! each with the scenario that exposes it.

use std::fmt;

use idem_runtime::InDoubtPolicy;

/// The bounds of one exploration.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Process crashes (SIGKILL) in all, at any step of any caller.
    pub crashes: u8,
    /// Restarts of a crashed caller's process, which then calls again as a new store instance.
    pub restarts: u8,
    /// Pauses of an owner's process (it stops renewing its lease until it resumes).
    pub pauses: u8,
    /// How far each actor's reading of the store's clock may be off, either way (ms).
    pub skew: u64,
    /// How long a lease lasts without renewal (ms).
    pub lease: u64,
    /// How far the store's clock may advance (ms, in steps of 1).
    pub ticks: u64,
    /// Decisions a person makes on approvals.
    pub decisions: u8,
    /// Resolves an operator makes.
    pub resolves: u8,
}

/// What one caller is.
#[derive(Clone, Copy, Debug)]
pub struct Role {
    pub policy: InDoubtPolicy,
    pub reconciler: bool,
    pub approval: bool,
    pub transactional: bool,
    /// The intent: the argument that goes into the key.
    pub amount: u8,
}

impl Role {
    pub const fn plain(policy: InDoubtPolicy) -> Role {
        Role { policy, reconciler: false, approval: false, transactional: false, amount: 1 }
    }

    const fn reconciled() -> Role {
        Role { reconciler: true, ..Role::plain(InDoubtPolicy::Fail) }
    }

    const fn approving(amount: u8) -> Role {
        Role { approval: true, amount, ..Role::plain(InDoubtPolicy::Fail) }
    }

    const fn transactional() -> Role {
        Role { transactional: true, ..Role::plain(InDoubtPolicy::Fail) }
    }
}

/// One exploration: the callers, the other actors, the policies and the bounds.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub callers: Vec<Role>,
    pub bounds: Bounds,
    /// The callers' `ttl` (ms).
    pub ttl: Option<u64>,
    /// The callers' `approval_ttl` (ms).
    pub approval_ttl: Option<u64>,
    /// The store's retention bound (ms), when a retainer runs.
    pub retention: Option<u64>,
    /// Whether an operator resolves keys in doubt, with what the system of record shows.
    pub operator: bool,
    /// Whether the system of record deduplicates the key: a second request under it gets the
    /// first one's answer and has no effect of its own (a vendor that a reconciler can ask by
    /// the key is one).
    pub keyed_vendor: bool,
}

const BASE: Bounds = Bounds {
    crashes: 1,
    restarts: 1,
    pauses: 1,
    skew: 1,
    lease: 3,
    ticks: 4,
    decisions: 0,
    resolves: 1,
};

impl Scenario {
    /// Whether an effect may happen again after a recorded takeover of the key in doubt.
    pub fn reruns(&self) -> bool {
        self.callers.iter().any(|role| role.policy == InDoubtPolicy::Rerun)
    }

    /// Every scenario, in the order the test runs them.
    pub fn all() -> Vec<Scenario> {
        use InDoubtPolicy::{Fail, Rerun};
        let plain = |policy| vec![Role::plain(policy); 3];
        let none = Scenario {
            name: "",
            callers: Vec::new(),
            bounds: BASE,
            ttl: None,
            approval_ttl: None,
            retention: None,
            operator: false,
            keyed_vendor: false,
        };
        vec![
            Scenario {
                name: "fail",
                callers: plain(Fail),
                bounds: Bounds { crashes: 2, restarts: 2, resolves: 2, ..BASE },
                operator: true,
                ..none.clone()
            },
            Scenario {
                name: "rerun",
                callers: plain(Rerun),
                bounds: Bounds { crashes: 2, resolves: 0, ..BASE },
                ..none.clone()
            },
            Scenario {
                name: "reconcile",
                callers: vec![Role::reconciled(); 3],
                bounds: Bounds { crashes: 2, restarts: 1, pauses: 0, resolves: 0, ..BASE },
                ..none.clone()
            },
            // An owner paused past its lease can land its effect after a reconciler said it had
            // not landed, and the call then runs the body: only a system of record that
            // deduplicates the key keeps that to one effect (DESIGN.md says so).
            Scenario {
                name: "reconcile-paused",
                callers: vec![Role::reconciled(); 3],
                bounds: Bounds { restarts: 0, resolves: 0, ..BASE },
                keyed_vendor: true,
                ..none.clone()
            },
            Scenario {
                name: "approval",
                callers: vec![Role::approving(1), Role::approving(1), Role::approving(2)],
                bounds: Bounds { pauses: 0, restarts: 0, resolves: 0, decisions: 2, ..BASE },
                approval_ttl: Some(2),
                ..none.clone()
            },
            Scenario {
                name: "retention",
                callers: vec![Role::plain(Fail), Role::plain(Fail), Role::approving(1)],
                bounds: Bounds { restarts: 0, resolves: 0, decisions: 2, ..BASE },
                ttl: Some(1),
                retention: Some(1),
                ..none.clone()
            },
            Scenario {
                name: "transactional",
                callers: vec![Role::plain(Fail), Role::plain(Fail), Role::transactional()],
                bounds: Bounds { crashes: 2, resolves: 0, ..BASE },
                ..none
            },
        ]
    }

    pub fn named(name: &str) -> Scenario {
        Scenario::all().into_iter().find(|s| s.name == name).expect("a scenario of that name")
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bounds;
        let roles: Vec<String> = self
            .callers
            .iter()
            .map(|r| {
                let mut role = match r.policy {
                    InDoubtPolicy::Rerun => "rerun".to_owned(),
                    _ => "fail".to_owned(),
                };
                if r.reconciler {
                    role.push_str("+reconciler");
                }
                if r.approval {
                    role.push_str(&format!("+approval(amount {})", r.amount));
                }
                if r.transactional {
                    role = "transactional".to_owned();
                }
                role
            })
            .collect();
        write!(
            f,
            "{}: callers [{}]; crashes {}, restarts {}, pauses {}; clock skew ±{} ms, lease {} ms, \
             clock advances {} ms; operator resolves {}; person decides {}; ttl {:?}, \
             approval_ttl {:?}, retention {:?}; {} system of record",
            self.name,
            roles.join(", "),
            b.crashes,
            b.restarts,
            b.pauses,
            b.skew,
            b.lease,
            b.ticks,
            if self.operator { b.resolves } else { 0 },
            b.decisions,
            self.ttl,
            self.approval_ttl,
            self.retention,
            if self.keyed_vendor { "deduplicating" } else { "plain" },
        )
    }
}

/// A bug planted in the model, replacing or wrapping the answer of one of the lifecycle's
/// functions, with the property it should break and the scenario that shows it.
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
            Mutant::FenceAdmitsStaleWriter => super::properties::FENCED_WRITE,
            Mutant::LateResultReturned => super::properties::RECORDED_RESULT,
            Mutant::LeaseHoldsForever => super::properties::NOT_IN_FLIGHT_FOREVER,
            Mutant::RerunUnderFail | Mutant::OperatorIgnoresLiveOwner => {
                super::properties::AT_MOST_ONCE
            }
            Mutant::ApprovalIgnoresArguments
            | Mutant::ApprovalNotAsked
            | Mutant::ApprovalGivenBack => super::properties::APPROVAL_ONCE,
            Mutant::RetentionRemovesInDoubt | Mutant::RetentionDeleteUnfenced => {
                super::properties::RETENTION_KEEPS
            }
            Mutant::TransactionCommitsEffectEarly => super::properties::TX_TOGETHER,
        }
    }

    pub fn named(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}
