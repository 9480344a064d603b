//! Finished records this process wrote or read lately, kept in memory so that replaying one (a
//! retry of a call that just finished, the commonest replay) is a hash lookup whatever the
//! store's size, instead of a walk down sled's tree that grows with it.
//!
//! The cache holds, for a key, nothing or exactly the record stored under it, and only `Done`
//! records. Its entry for a key changes only under that key's lock (`SledStore::lock_key`): a
//! write sets it to what it stored, or drops it, before the lock is released, and a read that
//! misses fills it from sled while holding the lock, so no write can come between what it read
//! and what it keeps. A record read from the cache is therefore one sled held at some moment
//! during the read, as a read from sled would be; readers still await the store's durable
//! point before acting on it. Eviction only forgets.

use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use crate::protocol::Status;
use crate::record::Record;

/// What an entry costs beyond its strings: the map's slot, the `Arc`, the record's fields.
const ENTRY_OVERHEAD: u64 = 160;

/// A record's weight: about the bytes it holds in memory.
#[derive(Clone)]
struct Bytes;

impl Weighter<Vec<u8>, Arc<Record>> for Bytes {
    fn weight(&self, key: &Vec<u8>, record: &Arc<Record>) -> u64 {
        let strings = [
            key.len(),
            record.tool.len(),
            record.scope.len(),
            record.owner.as_str().len(),
            record.function.as_ref().map_or(0, String::len),
            record.result.as_ref().map_or(0, String::len),
        ];
        ENTRY_OVERHEAD + strings.iter().sum::<usize>() as u64
    }
}

pub(super) struct Recent {
    /// `None` when the store was opened with no room for it.
    cache: Option<Cache<Vec<u8>, Arc<Record>, Bytes>>,
}

impl Recent {
    /// A cache of at most about `bytes` of records; none at all for 0.
    pub(super) fn new(bytes: u64) -> Recent {
        // About 512 bytes a typical entry, for the map's initial size.
        let items = usize::try_from(bytes / 512).unwrap_or(usize::MAX).max(16);
        Recent { cache: (bytes > 0).then(|| Cache::with_weighter(items, bytes, Bytes)) }
    }

    /// The record under `key`, if the cache has it.
    pub(super) fn get(&self, key: &[u8]) -> Option<Record> {
        self.cache.as_ref()?.get(key).map(|record| Record::clone(&record))
    }

    /// Under `key`'s lock: `stored` is what sled now holds under it (`None`: nothing, or not
    /// known, as after a failed write). Keeps it if it is a finished record, else forgets the key.
    pub(super) fn set(&self, key: &[u8], stored: Option<&Record>) {
        let Some(cache) = &self.cache else { return };
        // Removed first: an entry too heavy for the cache is not kept, and must not leave the
        // record it replaces behind.
        cache.remove(key);
        if let Some(record) = stored.filter(|record| record.status == Status::Done) {
            cache.insert(key.to_vec(), Arc::new(record.clone()));
        }
    }
}
