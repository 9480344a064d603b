//! [`PgStoreBuilder`]: the options a [`PgStore`](crate::PgStore) is opened with. Connecting
//! lives with the store (`store.rs`), which reads these options; nothing here reads the store.

use std::time::Duration;

use idem_runtime::store::CommonOptions;

/// How long an owner's lease lasts unless its heartbeat renews it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// Options for [`PgStore`](crate::PgStore): lease, heartbeat, pool size, schema, table and
/// retention. [`PgStoreBuilder::connect`] opens the store.
#[derive(Clone, Debug)]
pub struct PgStoreBuilder {
    pub(crate) url: String,
    pub(crate) listen_url: Option<String>,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) pool_size: usize,
    pub(crate) schema: String,
    pub(crate) table: String,
    /// The options every store's builder has; PostgreSQL offers `create` and retention
    /// (`durability` is the server's `synchronous_commit`, and it creates no files).
    pub(crate) common: CommonOptions,
}

idem_runtime::store_options! {
    PgStoreBuilder {
        /// The store is the schema and its tables, created when missing.
        create,
        retention,
    }
}

impl PgStoreBuilder {
    pub(crate) fn new(url: &str) -> PgStoreBuilder {
        let (url, named) = split_table_param(url);
        let (schema, table) = match named.as_deref().map(|t| t.split_once('.')) {
            Some(Some((schema, table))) => (schema.to_owned(), table.to_owned()),
            Some(None) => ("idem".to_owned(), named.unwrap_or_default()),
            None => ("idem".to_owned(), "records".to_owned()),
        };
        PgStoreBuilder {
            url,
            listen_url: None,
            lease: DEFAULT_LEASE,
            heartbeat: None,
            pool_size: 16,
            schema,
            table,
            common: CommonOptions::default(),
        }
    }

    /// How long an owner's lease lasts without a heartbeat; 15 s. A crashed owner's record is
    /// in doubt for everyone this long after its last heartbeat.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often running calls' leases are renewed; a third of the lease unless set.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// Most connections the pool opens (besides the one listening connection); 16.
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.pool_size = connections.max(1);
        self
    }

    /// A URL for the one listening connection, when the store's own URL reaches the server
    /// through a pooler in transaction mode (PgBouncer's `pool_mode = transaction`, and the
    /// poolers of hosted databases): a direct or session-mode URL of the same database. Through
    /// such a pooler `LISTEN` hears nothing, so without this URL the store finds that out (its
    /// probe does not come back) and waiters re-read every 50 ms instead of waking at once.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// let store = idem_postgres::PgStore::builder("postgres://agent@pooler.internal:6432/agents")
    ///     .listen_url("postgres://agent@db.internal:5432/agents")
    ///     .connect()?;
    /// # Ok(()) }
    /// ```
    pub fn listen_url(mut self, url: &str) -> Self {
        self.listen_url = Some(url.to_owned());
        self
    }

    /// The schema of the records table; `idem`.
    pub fn schema(mut self, schema: &str) -> Self {
        self.schema = schema.to_owned();
        self
    }

    /// The records table; `records`.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_owned();
        self
    }
}

/// Takes the `idem_table` parameter out of a URL's query, which PostgreSQL would refuse.
fn split_table_param(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut table = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("idem_table=") {
            Some(value) => {
                table = Some(value.to_owned());
                false
            }
            None => true,
        })
        .collect();
    let url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    (url, table)
}

#[cfg(test)]
mod tests {
    use super::split_table_param;

    #[test]
    fn the_table_parameter_is_taken_out_of_the_url() {
        assert_eq!(split_table_param("postgres://h/db"), ("postgres://h/db".to_owned(), None));
        assert_eq!(
            split_table_param("postgres://h/db?idem_table=a.b"),
            ("postgres://h/db".to_owned(), Some("a.b".to_owned()))
        );
        assert_eq!(
            split_table_param("postgres://h/db?sslmode=disable&idem_table=b&connect_timeout=3"),
            ("postgres://h/db?sslmode=disable&connect_timeout=3".to_owned(), Some("b".to_owned()))
        );
    }
}
