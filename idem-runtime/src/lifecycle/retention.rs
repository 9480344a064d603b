//! What may be removed without a person asking, and when: once, here. A purge by age
//! (`idem purge --older-than`) and a store's retention pass both ask these two questions.
//!
//! - A record goes only when it is [finished](super::Status::is_finished) and finished longer
//!   ago than the bound. Nothing else: a key in flight or in doubt (or in any status added
//!   later, unless it is declared finished) is kept until a call or a person settles it.
//! - A history with no record (a released key's) goes once its last entry is older than the
//!   bound.
//!
//! The policy a store's opener gives the engine's passes ([`Retention`]: the bound, and the
//! pace), and what the passes removed ([`Removed`], [`PassReport`], [`RetentionStatus`]), are
//! here too: plain data, which a store's builder holds and `idem stats` shows without reaching
//! into the engine.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record::Record;

/// Whether `record` is finished and finished longer than `bound` before `now` (milliseconds on
/// the store's clock).
pub fn outlived(record: &Record, bound: Duration, now: u64) -> bool {
    record.status.is_finished()
        && older(record.completed_at.unwrap_or(record.updated_at), bound, now)
}

/// Whether the history of a key with no record, last changed at `last`, is older than `bound`
/// at `now`.
pub fn history_outlived(last: u64, bound: Duration, now: u64) -> bool {
    older(last, bound, now)
}

fn older(at: u64, bound: Duration, now: u64) -> bool {
    let bound = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    now.saturating_sub(at) > bound
}

/// The environment variable a store reads its retention from when its builder sets none:
/// a duration (`30d`, `12h`), or `off`.
pub const RETAIN_ENV: &str = "IDEM_RETAIN";

/// How long a store keeps finished records, and how its background passes go.
///
/// A pass walks the store a page of `batch` records at a time, removes those of the page that
/// are finished and finished longer than `keep` ago (each with its history), then the
/// histories of released keys last changed longer than `keep` ago, likewise a page at a time,
/// pausing `pause` between pages; passes start `every` apart. A key in flight or in doubt is
/// never removed, nor a record that changed since the pass read it.
///
/// ```
/// use std::time::Duration;
/// let policy = idem_runtime::Retention::new(Duration::from_secs(30 * 86_400)).batch(200);
/// assert_eq!(policy.keep(), Duration::from_secs(30 * 86_400));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    pub(crate) keep: Duration,
    pub(crate) batch: usize,
    pub(crate) every: Duration,
    pub(crate) pause: Duration,
}

impl Retention {
    /// Keeps finished records and released keys' histories for `keep`; pages of 100, a pause of
    /// 10 ms between them, and a pass every `keep / 24`, between 1 s and 1 h.
    pub fn new(keep: Duration) -> Retention {
        let every = (keep / 24).clamp(Duration::from_secs(1), Duration::from_secs(3600));
        Retention { keep, batch: 100, every, pause: Duration::from_millis(10) }
    }

    /// Reads a policy as `IDEM_RETAIN` takes it: a duration in humantime's syntax (`30d`,
    /// `12h`, `1h 30m`), or `off` (or `none`) for no retention.
    pub fn parse(text: &str) -> Result<Option<Retention>, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("off") || text.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        humantime::parse_duration(text).map(|keep| Some(Retention::new(keep))).map_err(|e| {
            format!(
                "`{text}` is not a retention ({e}): write a duration such as 30d, 12h or 90m, \
                 or `off`"
            )
        })
    }

    /// How many records (or released keys) a batch looks at, and so removes at most; 100.
    pub fn batch(mut self, records: usize) -> Retention {
        self.batch = records.max(1);
        self
    }

    /// How long after one pass the next starts; `keep / 24` between 1 s and 1 h by default. A
    /// record is removed between `keep` and `keep + every` (and the pass's own time) after it
    /// finished.
    pub fn every(mut self, every: Duration) -> Retention {
        self.every = every;
        self
    }

    /// How long a pass rests between two batches; 10 ms.
    pub fn pause(mut self, pause: Duration) -> Retention {
        self.pause = pause;
        self
    }

    /// How long finished records and released keys' histories are kept.
    pub fn keep(&self) -> Duration {
        self.keep
    }
}

/// What a retention pass, or a part of one, removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Removed {
    /// Finished records, each with its history.
    pub records: u64,
    /// Histories of released keys (keys with no record).
    pub histories: u64,
}

impl Removed {
    pub(crate) fn add(&mut self, other: Removed) {
        self.records += other.records;
        self.histories += other.histories;
    }
}

/// What a store's retention is set to, and what its passes removed in this process: what
/// `idem stats` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RetentionStatus {
    /// The bound, in milliseconds: finished records and released keys' histories older than
    /// this are removed.
    pub keep_ms: u64,
    /// The most records (or released keys) one batch looks at.
    pub batch: u64,
    /// Milliseconds between the end of one pass and the start of the next.
    pub every_ms: u64,
    /// Passes ended since the store opened.
    pub passes: u64,
    /// What the passes removed since the store opened, the running one included.
    pub removed: Removed,
    /// The last passes that ended, oldest first: at most [`RetentionStatus::RECENT`], each with
    /// what it removed.
    pub recent_passes: Vec<PassReport>,
    /// The last pass that failed, and why (it is tried again at the next pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl RetentionStatus {
    /// How many ended passes [`RetentionStatus::recent_passes`] keeps.
    pub const RECENT: usize = 10;

    /// The last pass that ended.
    pub fn last_pass(&self) -> Option<&PassReport> {
        self.recent_passes.last()
    }
}

/// What one ended pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PassReport {
    /// When it ended, in milliseconds since the Unix epoch on the store's clock.
    pub ended_at: u64,
    /// How long it ran, in milliseconds, pauses included.
    pub took_ms: u64,
    /// Batches it ran.
    pub batches: u64,
    /// What it removed.
    pub removed: Removed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::owner::Owner;
    use crate::lifecycle::transition;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn only_a_finished_record_past_the_bound_goes() {
        let owner = Owner::new_call("sled:host:1:1:0");
        let reserved = transition::reserve_record("k", "charge", "o-1", None, &owner, 1_000);
        let done = transition::complete(&reserved, "1".into(), None, 2_000).new.unwrap();
        let doubted = transition::leave_in_doubt(&reserved, "crash", 2_000).new.unwrap();
        let later = 2_000 + 3_600_000;
        assert!(!outlived(&done, HOUR, later), "exactly the bound is kept");
        assert!(outlived(&done, HOUR, later + 1));
        assert!(!outlived(&doubted, HOUR, u64::MAX), "in doubt is never removed");
        assert!(!outlived(&reserved, HOUR, u64::MAX), "in flight is never removed");
        assert!(history_outlived(0, HOUR, 3_600_001));
        assert!(!history_outlived(0, Duration::MAX, u64::MAX));
    }
}
