//! How the sled store lays a record out: a small binary header, then the strings, then the
//! result's JSON text as it was written. Reading it back borrows from sled's bytes, so a replay
//! copies nothing but what it hands out, and the result is parsed once, by the caller, straight
//! into the tool's type.
//!
//! ```text
//! 0      format (1)            JSON records of the first format begin with `{`, and still read
//! 1      status                0 in flight, 1 done, 2 in doubt
//! 2      which options follow  1 completed_at, 2 expires_at, 4 lease_until, 8 result
//! 3..7   attempts              u32, little-endian, as every integer here
//! 7..23  created_at, updated_at (u64 each), then each option present among completed_at,
//!        expires_at, lease_until (u64 each)
//! then   tool, scope, owner, args_fingerprint: each a u32 length and its UTF-8 bytes
//! then   the result's JSON text, a u32 length and its bytes, when present
//! ```
//!
//! The key is sled's own key for the entry, so it is not repeated in the value.

use std::borrow::Cow;

use crate::error::StoreError;
use crate::protocol::{Fence, Status};
use crate::record::Record;

const FORMAT: u8 = 1;
const COMPLETED: u8 = 1;
const EXPIRES: u8 = 2;
const LEASE: u8 = 4;
const RESULT: u8 = 8;

/// A record read from sled's bytes without copying them (a record of the first, JSON format is
/// decoded into owned fields instead).
#[derive(Debug)]
pub(crate) struct View<'a> {
    pub(crate) status: Status,
    pub(crate) attempts: u32,
    pub(crate) created_at: u64,
    pub(crate) updated_at: u64,
    pub(crate) completed_at: Option<u64>,
    pub(crate) expires_at: Option<u64>,
    pub(crate) lease_until: Option<u64>,
    pub(crate) tool: Cow<'a, str>,
    pub(crate) scope: Cow<'a, str>,
    pub(crate) owner: Cow<'a, str>,
    pub(crate) args_fingerprint: Cow<'a, str>,
    pub(crate) result: Option<Cow<'a, str>>,
}

impl View<'_> {
    /// The record under `key`, owning its fields.
    pub(crate) fn to_record(&self, key: &str) -> Record {
        Record {
            key: key.to_owned(),
            status: self.status,
            tool: self.tool.clone().into_owned(),
            scope: self.scope.clone().into_owned(),
            owner: self.owner.as_ref().into(),
            attempts: self.attempts,
            created_at: self.created_at,
            updated_at: self.updated_at,
            completed_at: self.completed_at,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            args_fingerprint: self.args_fingerprint.clone().into_owned(),
            result: self.result.as_ref().map(|text| text.clone().into_owned()),
        }
    }

    /// The state a write replacing this record is fenced on.
    pub(crate) fn fence(&self) -> Fence<'_> {
        Fence { status: self.status, owner: &self.owner, attempts: self.attempts }
    }
}

