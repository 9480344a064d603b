//! The mapping between rows and records: a record's values as statement parameters, and rows
//! read back into records and history entries.

use idem_runtime::history::{Change, Entry, Event};
use idem_runtime::store::RecordParts;
use idem_runtime::{Record, Status, StoreError};
use tokio_postgres::Row;

use crate::sql::Param;

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The values of a record in column order.
pub(crate) struct Values {
    pub(crate) key: String,
    status: &'static str,
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

impl Values {
    pub(crate) fn of(record: &Record) -> Values {
        Values {
            key: record.key.clone(),
            status: record.status.as_str(),
            tool: record.tool.clone(),
            scope: record.scope.clone(),
            owner: record.owner.as_str().to_owned(),
            attempts: i64::from(record.attempts),
            created_at: to_i64(record.created_at),
            updated_at: to_i64(record.updated_at),
            completed_at: record.completed_at.map(to_i64),
            expires_at: record.expires_at.map(to_i64),
            // As the engine stamped it: a store sets no lease of its own.
            lease_until: record.lease_until.map(to_i64),
            // Stored as JSON text rather than jsonb: jsonb refuses `\u0000` in strings and
            // would reject some results that a tool can legitimately return.
            result: record.result.clone(),
            function: record.function.clone(),
        }
    }

    /// Parameters $1..$12 of the insert: the key, then the columns an update writes too.
    pub(crate) fn insert_params(&self) -> Vec<Param<'_>> {
        let mut params: Vec<Param<'_>> = vec![&self.key];
        params.extend_from_slice(&self.update_params());
        params
    }

    /// The record's lease (NULL for one not in flight, or on a store without leases): the
    /// parameter after the record's columns, in both statements.
    pub(crate) fn lease_until(&self) -> Param<'_> {
        &self.lease_until
    }

    /// The function that wrote the record: the parameter after the lease, in both statements.
    pub(crate) fn function(&self) -> Param<'_> {
        &self.function
    }

    /// Parameters $6..$16 of the update (the key does not change).
    pub(crate) fn update_params(&self) -> [Param<'_>; 11] {
        [
            &self.status,
            &self.tool,
            &self.scope,
            &self.owner,
            &self.attempts,
            &self.created_at,
            &self.updated_at,
            &self.completed_at,
            &self.expires_at,
            // The column held a fingerprint of the arguments in earlier releases; it is written
            // empty, since the key already stands for the arguments.
            &"",
            &self.result,
        ]
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
    let key: String = row.get(0);
    let damaged = |what: &str| {
        StoreError::new(format!(
            "the record under key {key} is damaged ({what}); inspect it with `idem show`, or fix \
             the row in PostgreSQL"
        ))
    };
    let status: String = row.get(1);
    let status: Status = status.parse().map_err(|_| damaged("unknown status"))?;
    let attempts: i64 = row.get(5);
    let result: Option<String> = row.get(12);
    if let Some(text) = &result {
        // Checked here so that a row edited by hand reads as damaged, not as a replay error.
        // Skipped over rather than built, which reads any depth: a deep result written by an
        // earlier release still lists.
        serde_json::from_str::<serde::de::IgnoredAny>(text)
            .map_err(|_| damaged("result is not JSON"))?;
    }
    Ok(Record::from(RecordParts {
        status,
        tool: row.get(2),
        scope: row.get(3),
        owner: row.get(4),
        attempts: u32::try_from(attempts).map_err(|_| damaged("attempts out of range"))?,
        created_at: to_u64(row.get(6)),
        updated_at: to_u64(row.get(7)),
        completed_at: row.get::<_, Option<i64>>(8).map(to_u64),
        expires_at: row.get::<_, Option<i64>>(9).map(to_u64),
        lease_until: row.get::<_, Option<i64>>(10).map(to_u64),
        result,
        function: row.get(13),
        key,
    }))
}
