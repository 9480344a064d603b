//! How the sled store lays a record out: a small binary header, then the strings, then the
//! result's JSON text as it was written. Reading it back (`encoding/view.rs`) borrows from
//! sled's bytes, so a replay copies nothing but what it hands out, and the result is parsed
//! once, by the caller, straight into the tool's type.
//!
//! ```text
//! 0      format (1)            JSON records of the first format begin with `{`, and still read
//! 1      status                0 in flight, 1 done, 2 in doubt, 4 awaiting approval,
//!                              5 approved, 6 denied (3 is a history entry's absent)
//! 2      which options follow  1 completed_at, 2 expires_at, 4 lease_until, 8 result,
//!                              16 function, 32 result kept in chunks, 64 history,
//!                              128 the history's newest entries kept in the record
//! 3..7   attempts              u32, little-endian, as every integer here
//! 7..23  created_at, updated_at (u64 each), then each option present among completed_at,
//!        expires_at, lease_until (u64 each)
//! then   tool, scope, owner, and a fourth string: each a u32 length and its UTF-8 bytes. The
//!        fourth held a fingerprint of the arguments in earlier releases; it is written empty
//!        and skipped on read, since the key already stands for the arguments
//! then   the result's JSON text, a u32 length and its bytes, when present (option 8)
//! or     where its chunks are: a u64 chunk id and the u32 length of the text (option 32)
//! then   the function that wrote the record, a u32 length and its bytes, when present
//! then   the key's newest history entries, oldest first (option 128): a u32 count, then each
//!        a u32 length and the entry's bytes (`history.rs` gives their layout)
//! then   the sequence number of the key's last history entry, a u64 (option 64: always
//!        written now, and last, so that a writer sets it once it holds the key's lock)
//! ```
//!
//! The entries a record holds are numbered up to its last one: with `k` of them and a last
//! number `n`, they are `n - k + 1 ..= n`, and the key's older entries are in the history tree
//! (`history.rs`). Records written before option 128 hold none.
//!
//! A result too large to sit in the record is kept in chunks (see `chunks.rs`), so that no
//! value handed to sled reaches the size at which sled writes it to a file of its own.
//!
//! The key is sled's own key for the entry, so it is not repeated in the value.

use crate::lifecycle::owner::MAX_OWNER;
use crate::lifecycle::Record;
use crate::lifecycle::Status;

pub(super) mod view;

const FORMAT: u8 = 1;
const COMPLETED: u8 = 1;
const EXPIRES: u8 = 2;
const LEASE: u8 = 4;
const RESULT: u8 = 8;
const FUNCTION: u8 = 16;
const CHUNKED: u8 = 32;
const HISTORY: u8 = 64;
const INLINE: u8 = 128;

/// The byte a status is stored as, in a record and in a history entry.
pub(crate) const fn status_byte(status: Status) -> u8 {
    match status {
        Status::InFlight => 0,
        Status::Done => 1,
        Status::InDoubt => 2,
        // 3 is taken: a history entry's "absent" (`store/sled/history.rs`).
        Status::AwaitingApproval => 4,
        Status::Approved => 5,
        Status::Denied => 6,
    }
}

/// The status stored as `byte`, if it is one.
pub(crate) const fn status_of(byte: u8) -> Option<Status> {
    match byte {
        0 => Some(Status::InFlight),
        1 => Some(Status::Done),
        2 => Some(Status::InDoubt),
        4 => Some(Status::AwaitingApproval),
        5 => Some(Status::Approved),
        6 => Some(Status::Denied),
        _ => None,
    }
}

/// Sets the history sequence number of a record [`encode`] wrote (its last 8 bytes).
pub(crate) fn set_history(bytes: &mut [u8], seq: u64) {
    let at = bytes.len() - 8;
    bytes[at..].copy_from_slice(&seq.to_le_bytes());
}

/// Where a result kept in chunks is: its chunk id and the length of its JSON text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spilled {
    pub(crate) id: u64,
    pub(crate) len: u32,
}

