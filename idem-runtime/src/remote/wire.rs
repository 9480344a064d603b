//! The admin socket's protocol: one JSON object per line each way, each carrying the protocol
//! version as `v`. A request names its operation in `op`; a response holds either `ok` (the
//! operation's value, shaped as [`crate::admin`] returns it) or `error`.
//!
//! ```text
//! {"v":1,"op":"ls","status":"in-doubt","tool":null}    {"v":1,"ok":[{…record…}]}
//! {"v":1,"op":"show","key":"…"}                         {"v":1,"ok":{…record…}}
//! {"v":1,"op":"history","key":"…"}                      {"v":1,"ok":[{…entry…}]}
//! {"v":1,"op":"resolve","key":"…","resolution":"release","by":"ann@host"}
//! {"v":1,"op":"resolve","key":"…","resolution":{"done":{"id":"ch_1"}},"by":"ann@host","note":"…"}
//! {"v":1,"op":"decide","key":"…","decision":"approve","by":"ann@host","note":"…"}
//! {"v":1,"op":"purge","which":"expired","by":"ann@host"}
//! {"v":1,"op":"purge","which":{"older-than-ms":9},"by":"ann@host"}  {"v":1,"ok":3,"histories":2}
//! {"v":1,"op":"stats"}                                  {"v":1,"error":{"kind":"not-found",…}}
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::time::Duration;

use crate::admin::{Filter, Listing, Purge, Purged};
use crate::error::{Error, StoreError};
use crate::lifecycle::history::Entry;
use crate::lifecycle::transition::Decision;
use crate::lifecycle::{Record, Resolution, Status};

/// Who a history records for a resolve or purge whose request names no one (a client from
/// before histories).
pub(crate) const UNNAMED: &str = "an operator (unnamed)";

/// The version this build speaks; a request with another is refused, not guessed at.
pub(crate) const VERSION: u64 = 1;

/// The socket's file name inside the store directory.
pub(crate) const SOCKET_FILE: &str = "admin.sock";

/// The largest request line accepted, newline included. A resolve carries the result an
/// operator types, so this is generous, but a client cannot make the server buffer without end.
pub(crate) const MAX_REQUEST_BYTES: usize = 4 << 20;

/// One operation of [`crate::admin`], as it travels.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum Request {
    Ls {
        #[serde(default)]
        status: Option<Status>,
        #[serde(default)]
        tool: Option<String>,
    },
    /// As `ls`, and the records that could not be read, as errors: `{"records": […],
    /// "unreadable": [error, …]}`.
    Scan {
        #[serde(default)]
        status: Option<Status>,
        #[serde(default)]
        tool: Option<String>,
    },
    Show {
        key: String,
    },
    History {
        key: String,
    },
    /// `by` and `note` go into the key's history. Optional, so that a request of a client
    /// from before histories still reads: it is recorded as by [`UNNAMED`].
    Resolve {
        key: String,
        resolution: WireResolution,
        #[serde(default)]
        by: Option<String>,
        #[serde(default)]
        note: Option<String>,
        /// Sent only when true, so that an agent from before it still reads every other resolve.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    Purge {
        which: WirePurge,
        #[serde(default)]
        by: Option<String>,
    },
    /// A person approves or denies a key that awaits approval; `by` and `note` go into its
    /// history. Added after the first release: an older holder refuses it as not understood.
    Decide {
        key: String,
        decision: WireDecision,
        by: String,
        #[serde(default)]
        note: Option<String>,
    },
    Stats,
}

/// [`Decision`] on the wire.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WireDecision {
    Approve,
    Deny,
}

impl From<Decision> for WireDecision {
    fn from(decision: Decision) -> WireDecision {
        match decision {
            Decision::Approve => WireDecision::Approve,
            Decision::Deny => WireDecision::Deny,
        }
    }
}

impl From<WireDecision> for Decision {
    fn from(decision: WireDecision) -> Decision {
        match decision {
            WireDecision::Approve => Decision::Approve,
            WireDecision::Deny => Decision::Deny,
        }
    }
}

