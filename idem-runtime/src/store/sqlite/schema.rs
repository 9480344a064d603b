//! The SQLite store's file: its tables, the marks that tell an idem store from any other SQLite
//! file, and how a record and a history entry are written as rows and read back.

use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};

use crate::error::StoreError;
use crate::lifecycle::history::{Change, Entry, Event};
use crate::lifecycle::{Record, RecordParts, Status};

/// `PRAGMA application_id` of an idem store: "idem" in ASCII. A SQLite file with another id
/// (or with tables and none) belongs to some other program.
pub(super) const APPLICATION_ID: i32 = 0x6964_656d;

/// `PRAGMA user_version`: the version of the layout below. A store of a greater version was
/// written by a later idem, whose rows this one might misread: it is refused at open.
pub(super) const SCHEMA_VERSION: i32 = 1;

/// The layout, created in one transaction with the marks above.
const CREATE: &str = "
CREATE TABLE idem_records (
    key TEXT PRIMARY KEY NOT NULL,
    status TEXT NOT NULL,
    tool TEXT NOT NULL,
    function TEXT,
    scope TEXT NOT NULL,
    owner TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    completed_at INTEGER,
    expires_at INTEGER,
    result TEXT
) WITHOUT ROWID;
CREATE TABLE idem_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    at INTEGER NOT NULL,
    event TEXT NOT NULL,
    answer TEXT,
    status TEXT,
    by TEXT NOT NULL,
    note TEXT
);
CREATE INDEX idem_history_by_key ON idem_history (key, seq);
";

/// The records in flight by owner, and nothing else (a partial index): what an opening process
/// reads to tell which gone instances' lock files are still the evidence a record needs (see
/// `owners.rs`). A store written before it existed gets it at its next open; an idem that does
/// not know it keeps it up to date all the same, since SQLite maintains every index.
const IN_FLIGHT_INDEX: &str = "CREATE INDEX IF NOT EXISTS idem_records_in_flight \
                               ON idem_records (owner) WHERE status = 'in-flight'";

pub(super) const COLUMNS: &str =
    "key, status, tool, function, scope, owner, attempts, created_at, \
                       updated_at, completed_at, expires_at, result";

/// What opening found in the file.
pub(super) enum Found {
    /// An idem store of this version.
    Store,
    /// A database with no table and no mark: the new file `create` writes the layout into, or,
    /// under a store's name, another program's (idem names a store only once it is whole).
    Empty,
}

/// Reads the marks of the file `conn` opened and says what it is; `what` names the file in
/// messages.
pub(super) fn inspect(conn: &Connection, what: &str) -> Result<Found, StoreError> {
    // The marks and the tables are read in one read transaction, from one state of the file:
    // a change another process commits (one transaction) lands before all three reads or
    // after them. (A store idem creates now gets its name only once it is whole, but one an
    // earlier idem created was written in place.) Under `create`'s own transaction there is
    // one already. Dropped, it ends without writing.
    let _snapshot = match conn.is_autocommit() {
        true => Some(conn.unchecked_transaction().map_err(|e| super::fault::open_error(what, e))?),
        false => None,
    };
    let read = |pragma: &str| -> Result<i32, StoreError> {
        conn.query_row(&format!("PRAGMA {pragma}"), [], |row| row.get(0))
            .map_err(|e| super::fault::open_error(what, e))
    };
    let (application, version) = (read("application_id")?, read("user_version")?);
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .map_err(|e| super::fault::open_error(what, e))?;
    match (application, tables) {
        (0, 0) => Ok(Found::Empty),
        (APPLICATION_ID, _) if version > SCHEMA_VERSION => Err(StoreError::new(format!(
            "{what} is an idem store of schema version {version}, written by a later idem than \
             this one (which reads version {SCHEMA_VERSION}): upgrade this program, or give it \
             a store of its own"
        ))
        .lasting()),
        (APPLICATION_ID, _) => Ok(Found::Store),
        _ => Err(StoreError::new(format!(
            "{what} is an SQLite database of another program, not an idem store (its \
             application_id is {application:#x}, idem's is {APPLICATION_ID:#x}): name another \
             file for the store; idem never writes to this one"
        ))
        .lasting()),
    }
}

/// Creates the layout and the marks, in one transaction, in the new file `conn` opened (see
/// `open::create_file`).
pub(super) fn create(conn: &mut Connection, what: &str) -> Result<(), StoreError> {
    let fail = |e| super::fault::open_error(what, e);
    let tx =
        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(fail)?;
    if let Found::Store = inspect(&tx, what)? {
        return Ok(());
    }
    tx.execute_batch(CREATE).map_err(fail)?;
    tx.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
    ))
    .map_err(fail)?;
    tx.commit().map_err(fail)
}

/// Adds the index of records in flight to a store written before it existed; a look, with no
/// write, when it is there.
pub(super) fn index_in_flight(conn: &Connection, what: &str) -> Result<(), StoreError> {
    let fail = |e| super::fault::open_error(what, e);
    let there: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master \
             WHERE type = 'index' AND name = 'idem_records_in_flight'",
            [],
            |row| row.get(0),
        )
        .map_err(fail)?;
    if !there {
        conn.execute_batch(IN_FLIGHT_INDEX).map_err(fail)?;
    }
    Ok(())
}

