//! The statements a transactional call runs inside the caller's transaction, and their
//! parameters, written once for both drivers.
//!
//! Every statement is sent unnamed with its parameters' types spelled out (tokio-postgres'
//! `query_typed`, sqlx's `persistent(false)`): nothing is prepared on the session, so a call
//! runs unchanged through a pooler in transaction mode.

use idem_runtime::history::Change;
use idem_runtime::store::{Guard, RecordParts, StoreError};
use idem_runtime::{Record, Status};

/// A parameter of a statement, with its PostgreSQL type.
#[derive(Clone, Debug)]
pub(crate) enum Param {
    /// `text`, or `NULL`.
    Text(Option<String>),
    /// `bigint`, or `NULL`.
    Int(Option<i64>),
    /// `boolean`, or `NULL`.
    Bool(Option<bool>),
}

fn text(value: &str) -> Param {
    Param::Text(Some(value.to_owned()))
}

fn int(value: u64) -> Param {
    Param::Int(Some(i64::try_from(value).unwrap_or(i64::MAX)))
}

fn int_opt(value: Option<u64>) -> Param {
    Param::Int(value.map(|v| i64::try_from(v).unwrap_or(i64::MAX)))
}

/// The record's columns in the order the store's insert and update take them after the key:
/// status, tool, scope, owner, attempts, created, updated, completed, expires, the empty
/// fingerprint column, result.
fn record_params(record: &Record) -> Vec<Param> {
    vec![
        text(record.status.as_str()),
        text(&record.tool),
        text(&record.scope),
        text(record.owner.as_str()),
        int(u64::from(record.attempts)),
        int(record.created_at),
        int(record.updated_at),
        int_opt(record.completed_at),
        int_opt(record.expires_at),
        text(""),
        Param::Text(record.result.clone()),
    ]
}

fn change_params(change: &Change<'_>) -> [Param; 4] {
    [
        text(change.event().as_str()),
        Param::Text(change.event().answer().map(|a| a.as_str().to_owned())),
        text(change.by()),
        Param::Text(change.note().map(str::to_owned)),
    ]
}

/// The parameters of the store's insert (`schema::Writes::insert`): the record, its lease as
/// the engine stamped it, its function, the change, and now on the store's clock.
pub(crate) fn insert_params(record: &Record, change: &Change<'_>) -> Vec<Param> {
    let mut params = vec![text(&record.key)];
    params.extend(record_params(record));
    params.push(int_opt(record.lease_until));
    params.push(Param::Text(record.function.clone()));
    params.extend(change_params(change));
    params.push(int(record.updated_at));
    params
}

/// The parameters of the store's fenced update (`schema::Writes::update`): the fence of
/// `current`, the guard the engine gave the write (`schema::guard_param`), the new record,
/// its lease (as the engine stamped it) and function, the change, and now.
pub(crate) fn update_params(
    current: &Record,
    guard: Guard,
    new: &Record,
    change: &Change<'_>,
    now: u64,
) -> Vec<Param> {
    let fence = current.fence();
    let mut params = vec![
        text(&current.key),
        text(fence.status.as_str()),
        text(fence.owner),
        int(u64::from(fence.attempts)),
        Param::Bool(crate::schema::guard_param(guard)),
    ];
    params.extend(record_params(new));
    params.push(int_opt(new.lease_until));
    params.push(Param::Text(new.function.clone()));
    params.extend(change_params(change));
    params.push(int(now));
    params
}

/// A row of the records table as `row_to_json` writes it.
#[derive(serde::Deserialize)]
struct Row {
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

/// A record back from [`get`]'s JSON; a row that does not read is reported, never guessed at.
pub(crate) fn decode(json: &str) -> Result<Record, StoreError> {
    let damaged = |what: String| {
        StoreError::new(format!(
            "a record of the idem table is damaged ({what}); inspect it with `idem show`, or fix \
             the row in PostgreSQL"
        ))
    };
    let row: Row = serde_json::from_str(json).map_err(|e| damaged(e.to_string()))?;
    let status: Status = row.status.parse().map_err(|_| damaged("unknown status".into()))?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Record::from(RecordParts {
        status,
        tool: row.tool,
        scope: row.scope,
        owner: row.owner,
        attempts: u32::try_from(row.attempts)
            .map_err(|_| damaged("attempts out of range".into()))?,
        created_at: unsigned(row.created_at),
        updated_at: unsigned(row.updated_at),
        completed_at: row.completed_at.map(unsigned),
        expires_at: row.expires_at.map(unsigned),
        lease_until: row.lease_until.map(unsigned),
        result: row.result,
        function: row.function,
        key: row.key,
    }))
}
