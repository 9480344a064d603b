//! How the sled store writes a record: every write of a key under the key's lock, its history
//! entry in the record it writes (or, for entries the record has no room for and a change that
//! leaves no record, in the history tree before the swap that confirms them), the in-flight
//! index around writes a crash could leave half done, a result's chunks before the record that
//! points to them, then the compare-and-swap, and the settling after it. A write is laid out
//! before the lock is taken (`write/plan.rs`). See `history.rs` for why the history needs no
//! transaction, and the in-flight index in `sled.rs` for what the open does with what a crash
//! leaves.

use self::plan::Planned;
use super::encoding::set_history;
use super::encoding::view::decode;
use super::encoding::Spilled;
use super::{io_error, SledStore};
use crate::error::StoreError;
use crate::lifecycle::history::Change;
use crate::lifecycle::{Record, Status};
use crate::store::sync::Ticket;

mod plan;

/// What a swap wrote that its settling must know: its history entry's number, whether that
/// entry is in the history tree, whether it purged the history, and whether it entered the key
/// in the in-flight index.
#[derive(Clone, Copy)]
struct Settled {
    seq: u64,
    in_tree: bool,
    purge: bool,
    indexed: bool,
}

/// A swap that happened: the ticket that completes once it is durable (`None`: nothing to wait
/// for), and the fencing token of the new record's owner when it is in flight (0 otherwise).
pub(super) struct Swapped {
    pub(super) ticket: Option<Ticket>,
    pub(super) token: u64,
}

/// What the steps under the key's lock got to, whether or not they all succeeded: the number
/// of the history entry written, the bytes handed to sled's swap, and the fencing token of an
/// in-flight record's owner.
#[derive(Default)]
struct Reached {
    written: Option<u64>,
    stored: Option<sled::IVec>,
    token: u64,
}

