//! A page of a store in key order ([`Store::scan_page`](super::Store::scan_page)): each key
//! with what it holds, and where the next page starts.

use crate::error::StoreError;
use crate::lifecycle::Record;

/// Records in key order, each beside its key, with an `Err` naming the key for one that cannot
/// be read: what a store's read of its records gives [`Page::merge`].
pub type RecordPage = Vec<(String, Result<Record, StoreError>)>;

/// What a page holds under a key.
// Built once per key of a page and taken apart at once: boxing the record would only add an
// allocation per key.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
#[non_exhaustive]
pub enum Stored {
    /// The key's record, or an `Err` naming the key for one that cannot be read (one bad
    /// record must not hide the rest).
    Record(Result<Record, StoreError>),
    /// No record, but a history (a released key's): when its last entry was made, in
    /// milliseconds since the Unix epoch on the store's clock.
    History {
        /// The time of the history's last entry.
        last_at: u64,
    },
}

/// Keys in key order, each with what it holds, and where the next page starts.
#[derive(Debug)]
#[non_exhaustive]
pub struct Page {
    /// The page's keys in key order, each once.
    pub entries: Vec<(String, Stored)>,
    /// The key to read the next page after, or `None` when this page is the last. A page may
    /// hold fewer keys than its limit and still not be the last.
    pub next: Option<String>,
}

impl Page {
    /// A page of `entries`, in key order, followed by the keys after `next` (none when `None`).
    pub fn new(entries: Vec<(String, Stored)>, next: Option<String>) -> Page {
        Page { entries, next }
    }

    /// The page's records, each as read or the `Err` that names its key, in key order; the keys
    /// that hold only a history are left out.
    pub fn into_records(self) -> impl Iterator<Item = Result<Record, StoreError>> {
        self.entries.into_iter().filter_map(|(_, stored)| match stored {
            Stored::Record(record) => Some(record),
            Stored::History { .. } => None,
        })
    }

    /// The page of at most `limit` keys that two reads from the same key make, for a store that
    /// keeps records and histories apart: `records`, up to `limit` records in key order, and
    /// `histories`, up to `limit` keys with a history in key order, each with its last entry's
    /// time when it has no record (`None` when it has one). Up to the end of the first read
    /// that came back full, every key is in one of them, so the page ends there (or at its
    /// `limit`th key) and the next one reads on after it: a key in both is its record, and a
    /// key the history read saw with a record that the record read did not (one written
    /// between the two reads) is left to the walk's concurrent changes, like any key written
    /// during a walk.
    pub fn merge(records: RecordPage, histories: Vec<(String, Option<u64>)>, limit: usize) -> Page {
        // A read that came back full may have stopped short of keys the other read has: the
        // page ends at the first of their ends, and the next page reads on from there.
        let end_of = |keys: Option<&String>, len: usize| keys.filter(|_| len >= limit).cloned();
        let end = match (
            end_of(records.last().map(|(key, _)| key), records.len()),
            end_of(histories.last().map(|(key, _)| key), histories.len()),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut records = records.into_iter().peekable();
        let mut histories =
            histories.into_iter().filter_map(|(key, last)| Some((key, last?))).peekable();
        let mut entries: Vec<(String, Stored)> = Vec::new();
        loop {
            let next = match (records.peek(), histories.peek()) {
                (Some((record, _)), Some((history, _))) if record > history => None,
                (Some(_), _) => records.next(),
                (None, _) => None,
            };
            let (key, stored) = match next {
                Some((key, record)) => {
                    // A key released between the two reads: its record, as first read.
                    histories.next_if(|(history, _)| *history == key);
                    (key, Stored::Record(record))
                }
                None => match histories.next() {
                    Some((key, last_at)) => (key, Stored::History { last_at }),
                    None => break,
                },
            };
            if end.as_ref().is_some_and(|end| key > *end) {
                break;
            }
            if entries.len() == limit {
                let next = entries.last().map(|(key, _)| key.clone());
                return Page { entries, next };
            }
            entries.push((key, stored));
        }
        Page { entries, next: end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(page: &Page) -> Vec<(&str, bool)> {
        page.entries
            .iter()
            .map(|(key, stored)| (key.as_str(), matches!(stored, Stored::Record(_))))
            .collect()
    }

    fn unreadable(key: &str) -> (String, Result<Record, StoreError>) {
        (key.to_owned(), Err(StoreError::new(format!("key {key}: damaged"))))
    }

    #[test]
    fn a_merged_page_ends_where_the_first_full_read_ends() {
        let records = vec![unreadable("a"), unreadable("c"), unreadable("e")];
        let histories = vec![("a".into(), None), ("b".into(), Some(7)), ("d".into(), Some(8))];
        let page = Page::merge(records, histories, 3);
        assert_eq!(keys(&page), [("a", true), ("b", false), ("c", true)], "the limit");
        assert_eq!(page.next.as_deref(), Some("c"));

        let records = vec![unreadable("a"), unreadable("z")];
        let histories = vec![("b".into(), Some(7)), ("c".into(), None)];
        let page = Page::merge(records, histories, 2);
        assert_eq!(keys(&page), [("a", true), ("b", false)], "no key past the histories' end");
        assert_eq!(page.next.as_deref(), Some("c"), "the keys after c are read next");
    }

    #[test]
    fn a_key_in_both_reads_is_its_record_and_short_reads_are_the_last_page() {
        let records = vec![unreadable("a"), unreadable("b")];
        let histories = vec![("b".into(), Some(7)), ("c".into(), Some(9))];
        let page = Page::merge(records, histories, 5);
        assert_eq!(keys(&page), [("a", true), ("b", true), ("c", false)]);
        assert!(page.next.is_none(), "neither read came back full");
        let Stored::History { last_at } = page.entries[2].1 else { unreachable!() };
        assert_eq!(last_at, 9);
    }

    #[test]
    fn a_key_the_history_read_saw_with_a_record_is_not_listed_as_released() {
        let page = Page::merge(Vec::new(), vec![("a".into(), None), ("b".into(), None)], 2);
        assert!(page.entries.is_empty(), "{page:?}");
        assert_eq!(page.next.as_deref(), Some("b"), "the walk goes on past what was read");
    }
}