/// Writes `record` in the current format.
pub(crate) fn encode(record: &Record) -> Vec<u8> {
    let strings = [
        record.tool.as_str(),
        record.scope.as_str(),
        record.owner.as_str(),
        record.args_fingerprint.as_str(),
    ];
    let result = record.result.as_deref();
    let len = 23
        + 3 * 8
        + strings.iter().map(|s| 4 + s.len()).sum::<usize>()
        + result.map_or(0, |text| 4 + text.len());
    let mut out = Vec::with_capacity(len);
    let mut options = 0;
    for (present, bit) in [
        (record.completed_at.is_some(), COMPLETED),
        (record.expires_at.is_some(), EXPIRES),
        (record.lease_until.is_some(), LEASE),
        (result.is_some(), RESULT),
    ] {
        if present {
            options |= bit;
        }
    }
    out.push(FORMAT);
    out.push(match record.status {
        Status::InFlight => 0,
        Status::Done => 1,
        Status::InDoubt => 2,
    });
    out.push(options);
    out.extend_from_slice(&record.attempts.to_le_bytes());
    out.extend_from_slice(&record.created_at.to_le_bytes());
    out.extend_from_slice(&record.updated_at.to_le_bytes());
    for at in [record.completed_at, record.expires_at, record.lease_until].into_iter().flatten() {
        out.extend_from_slice(&at.to_le_bytes());
    }
    for s in strings {
        // A string over 4 GiB in a record is not something a tool call produces.
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    if let Some(text) = result {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out
}

fn damaged(key: &[u8], why: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::with_source(
        format!(
            "the record under key {} is damaged (not a readable record); nothing was run for it: \
             stop the agents, copy the store aside, and inspect it",
            String::from_utf8_lossy(key)
        ),
        why,
    )
}

/// Why a record in the current format does not read.
#[derive(Debug)]
struct Truncated(&'static str);

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Truncated {}

/// Reads the record stored under `key`, in either format.
pub(crate) fn decode<'a>(key: &[u8], bytes: &'a [u8]) -> Result<View<'a>, StoreError> {
    match bytes.first() {
        Some(&FORMAT) => decode_current(bytes).map_err(|why| damaged(key, why)),
        _ => {
            let record: Record = serde_json::from_slice(bytes).map_err(|e| damaged(key, e))?;
            Ok(View {
                status: record.status,
                attempts: record.attempts,
                created_at: record.created_at,
                updated_at: record.updated_at,
                completed_at: record.completed_at,
                expires_at: record.expires_at,
                lease_until: record.lease_until,
                tool: Cow::Owned(record.tool),
                scope: Cow::Owned(record.scope),
                owner: Cow::Owned(record.owner.as_str().to_owned()),
                args_fingerprint: Cow::Owned(record.args_fingerprint),
                result: record.result.map(Cow::Owned),
            })
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if self.bytes.len() < n {
            return Err(Truncated("the record ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Truncated> {
        let mut word = [0; 4];
        word.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(word))
    }

    fn u64(&mut self) -> Result<u64, Truncated> {
        let mut word = [0; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    fn str(&mut self, n: usize) -> Result<&'a str, Truncated> {
        std::str::from_utf8(self.take(n)?).map_err(|_| Truncated("a text field is not UTF-8"))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, Truncated> {
        let len = self.u32()? as usize;
        self.str(len).map(Cow::Borrowed)
    }
}

fn decode_current(bytes: &[u8]) -> Result<View<'_>, Truncated> {
    let mut r = Reader { bytes: &bytes[1..] };
    let status = match r.u8()? {
        0 => Status::InFlight,
        1 => Status::Done,
        2 => Status::InDoubt,
        _ => return Err(Truncated("unknown status")),
    };
    let options = r.u8()?;
    let attempts = r.u32()?;
    let created_at = r.u64()?;
    let updated_at = r.u64()?;
    let mut option = |bit: u8| if options & bit != 0 { r.u64().map(Some) } else { Ok(None) };
    let completed_at = option(COMPLETED)?;
    let expires_at = option(EXPIRES)?;
    let lease_until = option(LEASE)?;
    let tool = r.string()?;
    let scope = r.string()?;
    let owner = r.string()?;
    let args_fingerprint = r.string()?;
    let result = if options & RESULT != 0 { Some(r.string()?) } else { None };
    if !r.bytes.is_empty() {
        return Err(Truncated("bytes after the record"));
    }
    Ok(View {
        status,
        attempts,
        created_at,
        updated_at,
        completed_at,
        expires_at,
        lease_until,
        tool,
        scope,
        owner,
        args_fingerprint,
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done() -> Record {
        Record::reserve("k", "charge_card", "order-17", "sled:1:2:3#4", "ab".repeat(32).as_str(), 7)
            .done(
                serde_json::json!({"id": "ch_1", "amount": 4200}),
                9,
                Some(std::time::Duration::from_secs(1)),
            )
    }

    #[test]
    fn a_record_reads_back_as_written() {
        for record in [
            done(),
            done().in_doubt(10),
            Record { lease_until: Some(11), ..done().taken_over("other#1", 10) },
        ] {
            let bytes = encode(&record);
            assert_eq!(decode(b"k", &bytes).unwrap().to_record("k"), record);
        }
    }

    #[test]
    fn a_record_of_the_first_json_format_still_reads() {
        let json = r#"{"key":"k","status":"done","tool":"charge_card","scope":"order-17",
            "owner":"sled:1:2:3#4","attempts":1,"created_at":7,"updated_at":9,"completed_at":9,
            "expires_at":null,"args_fingerprint":"ab","result":{"id":"ch_1"}}"#;
        let record = decode(b"k", json.as_bytes()).unwrap().to_record("k");
        assert_eq!(record.status, Status::Done);
        assert_eq!(record.result.as_deref(), Some(r#"{"id":"ch_1"}"#));
    }

    #[test]
    fn a_truncated_record_is_damaged_not_a_panic() {
        let mut bytes = encode(&done());
        for len in 1..bytes.len() {
            assert!(decode(b"k", &bytes[..len]).is_err(), "cut at {len} read as a record");
        }
        bytes.push(0);
        assert!(decode(b"k", &bytes).is_err(), "a byte too many read as a record");
    }
}
