//! What a record means, written once: how a status is spelled, who owns a record, which writes
//! the fence lets through, and what a caller that finds a record must do with it.
//!
//! The engine, the operator API, every store and the `idem` command use these; a store adds
//! storage, never semantics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::record::Record;

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

/// Who holds a record: the store instance that reserved or took it over, and which of that
/// instance's calls did (`<instance>#<call>`), so that the fence tells two calls of one process
/// apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Owner(String);

static CALL_SEQ: AtomicU64 = AtomicU64::new(0);

impl Owner {
    /// A new call of the store instance `instance`, numbered apart from every other call of
    /// this process.
    pub fn new_call(instance: &str) -> Owner {
        Owner(format!("{instance}#{}", CALL_SEQ.fetch_add(1, Ordering::Relaxed)))
    }

    /// The store instance this owner is a call of: the text before `#` (all of it when there
    /// is no call number).
    pub fn instance(&self) -> &str {
        self.0.split_once('#').map_or(self.0.as_str(), |(instance, _)| instance)
    }

    /// Whether this owner is a call of the store instance `instance`.
    pub fn is_of(&self, instance: &str) -> bool {
        self.instance() == instance
    }

    /// The owner as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Owner {
    /// An owner as stored; any text reads (an owner written by hand has no call number).
    fn from(text: &str) -> Owner {
        Owner(text.to_owned())
    }
}

impl From<&String> for Owner {
    fn from(text: &String) -> Owner {
        Owner(text.clone())
    }
}

impl From<String> for Owner {
    fn from(text: String) -> Owner {
        Owner(text)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The state a write is fenced on: a store changes a record only while it is still in the
/// state the writer saw (same status, owner and attempts). A caller whose record was settled or
/// taken over meanwhile cannot write.
///
/// A store with leases adds one rule the fence alone cannot express: an in-flight record may
/// be replaced by anyone but its owner only once the owner's lease has lapsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The status seen.
    pub status: Status,
    /// The owner seen.
    pub owner: &'a str,
    /// The attempts seen.
    pub attempts: u32,
}

impl Fence<'_> {
    /// Whether a write expecting this state may replace a record now in state `stored`.
    pub fn admits(&self, stored: Fence<'_>) -> bool {
        *self == stored
    }
}

impl Record {
    /// The state a write that replaces this record is fenced on.
    pub fn fence(&self) -> Fence<'_> {
        Fence { status: self.status, owner: self.owner.as_str(), attempts: self.attempts }
    }
}

/// What a caller must do about the record it found under its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assessment {
    /// No record: reserve the key.
    Absent,
    /// A finished result still within its `ttl`: replay it.
    Replay,
    /// A finished result past its `ttl`: take the key over and run again.
    Expired,
    /// An owner that is alive runs the body: wait for it.
    Running,
    /// The effect may or may not have landed: an in-doubt record, or an in-flight one whose
    /// owner is dead. The caller's in-doubt policy (or an operator) decides.
    InDoubt,
}

/// Assesses `found` at `now` (milliseconds since the Unix epoch); `owner_alive` answers, for an
/// in-flight record, whether its owner still runs the body (the store knows: a lease, or the
/// process itself).
pub fn assess(
    found: Option<&Record>,
    now: u64,
    owner_alive: impl FnOnce(&Record) -> bool,
) -> Assessment {
    match found {
        None => Assessment::Absent,
        Some(record) => match record.status {
            Status::Done if record.is_expired(now) => Assessment::Expired,
            Status::Done => Assessment::Replay,
            Status::InFlight if owner_alive(record) => Assessment::Running,
            Status::InFlight | Status::InDoubt => Assessment::InDoubt,
        },
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
    fn an_owner_is_a_call_of_one_instance() {
        let a = Owner::new_call("sled:1:2:3");
        let b = Owner::new_call("sled:1:2:3");
        assert_ne!(a, b, "two calls of one instance are told apart");
        assert!(a.is_of("sled:1:2:3") && !a.is_of("sled:1:2"));
        assert_eq!(Owner::from("pg:host:1:2:ab").instance(), "pg:host:1:2:ab");
    }

    #[test]
    fn a_found_record_is_assessed_by_status_time_and_owner() {
        let held = Record::reserve("k", "t", "s", "i#1", 10);
        let alive = |_: &Record| true;
        let dead = |_: &Record| false;
        assert_eq!(assess(None, 10, alive), Assessment::Absent);
        assert_eq!(assess(Some(&held), 10, alive), Assessment::Running);
        assert_eq!(assess(Some(&held), 10, dead), Assessment::InDoubt);
        assert_eq!(assess(Some(&held.in_doubt(11)), 11, alive), Assessment::InDoubt);
        let done = held.done_json("1".into(), 12, Some(std::time::Duration::from_millis(5)));
        assert_eq!(assess(Some(&done), 16, dead), Assessment::Replay);
        assert_eq!(assess(Some(&done), 17, dead), Assessment::Expired);
    }
}
