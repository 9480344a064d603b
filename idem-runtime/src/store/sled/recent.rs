//! Finished records this process wrote or read lately, kept in memory so that replaying one (a
//! retry of a call that just finished, the commonest replay) costs the same whatever the store's
//! size, instead of a walk down sled's tree that grows with it.
//!
//! The cache holds, for a key, nothing or exactly the bytes sled holds under it, and only those
//! of `Done` records whose result sits in the record (not in chunks). An entry is sled's own
//! buffer, shared rather than copied, and decoded on a hit as a read from sled would be: one
//! contiguous buffer is what a hit touches, however scattered the process's memory.
//!
//! Its entry for a key changes only under that key's lock (`SledStore::lock_key`): a write sets
//! it to what it stored, or drops it, before the lock is released, and a read that misses fills
//! it from sled while holding the lock, so no write can come between what it read and what it
//! keeps. A record read from the cache is therefore one sled held at some moment during the
//! read, as a read from sled would be; readers still await the store's durable point before
//! acting on it. Eviction only forgets.

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use super::encoding::view::decode;
use crate::lifecycle::Record;
use crate::lifecycle::Status;

/// What an entry costs beyond its bytes: the map's slot, the key's allocation, the buffer's
/// header.
const ENTRY_OVERHEAD: u64 = 96;

/// An entry's weight: about the bytes it holds in memory.
#[derive(Clone)]
struct Bytes;

impl Weighter<Vec<u8>, sled::IVec> for Bytes {
    fn weight(&self, key: &Vec<u8>, bytes: &sled::IVec) -> u64 {
        ENTRY_OVERHEAD + (key.len() + bytes.len()) as u64
    }
}

pub(super) struct Recent {
    /// `None` when the store was opened with no room for it.
    cache: Option<Cache<Vec<u8>, sled::IVec, Bytes>>,
}

impl Recent {
    /// A cache of at most about `bytes` of records; none at all for 0.
    pub(super) fn new(bytes: u64) -> Recent {
        // About 384 bytes a typical entry, for the map's initial size.
        let items = usize::try_from(bytes / 384).unwrap_or(usize::MAX).max(16);
        Recent { cache: (bytes > 0).then(|| Cache::with_weighter(items, bytes, Bytes)) }
    }

    /// The record under `key`, if the cache has it.
    pub(super) fn get(&self, key: &str) -> Option<Record> {
        let bytes = self.cache.as_ref()?.get(key.as_bytes())?;
        let view = decode(key.as_bytes(), &bytes).ok()?;
        Some(view.to_record(key))
    }

    /// Under `key`'s lock: `stored` is what sled now holds under it (`None`: nothing, or not
    /// known, as after a failed write). Keeps it if it is a finished record with its result in
    /// it, else forgets the key.
    pub(super) fn set(&self, key: &[u8], stored: Option<&sled::IVec>) {
        let Some(cache) = &self.cache else { return };
        // Removed first: an entry too heavy for the cache is not kept, and must not leave the
        // record it replaces behind.
        cache.remove(key);
        let keep = stored.filter(|bytes| {
            decode(key, bytes)
                .is_ok_and(|view| view.status == Status::Done && view.spilled.is_none())
        });
        if let Some(bytes) = keep {
            cache.insert(key.to_vec(), bytes.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sled::encoding::encode;

    fn bytes(record: &Record) -> sled::IVec {
        sled::IVec::from(encode(record, None))
    }

    #[test]
    fn keeps_a_finished_record_and_forgets_the_key_on_any_other_write() {
        let recent = Recent::new(1 << 20);
        let reserved = Record::reserve("k1", "charge_card", "s", &"owner#1".into(), 1);
        let done = reserved.done(serde_json::json!("ch_1"), 2, None);
        recent.set(b"k1", Some(&bytes(&done)));
        assert_eq!(recent.get("k1"), Some(done.clone()), "a finished record is kept as stored");
        recent.set(b"k1", Some(&bytes(&reserved)));
        assert_eq!(recent.get("k1"), None, "an in-flight record is not kept");
        recent.set(b"k1", Some(&bytes(&done)));
        recent.set(b"k1", Some(&bytes(&done.in_doubt(3))));
        assert_eq!(recent.get("k1"), None, "a record in doubt is not kept");
        recent.set(b"k1", Some(&bytes(&done)));
        recent.set(b"k1", None);
        assert_eq!(recent.get("k1"), None, "a removed or unknown record is forgotten");
    }

    #[test]
    fn a_record_too_large_to_keep_does_not_leave_the_one_it_replaces() {
        let recent = Recent::new(64 * 1024);
        let reserved = Record::reserve("k1", "charge_card", "s", &"owner#1".into(), 1);
        let small = reserved.done(serde_json::json!("ch_1"), 2, None);
        recent.set(b"k1", Some(&bytes(&small)));
        assert!(recent.get("k1").is_some());
        let large = reserved.done(serde_json::json!("x".repeat(256 * 1024)), 3, None);
        recent.set(b"k1", Some(&bytes(&large)));
        assert_eq!(recent.get("k1"), None, "the smaller record replaced by a larger one stayed");
    }

    #[test]
    fn a_store_opened_without_the_cache_keeps_nothing() {
        let recent = Recent::new(0);
        let done = Record::reserve("k1", "charge_card", "s", &"owner#1".into(), 1).done(
            serde_json::json!(1),
            2,
            None,
        );
        recent.set(b"k1", Some(&bytes(&done)));
        assert_eq!(recent.get("k1"), None);
    }
}
