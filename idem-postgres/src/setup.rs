//! Starting a store on its own runtime: the table (created, migrated or checked), the clock,
//! and the listening connection with its probe.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use idem_runtime::store::{now_ms, StoreError};

use crate::fault::{retrying, Fault};
use crate::listen::{self, Channels};
use crate::operations::Table;
use crate::sql::{Param, Sql};

impl Table {
    /// Makes the store ready on its own runtime: the table (created, or checked), the clock
    /// and the listening connection. Fails fast: a server that cannot be reached
    /// now is most often a wrong URL, which waiting would only hide.
    pub(crate) async fn start(
        self: Arc<Self>,
        listen: tokio_postgres::Config,
        pool_url: bool,
        create: bool,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        if create {
            self.migrate(now).await?;
        } else {
            self.check_table(now).await?;
        }
        self.measure_clock(now).await?;
        let channels = Channels::new(self.names.channel(), self.instance.id());
        let probe = {
            let (table, channel) = (Arc::clone(&self), channels.probe.clone());
            move |n: u64| {
                let (table, channel) = (Arc::clone(&table), channel.clone());
                async move { table.announce(&channel, &n.to_string()).await }
            }
        };
        let listener =
            listen::start(listen, pool_url, channels, Arc::clone(&self.listener), probe).await?;
        tokio::spawn(listener);
        Ok(())
    }

    pub(crate) async fn migrate(&self, deadline: Instant) -> Result<(), StoreError> {
        let table = self.names.qualified();
        retrying!(deadline, format!("cannot create {table}"), self.try_migrate())
    }

    async fn try_migrate(&self) -> Result<(), Fault> {
        let client = self.connection().await?;
        // One message of statements, which the server runs as one transaction (a pooler in
        // transaction mode keeps it on one server connection); under a lock taken in that
        // transaction, so that a fleet starting at once does not race on `CREATE … IF NOT
        // EXISTS`. The names are checked identifiers, safe to write into the text.
        let migration = format!(
            "SELECT pg_advisory_xact_lock(hashtext('idem migrate {}')); {}",
            self.names.qualified(),
            self.names.migration()
        );
        Ok(client.batch(&migration).await?)
    }

    pub(crate) async fn check_table(&self, deadline: Instant) -> Result<(), StoreError> {
        let table = self.names.qualified();
        let history = self.names.history();
        let (records, histories): (bool, bool) = retrying!(
            deadline,
            "cannot look for the records table",
            self.query_pair(&self.statements.exists, &[&table, &history])
        )?;
        if !records {
            return Err(StoreError::new(format!(
                "no idem records table {table} in this database: check the URL (name another \
                 table with ?idem_table=schema.table); the first idempotent call creates it"
            )));
        }
        if !histories {
            return Err(StoreError::new(format!(
                "the idem records table {table} has no history table {history}: it was created \
                 by an earlier idem; migrate it by connecting an agent of this version (or call \
                 PgStore::migrate), then run the command again"
            )));
        }
        Ok(())
    }

    async fn query_pair(
        &self,
        statement: &Sql,
        params: &[Param<'_>],
    ) -> Result<(bool, bool), Fault> {
        let client = self.connection().await?;
        let row = statement.query_one(&client, params).await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// Measures the database clock against this machine's, halving the round trip.
    pub(crate) async fn measure_clock(&self, deadline: Instant) -> Result<(), StoreError> {
        let (before, db, after) =
            retrying!(deadline, "cannot read the database clock", self.try_clock())?;
        self.clock_offset.store(db - (before + after) / 2, Ordering::Relaxed);
        Ok(())
    }

    async fn try_clock(&self) -> Result<(i64, i64, i64), Fault> {
        let client = self.connection().await?;
        let before = now_ms() as i64;
        let db: i64 = self.statements.now.query_one(&client, &[]).await?.try_get(0)?;
        Ok((before, db, now_ms() as i64))
    }

    /// Sends `payload` on `channel` through the pool, once: the listening connection's probe.
    async fn announce(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        let sent = async {
            let client = self.connection().await?;
            self.statements.notify.execute(&client, &[&channel, &payload]).await?;
            Ok::<_, Fault>(())
        };
        sent.await.map_err(|fault| fault.into_store_error("cannot probe the listening connection"))
    }
}
