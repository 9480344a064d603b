//! Durations as operators write them: `30d`, `12h`, `15m`, `90s`, `500ms`, in humantime's syntax,
//! the one the attributes' `wait` and `ttl` take too.

use std::time::Duration;

/// Parses a duration such as `30d` or `1h 30m` (see `humantime::parse_duration`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| {
        format!(
            "`{text}` is not a duration ({error}): write a number and a unit, such as 30d, 12h, \
             15m, 90s or 500ms"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_unit() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(15 * 60)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn reads_humantimes_longer_forms() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse_duration("1w"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("10sec"), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn refuses_anything_else() {
        for bad in ["", "30", "d", "-1d", "30D", "1fortnight", "99999999999999999999d"] {
            let error = parse_duration(bad).expect_err(bad);
            assert!(error.contains(&format!("`{bad}` is not a duration")), "{error}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }
}
