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
pub enum Status {
    /// Reserved by an owner that is running the body.
    InFlight,
    /// The body returned `Ok`; the result is stored and replayed.
    Done,
    /// An attempt was interrupted (crash, panic, dropped future): the effect may have landed.
    InDoubt,
}

impl Status {
    /// Every status, in the order a key normally goes through them.
    pub const ALL: [Status; 3] = [Status::InFlight, Status::Done, Status::InDoubt];

    /// Whether a record in this status is finished: its call ended and settled it, so nothing
    /// but a new call of its key will change it. Only finished records are ever removed, by a
    /// purge or by retention. Every other status (in flight, in doubt, and any status added
    /// later unless it is listed here) is kept until a person or a call settles it.
    pub const fn is_finished(self) -> bool {
        matches!(self, Status::Done)
    }

    /// The one spelling of the status: `in-flight`, `done`, `in-doubt`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::InFlight => "in-flight",
            Status::Done => "done",
            Status::InDoubt => "in-doubt",
        }
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
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown status `{s}`: use in-flight, done or in-doubt"))
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
    fn only_a_done_record_is_finished() {
        let finished: Vec<Status> = Status::ALL.into_iter().filter(|s| s.is_finished()).collect();
        assert_eq!(finished, [Status::Done]);
    }
}
