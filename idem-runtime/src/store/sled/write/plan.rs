//! How a sled write is laid out before the key's lock is taken: the record's bytes, where a
//! result too large for the record goes, which of the key's history entries the record holds and
//! which go to the history tree, and whether the write goes through the in-flight index. What the
//! store cannot keep is refused here, before anything is written.

use super::super::chunks::{MAX_RESULT, MAX_VALUE};
use super::super::encoding::view::decode;
use super::super::encoding::{encode_with, encoded_len, lifetime_len, Spilled};
use super::super::history;
use super::super::{io_error, SledStore};
use crate::error::StoreError;
use crate::lifecycle::history::Change;
use crate::lifecycle::{now_ms, Record, Status};

/// A write laid out before the key's lock is taken: the record's bytes (holding the newest
/// history entries, the last one numbered under the lock), the entries that go to the history
/// tree instead, and what the write leaves for its settling to do.
pub(super) struct Planned {
    pub(super) bytes: Option<Vec<u8>>,
    pub(super) spilled: Option<Spilled>,
    /// Entries for the history tree, oldest first: those of the old record and the new change
    /// that the new record has no room for (all of them when the change leaves no record).
    pub(super) to_tree: Vec<Vec<u8>>,
    /// How many entries the new record holds (the newest; the change's own among them when
    /// this is not 0).
    pub(super) kept: u64,
    pub(super) old_spilled: Option<Spilled>,
    pub(super) old_history: Option<Option<u64>>,
    pub(super) in_flight: bool,
    pub(super) purge: bool,
    pub(super) indexed: bool,
}

impl SledStore {
    /// Lays the write out: the bytes of `new`, the entry of `change`, and whether the write
    /// goes through the in-flight index. Refuses what the store cannot keep (`lay_out`).
    pub(super) fn plan(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
        change: &Change<'_>,
    ) -> Result<Planned, StoreError> {
        let old_view = old.and_then(|old| decode(key, old).ok());
        let was_in_flight = old_view.as_ref().is_some_and(|view| view.status == Status::InFlight);
        let old_spilled = old_view.as_ref().and_then(|view| view.spilled);
        let old_history = old_view.as_ref().map(|view| view.history);
        let in_flight = new.is_some_and(|new| new.status == Status::InFlight);
        let entry = history::encode(change, new.map(|record| record.status), now_ms());
        // The key's entries that a record holds: the old record's, then this change's.
        let mut entries: Vec<&[u8]> = match &old_view {
            Some(view) => view.inline.entries().collect(),
            None => Vec::new(),
        };
        entries.push(&entry);
        let (bytes, spilled, kept) = match new {
            Some(record) => {
                let (bytes, spilled, kept) = self.lay_out(record, &entries)?;
                (Some(bytes), spilled, kept)
            }
            None => (None, None, 0),
        };
        let to_tree = entries[..entries.len() - kept].iter().map(|entry| entry.to_vec()).collect();
        let purge = change.event().ends_history();
        // A write that leaves or enters flight, or writes or drops a result's chunks, or purges
        // a history, is indexed: a crash part-way leaves the key in the index for the next open
        // to settle.
        let indexed =
            was_in_flight || in_flight || spilled.is_some() || old_spilled.is_some() || purge;
        Ok(Planned {
            bytes,
            spilled,
            to_tree,
            kept: kept as u64,
            old_spilled,
            old_history,
            in_flight,
            purge,
            indexed,
        })
    }

    /// How `record` is written: its bytes, where its result's chunks go when it does not fit in
    /// the record, and how many of the newest of the key's history `entries` (oldest first) it
    /// holds: as many as fit in what the record leaves of [`MAX_VALUE`]. Refuses what the store
    /// cannot keep, before anything is written, and an in-flight record whose call could not
    /// keep its later records.
    fn lay_out(
        &self,
        record: &Record,
        entries: &[&[u8]],
    ) -> Result<(Vec<u8>, Option<Spilled>, usize), StoreError> {
        let encode = |spilled: Option<Spilled>| {
            // The newest entries that fit in what the record leaves (a count, then each with
            // its length); the older ones go to the tree.
            let mut room = MAX_VALUE.saturating_sub(encoded_len(record, spilled.is_some()) + 4);
            let kept = entries
                .iter()
                .rev()
                .take_while(|entry| match room.checked_sub(4 + entry.len()) {
                    Some(left) => {
                        room = left;
                        true
                    }
                    None => false,
                })
                .count();
            (encode_with(record, spilled, &entries[entries.len() - kept..]), spilled, kept)
        };
        let result_len = record.result.as_ref().map_or(0, String::len);
        if result_len > MAX_RESULT {
            return Err(StoreError::new(format!(
                "key {}: the result of tool `{}` is {result_len} bytes of JSON, more than the \
                 {MAX_RESULT} bytes the sled store keeps; nothing was recorded for it: return \
                 less (for example where the data is kept, not the data)",
                record.key, record.tool
            ))
            .lasting());
        }
        // A call is refused before its body runs, rather than after, when it could not record
        // how it ended: an in-flight record must leave room for every later one of its call.
        if record.status == Status::InFlight && lifetime_len(record) > MAX_VALUE {
            let function = match &record.function {
                Some(function) => format!(", function `{function}`"),
                None => String::new(),
            };
            return Err(StoreError::new(format!(
                "key {}: tool `{}` with a scope of {} bytes{function} needs up to {} bytes for \
                 its record once it finishes (with its times, where its result is kept and its \
                 owner), more than the {MAX_VALUE} bytes a sled record holds; nothing was run or \
                 recorded for it: use a shorter scope (or tool name or function path)",
                record.key,
                record.tool,
                record.scope.len(),
                lifetime_len(record)
            )));
        }
        if encoded_len(record, false) <= MAX_VALUE {
            return Ok(encode(None));
        }
        if record.result.is_some() && encoded_len(record, true) <= MAX_VALUE {
            let id =
                self.db.generate_id().map_err(|e| io_error(&self.path, "cannot write to", e))?;
            // Bounded by MAX_RESULT above.
            let spilled = Spilled { id, len: result_len as u32 };
            return Ok(encode(Some(spilled)));
        }
        Err(StoreError::new(format!(
            "key {}: tool `{}` with its scope takes {} bytes, more than the {MAX_VALUE} bytes a \
             sled record holds; nothing was recorded for it: use a shorter scope or tool name",
            record.key,
            record.tool,
            encoded_len(record, true)
        )))
    }
}
