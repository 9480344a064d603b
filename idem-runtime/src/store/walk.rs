//! A walk over every key of a store, a page at a time in key order ([`Store::scan_page`]): how
//! the operator interface and a sweep read a whole store without holding it in memory at once,
//! and without a second way to list records that every backend would have to write.

use super::{Store, Stored};
use crate::error::StoreError;

/// How many keys a walk reads at a time.
pub(crate) const PAGE: usize = 512;

/// Where a walk over a store's keys stands: the key its next page reads after, until the
/// store's last page.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    after: Option<String>,
    ended: bool,
}

impl Walk {
    /// The next page of `store`'s keys, after those this walk read; `None` once it read them
    /// all. A record that cannot be read is an `Err` in its place, as the store gave it.
    pub(crate) async fn next(
        &mut self,
        store: &dyn Store,
    ) -> Result<Option<Vec<(String, Stored)>>, StoreError> {
        if self.ended {
            return Ok(None);
        }
        let page = store.scan_page(self.after.as_deref(), PAGE).await?;
        self.ended = page.next.is_none();
        self.after = page.next;
        Ok(Some(page.entries))
    }
}
