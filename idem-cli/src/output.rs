//! Text for people: aligned tables, ages, timestamps, sizes.

use std::fmt::Write as _;

/// Rows under a header, each column padded to its widest cell; the last column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A cell holding user text (a scope is any `Display` text): control characters escaped, so
/// that a newline or a tab cannot break the table.
pub(crate) fn cell(text: &str) -> String {
    if text.is_empty() {
        return "\"\"".to_owned();
    }
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> =
                if c.is_control() { c.escape_default().collect() } else { vec![c] };
            escaped
        })
        .collect()
}

/// How long ago `then_ms` was, in its largest whole unit: `45s`, `12m`, `3h`, `2d`.
pub(crate) fn age(now_ms: u64, then_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time, to the millisecond.
pub(crate) fn timestamp(ms: u64) -> String {
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

/// A byte count with a readable unit beside it: `1234567 bytes (1.2 MiB)`.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{bytes} bytes ({value:.1} {})", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let rows = vec![
            vec!["a".to_owned(), "long value".to_owned(), "x".to_owned()],
            vec!["bbbb".to_owned(), "v".to_owned(), "y".to_owned()],
        ];
        assert_eq!(
            table(&["K", "V", "LAST"], &rows),
            "K     V           LAST\na     long value  x\nbbbb  v           y\n"
        );
    }

    #[test]
    fn formats_times() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(timestamp(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(age(100_000, 99_500), "0s");
        assert_eq!(age(10 * 60_000, 0), "10m");
        assert_eq!(age(3 * 86_400_000 + 5, 0), "3d");
        assert_eq!(age(0, 5), "0s");
    }

    #[test]
    fn escapes_control_characters_in_cells() {
        assert_eq!(cell("a\tb\nc"), "a\\tb\\nc");
        assert_eq!(cell(""), "\"\"");
        assert_eq!(cell("zoë"), "zoë");
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(size(12), "12 bytes");
        assert_eq!(size(1_572_864), "1572864 bytes (1.5 MiB)");
    }
}
