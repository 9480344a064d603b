//! The keys' histories on sled, one entry per change: the newest in the key's record, the rest
//! in a tree of their own, `idem.history`.
//!
//! A record holds its key's newest entries (`encoding.rs`, option 128), as many as fit in what
//! the record leaves of its 4 KiB, so a change and its entry are one write: a call's two
//! changes write two records and nothing else, and no entry can outlive or precede its change.
//! Entries are numbered from 1 per key; a record names its last entry's number `n`, and with
//! `k` entries of its own holds `n - k + 1 ..= n`. The older ones, and those of a key with no
//! record, are in the tree.
//!
//! An entry's key in the tree is the record's key, a zero byte and its number (u64,
//! big-endian), so a key's entries are adjacent and in order. An entry goes to the tree when the
//! record has no room for it (the oldest first), and when its change leaves no record (a
//! release, a purge): the record's own entries go with it. Without a sled transaction (which
//! takes sled's global write lock) those writes and the record's change cannot be one write,
//! so they are ordered and tied together:
//!
//! - Under the key's lock, the writer writes the tree's entries, then swaps the record, which
//!   says which entries it confirms: with a record, the tree's entries through `n - k`; with
//!   none, those up to the last entry that left the key absent (any entry after it belongs to a
//!   change that did not land).
//! - sled recovers a prefix of its writes in order, so a crash between the two leaves entries
//!   that are not confirmed, and a later write of those numbers replaces them: a record's next
//!   entries are numbered after its own.
//! - Records written before records held entries hold none (`k` = 0): their history is the
//!   tree's through `n`, and it goes on in the record.
//! - A purge writes its entry (`purged`), deletes the record, then removes the entries through
//!   its own (the first one last); readers show nothing up to a confirmed `purged` entry, so a
//!   crash part-way shows no history, and the open (the key is in the in-flight index
//!   meanwhile) removes the rest.
//! - A history in the tree starts at 1, and entry 1 is the last to go, so a key without it has
//!   none there: a fresh reservation learns its number from one read, not from an iterator
//!   (sled 0.34's reverse iteration clones a tree node, and tripled the cost of a fresh call
//!   with `Durability::None`).
//!
//! No entry adds a durable point: it is written with or before the record's change, so the
//! sync that makes the change durable covers it.
//!
//! Each entry, in the record or the tree:
//!
//! ```text
//! 0      format (1)
//! 1      event         its tag (`event_tag`: an explicit number per event, never reused)
//! 2      state         the status the change left the record in (as a record stores it), or 3:
//!                      absent
//! 3..11  at            u64, little-endian
//! then   by            a u32 length and its UTF-8 bytes
//! then   the note      a u32 length and its bytes, when option bit 1 of byte 11 is set
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sled::{IVec, Tree};

use super::encoding::view::Inline;
use super::encoding::{status_byte, status_of};
use crate::error::StoreError;
use crate::lifecycle::history::{Answer, Change, Entry, Event};
use crate::lifecycle::Status;

const FORMAT: u8 = 1;
const ABSENT: u8 = 3;
const NOTE: u8 = 1;

#[derive(Clone)]
pub(crate) struct History {
    pub(crate) tree: Tree,
    /// True while the tree is known to hold no entry: it held none at the open, and none was
    /// written since. Then a key with no record has no history, and a fresh reservation reads
    /// nothing to number its entry. Set false before any entry is written, under that key's
    /// lock, so a reader holding a key's lock sees every earlier write of that key.
    empty: Arc<AtomicBool>,
}

fn prefix(key: &[u8]) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(key.len() + 9);
    prefix.extend_from_slice(key);
    prefix.push(0);
    prefix
}

fn entry_key(key: &[u8], seq: u64) -> Vec<u8> {
    let mut entry_key = prefix(key);
    entry_key.extend_from_slice(&seq.to_be_bytes());
    entry_key
}

/// The sequence number of an entry of `key`, or `None` for an entry of a longer key that shares
/// the prefix.
fn seq_of(key: &[u8], entry_key: &[u8]) -> Option<u64> {
    let seq = entry_key.get(key.len() + 1..)?;
    (seq.len() == 8).then(|| u64::from_be_bytes(seq.try_into().expect("eight bytes")))
}

