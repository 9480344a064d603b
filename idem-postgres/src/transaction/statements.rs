//! The statements a transactional call runs inside the caller's transaction, and their
//! parameters, written once for both drivers.
//!
//! Every statement is sent unnamed with its parameters' types spelled out (tokio-postgres'
//! `query_typed`, sqlx's `persistent(false)`): nothing is prepared on the session, so a call
//! runs unchanged through a pooler in transaction mode.

use idem_runtime::history::Change;
use idem_runtime::store::{Guard, StoreError};
use idem_runtime::Record;

use crate::rows::{self, Columns};
use crate::sql::Typed;

fn int(value: u64) -> Typed<'static> {
    Typed::Int(Some(i64::try_from(value).unwrap_or(i64::MAX)))
}

fn change_params<'a>(change: &'a Change<'_>) -> [Typed<'a>; 4] {
    [
        Typed::Text(Some(change.event().as_str())),
        Typed::Text(change.event().answer().map(|a| a.as_str())),
        Typed::Text(Some(change.by())),
        Typed::Text(change.note()),
    ]
}

/// The parameters of the store's insert (`schema::Writes::insert`): the record, its lease as
/// the engine stamped it, its function, the change, and now on the store's clock.
pub(crate) fn insert_params<'a>(record: &'a Record, change: &'a Change<'_>) -> Vec<Typed<'a>> {
    let mut params = vec![Typed::Text(Some(&record.key))];
    params.extend(rows::written(record));
    params.extend(change_params(change));
    params.push(int(record.updated_at));
    params
}

/// The parameters of the store's fenced update (`schema::Writes::update`): the fence of
/// `current`, the guard the engine gave the write (`schema::guard_param`), the new record,
/// its lease (as the engine stamped it) and function, the change, and now.
pub(crate) fn update_params<'a>(
    current: &'a Record,
    guard: Guard,
    new: &'a Record,
    change: &'a Change<'_>,
    now: u64,
) -> Vec<Typed<'a>> {
    let fence = current.fence();
    let mut params = vec![
        Typed::Text(Some(&current.key)),
        Typed::Text(Some(fence.status.as_str())),
        Typed::Text(Some(fence.owner)),
        int(u64::from(fence.attempts)),
        Typed::Bool(crate::schema::guard_param(guard)),
    ];
    params.extend(rows::written(new));
    params.extend(change_params(change));
    params.push(int(now));
    params
}

/// A record back from [`get`]'s JSON (`row_to_json` of the table's row); a row that does not
/// read is reported, never guessed at.
pub(crate) fn decode(json: &str) -> Result<Record, StoreError> {
    let damaged = |what: &str| {
        StoreError::new(format!(
            "a record of the idem table is damaged ({what}); inspect it with `idem show`, or fix \
             the row in PostgreSQL"
        ))
    };
    let columns: Columns = serde_json::from_str(json).map_err(|e| damaged(&e.to_string()))?;
    columns.into_record(|_key, what| damaged(what))
}
