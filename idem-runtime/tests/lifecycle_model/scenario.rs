//! The scenarios the model explores, each with its bounds.

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

    const fn transactional_approving(amount: u8) -> Role {
        Role { transactional: true, ..Role::approving(amount) }
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
                ..none.clone()
            },
            // A plain call and two transactional ones, all needing approval, two of one intent.
            Scenario {
                name: "transactional-approval",
                callers: vec![
                    Role::approving(1),
                    Role::transactional_approving(1),
                    Role::transactional_approving(2),
                ],
                bounds: Bounds { pauses: 0, restarts: 0, resolves: 0, decisions: 2, ..BASE },
                approval_ttl: Some(2),
                ..none
            },
        ]
    }

    pub fn named(name: &str) -> Scenario {
        let all = Scenario::all();
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        let message = format!("no scenario named {name}; the scenarios are {names:?}");
        all.into_iter().find(|s| s.name == name).expect(&message)
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
                    role = role.replacen("fail", "transactional", 1);
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