/// The byte an event is stored as. Explicit, so that no reordering of `Event` moves it; a new
/// event takes the next free number.
const fn event_tag(event: Event) -> u8 {
    match event {
        Event::Reserved => 0,
        Event::TookOver => 1,
        Event::Done => 2,
        Event::Released => 3,
        Event::Undone => 4,
        Event::InDoubt => 5,
        Event::Resolved => 6,
        Event::Reconciled { answer: Answer::Landed } => 7,
        Event::Reconciled { answer: Answer::NotLanded } => 8,
        Event::Reconciled { answer: Answer::CannotTell } => 9,
        Event::Reconciled { answer: Answer::Erred } => 10,
        Event::Purged => 11,
        Event::LateWriteRefused => 12,
        Event::ApprovalRequested => 13,
        Event::Approved => 14,
        Event::Denied => 15,
    }
}

/// The event stored as `tag`, if it is one.
fn event_of(tag: u8) -> Option<Event> {
    Event::ALL.into_iter().find(|event| event_tag(*event) == tag)
}

const PURGED: u8 = event_tag(Event::Purged);

/// The bytes of the entry for `change`, which left the record in `status`, made at `at`.
pub(crate) fn encode(change: &Change<'_>, status: Option<Status>, at: u64) -> Vec<u8> {
    let (by, note) = (change.by(), change.note());
    let mut out = Vec::with_capacity(12 + 4 + by.len() + 4 + note.map_or(0, str::len));
    out.push(FORMAT);
    out.push(event_tag(change.event()));
    out.push(status.map_or(ABSENT, status_byte));
    out.extend_from_slice(&at.to_le_bytes());
    out.push(if note.is_some() { NOTE } else { 0 });
    // Both bounded by `Change`, far below 4 GiB.
    out.extend_from_slice(&(by.len() as u32).to_le_bytes());
    out.extend_from_slice(by.as_bytes());
    if let Some(note) = note {
        out.extend_from_slice(&(note.len() as u32).to_le_bytes());
        out.extend_from_slice(note.as_bytes());
    }
    out
}

/// What the reader and the writer need of an entry without decoding it whole: whether it left
/// the key absent, and whether it is a purge.
fn leaves_absent(bytes: &[u8]) -> bool {
    bytes.get(2) == Some(&ABSENT)
}

fn is_purge(bytes: &[u8]) -> bool {
    bytes.get(1) == Some(&PURGED)
}

fn decode(key: &[u8], bytes: &[u8]) -> Result<Entry, StoreError> {
    let damaged = || {
        StoreError::new(format!(
            "a history entry of key {} is damaged; the record itself is not affected: copy the \
             store aside and inspect it",
            String::from_utf8_lossy(key)
        ))
    };
    let take = |at: usize, n: usize| bytes.get(at..at + n).ok_or_else(damaged);
    let u32_at = |at: usize| -> Result<usize, StoreError> {
        Ok(u32::from_le_bytes(take(at, 4)?.try_into().expect("four bytes")) as usize)
    };
    let text = |at: usize, n: usize| -> Result<String, StoreError> {
        String::from_utf8(take(at, n)?.to_vec()).map_err(|_| damaged())
    };
    if bytes.first() != Some(&FORMAT) {
        return Err(damaged());
    }
    let event = event_of(take(1, 1)?[0]).ok_or_else(damaged)?;
    let status = match take(2, 1)?[0] {
        ABSENT => None,
        byte => Some(status_of(byte).ok_or_else(damaged)?),
    };
    let at = u64::from_le_bytes(take(3, 8)?.try_into().expect("eight bytes"));
    let options = take(11, 1)?[0];
    let by_len = u32_at(12)?;
    let by = text(16, by_len)?;
    let mut end = 16 + by_len;
    let note = if options & NOTE != 0 {
        let len = u32_at(end)?;
        let note = text(end + 4, len)?;
        end += 4 + len;
        Some(note)
    } else {
        None
    };
    if end != bytes.len() {
        return Err(damaged());
    }
    Ok(Entry::new(at, event, status, by, note))
}

impl History {
    pub(crate) fn new(tree: Tree) -> History {
        let empty = Arc::new(AtomicBool::new(tree.is_empty()));
        History { tree, empty }
    }

    /// The last entry of `key` the stored state confirms, for a key with no record, or for a
    /// record written before histories were kept (which confirms none of its own): the last
    /// entry that left the key absent. A crash leaves at most one entry after it, so at most
    /// the last two are read (a record is absent only after a write that said so, and one from
    /// before histories has none).
    fn last_absent(&self, key: &[u8]) -> sled::Result<u64> {
        // A history starts at 1 and loses its first entry last (`remove_through`), so a key
        // without entry 1 has none. One read answers a fresh key, the common case: sled 0.34's
        // reverse iterator clones a node and costs tens of microseconds.
        if self.empty.load(Ordering::Acquire) || self.tree.get(entry_key(key, 1))?.is_none() {
            return Ok(0);
        }
        for entry in self.tree.scan_prefix(prefix(key)).rev().take(2) {
            let (entry_key, bytes) = entry?;
            let Some(seq) = seq_of(key, &entry_key) else { continue };
            if leaves_absent(&bytes) {
                return Ok(seq);
            }
        }
        Ok(0)
    }

