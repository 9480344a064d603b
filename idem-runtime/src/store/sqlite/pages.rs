//! What a walk of the whole store asks of the SQLite file: pages of records and of histories in key
//! order, each one statement that seeks by key (the records' primary key, the history's index
//! by key) and reads no row past the page. The pass decides what to remove and removes it
//! through the store's fenced deletes; nothing here decides.

use rusqlite::Connection;

use super::schema::{row_parts, COLUMNS};
use crate::lifecycle::Record;
use crate::store::RecordPage;

/// Up to `limit` records whose keys sort after `after` (no key is empty, so `""` is from the
/// first), in key order.
fn records_sql() -> String {
    format!("SELECT {COLUMNS} FROM idem_records WHERE key > ?1 ORDER BY key LIMIT ?2")
}

/// Up to `limit` keys with history rows that sort after `after`, in key order, each with its
/// last row's time and whether it has a record. Grouped in the index's order, so the page ends
/// at its `limit`th key rather than after every key's group.
const HISTORIES_SQL: &str = "SELECT h.key, max(h.at), \
     EXISTS (SELECT 1 FROM idem_records AS r WHERE r.key = h.key) \
     FROM idem_history AS h WHERE h.key > ?1 GROUP BY h.key ORDER BY h.key LIMIT ?2";

/// Up to `limit` records after `after`, in key order, each beside its key, as stored (the
/// caller presents them); one that cannot be read is an `Err` naming its key.
pub(super) fn records(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
) -> Result<RecordPage, rusqlite::Error> {
    let mut statement = conn.prepare_cached(&records_sql())?;
    let rows = statement
        .query_map(rusqlite::params![after.unwrap_or(""), bound(limit)], |row| {
            Ok((row.get::<_, String>(0)?, row_parts(row)?))
        })?;
    let mut page = Vec::with_capacity(limit.min(1024));
    for row in rows {
        let (key, parts) = row?;
        page.push((key, parts.map(Record::from)));
    }
    Ok(page)
}

/// Up to `limit` keys with a history after `after`, in key order, each with the time of its
/// last entry when it has no record.
pub(super) fn histories(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, Option<u64>)>, rusqlite::Error> {
    let mut statement = conn.prepare_cached(HISTORIES_SQL)?;
    let rows =
        statement.query_map(rusqlite::params![after.unwrap_or(""), bound(limit)], |row| {
            let (key, last, recorded): (String, i64, bool) =
                (row.get(0)?, row.get(1)?, row.get(2)?);
            Ok((key, (!recorded).then(|| u64::try_from(last).unwrap_or(0))))
        })?;
    rows.collect()
}

fn bound(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What SQLite plans for `sql`: one line per step of the plan.
    fn plan(sql: &str) -> Vec<String> {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::create(&mut conn, "a test store").unwrap();
        super::super::schema::index_in_flight(&conn, "a test store").unwrap();
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let details = statement.query_map(["k", "10"], |row| row.get::<_, String>(3)).unwrap();
        details.map(Result::unwrap).collect()
    }

    #[test]
    fn a_page_of_records_seeks_by_the_primary_key() {
        let plan = plan(&records_sql());
        assert_eq!(plan, ["SEARCH idem_records USING PRIMARY KEY (key>?)"], "{plan:?}");
    }

    #[test]
    fn a_page_of_histories_seeks_by_the_index_and_sorts_nothing() {
        let plan = plan(HISTORIES_SQL);
        assert!(
            plan.iter().any(|step| step == "SEARCH h USING INDEX idem_history_by_key (key>?)"),
            "{plan:?}"
        );
        assert!(
            plan.iter().all(|step| !step.starts_with("SCAN") && !step.contains("TEMP B-TREE")),
            "no walk of a whole table, no sort of every key: {plan:?}"
        );
    }
}
