//! Record times (milliseconds since the Unix epoch) as people read them, and deadlines that
//! never overflow.

use std::time::{Duration, Instant};

/// `from + wait`, or the latest instant the platform can represent past `from` when that sum
/// overflows: a wait of `Duration::MAX` means "as long as it takes", never a panic.
pub fn deadline_after(from: Instant, wait: Duration) -> Instant {
    let mut wait = wait;
    loop {
        match from.checked_add(wait) {
            Some(at) => return at,
            None => wait /= 2,
        }
    }
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time, to the millisecond.
///
/// ```
/// assert_eq!(idem_runtime::utc_timestamp(951_782_400_123), "2000-02-29T00:00:00.123Z");
/// ```
pub fn utc_timestamp(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let in_day = ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{deadline_after, utc_timestamp};

    #[test]
    fn a_deadline_saturates_instead_of_overflowing() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
        assert!(deadline_after(now, Duration::MAX) > now + Duration::from_secs(100 * 365 * 86_400));
    }

    #[test]
    fn formats_times_across_leap_days_and_year_ends() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_timestamp(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(utc_timestamp(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }
}
