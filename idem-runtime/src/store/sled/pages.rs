//! What a walk of the whole store asks of the sled store: pages of records and of histories in
//! key order, read by seeking rather than by walking the whole store, joined.

use std::ops::Bound;

use super::encoding::view::decode;
use super::{io_error, SledStore};
use crate::error::StoreError;
use crate::store::{Page, RecordPage};

impl SledStore {
    /// Up to `limit` keys after `after` in key order, each with its record or its history's
    /// last time: a page of each tree, joined.
    pub(super) fn scan_page_now(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let records = self.records_page(after, limit)?;
        Ok(Page::merge(records, self.histories_page(after, limit)?, limit))
    }

    /// Up to `limit` records after `after`, in key order, each beside its key.
    fn records_page(&self, after: Option<&str>, limit: usize) -> Result<RecordPage, StoreError> {
        let from = match after {
            Some(after) => Bound::Excluded(after.as_bytes()),
            None => Bound::Unbounded,
        };
        let mut page = Vec::new();
        for entry in self.tree.range::<&[u8], _>((from, Bound::Unbounded)) {
            if page.len() == limit {
                break;
            }
            let (key, bytes) = entry.map_err(|e| io_error(&self.path, "cannot read", e))?;
            let key = String::from_utf8_lossy(&key).into_owned();
            // A record whose result is in chunks is read whole (unless it went meanwhile); a
            // damaged one is reported.
            let record = match decode(key.as_bytes(), &bytes) {
                Ok(view) if view.spilled.is_none() => Ok(view.to_record(&key)),
                Ok(_) => match self.load(&key).transpose() {
                    Some(record) => record,
                    None => continue,
                },
                Err(e) => Err(e),
            };
            page.push((key, record));
        }
        Ok(page)
    }

    /// Up to `limit` keys with a history after `after`, in key order, each with its last
    /// confirmed entry's time when it has no record.
    fn histories_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<u64>)>, StoreError> {
        let read_error = |e| io_error(&self.path, "cannot read", e);
        let keys = self.history.keys_after(after.map(str::as_bytes), limit).map_err(read_error)?;
        let mut page = Vec::with_capacity(keys.len());
        for key in keys {
            // Under the key's lock, the record and its entries are read as one state.
            let _key_lock = self.lock_key(&key);
            let last = match self.tree.get(&key).map_err(read_error)? {
                Some(_) => None,
                None => {
                    let confirmed = self.history.confirmed(&key, None).map_err(read_error)?;
                    self.history.read(&key, confirmed)?.last().map(|entry| entry.at)
                }
            };
            page.push((String::from_utf8_lossy(&key).into_owned(), last));
        }
        Ok(page)
    }
}