/// The bytes `entries` take in a record: a count, then each with its length.
fn inline_len<'e>(entries: impl IntoIterator<Item = &'e [u8]>) -> usize {
    4 + entries.into_iter().map(|entry| 4 + entry.len()).sum::<usize>()
}

/// The length [`encode`] gives `record`, with its result inline, or with a chunk reference in
/// its place when `spilled`.
pub(crate) fn encoded_len(record: &Record, spilled: bool) -> usize {
    let result = match (&record.result, spilled) {
        (Some(_), true) => CHUNK_REFERENCE,
        (Some(text), false) => 4 + text.len(),
        (None, _) => 0,
    };
    let times = [record.completed_at, record.expires_at, record.lease_until];
    len_with(record, record.owner.as_str().len(), times.iter().flatten().count(), result)
}

/// The longest any later record of the call that writes the in-flight `record` can be
/// encoded: finished, with every time set (completed, expiring, leased) and its result kept in
/// chunks (the store keeps a result in the record only when the record still fits), or in
/// doubt, or taken over, under any owner of at most [`MAX_OWNER`] bytes. Tool, scope and
/// function do not change while the call holds the key (a takeover that names another function
/// is an in-flight write, bounded in turn), and notes go to the history, not the record.
pub(crate) fn lifetime_len(record: &Record) -> usize {
    len_with(record, record.owner.as_str().len().max(MAX_OWNER), 3, CHUNK_REFERENCE)
}

/// A chunk reference in place of a result: its chunk id and the length of the text.
const CHUNK_REFERENCE: usize = 8 + 4;

/// The encoded length of `record` with an owner of `owner` bytes, `times` of its optional
/// times, and `result` bytes for its result.
fn len_with(record: &Record, owner: usize, times: usize, result: usize) -> usize {
    // tool, scope, owner and the empty fourth string, each with its length
    let strings = 4 * 4 + record.tool.len() + record.scope.len() + owner;
    let function = record.function.as_ref().map_or(0, |text| 4 + text.len());
    23 + 8 * times + 8 + strings + result + function
}

/// Writes `record` in the current format; with `spilled`, its result is replaced by a reference
/// to the chunks that hold it.
#[cfg(test)]
pub(crate) fn encode(record: &Record, spilled: Option<Spilled>) -> Vec<u8> {
    encode_with(record, spilled, &[])
}