/// [`Resolution`] on the wire: an enum rather than an optional result, since `null` is a result.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum WireResolution {
    Release,
    Done(Value),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum WirePurge {
    Expired,
    OlderThanMs(u64),
}

impl From<Resolution> for WireResolution {
    fn from(resolution: Resolution) -> WireResolution {
        match resolution {
            Resolution::Release => WireResolution::Release,
            Resolution::Done(value) => WireResolution::Done(value),
        }
    }
}

impl From<WireResolution> for Resolution {
    fn from(resolution: WireResolution) -> Resolution {
        match resolution {
            WireResolution::Release => Resolution::Release,
            WireResolution::Done(value) => Resolution::Done(value),
        }
    }
}

impl From<Purge> for WirePurge {
    fn from(which: Purge) -> WirePurge {
        match which {
            Purge::Expired => WirePurge::Expired,
            Purge::OlderThan(age) => {
                WirePurge::OlderThanMs(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
            }
        }
    }
}

impl From<WirePurge> for Purge {
    fn from(which: WirePurge) -> Purge {
        match which {
            WirePurge::Expired => Purge::Expired,
            WirePurge::OlderThanMs(ms) => Purge::OlderThan(Duration::from_millis(ms)),
        }
    }
}

impl Request {
    pub(crate) fn scan(filter: &Filter) -> Request {
        Request::Scan { status: filter.status, tool: filter.tool.clone() }
    }

    pub(crate) fn resolve(
        key: &str,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
        force: bool,
    ) -> Request {
        Request::Resolve {
            key: key.to_owned(),
            resolution: resolution.into(),
            by: Some(by.to_owned()),
            note: note.map(str::to_owned),
            force,
        }
    }

    pub(crate) fn decide(key: &str, decision: Decision, by: &str, note: Option<&str>) -> Request {
        Request::Decide {
            key: key.to_owned(),
            decision: decision.into(),
            by: by.to_owned(),
            note: note.map(str::to_owned),
        }
    }

    pub(crate) fn purge(which: Purge, by: &str) -> Request {
        Request::Purge { which: which.into(), by: Some(by.to_owned()) }
    }

    /// The line a client sends, newline included.
    pub(crate) fn to_line(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a request is plain JSON");
        value["v"] = VERSION.into();
        let mut line = value.to_string();
        line.push('\n');
        line
    }

    /// Reads one request line. The version is checked before the operation, so that a newer
    /// client's new operation is reported as a version mismatch rather than as nonsense.
    pub(crate) fn from_line(line: &[u8]) -> Result<Request, String> {
        let mut value: Value = serde_json::from_slice(line)
            .map_err(|e| format!("the request is not one JSON object on one line: {e}"))?;
        let Some(object) = value.as_object_mut() else {
            return Err("the request must be a JSON object".to_owned());
        };
        match object.remove("v") {
            Some(v) if v.as_u64() == Some(VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "protocol version {v} is not spoken here (this process speaks {VERSION}): \
                     use an idem command built from the same idem version as the agent"
                ))
            }
            None => {
                return Err(format!(
                    "the request has no protocol version `v` (this process speaks {VERSION})"
                ))
            }
        }
        Request::deserialize(value).map_err(|e| format!("the request is not understood: {e}"))
    }
}

/// Why an operation failed, as it travels: enough to rebuild the [`Error`] the operation gave,
/// so that the `idem` command prints the same line either way.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(crate) enum WireError {
    NotAKey {
        text: String,
    },
    NotFound {
        key: String,
    },
    NotResolvable {
        key: String,
        tool: String,
        status: Status,
    },
    NotAwaitingApproval {
        key: String,
        tool: String,
        status: Status,
    },
    Store {
        key: Option<String>,
        tool: Option<String>,
        message: String,
    },
    /// The request itself was refused: malformed, too large, another version, another user.
    Refused {
        message: String,
    },
    /// Any other error, as its message.
    Other {
        message: String,
    },
}

