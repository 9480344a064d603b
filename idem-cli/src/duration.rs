//! Durations as operators write them: `30d`, `12h`, `15m`, `90s`, `500ms`.

use std::time::Duration;

/// Parses a whole number followed by one unit: `ms`, `s`, `m`, `h` or `d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!("`{text}` is not a duration: write a whole number and a unit, such as 30d, 12h, 15m, 90s or 500ms")
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let number: u64 = number.parse().map_err(|_| bad())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long a duration"))
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
    fn refuses_anything_else() {
        for bad in [
            "",
            "30",
            "d",
            "-1d",
            "1.5h",
            "30 d",
            "30D",
            "1w",
            "10sec",
            "1h30m",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }
}
