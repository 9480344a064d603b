//! The mapping between rows and records: a record's values as statement parameters, and rows
//! read back into records and history entries, for the store's statements and a transaction's.

use idem_runtime::history::{Change, Entry, Event};
use idem_runtime::store::RecordParts;
use idem_runtime::{Record, Status, StoreError};
use tokio_postgres::Row;

use crate::sql::{Param, Typed};

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The values a write gives a record's columns after its key, in the order the store's insert
/// and update take them (the insert's `$2..$14`, the update's `$6..$18`, in the store's
/// statements and a transaction's alike): status, tool, scope, owner, attempts, created,
/// updated, completed, expires, the empty fingerprint column, result; then the lease and the
/// function that wrote the record.
pub(crate) fn written(record: &Record) -> [Typed<'_>; 13] {
    let int = |n: u64| Typed::Int(Some(to_i64(n)));
    [
        Typed::Text(Some(record.status.as_str())),
        Typed::Text(Some(&record.tool)),
        Typed::Text(Some(&record.scope)),
        Typed::Text(Some(record.owner.as_str())),
        Typed::Int(Some(i64::from(record.attempts))),
        int(record.created_at),
        int(record.updated_at),
        Typed::Int(record.completed_at.map(to_i64)),
        Typed::Int(record.expires_at.map(to_i64)),
        // The column held a fingerprint of the arguments in earlier releases; it is written
        // empty, since the key already stands for the arguments.
        Typed::Text(Some("")),
        // Stored as JSON text rather than jsonb: jsonb refuses `\u0000` in strings and would
        // reject some results that a tool can legitimately return.
        Typed::Text(record.result.as_deref()),
        // As the engine stamped it (NULL for a record not in flight, or on a store without
        // leases): a store sets no lease of its own.
        Typed::Int(record.lease_until.map(to_i64)),
        Typed::Text(record.function.as_deref()),
    ]
}

/// A record as the table's columns hold it, read back: by the store from its rows, by a
/// transaction from `row_to_json`.
#[derive(serde::Deserialize)]
pub(crate) struct Columns {
    key: String,
    status: String,
    tool: String,
    scope: String,
    owner: String,
    attempts: i64,
    created_at: i64,
    updated_at: i64,
    completed_at: Option<i64>,
    expires_at: Option<i64>,
    lease_until: Option<i64>,
    result: Option<String>,
    function: Option<String>,
}

impl Columns {
    /// A row of the store's statements, which read the table's columns in order.
    fn of_row(row: &Row) -> Columns {
        Columns {
            key: row.get(0),
            status: row.get(1),
            tool: row.get(2),
            scope: row.get(3),
            owner: row.get(4),
            attempts: row.get(5),
            created_at: row.get(6),
            updated_at: row.get(7),
            completed_at: row.get(8),
            expires_at: row.get(9),
            lease_until: row.get(10),
            // Column 11 is the fingerprint, written empty and never read.
            result: row.get(12),
            function: row.get(13),
        }
    }

    /// The record; one that does not decode is reported, never guessed at, in the words
    /// `damaged` gives (from the key and what is wrong).
    pub(crate) fn into_record(
        self,
        damaged: impl Fn(&str, &str) -> StoreError,
    ) -> Result<Record, StoreError> {
        let status: Status =
            self.status.parse().map_err(|_| damaged(&self.key, "unknown status"))?;
        let attempts = u32::try_from(self.attempts)
            .map_err(|_| damaged(&self.key, "attempts out of range"))?;
        Ok(Record::from(RecordParts {
            status,
            tool: self.tool,
            scope: self.scope,
            owner: self.owner,
            attempts,
            created_at: to_u64(self.created_at),
            updated_at: to_u64(self.updated_at),
            completed_at: self.completed_at.map(to_u64),
            expires_at: self.expires_at.map(to_u64),
            lease_until: self.lease_until.map(to_u64),
            result: self.result,
            function: self.function,
            key: self.key,
        }))
    }
}

/// A [`Change`] as the statements take it, owned so that it can go to the store's runtime.
pub(crate) struct ChangeValues {
    event: &'static str,
    answer: Option<&'static str>,
    pub(crate) by: String,
    note: Option<String>,
    pub(crate) ends_history: bool,
}

impl ChangeValues {
    pub(crate) fn of(change: &Change<'_>) -> ChangeValues {
        ChangeValues {
            event: change.event().as_str(),
            answer: change.event().answer().map(|answer| answer.as_str()),
            by: change.by().to_owned(),
            note: change.note().map(str::to_owned),
            ends_history: change.event().ends_history(),
        }
    }

    /// The parameters after the record's: event, answer, by, note.
    pub(crate) fn params(&self) -> [Param<'_>; 4] {
        [&self.event, &self.answer, &self.by, &self.note]
    }
}

/// A history row back into an entry; one that does not decode is reported.
pub(crate) fn decode_entry(key: &str, row: &Row) -> Result<Entry, StoreError> {
    let damaged = |what: &str| {
        StoreError::new(format!(
            "a history row of key {key} is damaged ({what}); the record itself is not affected: \
             fix the row in PostgreSQL"
        ))
    };
    let event: String = row.get(1);
    let answer: Option<String> = row.get(2);
    let event: Event =
        Event::from_parts(&event, answer.as_deref()).ok_or_else(|| damaged("unknown event"))?;
    let status = match row.get::<_, Option<String>>(3) {
        Some(status) => Some(status.parse::<Status>().map_err(|_| damaged("unknown status"))?),
        None => None,
    };
    Ok(Entry::new(to_u64(row.get(0)), event, status, row.get(4), row.get(5)))
}

/// A row back into a record; a row that does not decode is reported, never guessed at.
pub(crate) fn decode(row: &Row) -> Result<Record, StoreError> {
    let damaged = |key: &str, what: &str| {
        StoreError::new(format!(
            "the record under key {key} is damaged ({what}); inspect it with `idem show`, or fix \
             the row in PostgreSQL"
        ))
    };
    let columns = Columns::of_row(row);
    if let Some(text) = &columns.result {
        // Checked here so that a row edited by hand reads as damaged, not as a replay error.
        // Skipped over rather than built, which reads any depth: a deep result written by an
        // earlier release still lists.
        serde_json::from_str::<serde::de::IgnoredAny>(text)
            .map_err(|_| damaged(&columns.key, "result is not JSON"))?;
    }
    columns.into_record(damaged)
}
