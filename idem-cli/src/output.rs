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

pub(crate) use idem_runtime::utc_timestamp as timestamp;

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
    fn formats_ages() {
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
