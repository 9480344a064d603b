//! A call as the engine's decisions read it: its name, key and policy, borrowed from [`Call`],
//! and what it reports about the record it finds (another function's record, a key awaiting
//! approval or denied, an owner that keeps it past the wait, a result that no longer reads).
//!
//! [`Call`]: super::Call

use std::time::{Duration, Instant};

use super::waiting::Waiting;
use super::{Approval, InDoubtPolicy};
use crate::error::Error;
use crate::key::Key;
use crate::lifecycle::history::{Entry, Event};
use crate::lifecycle::Record;
use crate::store::Store;

/// A call's name, key and policy, as the engine's decisions read them ([`Call::parts`]).
///
/// [`Call::parts`]: super::Call::parts
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallParts<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The calling function's path, when the call names one.
    pub function: Option<&'a str>,
    /// The scope, as text.
    pub scope: &'a str,
    /// The key.
    pub key: &'a Key,
    /// How long to wait for another owner ([`DEFAULT_WAIT`](super::DEFAULT_WAIT) when `None`).
    pub wait: Option<Duration>,
    /// What to do with a key in doubt.
    pub in_doubt: InDoubtPolicy,
    /// Whether the call needs a person's approval, and for how long one stays good.
    pub(super) approval: Option<Approval>,
}

impl CallParts<'_> {
    /// Refuses a record another function wrote: the two share a tool name, and so its keys.
    /// Records that name no function (written by `Call` without one, or by another language's
    /// client) are taken as this call's.
    pub fn check_function(&self, found: &Record) -> Result<(), Error> {
        match (&found.function, self.function) {
            (Some(recorded), Some(calling)) if recorded != calling => Err(Error::SharedToolName {
                key: self.key.to_string(),
                tool: self.tool.to_owned(),
                recorded: recorded.clone(),
                calling: calling.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// The error of a call that finds `existing` awaiting a person's approval.
    pub fn awaiting_approval(&self, existing: &Record) -> Error {
        Error::AwaitingApproval {
            key: self.key.to_string(),
            tool: self.tool.to_owned(),
            scope: existing.scope.clone(),
            since_ms: existing.created_at,
        }
    }

    /// The error of a call that finds its key denied, with who denied it and their note, from
    /// the key's `history` (a person unnamed when it cannot be read).
    pub fn denied(&self, history: Option<&[Entry]>) -> Error {
        let decision = history
            .and_then(|entries| entries.iter().rev().find(|entry| entry.event == Event::Denied));
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: denied: not running");
        Error::Denied {
            key: self.key.to_string(),
            tool: self.tool.to_owned(),
            by: decision.map_or_else(|| "a person".to_owned(), |entry| entry.by.clone()),
            note: decision.and_then(|entry| entry.note.clone()),
        }
    }

    /// Waits on `store` until the record of the key is no longer `existing` (another call's
    /// in flight), until `deadline`; the record as it then stands, or `Error::InFlight` when
    /// the deadline passed with the owner still holding it.
    pub async fn wait_for_owner(
        &self,
        store: &dyn Store,
        existing: Record,
        deadline: Instant,
    ) -> Result<Option<Record>, Error> {
        let key = self.key.as_str();
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: waiting for the owner");
        let _waiting = Waiting::start(key);
        let now = store
            .watch(key, &existing, deadline)
            .await
            .map_err(|e| Error::store(Some(key), Some(self.tool), e))?;
        match now {
            Some(now) if now.is_as(&existing) && Instant::now() >= deadline => {
                Err(Error::InFlight {
                    key: self.key.to_string(),
                    tool: self.tool.to_owned(),
                    since_ms: existing.created_at,
                })
            }
            now => Ok(now),
        }
    }

    /// The result `record` holds, read back with `decode`; a result that no longer reads as
    /// the tool's type is `Error::Replay`.
    pub fn replay<T>(
        &self,
        record: &Record,
        decode: impl FnOnce(&str) -> serde_json::Result<T>,
    ) -> Result<T, Error> {
        // A unit result of the first (JSON) sled format reads back as no result: `null`.
        let json = record.result.as_deref().unwrap_or("null");
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: replay");
        decode(json).map_err(|source| Error::Replay {
            key: self.key.to_string(),
            tool: self.tool.to_owned(),
            source,
        })
    }
}
