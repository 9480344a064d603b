//! A page of the store in key order (`Store::scan_page`): a page of records and one of
//! histories, each one statement that seeks by the primary key, joined. A walk decides what to
//! do with it; nothing here decides.
//!
//! The statements are sent unnamed, with their parameter types (`query_typed`), so that they
//! need no prepared statement on the connection.

use idem_runtime::store::{Page, RecordPage};
use idem_runtime::StoreError;
use tokio_postgres::types::Type;
use tokio_postgres::Row;

use crate::fault::{Fault, Retry};
use crate::operations::Table;
use crate::rows;
use crate::schema::COLUMNS;

impl Table {
    /// Up to `limit` keys after `after` in key order, each with its record or its history's
    /// last time.
    pub(crate) async fn scan_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let records = self.records_page(after, limit).await?;
        Ok(Page::merge(records, self.histories_page(after, limit).await?, limit))
    }

    /// Up to `limit` records whose keys sort after `after`, in key order.
    async fn records_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<RecordPage, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM {} WHERE key > $1 ORDER BY key LIMIT $2",
            self.names.qualified()
        );
        let rows = self.page(&sql, after, limit, "cannot list a page of records").await?;
        // One damaged row is reported as such; the page goes on.
        Ok(rows.iter().map(|row| (row.get::<_, String>(0), rows::decode(row))).collect())
    }

    /// Up to `limit` keys with history rows that sort after `after`, in key order, each with
    /// its last row's time when the key has no record.
    ///
    /// The page's keys are found first and each is then looked up in the records (a lateral
    /// join): asked of every group, as an `EXISTS` in the select list, the question lets the
    /// planner hash the whole records table once per page when it expects many groups, and a
    /// pass would read every record for every page.
    async fn histories_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Option<u64>)>, StoreError> {
        let sql = format!(
            "SELECT p.key, p.last, r.found IS NOT NULL \
             FROM (SELECT key, max(at) AS last FROM {} WHERE key > $1 \
                   GROUP BY key ORDER BY key LIMIT $2) AS p \
             LEFT JOIN LATERAL (SELECT true AS found FROM {} AS r WHERE r.key = p.key LIMIT 1) \
                   AS r ON true \
             ORDER BY p.key",
            self.names.history(),
            self.names.qualified()
        );
        let rows = self.page(&sql, after, limit, "cannot list a page of histories").await?;
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            let (key, last, recorded): (String, i64, bool) = (row.get(0), row.get(1), row.get(2));
            page.push((key, (!recorded).then(|| u64::try_from(last).unwrap_or(0))));
        }
        Ok(page)
    }

    /// Runs a page's statement, trying again on a fresh connection within a lease.
    async fn page(
        &self,
        sql: &str,
        after: Option<&str>,
        limit: usize,
        doing: &str,
    ) -> Result<Vec<Row>, StoreError> {
        // No key is empty, so "" stands for "from the first".
        let after = after.unwrap_or("");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut retry = Retry::until(self.deadline());
        loop {
            match self.try_page(sql, after, limit).await {
                Ok(rows) => return Ok(rows),
                Err(fault) if retry.again(&fault).await => {}
                Err(fault) => return Err(fault.into_store_error(doing)),
            }
        }
    }

    async fn try_page(&self, sql: &str, after: &str, limit: i64) -> Result<Vec<Row>, Fault> {
        let client = self.pool.get().await?;
        let rows = client.query_typed(sql, &[(&after, Type::TEXT), (&limit, Type::INT8)]).await?;
        Ok(rows)
    }
}
