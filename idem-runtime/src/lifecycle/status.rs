//! How a status is spelled: once, here. On disk, in SQL, in the `idem` command, in metrics, in
//! the MCP error kinds and in messages, a status is [`Status::as_str`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a key stands.
///
/// Each status has one spelling, [`Status::as_str`]: on disk, in SQL, in the `idem` command
/// and in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Status {
    /// Reserved by an owner that is running the body.
    InFlight,
    /// The body returned `Ok`; the result is stored and replayed.
    Done,
    /// An attempt was interrupted (crash, panic, dropped future): the effect may have landed.
    InDoubt,
    /// The tool needs a person's approval for these exact arguments, and none has decided yet:
    /// the body has not run. Never removed automatically (a person is to see it).
    AwaitingApproval,
    /// A person approved the key; the body has not run yet. The next call runs it once,
    /// unless the approval has outlived the call's `approval_ttl`.
    Approved,
    /// A person denied the key: every call returns `Error::Denied` with their note, and the
    /// body never runs.
    Denied,
}

impl Status {
    /// Every status: those of every key, in the order a key normally goes through them, then
    /// those of a tool that needs approval.
    pub const ALL: [Status; 6] = [
        Status::InFlight,
        Status::Done,
        Status::InDoubt,
        Status::AwaitingApproval,
        Status::Approved,
        Status::Denied,
    ];

    /// Whether a record in this status is finished: its call ended and settled it (done), or a
    /// person refused it (denied), so nothing but a new call of its key will change it. Only
    /// finished records are ever removed, by a purge or by retention; a denied key removed asks
    /// for approval again on its next call. Every other status (in flight, in doubt, awaiting
    /// approval, approved, and any status added later unless it is listed here) is kept until a
    /// person or a call settles it.
    pub const fn is_finished(self) -> bool {
        matches!(self, Status::Done | Status::Denied)
    }

    /// The one spelling of the status: `in-flight`, `done`, `in-doubt`, `awaiting-approval`,
    /// `approved`, `denied`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::InFlight => "in-flight",
            Status::Done => "done",
            Status::InDoubt => "in-doubt",
            Status::AwaitingApproval => "awaiting-approval",
            Status::Approved => "approved",
            Status::Denied => "denied",
        }
    }

    /// Whether a record in this status waits for a person (awaiting a decision, or approved and
    /// not yet run): such a record must never be removed automatically.
    pub const fn waits_for_a_person(self) -> bool {
        matches!(self, Status::AwaitingApproval | Status::Approved)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = String;

    /// Reads only the spelling [`Status::as_str`] writes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL.into_iter().find(|status| status.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Status::ALL.iter().map(|status| status.as_str()).collect();
            format!("unknown status `{s}`: use one of {}", known.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_reads_back_only_in_its_one_spelling() {
        for status in Status::ALL {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        assert!("in_flight".parse::<Status>().is_err());
        assert!("InDoubt".parse::<Status>().is_err());
    }

    #[test]
    fn only_a_done_or_denied_record_is_finished() {
        let finished: Vec<Status> = Status::ALL.into_iter().filter(|s| s.is_finished()).collect();
        assert_eq!(finished, [Status::Done, Status::Denied]);
    }
}