/// Writes `record` as [`encode`] does, holding the history entries `inline` (oldest first; the
/// writer numbers the last one with `set_history`).
pub(crate) fn encode_with(record: &Record, spilled: Option<Spilled>, inline: &[&[u8]]) -> Vec<u8> {
    let strings = [record.tool.as_str(), record.scope.as_str(), record.owner.as_str(), ""];
    let result = if spilled.is_some() { None } else { record.result.as_deref() };
    let function = record.function.as_deref();
    let inline_bytes = if inline.is_empty() { 0 } else { inline_len(inline.iter().copied()) };
    let len = encoded_len(record, spilled.is_some()) + inline_bytes;
    let mut out = Vec::with_capacity(len);
    let mut options = 0;
    for (present, bit) in [
        (record.completed_at.is_some(), COMPLETED),
        (record.expires_at.is_some(), EXPIRES),
        (record.lease_until.is_some(), LEASE),
        (result.is_some(), RESULT),
        (function.is_some(), FUNCTION),
        (spilled.is_some(), CHUNKED),
        (true, HISTORY),
        (!inline.is_empty(), INLINE),
    ] {
        if present {
            options |= bit;
        }
    }
    out.push(FORMAT);
    out.push(status_byte(record.status));
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
    if let Some(Spilled { id, len }) = spilled {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    if let Some(text) = function {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    if !inline.is_empty() {
        // Bounded by the record's size (`chunks::MAX_VALUE`), as is each entry.
        out.extend_from_slice(&(inline.len() as u32).to_le_bytes());
        for entry in inline {
            out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
            out.extend_from_slice(entry);
        }
    }
    // Set by the writer under the key's lock (`set_history`).
    out.extend_from_slice(&0u64.to_le_bytes());
    debug_assert_eq!(out.len(), len);
    out
}

#[cfg(test)]
mod tests {
    use super::view::decode;
    use super::*;

    fn done() -> Record {
        Record::reserve("k", "charge_card", "order-17", &"sled:1:2:3#4".into(), 7).done(
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
            Record { lease_until: Some(11), ..done().taken_over(&"other#1".into(), 10) },
            Record { function: Some("billing::send".into()), ..done() },
        ] {
            let bytes = encode(&record, None);
            assert_eq!(bytes.len(), encoded_len(&record, false));
            assert_eq!(decode(b"k", &bytes).unwrap().to_record("k"), record);
        }
    }

    #[test]
    fn a_record_points_to_its_last_history_entry() {
        let mut bytes = encode(&done(), None);
        assert_eq!(decode(b"k", &bytes).unwrap().history, Some(0));
        set_history(&mut bytes, 0x0102_0304_0506_0708);
        let view = decode(b"k", &bytes).unwrap();
        assert_eq!(view.history, Some(0x0102_0304_0506_0708));
        assert_eq!(view.to_record("k"), done());
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
    fn a_result_in_chunks_reads_back_as_its_reference() {
        let record = done();
        let spilled = Spilled { id: 0x0102_0304_0506_0708, len: 70_000 };
        let bytes = encode(&record, Some(spilled));
        assert_eq!(bytes.len(), encoded_len(&record, true));
        let view = decode(b"k", &bytes).unwrap();
        assert_eq!(view.spilled, Some(spilled));
        assert_eq!(view.to_record("k"), Record { result: None, ..record });
    }

    #[test]
    fn no_later_record_of_a_call_passes_its_lifetime_bound() {
        let owner = "sled:host:1:2:0badcafe#3".into();
        let longest_owner = "o".repeat(MAX_OWNER).into();
        let mut held = Record::reserve("k", "charge_card", &"s".repeat(3000), &owner, 7);
        held.function = Some("billing::send".into());
        let bound = lifetime_len(&held);
        let ttl = Some(std::time::Duration::from_secs(60));
        let done = held.done_json("1".repeat(100_000), 9, ttl);
        let taken = held.taken_over(&longest_owner, 10);
        let later = [
            held.clone(),
            held.in_doubt(10),
            Record { owner: longest_owner.clone(), ..done.clone() },
            done,
            Record { lease_until: Some(11), ..taken.clone() },
            Record { lease_until: Some(11), ..taken.done_json("2".repeat(20), 12, ttl) },
            taken.in_doubt(13),
        ];
        for record in later {
            // A result that does not fit in the record goes to chunks, and this is what is left.
            let len = encoded_len(&record, record.result.is_some());
            assert!(len <= bound, "{len} > {bound}: {:?}", record.status);
        }
    }

    #[test]
    fn a_record_holds_its_newest_history_entries() {
        let entries: [&[u8]; 3] = [b"first", b"", b"third \xc3\xa9"];
        let mut bytes = encode_with(&done(), None, &entries);
        set_history(&mut bytes, 7);
        let view = decode(b"k", &bytes).unwrap();
        assert_eq!((view.history, view.inline.len()), (Some(7), 3));
        assert_eq!(view.inline.entries().collect::<Vec<_>>(), entries);
        assert_eq!(view.to_record("k"), done());
        // Numbered up to the record's last: more entries than that number is damage.
        set_history(&mut bytes, 2);
        assert!(decode(b"k", &bytes).is_err(), "3 entries numbered up to 2 read as a record");
    }

    #[test]
    fn a_truncated_record_is_damaged_not_a_panic() {
        for mut bytes in [encode(&done(), None), encode_with(&done(), None, &[b"e1", b"e2"])] {
            set_history(&mut bytes, 2);
            for len in 1..bytes.len() {
                assert!(decode(b"k", &bytes[..len]).is_err(), "cut at {len} read as a record");
            }
            bytes.push(0);
            assert!(decode(b"k", &bytes).is_err(), "a byte too many read as a record");
        }
    }
}
