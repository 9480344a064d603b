//! The one error type of idem: every message names the key and the tool and says what to do.

use std::fmt;

use crate::lifecycle::Status;

/// A failure of the store backend, with its source. Backend-neutral: sled, PostgreSQL and any
/// other store report through this type.
#[derive(Debug)]
pub struct StoreError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    /// Whether the same call could succeed later without anyone acting (see [`Error::is_retryable`]).
    retryable: bool,
    /// Whether the database refused a transaction in a way that running it again cures.
    transient: bool,
}

impl StoreError {
    /// A store error with a message that says what went wrong and what to do.
    pub fn new(message: impl Into<String>) -> Self {
        StoreError { message: message.into(), source: None, retryable: true, transient: false }
    }

    /// A store error caused by `source`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError {
            message: message.into(),
            source: Some(Box::new(source)),
            retryable: true,
            transient: false,
        }
    }

    /// Marks the failure as one that stays until someone acts (a store that cannot be created
    /// at its path), so that [`Error::is_retryable`] is false for it and `idem::retry!` stops at
    /// once. A store error is retryable unless marked so.
    pub fn lasting(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// Whether calling again could succeed without anyone acting: true unless [`Self::lasting`].
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// Marks the failure as one that ends a transactional call's transaction in a way another
    /// attempt cures (a serialization failure, a deadlock, a broken connection): the engine
    /// rolls it back and runs the transaction again, a bounded number of times.
    pub fn transient(mut self) -> Self {
        self.transient = true;
        self
    }

    /// Whether another attempt of the transaction may cure the failure ([`Self::transient`]).
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Formats the key and tool of a store error, as far as they are known, as the start of its
/// message (`key K (tool `t`): `); nothing when neither is, so that a store error outside a
/// call reads as one problem, not two.
struct Subject<'a>(&'a Option<String>, &'a Option<String>);

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(key), Some(tool)) => write!(f, "key {key} (tool `{tool}`): "),
            (Some(key), None) => write!(f, "key {key}: "),
            (None, Some(tool)) => write!(f, "tool `{tool}`: "),
            (None, None) => Ok(()),
        }
    }
}

/// Formats why a reconciler did not settle a key in doubt, when one was asked.
struct Reason<'a>(&'a Option<String>);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(reason) => write!(f, ", and its reconciler did not settle it: {reason}"),
            None => Ok(()),
        }
    }
}

/// Formats a person's note on a denial, when they gave one.
struct Note<'a>(&'a Option<String>);

impl fmt::Display for Note<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(note) => write!(f, " ({note:?})"),
            None => Ok(()),
        }
    }
}