impl From<Error> for WireError {
    fn from(error: Error) -> WireError {
        match error {
            Error::NotAKey { text } => WireError::NotAKey { text },
            Error::NotFound { key } => WireError::NotFound { key },
            Error::NotResolvable { key, tool, status } => {
                WireError::NotResolvable { key, tool, status }
            }
            Error::NotAwaitingApproval { key, tool, status } => {
                WireError::NotAwaitingApproval { key, tool, status }
            }
            Error::Store { key, tool, source } => {
                WireError::Store { key, tool, message: source.to_string() }
            }
            other => WireError::Other { message: other.to_string() },
        }
    }
}

impl WireError {
    pub(crate) fn into_error(self) -> Error {
        match self {
            WireError::NotAKey { text } => Error::NotAKey { text },
            WireError::NotFound { key } => Error::NotFound { key },
            WireError::NotResolvable { key, tool, status } => {
                Error::NotResolvable { key, tool, status }
            }
            WireError::NotAwaitingApproval { key, tool, status } => {
                Error::NotAwaitingApproval { key, tool, status }
            }
            WireError::Store { key, tool, message } => {
                Error::Store { key, tool, source: StoreError::new(message) }
            }
            WireError::Refused { message } | WireError::Other { message } => Error::store(
                None,
                None,
                StoreError::new(format!(
                    "the process holding the store refused the request: {message}"
                )),
            ),
        }
    }
}

/// A record as it travels: as [`Record`] serializes, but with its result as the JSON text it is
/// stored as, so that the operator sees that text exactly (a JSON value would reorder keys).
pub(crate) fn record_to_value(record: &Record) -> Value {
    let mut value = serde_json::to_value(Record { result: None, ..record.clone() })
        .expect("a record is plain JSON");
    value["result"] = record.result.clone().map_or(Value::Null, Value::String);
    value
}

/// The inverse of [`record_to_value`].
pub(crate) fn record_from_value(mut value: Value) -> Result<Record, String> {
    let result = match value.get_mut("result").map(Value::take) {
        Some(Value::String(text)) => Some(text),
        Some(Value::Null) | None => None,
        Some(other) => return Err(format!("a record's result must be JSON text, not {other}")),
    };
    let mut record: Record =
        serde_json::from_value(value).map_err(|e| format!("not a record: {e}"))?;
    record.result = result;
    Ok(record)
}

/// Records as they travel: an array of [`record_to_value`].
pub(crate) fn records_to_value(records: &[Record]) -> Value {
    Value::Array(records.iter().map(record_to_value).collect())
}

/// The answer to `scan`: `{"records": […], "unreadable": [error, …]}`.
pub(crate) fn listing_to_value(listing: Listing) -> Value {
    let unreadable = listing
        .unreadable
        .into_iter()
        .map(|e| serde_json::to_value(WireError::from(e)).expect("an error is plain JSON"))
        .collect();
    serde_json::json!({
        "records": records_to_value(&listing.records),
        "unreadable": Value::Array(unreadable),
    })
}

