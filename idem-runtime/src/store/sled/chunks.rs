//! Results too large to sit in a record, kept as chunks in a tree of their own.
//!
//! sled 0.34 writes any page whose serialized form passes a quarter of its 512 KiB segment
//! (`reserve_inner` in its `pagecache/logger.rs`) to a file of its own under `blobs/`, and never
//! syncs that file; a blob lost to a power loss makes sled's recovery drop every later write,
//! synced or not. A page is a whole tree node when sled consolidates it, and a leaf splits past
//! 16 entries, so values of at most [`MAX_VALUE`] bytes keep even a leaf holding twice that many
//! entries well under the threshold: the store never hands sled a value that becomes a blob.
//!
//! A chunk's key is the record's key, a zero byte, the chunk id (a u64 from sled's
//! `generate_id`, unique to one write of one result) and the chunk's index, both big-endian, so
//! the chunks of one result are adjacent and in order. They are written before the record that
//! points to them, so the sync that makes the record durable covers them too; they are removed
//! once a record no longer points to them, and chunks that no record points to (left by a crash
//! between the two writes) are removed when the store opens: the key of every such write is in
//! the in-flight index until the write is complete, so the open looks only at those keys (and
//! scans every chunk once, when it migrates a store written before the index).

use sled::{IVec, Tree};

use super::encoding::view::decode;
use super::encoding::Spilled;
use crate::error::StoreError;

/// The largest value the store hands sled: a record, or one chunk of a result.
pub(crate) const MAX_VALUE: usize = 4096;

/// The largest result the sled store keeps, in bytes of its JSON text.
pub(crate) const MAX_RESULT: usize = 16 * 1024 * 1024;

#[derive(Clone)]
pub(crate) struct Chunks {
    pub(crate) tree: Tree,
}

fn prefix(key: &[u8], id: u64) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(key.len() + 9 + 4);
    prefix.extend_from_slice(key);
    prefix.push(0);
    prefix.extend_from_slice(&id.to_be_bytes());
    prefix
}

/// The record key and chunk id a chunk key belongs to.
fn owner_of(chunk_key: &[u8]) -> Option<(&[u8], u64)> {
    let split = chunk_key.len().checked_sub(13)?;
    let (key, rest) = chunk_key.split_at(split);
    let id = u64::from_be_bytes(rest.get(1..9)?.try_into().ok()?);
    (rest[0] == 0).then_some((key, id))
}

impl Chunks {
    /// Writes `text` as the chunks of `id` under `key`.
    pub(crate) fn write(&self, key: &[u8], id: u64, text: &str) -> sled::Result<()> {
        let prefix = prefix(key, id);
        for (index, piece) in text.as_bytes().chunks(MAX_VALUE).enumerate() {
            let mut chunk_key = prefix.clone();
            // A result is at most MAX_RESULT bytes, so the index fits in a u32.
            chunk_key.extend_from_slice(&(index as u32).to_be_bytes());
            self.tree.insert(chunk_key, piece)?;
        }
        Ok(())
    }

    /// The text kept in the chunks `spilled` names, or `None` when they are not all there (a
    /// writer removed them after the record that pointed to them was replaced).
    pub(crate) fn read(&self, key: &[u8], spilled: Spilled) -> sled::Result<Option<Vec<u8>>> {
        let mut text = Vec::with_capacity(spilled.len as usize);
        for (index, entry) in self.tree.scan_prefix(prefix(key, spilled.id)).enumerate() {
            let (chunk_key, piece) = entry?;
            let at =
                u32::from_be_bytes(chunk_key[chunk_key.len() - 4..].try_into().unwrap_or([0; 4]));
            if at as usize != index {
                return Ok(None);
            }
            text.extend_from_slice(&piece);
        }
        Ok((text.len() == spilled.len as usize).then_some(text))
    }

    /// Removes the chunks of `id` under `key`.
    pub(crate) fn remove(&self, key: &[u8], id: u64) -> sled::Result<()> {
        for entry in self.tree.scan_prefix(prefix(key, id)).keys() {
            self.tree.remove(entry?)?;
        }
        Ok(())
    }

    /// Removes the chunks under `key` other than those of `keep` (the id the key's record points
    /// to, if any); how many were removed. The in-flight index names the keys to look at.
    pub(crate) fn remove_orphans_of(&self, key: &[u8], keep: Option<u64>) -> sled::Result<usize> {
        let mut start = key.to_vec();
        start.push(0);
        let mut removed = 0;
        for entry in self.tree.scan_prefix(start).keys() {
            let chunk_key = entry?;
            // A longer record key may share the prefix: only this key's chunks are looked at.
            match owner_of(&chunk_key) {
                Some((owner, id)) if owner == key && Some(id) != keep => {
                    self.tree.remove(&chunk_key)?;
                    removed += 1;
                }
                _ => {}
            }
        }
        Ok(removed)
    }

    /// Removes every chunk that no record in `records` points to; how many were removed.
    pub(crate) fn remove_orphans(&self, records: &Tree) -> Result<usize, StoreError> {
        let mut removed = 0;
        let mut last: Option<(IVec, bool)> = None;
        for entry in self.tree.iter().keys() {
            let chunk_key = entry.map_err(|e| StoreError::with_source("cannot read chunks", e))?;
            let prefix_len = chunk_key.len().saturating_sub(4);
            let kept = match &last {
                Some((prefix, kept)) if prefix[..] == chunk_key[..prefix_len] => *kept,
                _ => {
                    let kept = match owner_of(&chunk_key) {
                        Some((key, id)) => {
                            let record = records
                                .get(key)
                                .map_err(|e| StoreError::with_source("cannot read records", e))?;
                            record.is_some_and(|bytes| {
                                decode(key, &bytes)
                                    .is_ok_and(|view| view.spilled.is_some_and(|s| s.id == id))
                            })
                        }
                        None => false,
                    };
                    last = Some((IVec::from(&chunk_key[..prefix_len]), kept));
                    kept
                }
            };
            if !kept {
                self.tree
                    .remove(&chunk_key)
                    .map_err(|e| StoreError::with_source("cannot remove a chunk", e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_key_names_its_record_and_id() {
        let mut chunk_key = prefix(b"abc", 7);
        chunk_key.extend_from_slice(&3u32.to_be_bytes());
        assert_eq!(owner_of(&chunk_key), Some((&b"abc"[..], 7)));
        assert_eq!(owner_of(b"short"), None);
    }
}
