//! A record read back from sled's bytes without copying them ([`View`], the history entries it
//! holds in [`Inline`]), and [`decode`], which reads one in either format: the layout is
//! `encoding.rs`'s.

use std::borrow::Cow;

use super::{
    status_of, Spilled, CHUNKED, COMPLETED, EXPIRES, FORMAT, FUNCTION, HISTORY, INLINE, LEASE,
    RESULT,
};
use crate::error::StoreError;
use crate::lifecycle::{Fence, Record, Status};

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
    pub(crate) function: Option<Cow<'a, str>>,
    pub(crate) scope: Cow<'a, str>,
    pub(crate) owner: Cow<'a, str>,
    pub(crate) result: Option<Cow<'a, str>>,
    /// The result, when it is kept in chunks rather than in `result`.
    pub(crate) spilled: Option<Spilled>,
    /// The sequence number of the key's last history entry this record confirms (`None` for a
    /// record written before histories were kept).
    pub(crate) history: Option<u64>,
    /// The key's newest history entries, which the record holds (numbered up to `history`).
    pub(crate) inline: Inline<'a>,
}

/// The history entries a record holds, oldest first, as their bytes (`history.rs`'s layout).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Inline<'a> {
    count: u32,
    bytes: &'a [u8],
}

impl<'a> Inline<'a> {
    pub(crate) fn len(&self) -> u64 {
        self.count.into()
    }

    /// Each entry's bytes, oldest first. The lengths were checked when the record was read.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &'a [u8]> {
        let mut rest = self.bytes;
        (0..self.count).map(move |_| {
            let (len, tail) = rest.split_at(4);
            let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
            let (entry, tail) = tail.split_at(len);
            rest = tail;
            entry
        })
    }
}

impl View<'_> {
    /// The record under `key`, owning its fields; a result kept in chunks is not read here, so
    /// the store fills it in (`result` is then `None`).
    pub(crate) fn to_record(&self, key: &str) -> Record {
        Record {
            key: key.to_owned(),
            status: self.status,
            tool: self.tool.clone().into_owned(),
            function: self.function.as_ref().map(|f| f.clone().into_owned()),
            scope: self.scope.clone().into_owned(),
            owner: self.owner.as_ref().into(),
            attempts: self.attempts,
            created_at: self.created_at,
            updated_at: self.updated_at,
            completed_at: self.completed_at,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            result: self.result.as_ref().map(|text| text.clone().into_owned()),
        }
    }

    /// The state a write replacing this record is fenced on.
    pub(crate) fn fence(&self) -> Fence<'_> {
        Fence { status: self.status, owner: &self.owner, attempts: self.attempts }
    }
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
                function: record.function.map(Cow::Owned),
                scope: Cow::Owned(record.scope),
                owner: Cow::Owned(record.owner.as_str().to_owned()),
                result: record.result.map(Cow::Owned),
                spilled: None,
                history: None,
                inline: Inline::default(),
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

    /// The history entries a record holds, each length checked, so that `Inline::entries`
    /// cannot run past them.
    fn inline(&mut self) -> Result<Inline<'a>, Truncated> {
        let count = self.u32()?;
        let start = self.bytes;
        for _ in 0..count {
            let len = self.u32()? as usize;
            self.take(len)?;
        }
        let used = start.len() - self.bytes.len();
        Ok(Inline { count, bytes: &start[..used] })
    }
}

fn decode_current(bytes: &[u8]) -> Result<View<'_>, Truncated> {
    let mut r = Reader { bytes: &bytes[1..] };
    let status = status_of(r.u8()?).ok_or(Truncated("unknown status"))?;
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
    let _fingerprint = r.string()?;
    let result = if options & RESULT != 0 { Some(r.string()?) } else { None };
    let spilled =
        if options & CHUNKED != 0 { Some(Spilled { id: r.u64()?, len: r.u32()? }) } else { None };
    let function = if options & FUNCTION != 0 { Some(r.string()?) } else { None };
    let inline = if options & INLINE != 0 { r.inline()? } else { Inline::default() };
    let history = if options & HISTORY != 0 { Some(r.u64()?) } else { None };
    if history.unwrap_or(0) < inline.len() {
        return Err(Truncated("more history entries than the history's number"));
    }
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
        function,
        scope,
        owner,
        result,
        spilled,
        history,
        inline,
    })
}