/// The store instances that own a record in flight (through the partial index).
pub(super) fn in_flight_instances(
    conn: &Connection,
    what: &str,
) -> Result<std::collections::HashSet<String>, StoreError> {
    let fail = |e| super::fault::open_error(what, e);
    let mut statement = conn
        .prepare("SELECT DISTINCT owner FROM idem_records WHERE status = 'in-flight'")
        .map_err(fail)?;
    let owners = statement.query_map([], |row| row.get::<_, String>(0)).map_err(fail)?;
    let mut instances = std::collections::HashSet::new();
    for owner in owners {
        instances.insert(crate::lifecycle::owner::instance_of(&owner.map_err(fail)?).to_owned());
    }
    Ok(instances)
}

/// The record under `key`, as stored.
pub(super) fn read(conn: &Connection, key: &str) -> Result<Option<Record>, rusqlite::Error> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?1"))?;
    let row = statement.query_row([key], row_parts).optional()?;
    row.map(|parts| parts.map(Record::from)).transpose().map_err(damaged)
}

/// A row's record parts, or an error naming the key when a column does not read.
pub(super) fn row_parts(row: &Row<'_>) -> rusqlite::Result<Result<RecordParts, StoreError>> {
    let key: String = row.get(0)?;
    let status: String = row.get(1)?;
    let Ok(status) = status.parse::<Status>() else {
        return Ok(Err(StoreError::new(format!(
            "key {key}: the record's status {status:?} is none idem writes: the store was \
             changed by hand; settle the key with `idem resolve`"
        ))));
    };
    let number = |index: usize| -> rusqlite::Result<Option<u64>> {
        Ok(row.get::<_, Option<i64>>(index)?.map(|n| u64::try_from(n).unwrap_or(0)))
    };
    Ok(Ok(RecordParts {
        key,
        status,
        tool: row.get(2)?,
        function: row.get(3)?,
        scope: row.get(4)?,
        owner: row.get(5)?,
        attempts: u32::try_from(row.get::<_, i64>(6)?).unwrap_or(u32::MAX),
        created_at: number(7)?.unwrap_or(0),
        updated_at: number(8)?.unwrap_or(0),
        completed_at: number(9)?,
        expires_at: number(10)?,
        lease_until: None,
        result: row.get(11)?,
    }))
}

fn damaged(error: StoreError) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(error))
}

fn time(ms: Option<u64>) -> Option<i64> {
    ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Writes `record` in place of whatever the key holds.
pub(super) fn put(tx: &Transaction<'_>, record: &Record) -> Result<(), rusqlite::Error> {
    let mut statement = tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO idem_records ({COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?;
    statement.execute(params![
        record.key,
        record.status.as_str(),
        record.tool,
        record.function,
        record.scope,
        record.owner.as_str(),
        i64::from(record.attempts),
        time(Some(record.created_at)),
        time(Some(record.updated_at)),
        time(record.completed_at),
        time(record.expires_at),
        record.result,
    ])?;
    Ok(())
}

/// Deletes the record of `key`.
pub(super) fn delete(tx: &Transaction<'_>, key: &str) -> Result<(), rusqlite::Error> {
    tx.prepare_cached("DELETE FROM idem_records WHERE key = ?1")?.execute([key])?;
    Ok(())
}

/// Appends `change`'s entry to the history of `key`, which it left in `status`, at `at`;
/// returns the entry's number, which grows over every key and is never reused (SQLite's
/// `AUTOINCREMENT`): the fencing token of the owner the write makes.
pub(super) fn append(
    tx: &Transaction<'_>,
    key: &str,
    change: &Change<'_>,
    status: Option<Status>,
    at: u64,
) -> Result<u64, rusqlite::Error> {
    let event = change.event();
    tx.prepare_cached(
        "INSERT INTO idem_history (key, at, event, answer, status, by, note) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        key,
        time(Some(at)),
        event.as_str(),
        event.answer().map(|a| a.as_str()),
        status.map(Status::as_str),
        change.by(),
        change.note(),
    ])?;
    Ok(u64::try_from(tx.last_insert_rowid()).unwrap_or(0))
}

/// Removes the history of `key`; how many entries it had.
pub(super) fn remove_history(tx: &Transaction<'_>, key: &str) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached("DELETE FROM idem_history WHERE key = ?1")?.execute([key])
}

/// The history of `key`, oldest first.
pub(super) fn history(conn: &Connection, key: &str) -> Result<Vec<Entry>, rusqlite::Error> {
    let mut statement = conn.prepare_cached(
        "SELECT at, event, answer, status, by, note FROM idem_history WHERE key = ?1 ORDER BY seq",
    )?;
    let rows = statement.query_map([key], |row| {
        let (event, answer): (String, Option<String>) = (row.get(1)?, row.get(2)?);
        let status: Option<String> = row.get(3)?;
        Ok((row.get::<_, i64>(0)?, event, answer, status, row.get(4)?, row.get(5)?))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (at, kind, answer, status, by, note) = row?;
        let event = Event::from_parts(&kind, answer.as_deref()).ok_or_else(|| {
            damaged(StoreError::new(format!(
                "key {key}: a history entry's event {kind:?} is none idem writes"
            )))
        })?;
        let status = match status {
            Some(text) => Some(text.parse::<Status>().map_err(|_| {
                damaged(StoreError::new(format!(
                    "key {key}: a history entry's status {text:?} is none idem writes"
                )))
            })?),
            None => None,
        };
        entries.push(Entry::new(u64::try_from(at).unwrap_or(0), event, status, by, note));
    }
    Ok(entries)
}