    /// The last confirmed entry of `key`, given the history number of its record (`Some(None)`:
    /// a record from before histories, `None`: no record).
    pub(crate) fn confirmed(&self, key: &[u8], record: Option<Option<u64>>) -> sled::Result<u64> {
        match record {
            Some(Some(seq)) => Ok(seq),
            Some(None) | None => self.last_absent(key),
        }
    }

    /// Writes `bytes` as entry `seq` of `key`, replacing a leftover there.
    pub(crate) fn write(&self, key: &[u8], seq: u64, bytes: Vec<u8>) -> sled::Result<()> {
        self.empty.store(false, Ordering::Release);
        self.tree.insert(entry_key(key, seq), bytes).map(drop)
    }

    /// Removes entry `seq` of `key`: its change did not happen.
    pub(crate) fn remove(&self, key: &[u8], seq: u64) -> sled::Result<()> {
        self.tree.remove(entry_key(key, seq)).map(drop)
    }

    /// Removes the entries of `key` through `seq`: from the second up, then the first. A crash
    /// part-way leaves the first entry and a later part, which readers do not show while a
    /// confirmed purge ends it (and a first entry alone never left the key absent); and while
    /// any entry is left, so is the first, which `last_absent` relies on.
    pub(crate) fn remove_through(&self, key: &[u8], seq: u64) -> sled::Result<()> {
        for entry in self.tree.range(entry_key(key, 2)..=entry_key(key, seq)).keys() {
            let entry_key = entry?;
            if seq_of(key, &entry_key).is_some() {
                self.tree.remove(entry_key)?;
            }
        }
        self.tree.remove(entry_key(key, 1)).map(drop)
    }

    /// Up to `limit` keys that have entries and sort after `after`, in order, each once: a
    /// retention pass's page. It seeks past every entry of `after` (its key, a zero byte, any
    /// sequence number), so each page reads only its own keys' entries. (A key holding a zero
    /// byte could sort among another's entries: keys are hex.)
    pub(crate) fn keys_after(
        &self,
        after: Option<&[u8]>,
        limit: usize,
    ) -> sled::Result<Vec<Vec<u8>>> {
        let from = match after {
            Some(after) => std::ops::Bound::Excluded(entry_key(after, u64::MAX)),
            None => std::ops::Bound::Unbounded,
        };
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for entry_key in self.tree.range::<Vec<u8>, _>((from, std::ops::Bound::Unbounded)).keys() {
            let entry_key = entry_key?;
            let Some(cut) = entry_key.len().checked_sub(9) else { continue };
            if entry_key[cut] == 0 && keys.last().map(Vec::as_slice) != Some(&entry_key[..cut]) {
                if keys.len() == limit {
                    break;
                }
                keys.push(entry_key[..cut].to_vec());
            }
        }
        Ok(keys)
    }

    /// For the open, on a key with no record: the entries through its last confirmed purge,
    /// which a crash kept the purge from removing.
    pub(crate) fn finish_purge(&self, key: &[u8]) -> sled::Result<()> {
        let confirmed = self.last_absent(key)?;
        let mut purged = None;
        for entry in self.tree.range(prefix(key)..=entry_key(key, confirmed)) {
            let (entry_key, bytes) = entry?;
            if seq_of(key, &entry_key).is_some() && is_purge(&bytes) {
                purged = seq_of(key, &entry_key);
            }
        }
        match purged {
            Some(seq) => self.remove_through(key, seq),
            None => Ok(()),
        }
    }

