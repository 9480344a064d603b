//! The record a store keeps per key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::owner::Owner;
use super::status::Status;

/// One key's record. The arguments are not stored, in any form: they may hold personal data,
/// and the key already stands for them.
///
/// Only the lifecycle makes or changes a record (see `lifecycle/transition.rs`); a store reads
/// one back from what it stored with [`RecordParts`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Record {
    /// The idempotency key (32 hex characters).
    pub key: String,
    /// Where the key stands.
    pub status: Status,
    /// The tool name that went into the key.
    pub tool: String,
    /// The function that wrote the record, by path (`billing::send`), when the call named it
    /// (the attributes do): two functions that share a tool name share its keys, and a call of
    /// one must not replay the other's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The scope text that went into the key.
    pub scope: String,
    /// The call that reserved (or last took over) the key.
    pub owner: Owner,
    /// How many times the body has been started for this key.
    pub attempts: u32,
    /// Milliseconds since the Unix epoch when the key was first reserved.
    pub created_at: u64,
    /// Milliseconds since the Unix epoch of the last change.
    pub updated_at: u64,
    /// When the body finished, for `Done` records.
    pub completed_at: Option<u64>,
    /// After this instant a `Done` record is no longer replayed (from `ttl`).
    pub expires_at: Option<u64>,
    /// For stores with leases: until when the owner's lease holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<u64>,
    /// The body's result as JSON text, when `Done`: kept as written, so that a replay parses it
    /// once, straight into the tool's type. It serializes as the JSON it holds, not as a string.
    #[serde(default, with = "json_text")]
    pub result: Option<String>,
}

impl Record {
    /// A new `InFlight` record owned by `owner`.
    pub(crate) fn reserve(key: &str, tool: &str, scope: &str, owner: &Owner, now: u64) -> Record {
        Record {
            key: key.to_owned(),
            status: Status::InFlight,
            tool: tool.to_owned(),
            function: None,
            scope: scope.to_owned(),
            owner: owner.clone(),
            attempts: 1,
            created_at: now,
            updated_at: now,
            completed_at: None,
            expires_at: None,
            lease_until: None,
            result: None,
        }
    }

    /// Whether a `Done` record has outlived its `ttl` at `now`.
    pub fn is_expired(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// This record taken over by `owner` for another attempt.
    pub(crate) fn taken_over(&self, owner: &Owner, now: u64) -> Record {
        Record {
            status: Status::InFlight,
            owner: owner.clone(),
            attempts: self.attempts.saturating_add(1),
            updated_at: now,
            completed_at: None,
            expires_at: None,
            result: None,
            ..self.clone()
        }
    }

    /// This record taken over by `owner` to ask the tool's reconciler whether the effect
    /// landed. In flight, so that no other caller runs the body or asks meanwhile, with the
    /// same `attempts`: the body does not start for it.
    pub(crate) fn reconciling(&self, owner: &Owner, now: u64) -> Record {
        Record { attempts: self.attempts, ..self.taken_over(owner, now) }
    }

    /// This record finished with `result`.
    pub(crate) fn done(
        &self,
        result: serde_json::Value,
        now: u64,
        ttl: Option<Duration>,
    ) -> Record {
        self.done_json(result.to_string(), now, ttl)
    }

    /// This record finished with `json`, a result already written as JSON text.
    pub(crate) fn done_json(&self, json: String, now: u64, ttl: Option<Duration>) -> Record {
        Record {
            status: Status::Done,
            updated_at: now,
            completed_at: Some(now),
            expires_at: ttl.map(|ttl| now.saturating_add(ttl.as_millis() as u64)),
            lease_until: None,
            result: Some(json),
            ..self.clone()
        }
    }

    /// A new record of `key` awaiting a person's approval: the body has not run (no attempts).
    pub(crate) fn awaiting_approval(
        key: &str,
        tool: &str,
        scope: &str,
        owner: &Owner,
        now: u64,
    ) -> Record {
        Record {
            status: Status::AwaitingApproval,
            attempts: 0,
            ..Record::reserve(key, tool, scope, owner, now)
        }
    }

    /// This record (a result past its `ttl`, or an approval past the call's `approval_ttl`)
    /// awaiting a new approval, asked by `owner`: a new request, as if the key were new.
    pub(crate) fn approval_asked_again(&self, owner: &Owner, now: u64) -> Record {
        Record {
            created_at: now,
            ..Record::awaiting_approval(&self.key, &self.tool, &self.scope, owner, now)
        }
    }

    /// This record, awaiting approval, decided by a person at `now`: approved or denied.
    pub(crate) fn decided(&self, status: Status, now: u64) -> Record {
        Record { status, updated_at: now, ..self.clone() }
    }

    /// Whether an `Approved` record's approval, given at its `updated_at`, has outlived `ttl`
    /// at `now`, so that a call must ask again. An approval without a `ttl` never expires.
    pub fn approval_expired(&self, ttl: Option<Duration>, now: u64) -> bool {
        self.status == Status::Approved
            && ttl.is_some_and(|ttl| self.updated_at.saturating_add(ttl.as_millis() as u64) <= now)
    }

    /// This record marked in doubt.
    pub(crate) fn in_doubt(&self, now: u64) -> Record {
        Record { status: Status::InDoubt, updated_at: now, lease_until: None, ..self.clone() }
    }
}

/// Every field of a [`Record`], for a store that reads one back from what it stored (a store
/// never makes a new state: it keeps what the lifecycle made).
#[derive(Clone, Debug)]
pub struct RecordParts {
    /// See [`Record::key`].
    pub key: String,
    /// See [`Record::status`].
    pub status: Status,
    /// See [`Record::tool`].
    pub tool: String,
    /// See [`Record::function`].
    pub function: Option<String>,
    /// See [`Record::scope`].
    pub scope: String,
    /// See [`Record::owner`].
    pub owner: String,
    /// See [`Record::attempts`].
    pub attempts: u32,
    /// See [`Record::created_at`].
    pub created_at: u64,
    /// See [`Record::updated_at`].
    pub updated_at: u64,
    /// See [`Record::completed_at`].
    pub completed_at: Option<u64>,
    /// See [`Record::expires_at`].
    pub expires_at: Option<u64>,
    /// See [`Record::lease_until`].
    pub lease_until: Option<u64>,
    /// See [`Record::result`].
    pub result: Option<String>,
}

impl From<RecordParts> for Record {
    fn from(parts: RecordParts) -> Record {
        Record {
            key: parts.key,
            status: parts.status,
            tool: parts.tool,
            function: parts.function,
            scope: parts.scope,
            owner: parts.owner.into(),
            attempts: parts.attempts,
            created_at: parts.created_at,
            updated_at: parts.updated_at,
            completed_at: parts.completed_at,
            expires_at: parts.expires_at,
            lease_until: parts.lease_until,
            result: parts.result,
        }
    }
}

/// `Record::result` in serde: the JSON it holds, embedded as JSON (as `idem show --json` prints
/// it), rather than as a string of JSON.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        text: &Option<String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let value = match text {
            Some(text) => Some(
                serde_json::from_str::<serde_json::Value>(text)
                    .map_err(serde::ser::Error::custom)?,
            ),
            None => None,
        };
        value.serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<String>, D::Error> {
        let value = Option::<serde_json::Value>::deserialize(deserializer)?;
        Ok(value.map(|v| v.to_string()))
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
