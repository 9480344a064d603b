//! What may be removed without a person asking, and when: once, here. A purge by age
//! (`idem purge --older-than`) and a store's retention pass both ask these two questions.
//!
//! - A record goes only when it is [finished](super::Status::is_finished) and finished longer
//!   ago than the bound. Nothing else: a key in flight or in doubt (or in any status added
//!   later, unless it is declared finished) is kept until a call or a person settles it.
//! - A history with no record (a released key's) goes once its last entry is older than the
//!   bound.

use std::time::Duration;

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