/// The inverse of [`listing_to_value`].
pub(crate) fn listing_from_value(mut value: Value) -> Result<Listing, String> {
    let (Value::Array(records), Value::Array(unreadable)) =
        (value["records"].take(), value["unreadable"].take())
    else {
        return Err(format!("a listing must hold `records` and `unreadable` arrays, not {value}"));
    };
    let records = records.into_iter().map(record_from_value).collect::<Result<_, _>>()?;
    let unreadable = unreadable
        .into_iter()
        .map(|error| {
            serde_json::from_value::<WireError>(error)
                .map(WireError::into_error)
                .map_err(|e| format!("not an error: {e}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(Listing { records, unreadable })
}

/// A history as it travels: the entries as they serialize.
pub(crate) fn entries_to_value(entries: &[Entry]) -> Value {
    serde_json::to_value(entries).expect("an entry is plain JSON")
}

/// An answer as it travels: the `ok` value, and the fields v1 gained beside it, which a client
/// of an earlier release does not read (a purge's `ok` is the records it removed, as it always
/// was; `histories` the histories of keys without a record).
#[derive(Debug)]
pub(crate) struct Answer {
    ok: Value,
    beside: Vec<(&'static str, Value)>,
}

impl From<Value> for Answer {
    fn from(ok: Value) -> Answer {
        Answer { ok, beside: Vec::new() }
    }
}

impl From<Purged> for Answer {
    fn from(purged: Purged) -> Answer {
        Answer { ok: purged.records.into(), beside: vec![("histories", purged.histories.into())] }
    }
}

/// One response line, newline included.
pub(crate) fn ok_line(answer: Answer) -> String {
    let mut response = serde_json::json!({ "v": VERSION, "ok": answer.ok });
    for (field, value) in answer.beside {
        response[field] = value;
    }
    let mut line = response.to_string();
    line.push('\n');
    line
}

/// One error response line, newline included.
pub(crate) fn error_line(error: WireError) -> String {
    let error = serde_json::to_value(error).expect("an error is plain JSON");
    let mut line = serde_json::json!({ "v": VERSION, "error": error }).to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of an earlier release reads a purge's `ok` as the number of records it removed;
    /// the histories travel beside it.
    #[test]
    fn a_purge_answer_keeps_its_count_of_records_in_ok() {
        let line = ok_line(Purged::new(3, 2).into());
        let response: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(response, serde_json::json!({"v": 1, "ok": 3, "histories": 2}));
        let plain: Value = serde_json::from_str(&ok_line(Value::Null.into())).unwrap();
        assert_eq!(plain, serde_json::json!({"v": 1, "ok": null}), "other answers gain nothing");
    }

    #[test]
    fn requests_round_trip_with_their_version() {
        let line = Request::resolve("k", Resolution::Done(Value::Null), "ann@h", Some("n"), false)
            .to_line();
        assert!(line.contains("\"v\":1"), "{line}");
        match Request::from_line(line.trim_end().as_bytes()).unwrap() {
            Request::Resolve {
                key,
                resolution: WireResolution::Done(Value::Null),
                by,
                note,
                force: false,
            } => {
                assert_eq!(
                    (key.as_str(), by.as_deref(), note.as_deref()),
                    ("k", Some("ann@h"), Some("n"))
                )
            }
            other => panic!("{other:?}"),
        }
        // A request from before histories names no one, and still reads.
        let old = br#"{"v":1,"op":"resolve","key":"k","resolution":"release"}"#;
        assert!(matches!(
            Request::from_line(old),
            Ok(Request::Resolve { by: None, note: None, .. })
        ));
    }

    #[test]
    fn a_decision_round_trips() {
        let line = Request::decide("k", Decision::Deny, "ann@h", Some("too much")).to_line();
        assert!(line.contains(r#""decision":"deny""#), "{line}");
        match Request::from_line(line.trim_end().as_bytes()).unwrap() {
            Request::Decide { key, decision: WireDecision::Deny, by, note } => {
                assert_eq!(
                    (key.as_str(), by.as_str(), note.as_deref()),
                    ("k", "ann@h", Some("too much"))
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_other_versions_unknown_fields_and_non_objects() {
        let version = Request::from_line(br#"{"v":2,"op":"stats"}"#).unwrap_err();
        assert!(version.contains("version 2") && version.contains("speaks 1"), "{version}");
        let missing = Request::from_line(br#"{"op":"stats"}"#).unwrap_err();
        assert!(missing.contains("no protocol version"), "{missing}");
        let field = Request::from_line(br#"{"v":1,"op":"show","key":"k","x":1}"#).unwrap_err();
        assert!(field.contains("unknown field"), "{field}");
        let op = Request::from_line(br#"{"v":1,"op":"drop-all"}"#).unwrap_err();
        assert!(op.contains("drop-all"), "{op}");
        assert!(Request::from_line(b"[1]").unwrap_err().contains("JSON object"));
        assert!(Request::from_line(b"{\"v\":").unwrap_err().contains("not one JSON object"));
    }
}