/// Everything that can go wrong around an idempotent call.
///
/// Tool functions return their own error type `E: From<idem::Error>`, so these travel inside it.
/// Each message names the key and the tool and says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The arguments could not be turned into canonical JSON, so no key exists; the body did not run.
    #[error(
        "tool `{tool}`: cannot derive an idempotency key: {reason}; \
         change the argument or mark it #[idem(skip)] if it is not part of the intent"
    )]
    Key {
        /// The tool whose arguments were refused.
        tool: String,
        /// What was wrong with them.
        reason: String,
    },

    /// A finished record's result no longer deserializes into the tool's return type.
    #[error(
        "key {key} (tool `{tool}`): the stored result no longer fits the return type: {source}; \
         the effect already ran, so it was not run again: fix the type, or settle the record \
         with `idem resolve {key} --done JSON`"
    )]
    Replay {
        /// The key of the record.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Why deserialization failed.
        source: serde_json::Error,
    },

    /// The body returned `Ok` but its value cannot be stored as JSON. The effect may have
    /// landed, so the record is left in doubt.
    #[error(
        "key {key} (tool `{tool}`): the result cannot be stored as JSON: {reason}; the effect \
         may have landed, so the record is in doubt: check and settle it with `idem resolve`"
    )]
    Result {
        /// The key of the record.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Why serialization failed.
        reason: String,
    },

    /// Another caller owns the key and did not finish within the wait.
    #[error(
        "key {key} (tool `{tool}`): another call has been running it since {} and did not \
         finish within the wait; retry later, or raise `wait`",
        crate::utc_timestamp(*since_ms)
    )]
    InFlight {
        /// The key that is in flight.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// When the owner reserved it, in milliseconds since the Unix epoch.
        since_ms: u64,
    },

    /// A crash or a panic left it unknown whether the effect landed.
    #[error(
        "key {key} (tool `{tool}`) is in doubt since {}: an earlier \
         attempt was interrupted and the effect may or may not have landed{}; check the target \
         system, then settle it with `idem resolve {key} --release` (not landed) or \
         `--done JSON` (landed), or use in_doubt = \"rerun\" where the vendor dedups the key",
        crate::utc_timestamp(*since_ms),
        Reason(reason)
    )]
    InDoubt {
        /// The key in doubt.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// When it was last updated, in milliseconds since the Unix epoch.
        since_ms: u64,
        /// Why the tool's reconciler did not settle it, when it has one and asked (it could not
        /// tell, it returned an error, it panicked); `None` when no reconciler was asked.
        reason: Option<String>,
    },

    /// The body ran, so its effect landed, but the store did not take its result. idem keeps
    /// trying to record it, in the background, for as long as this process runs: a later call
    /// of the key waits for it and replays it. Should the process end first, the key is in
    /// doubt.
    #[error(
        "key {key} (tool `{tool}`): the effect ran, but its result could not be recorded \
         ({reason}); idem keeps trying to record it while this process runs: call again to get \
         the result (the call waits for it), and do not repeat the effect by other means; if \
         the process ends first, the key is in doubt: settle it with `idem resolve {key} --done \
         JSON`"
    )]
    Unrecorded {
        /// The key whose result is not recorded yet.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Why the store did not take it.
        reason: String,
    },

    /// Two functions share a tool name, and so its keys: the record was written by another
    /// function than the one calling. Nothing was run or replayed.
    #[error(
        "key {key} (tool `{tool}`) was recorded by `{recorded}`, but `{calling}` is calling it: \
         two functions share the tool name `{tool}`, and so its keys; nothing was run or \
         replayed: pin distinct names with `tool = \"…\"` on one of them"
    )]
    SharedToolName {
        /// The key both derive.
        key: String,
        /// The tool name they share.
        tool: String,
        /// The function that wrote the record.
        recorded: String,
        /// The function that is calling.
        calling: String,
    },

    /// This call's body ran, but while it ran the key was taken over or settled by someone else
    /// (its owner was presumed dead: a process paused past its lease, or an operator's
    /// resolve), and the store holds no result to return in its place. Its own result was not
    /// recorded, and the effect may have run twice.
    #[error(
        "key {key} (tool `{tool}`): this call's effect ran, but the key was taken over or \
         settled while it ran (its owner was taken for dead), so its result was not recorded \
         and the store holds {now}; the effect may have run twice: check the target system and \
         `idem show {key}` before calling again"
    )]
    Superseded {
        /// The key of the call.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// What the store holds now: a status, or `absent`.
        now: String,
    },

    /// An operator asked to settle a key whose owner is a process that still runs on this host
    /// (stopped or slow: its lease ran out before its call ended). Settling it now could let the
    /// effect happen twice when the owner resumes; nothing was changed.
    #[error(
        "key {key} (tool `{tool}`): its owner, process {pid} on this host, still runs (stopped \
         or slow: its lease ran out before its call ended); settling the key now could run the \
         effect twice when it resumes, so nothing was changed: stop that process first (or find \
         why it stalls), or settle anyway with `idem resolve --force`"
    )]
    OwnerAlive {
        /// The key.
        key: String,
        /// Its tool.
        tool: String,
        /// The owner's process id.
        pid: u32,
    },

    /// A text given as a key is not one (operator API, `idem show`, `idem resolve`).
    #[error(
        "{text:?} is not a key: a key is 32 lower-case hex digits, such as \
             82e1e1a327aa97bb3929e05cc4ca3bd5 (see `idem ls`)"
    )]
    NotAKey {
        /// The text that was given.
        text: String,
    },

    /// No record exists for this key (operator API).
    #[error("key {key}: no record; check the key with `idem ls`")]
    NotFound {
        /// The key asked for.
        key: String,
    },

    /// An operator asked to resolve a record that is not in doubt.
    #[error(
        "key {key} (tool `{tool}`) is {status} and cannot be resolved: only an in-doubt record, \
         or an in-flight one whose owner is gone, can be settled"
    )]
    NotResolvable {
        /// The key asked for.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Its current status.
        status: Status,
    },

    /// The tool needs a person's approval for exactly these arguments and none has decided
    /// yet: the key is recorded as awaiting approval, and the body did not run.
    #[error(
        "key {key} (tool `{tool}`, scope `{scope}`) needs a person's approval for exactly these \
         arguments (asked since {}); nothing ran: a person approves it with `idem approve {key}` \
         or denies it with `idem deny {key} --note …`, then the same call runs once; a call \
         with other arguments is another request, which needs its own approval",
        crate::utc_timestamp(*since_ms)
    )]
    AwaitingApproval {
        /// The key that awaits approval.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// The scope of the call.
        scope: String,
        /// When the approval was asked, in milliseconds since the Unix epoch.
        since_ms: u64,
    },

    /// A person denied the key: the body did not run, and no call with these arguments will.
    #[error(
        "key {key} (tool `{tool}`) was denied by {by}{}; nothing ran, and no call with these \
         arguments will run: do not call it again, and tell the user why",
        Note(note)
    )]
    Denied {
        /// The key that was denied.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Who denied it (`user@host`).
        by: String,
        /// Their note, when they gave one.
        note: Option<String>,
    },

    /// An operator approved or denied a key that does not await approval (it was decided
    /// already, or it never needed approval). Nothing was changed.
    #[error(
        "key {key} (tool `{tool}`) is {status}, not awaiting approval, so nothing was changed; \
         `idem show {key}` says who decided it and when"
    )]
    NotAwaitingApproval {
        /// The key asked for.
        key: String,
        /// The tool it belongs to.
        tool: String,
        /// Its current status.
        status: Status,
    },

    /// The store failed.
    #[error("{}the store failed: {source}", Subject(key, tool))]
    Store {
        /// The key being worked on, when there was one.
        key: Option<String>,
        /// The tool being called, when there was a call.
        tool: Option<String>,
        /// The backend's error.
        source: StoreError,
    },
}