impl SledStore {
    /// sled's compare-and-swap, with the entry `change` adds to the key's history (see
    /// `sled/history.rs`). `Ok(Ok(swapped))` when it happened, `Ok(Err(current))` with the
    /// stored bytes when they were not `old`.
    pub(super) fn cas(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> Result<Result<Swapped, Option<sled::IVec>>, StoreError> {
        let planned = self.plan(key, old, new, &change)?;
        // Every write of a key holds its lock: the entry and the swap are one step to every
        // other writer and reader of the key.
        let key_lock = self.lock_key(key);
        // Under the lock no other write of the key can come between this read and the swap, so
        // a write that would be refused writes nothing, not even its entry.
        let current = self.tree.get(key).map_err(|e| io_error(&self.path, "cannot read", e))?;
        if current.as_deref() != old {
            self.recent.set(key, current.as_ref());
            return Ok(Err(current));
        }
        self.write(key, old, new, &change, planned, &key_lock)
    }

    /// [`SledStore::cas`] for a caller that holds the key's lock (`key_lock`, from
    /// [`SledStore::lock_key`]) and read `old` under it: nothing can have replaced it since, so
    /// the swap does not read the record again.
    pub(super) fn cas_held(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
        change: Change<'_>,
        key_lock: &std::sync::MutexGuard<'_, ()>,
    ) -> Result<Result<Swapped, Option<sled::IVec>>, StoreError> {
        let planned = self.plan(key, old, new, &change)?;
        self.write(key, old, new, &change, planned, key_lock)
    }

    /// The write of a planned swap of `old`, which the caller read under the key's lock
    /// (`_key_lock`, held by the caller).
    fn write(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&Record>,
        change: &Change<'_>,
        mut planned: Planned,
        _key_lock: &std::sync::MutexGuard<'_, ()>,
    ) -> Result<Result<Swapped, Option<sled::IVec>>, StoreError> {
        if let Some(syncer) = &self.syncer {
            syncer.begin_write()?;
        }
        let mut reached = Reached::default();
        let result = new.and_then(|record| record.result.as_deref());
        let swapped = self.swap_locked(key, old, result, change, &mut planned, &mut reached);
        self.finish(key, swapped, &planned, reached)
    }

    /// Removes the history of `key` while it has no record: a purge with no record on either
    /// side of the swap, so that it takes the purge's path (its entry, the in-flight index, the
    /// removal through it, which the open finishes after a crash). `None` when the key has a
    /// record or no history; else the ticket, as from `cas`.
    pub(super) fn remove_history_now(
        &self,
        key: &[u8],
        change: Change<'_>,
    ) -> Result<Option<Option<Ticket>>, StoreError> {
        let read_error = |e| io_error(&self.path, "cannot read", e);
        {
            let _key_lock = self.lock_key(key);
            if self.tree.get(key).map_err(read_error)?.is_some()
                || self.history.confirmed(key, None).map_err(read_error)? == 0
            {
                return Ok(None);
            }
        }
        // A reservation between the look and the swap makes the swap fail; one that came and
        // was released again leaves a history this removes as well, the key still having no
        // record.
        Ok(self.cas(key, None, None, change)?.ok().map(|swapped| swapped.ticket))
    }

    /// The steps under the key's lock, once the record is known to be `old`, up to the swap: the
    /// index entry, the history entries that go to the tree, the result's chunks, then sled's
    /// compare-and-swap of `old` for the planned bytes. `reached` says how far they got, for
    /// `finish` to settle.
    fn swap_locked(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        result: Option<&str>,
        // Names the crash test's stopping point.
        #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))] change: &Change<'_>,
        planned: &mut Planned,
        reached: &mut Reached,
    ) -> sled::Result<Result<(), Option<sled::IVec>>> {
        if planned.indexed {
            self.index.insert(key, &[][..])?;
        }
        let seq = self.history.confirmed(key, planned.old_history)? + 1;
        // The entries for the tree come just before those the record holds. The old record's
        // own are numbered up to `seq - 1`, and its number is at least their count (`decode`),
        // so the first is at least 1.
        let first = seq + 1 - planned.kept - planned.to_tree.len() as u64;
        for (n, entry) in std::mem::take(&mut planned.to_tree).into_iter().enumerate() {
            self.history.write(key, first + n as u64, entry)?;
        }
        reached.written = Some(seq);
        #[cfg(feature = "failpoints")]
        {
            // A crash test stops here with the entry on disk and the change not made.
            let point = format!("after_entry_{}", change.event().as_str());
            if crate::failpoint::armed(&point) {
                let _ = self.db.flush();
                crate::failpoint::failpoint(&point);
            }
        }
        if let Some(bytes) = &mut planned.bytes {
            set_history(bytes, seq);
        }
        if planned.in_flight {
            // sled's ids grow across restarts (it persists the counter ahead of the ids it
            // hands out) and over every key, so a later owner of this key, which takes it under
            // this lock after this write, gets a greater one, even after a purge restarts the
            // key's history numbers. Starting at 1 leaves 0 to mean no token.
            reached.token = self.db.generate_id()?.saturating_add(1);
        }
        if let (Some(spilled), Some(text)) = (planned.spilled, result) {
            // The chunks go first: the sync that makes the record durable covers them.
            self.chunks.write(key, spilled.id, text)?;
            #[cfg(feature = "failpoints")]
            {
                // A crash test stops here with the chunks on disk and no record pointing to
                // them.
                let _ = self.db.flush();
                crate::failpoint::failpoint("after_chunks");
            }
        }
        // sled's own buffer, shared with the cache of recent records (see `finish`).
        let bytes = planned.bytes.take().map(sled::IVec::from);
        let swap = self.tree.compare_and_swap(key, old, bytes.clone());
        reached.stored = bytes;
        swap.map(|swap| swap.map_err(|c| c.current))
    }

    /// The steps after the swap, still under the key's lock: the cache of recent records, the
    /// store's poisoning on a failure, the sync, the settling of the index, chunks and history,
    /// and the waiters' notice.
    fn finish(
        &self,
        key: &[u8],
        swapped: sled::Result<Result<(), Option<sled::IVec>>>,
        planned: &Planned,
        reached: Reached,
    ) -> Result<Result<Swapped, Option<sled::IVec>>, StoreError> {
        let won = matches!(swapped, Ok(Ok(())));
        // The cache of recent records follows what sled now holds (after a refused or failed
        // swap, which it does not know, it forgets the key).
        self.recent.set(key, if won { reached.stored.as_ref() } else { None });
        if let (Err(e), Some(syncer)) = (&swapped, &self.syncer) {
            syncer.poison(format!("a write failed: {e}"));
        }
        let ticket = self.syncer.as_deref().and_then(|syncer| syncer.end_write(won));
        if let (Ok(outcome), Some(seq)) = (&swapped, reached.written) {
            self.settle_indexed(
                key,
                outcome,
                if won { planned.old_spilled } else { planned.spilled },
                planned.in_flight,
                Settled {
                    seq,
                    in_tree: planned.kept == 0,
                    purge: planned.purge,
                    indexed: planned.indexed,
                },
            );
        }
        match swapped {
            Ok(Ok(())) => {
                self.notifier.notify(&String::from_utf8_lossy(key));
                Ok(Ok(Swapped { ticket, token: reached.token }))
            }
            Ok(Err(current)) => Ok(Err(current)),
            Err(e) => Err(io_error(&self.path, "cannot write to", e)),
        }
    }

    /// Serialises the writes of `key` (striped: contention on one key is rare), so that one
    /// writer's index removal never drops the entry of another's newer write, and a history
    /// entry and the record's change that confirms it are one step to everyone else. A sled
    /// transaction would tie the writes too, but it takes sled's global write lock, which waits
    /// for every flush: it made fresh calls on a large store ten times slower.
    pub(super) fn lock_key(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ()> {
        let stripe = key.iter().fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b.into()));
        self.key_locks[stripe % self.key_locks.len()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After a swap that wrote its history entry (`outcome`, under the key's lock): removes
    /// the entry if the swap was refused after all, the history a purge ended, the chunks no
    /// record points to any more (`unused`), then the key's index entry unless the stored
    /// record is in flight. sled recovers a prefix of its writes, so at any point a crash stops
    /// at, the index holds every key that is in flight or may have chunks no record points to
    /// or a purged history; a failure here leaves the entry, and the next open finishes the job.
    fn settle_indexed(
        &self,
        key: &[u8],
        outcome: &Result<(), Option<sled::IVec>>,
        unused: Option<Spilled>,
        in_flight: bool,
        written: Settled,
    ) {
        let settled = (|| {
            match outcome {
                // Only a write made without the key's lock can change the record under it; the
                // entry of a change that did not happen goes. (Entries of the old record that
                // went to the tree with it stay: each is one the key had.)
                Err(_) if written.in_tree => self.history.remove(key, written.seq)?,
                Err(_) => {}
                Ok(()) if written.purge => {
                    #[cfg(feature = "failpoints")]
                    if crate::failpoint::armed("after_purge_swap") {
                        // A crash test stops here with the record gone and its history not.
                        let _ = self.db.flush();
                        crate::failpoint::failpoint("after_purge_swap");
                    }
                    self.history.remove_through(key, written.seq)?
                }
                Ok(()) => {}
            }
            if !written.indexed {
                return Ok(());
            }
            if let Some(unused) = unused {
                self.chunks.remove(key, unused.id)?;
            }
            let still_needed = match outcome {
                Ok(()) => in_flight,
                Err(current) => current.as_deref().is_some_and(|bytes| {
                    decode(key, bytes).is_ok_and(|view| view.status == Status::InFlight)
                }),
            };
            if !still_needed {
                self.index.remove(key)?;
            }
            Ok::<(), sled::Error>(())
        })();
        if let Err(e) = settled {
            tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "idem: cannot remove a result's chunks, a purged history or an index entry; the next open removes them");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunks::MAX_VALUE;
    use super::super::encoding::encode;
    use super::super::history;
    use super::*;
    use crate::exec::block_on;
    use crate::lifecycle::history::{Answer, Event};
    use crate::store::{Durability, Store};

    const KEY: &str = "k1";

    fn store(dir: &std::path::Path) -> SledStore {
        SledStore::open_storage(&SledStore::builder(dir).durability(Durability::None)).unwrap()
    }

    fn record() -> Record {
        Record::reserve(KEY, "charge_card", "order-17", &"sled:1:2:3#4".into(), 7)
    }

    fn stored(store: &SledStore) -> sled::IVec {
        store.tree.get(KEY).unwrap().expect("a record")
    }

    fn in_tree(store: &SledStore) -> usize {
        store.history.tree.scan_prefix(format!("{KEY}\0")).count()
    }

    fn note(store: &SledStore, text: &str) {
        let change = Change::new(Event::Reconciled { answer: Answer::CannotTell }, "op@host");
        block_on(store.append_history(KEY, change.with_note(text.to_owned()))).unwrap();
    }

    fn notes(store: &SledStore) -> Vec<String> {
        let entries = block_on(Store::history(store, KEY)).unwrap();
        entries
            .into_iter()
            .map(|entry| entry.note.unwrap_or_else(|| entry.event.to_string()))
            .collect()
    }

    /// A record keeps its history's newest entries, as many as it has room for; the older ones
    /// go to the tree, and the history reads whole and in order, also after a release, which
    /// leaves no record to hold them.
    #[test]
    fn a_long_history_moves_its_oldest_entries_to_the_tree_and_reads_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let reserved = Change::new(Event::Reserved, "sled:1:2:3#4");
        assert!(store.cas(KEY.as_bytes(), None, Some(&record()), reserved).unwrap().is_ok());
        assert_eq!(in_tree(&store), 0, "a short history is the record's alone");
        let mut expected = vec![Event::Reserved.to_string()];
        for n in 0..40 {
            let text = format!("{n:03} {}", "x".repeat(300));
            note(&store, &text);
            expected.push(text);
            let bytes = stored(&store);
            assert!(bytes.len() <= MAX_VALUE, "{} bytes after {n} notes", bytes.len());
            let view = decode(KEY.as_bytes(), &bytes).unwrap();
            assert_eq!(view.history, Some(n + 2));
            assert!(view.inline.len() >= 1, "the newest entry is in the record");
            assert_eq!(in_tree(&store) as u64 + view.inline.len(), n + 2);
        }
        assert!(in_tree(&store) > 20, "the oldest entries went to the tree");
        assert_eq!(notes(&store), expected);

        let released = Change::new(Event::Released, "sled:1:2:3#4");
        let old = stored(&store);
        assert!(store.cas(KEY.as_bytes(), Some(&old), None, released).unwrap().is_ok());
        expected.push(Event::Released.to_string());
        assert_eq!(notes(&store), expected, "the release moved the record's entries");
        assert_eq!(in_tree(&store), expected.len());
    }

    /// A record written before records held their history (its entries all in the tree, the
    /// record naming the last) goes on: its next entries are its own, after the tree's.
    #[test]
    fn a_history_kept_in_the_tree_by_an_earlier_version_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let by = "sled:1:2:3#4";
        let done = record().done(serde_json::json!("ch_1"), 9, None);
        for (seq, (event, status)) in
            [(Event::Reserved, Status::InFlight), (Event::Done, Status::Done)]
                .into_iter()
                .enumerate()
        {
            let entry = history::encode(&Change::new(event, by), Some(status), 1);
            store.history.write(KEY.as_bytes(), seq as u64 + 1, entry).unwrap();
        }
        let mut bytes = encode(&done, None);
        set_history(&mut bytes, 2);
        store.tree.insert(KEY, bytes).unwrap();
        assert_eq!(notes(&store), ["reserved", "done"]);

        note(&store, "asked the vendor");
        let view_bytes = stored(&store);
        let view = decode(KEY.as_bytes(), &view_bytes).unwrap();
        assert_eq!((view.history, view.inline.len()), (Some(3), 1));
        assert_eq!(notes(&store), ["reserved", "done", "asked the vendor"]);
        assert_eq!(in_tree(&store), 2, "the tree's entries stay where they are");
    }
}