    /// The history of `key`, oldest first, given what its record says of it (`None`: no record;
    /// else the record's last entry number, `None` for a record from before histories, and the
    /// entries it holds): the entries in the tree before the record's own, less anything up to a
    /// purge, then the record's own.
    pub(crate) fn read_all(
        &self,
        key: &[u8],
        record: Option<(Option<u64>, Inline<'_>)>,
    ) -> Result<Vec<Entry>, StoreError> {
        let read_error = |e| StoreError::with_source("cannot read a history", e);
        let (through, inline) = match record {
            // A record holds the newest entries; the tree, those before them.
            Some((Some(last), inline)) => (last - inline.len(), inline),
            Some((None, _)) | None => {
                (self.last_absent(key).map_err(read_error)?, Inline::default())
            }
        };
        let mut entries = if through == 0 { Vec::new() } else { self.read(key, through)? };
        for bytes in inline.entries() {
            entries.push(decode(key, bytes)?);
        }
        Ok(entries)
    }

    /// The confirmed history of `key` in the tree (`confirmed` from [`History::confirmed`]),
    /// oldest first, less anything up to a purge.
    pub(crate) fn read(&self, key: &[u8], confirmed: u64) -> Result<Vec<Entry>, StoreError> {
        let mut entries = Vec::new();
        for entry in self.tree.range(prefix(key)..=entry_key(key, confirmed)) {
            let (entry_key, bytes): (IVec, IVec) =
                entry.map_err(|e| StoreError::with_source("cannot read a history", e))?;
            if seq_of(key, &entry_key).is_none() {
                continue;
            }
            if is_purge(&bytes) {
                entries.clear();
                continue;
            }
            entries.push(decode(key, &bytes)?);
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::history::Answer;

    #[test]
    fn an_entry_reads_back_as_written() {
        let by = "sled:1:2:3#4";
        for (change, status) in [
            (Change::new(Event::Reserved, by), Some(Status::InFlight)),
            (Change::new(Event::Released, by), None),
            (
                Change::new(Event::Reconciled { answer: Answer::CannotTell }, by).with_note("é ✓"),
                Some(Status::InDoubt),
            ),
        ] {
            let bytes = encode(&change, status, 77);
            assert_eq!(decode(b"k", &bytes).unwrap(), Entry::of(&change, status, 77));
            assert_eq!(leaves_absent(&bytes), status.is_none());
            for len in 0..bytes.len() {
                assert!(decode(b"k", &bytes[..len]).is_err(), "cut at {len} read as an entry");
            }
        }
        assert!(is_purge(&encode(&Change::new(Event::Purged, by), None, 1)));
    }

    /// A purge cut short anywhere in its removal: the key shows no history, and the next
    /// reservation's number follows the purge.
    #[test]
    fn a_purge_cut_short_anywhere_shows_nothing() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let history = History::new(db.open_tree("h").unwrap());
        let by = "o#1";
        let steps = [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
            (Event::Purged, None),
        ];
        for cut in 0..=steps.len() {
            let key = format!("k{cut}");
            let key = key.as_bytes();
            for (seq, (event, status)) in steps.iter().enumerate() {
                let bytes = encode(&Change::new(*event, by), *status, 1);
                history.write(key, seq as u64 + 1, bytes).unwrap();
            }
            // The removal's order, stopped after `cut` removals.
            let order = [2u64, 3, 1];
            for seq in &order[..cut] {
                history.remove(key, *seq).unwrap();
            }
            let confirmed = history.confirmed(key, None).unwrap();
            assert!(history.read(key, confirmed).unwrap().is_empty(), "cut after {cut}");
            // After the purge's own entry; or, once only the first entry is left (which never
            // left the key absent), over it.
            let next = confirmed + 1;
            assert_eq!(next, if cut < 2 { 4 } else { 1 }, "cut after {cut}");
        }
    }

    #[test]
    fn event_codes_on_disk_do_not_move() {
        // Stored entries name their event by these numbers: a reorder would misread them.
        let code = |event: Event| encode(&Change::new(event, "b"), None, 0)[1];
        assert_eq!(code(Event::Reserved), 0);
        assert_eq!(code(Event::Done), 2);
        assert_eq!(code(Event::Reconciled { answer: Answer::Landed }), 7);
        assert_eq!(code(Event::Purged), 11);
        assert_eq!(code(Event::LateWriteRefused), 12);
        for event in Event::ALL {
            assert_eq!(event_of(event_tag(event)), Some(event), "{event}");
        }
    }

    #[test]
    fn every_key_with_entries_is_listed_once() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let history = History::new(db.open_tree("h").unwrap());
        let entry = encode(&Change::new(Event::Reserved, "o#1"), Some(Status::InFlight), 1);
        for (key, seq) in [(&b"ab"[..], 1), (b"ab", 2), (b"ab\0x", 1), (b"b", 300)] {
            history.write(key, seq, entry.clone()).unwrap();
        }
        assert_eq!(history.keys_after(None, 10).unwrap(), [&b"ab"[..], b"ab\0x", b"b"]);
        assert_eq!(history.keys_after(None, 2).unwrap(), [&b"ab"[..], b"ab\0x"], "the limit");
        assert_eq!(history.keys_after(Some(b"ab\0x"), 10).unwrap(), [&b"b"[..]], "the rest");
    }

    #[test]
    fn an_entry_key_names_only_its_own_record() {
        assert_eq!(seq_of(b"ab", &entry_key(b"ab", 9)), Some(9));
        assert_eq!(seq_of(b"ab", &entry_key(b"ab\0x", 9)), None);
    }
}