impl Error {
    /// The key this error is about, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Error::Key { .. } | Error::NotAKey { .. } => None,
            Error::Replay { key, .. }
            | Error::Result { key, .. }
            | Error::InFlight { key, .. }
            | Error::InDoubt { key, .. }
            | Error::Unrecorded { key, .. }
            | Error::SharedToolName { key, .. }
            | Error::Superseded { key, .. }
            | Error::OwnerAlive { key, .. }
            | Error::NotFound { key }
            | Error::NotResolvable { key, .. }
            | Error::AwaitingApproval { key, .. }
            | Error::Denied { key, .. }
            | Error::NotAwaitingApproval { key, .. } => Some(key),
            Error::Store { key, .. } => key.as_deref(),
        }
    }

    /// What kind of error this is, in one spelling (kebab-case, and a status's own spelling for
    /// `in-flight` and `in-doubt`): `key`, `replay`, `result`, `in-flight`, `in-doubt`,
    /// `unrecorded`, `shared-tool-name`, `superseded`, `owner-alive`, `not-a-key`, `not-found`, `not-resolvable`,
    /// `awaiting-approval`, `denied`, `not-awaiting-approval`, `store`.
    /// What an MCP
    /// client reads as the error's kind, and what the metrics' outcomes spell.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Key { .. } => "key",
            Error::Replay { .. } => "replay",
            Error::Result { .. } => "result",
            Error::InFlight { .. } => Status::InFlight.as_str(),
            Error::InDoubt { .. } => Status::InDoubt.as_str(),
            Error::Unrecorded { .. } => "unrecorded",
            Error::SharedToolName { .. } => "shared-tool-name",
            Error::Superseded { .. } => "superseded",
            Error::OwnerAlive { .. } => "owner-alive",
            Error::NotAKey { .. } => "not-a-key",
            Error::NotFound { .. } => "not-found",
            Error::NotResolvable { .. } => "not-resolvable",
            Error::AwaitingApproval { .. } => Status::AwaitingApproval.as_str(),
            Error::Denied { .. } => Status::Denied.as_str(),
            Error::NotAwaitingApproval { .. } => "not-awaiting-approval",
            Error::Store { .. } => "store",
        }
    }

    /// Whether calling again could succeed: true for [`Error::InFlight`] (the owner may finish),
    /// [`Error::Unrecorded`] (the call waits for the result being recorded, and replays it)
    /// and [`Error::Store`] (the backend may recover), unless the store error is one that stays
    /// until someone acts ([`StoreError::lasting`]: a store that cannot be created at its path);
    /// false for the rest, which stay as they are until someone acts (an in-doubt key is
    /// settled, the arguments or the type change). `idem::retry!` returns a non-retryable error
    /// at once.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A call again waits for the result idem is still recording, and replays it.
            Error::InFlight { .. } | Error::Unrecorded { .. } => true,
            Error::Store { source, .. } => source.is_retryable(),
            _ => false,
        }
    }

    /// The store failed while working on `key` for `tool`, as far as they are known.
    pub(crate) fn store(key: Option<&str>, tool: Option<&str>, source: StoreError) -> Self {
        Error::Store { key: key.map(str::to_owned), tool: tool.map(str::to_owned), source }
    }
}

/// For tools whose error type is a plain `String` (`Result<T, String>`): the message, which
/// names the key and says what to do.
impl From<Error> for String {
    fn from(error: Error) -> Self {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, StoreError};

    #[test]
    fn a_store_error_names_what_it_knows_and_nothing_else() {
        let failed = |key: Option<&str>, tool: Option<&str>| {
            Error::store(key, tool, StoreError::new("the disk is full")).to_string()
        };
        assert_eq!(failed(None, None), "the store failed: the disk is full");
        assert_eq!(
            failed(None, Some("refund")),
            "tool `refund`: the store failed: the disk is full"
        );
        assert_eq!(failed(Some("k1"), None), "key k1: the store failed: the disk is full");
        assert_eq!(
            failed(Some("k1"), Some("refund")),
            "key k1 (tool `refund`): the store failed: the disk is full"
        );
    }
}
