//! [`PgStore`]: the [`Store`] interface over a PostgreSQL table.

use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idem_runtime::{assess, now_ms, Assessment, Record, Reserved, Store, StoreError, StoreFuture};
use tokio::runtime::Handle;
use tokio_postgres::NoTls;

use crate::builder::PgStoreBuilder;
use crate::lease::{Holder, Leases};
use crate::listen::{self, Fanout, DEGRADED_RECHECK};
use crate::runtime::{Detached, OwnRuntime};
use crate::sql::{self, Names, Statements, Values};

/// How long an owner's lease lasts unless its heartbeat renews it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// A store shared by every process and machine that reaches one PostgreSQL database.
///
/// Records live in one table (`idem.records` unless the builder names another), created on
/// first use. What the store guarantees, and how:
///
/// - **One owner per key**: a reservation is one `INSERT … ON CONFLICT DO NOTHING`.
/// - **Durability**: every write is a committed transaction; with PostgreSQL's default
///   `synchronous_commit = on` it has reached the server's WAL on stable storage before the call
///   goes on (and a synchronous standby too, when one is configured). A server run with
///   `synchronous_commit = off` or `fsync = off` weakens that, and this store cannot tell.
/// - **Leases**: an owner's record carries a lease, renewed by a heartbeat task while the body
///   runs. Lease times come from the database's clock. When an owner dies, its lease lapses and
///   every caller then treats the record as in doubt.
/// - **Fencing**: every write names the state it replaces (status, owner, attempts) and a lapsed
///   lease is never renewed, so an owner whose record was taken over cannot write to it.
/// - **Waiting without polling**: a trigger announces every change with `NOTIFY`; one listening
///   connection per store wakes the waiters of this process, which otherwise sleep until their
///   wait ends or the owner's lease lapses.
///
/// The store runs its I/O on a small tokio runtime of its own, so its futures work from plain
/// threads (sync tools) and from inside any async runtime alike. It needs a direct session to
/// the server (or a pooler in session mode): `LISTEN` does not work through a
/// transaction-pooling proxy.
///
/// ```no_run
/// # fn main() -> Result<(), idem_runtime::Error> {
/// use std::sync::Arc;
/// let store = idem_postgres::PgStore::connect("postgres://agent@db.internal/agents")?;
/// idem_runtime::set_default_store(Arc::new(store));
/// # Ok(()) }
/// ```
pub struct PgStore {
    shared: Arc<Shared>,
    runtime: OwnRuntime,
}

/// What the store's tasks share with it.
struct Shared {
    pool: Pool,
    statements: Statements,
    names: Names,
    owner: String,
    lease: Duration,
    heartbeat: Duration,
    default_wait: Duration,
    /// The database clock minus this machine's, in milliseconds.
    clock_offset: AtomicI64,
    fanout: Arc<Fanout>,
    leases: Leases,
    detached: Detached,
}

pub(crate) fn store_error(source: StoreError) -> idem_runtime::Error {
    idem_runtime::Error::Store { key: None, tool: None, source }
}

fn pg_error(what: &str, e: tokio_postgres::Error) -> StoreError {
    StoreError::with_source(format!("PostgreSQL store: {what}"), e)
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::with_source(
        "PostgreSQL store: no connection to the database; check that the server is up and \
         reachable, and that the pool is large enough for the calls in flight",
        e,
    )
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// A store owner id unique across processes and machines: host, process, start time, instance
/// and some randomness (two hosts may share a name).
fn new_owner_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!(
        "pg:{host}:{}:{}:{:08x}",
        std::process::id(),
        INSTANCE.fetch_add(1, Ordering::Relaxed),
        hasher.finish() as u32
    )
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user@host/db` or `host=… dbname=…`) with
    /// the default options, creating the table on first use.
    pub fn connect(url: &str) -> Result<PgStore, idem_runtime::Error> {
        PgStore::builder(url).connect()
    }

    /// Options for connecting to the database at `url`.
    ///
    /// The URL may name the records table with an `idem_table=schema.table` query parameter
    /// (so that the `idem` command reaches a fleet's table with `--store` alone); the builder's
    /// [`schema`](PgStoreBuilder::schema) and [`table`](PgStoreBuilder::table) override it.
    pub fn builder(url: &str) -> PgStoreBuilder {
        PgStoreBuilder::new(url)
    }

    pub(crate) async fn open(options: PgStoreBuilder) -> Result<PgStore, StoreError> {
        sql::check_identifier("schema", &options.schema)?;
        sql::check_identifier("table", &options.table)?;
        if options.lease < Duration::from_millis(100) {
            return Err(StoreError::new("the lease must be at least 100 ms"));
        }
        let heartbeat = options.heartbeat.unwrap_or(options.lease / 3);
        if heartbeat >= options.lease {
            return Err(StoreError::new(
                "the heartbeat must be shorter than the lease, or leases lapse while bodies run",
            ));
        }
        let mut config = tokio_postgres::Config::from_str(&options.url).map_err(|e| {
            // The URL may hold a password: never echo it.
            StoreError::with_source(
                "the PostgreSQL URL is not valid: use postgres://user@host:port/database",
                e,
            )
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("idem");
        }
        let runtime = OwnRuntime::new()?;
        let names = Names { schema: options.schema.clone(), table: options.table.clone() };
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(15)))
            .build()
            .map_err(|e| StoreError::with_source("cannot build the PostgreSQL pool", e))?;
        let shared = Arc::new(Shared {
            pool,
            statements: Statements::new(&names),
            names,
            owner: new_owner_id(),
            lease: options.lease,
            heartbeat,
            default_wait: options.default_wait,
            clock_offset: AtomicI64::new(0),
            fanout: Arc::new(Fanout::default()),
            leases: Leases::default(),
            detached: Detached::default(),
        });
        let setup = Arc::clone(&shared);
        let create = options.create;
        runtime
            .spawn_store(async move {
                if create {
                    setup.migrate().await?;
                } else {
                    setup.check_table().await?;
                }
                setup.measure_clock().await?;
                let listener =
                    listen::start(config, setup.names.channel(), Arc::clone(&setup.fanout)).await?;
                tokio::spawn(listener);
                tokio::spawn(heartbeat_loop(Arc::clone(&setup)));
                Ok(())
            })
            .await?;
        Ok(PgStore { shared, runtime })
    }

    /// Creates the schema, table and triggers if they are missing. [`PgStore::connect`] does
    /// this already unless the builder said `create(false)`; run it from a deploy step to keep
    /// DDL out of the agents' start-up.
    pub fn migrate(&self) -> Result<(), idem_runtime::Error> {
        let shared = Arc::clone(&self.shared);
        idem_runtime::for_stores::block_on(
            self.runtime.spawn_store(async move { shared.migrate().await }),
        )
        .map_err(store_error)
    }

    /// Extends `record`'s lease if its owner still holds it: what the heartbeat does for every
    /// running call of this instance. Returns whether the lease was extended; a lease that has
    /// lapsed, or a record that changed hands, is never extended.
    pub fn renew<'a>(&'a self, record: &Record) -> StoreFuture<'a, bool> {
        let shared = Arc::clone(&self.shared);
        let holding = vec![(record.key.clone(), Holder::of(record))];
        self.runtime.spawn_store(async move { Ok(!shared.renew(&holding).await?.is_empty()) })
    }

    /// The records table, schema-qualified.
    pub fn table(&self) -> String {
        format!("{}.{}", self.shared.names.schema, self.shared.names.table)
    }

    /// The lease an owner holds without a heartbeat.
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }
}

impl Shared {
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let table = self.names.qualified();
        let tx =
            client.transaction().await.map_err(|e| pg_error("cannot start a transaction", e))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            &[&format!("idem migrate {table}")],
        )
        .await
        .map_err(|e| pg_error("cannot take the migration lock", e))?;
        tx.batch_execute(&self.names.migration()).await.map_err(|e| {
            pg_error(&format!("cannot create {table}; check the role's privileges"), e)
        })?;
        tx.commit().await.map_err(|e| pg_error("cannot commit the migration", e))
    }

    async fn check_table(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let table = self.names.qualified();
        let row = client
            .query_one(&self.statements.exists, &[&table])
            .await
            .map_err(|e| pg_error("cannot look for the records table", e))?;
        if row.get::<_, bool>(0) {
            Ok(())
        } else {
            Err(StoreError::new(format!(
                "no idem records table {table} in this database: check the URL (name another \
                 table with ?idem_table=schema.table); the first idempotent call creates it"
            )))
        }
    }

    /// Measures the database clock against this machine's, halving the round trip.
    async fn measure_clock(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.statements.now)
            .await
            .map_err(|e| pg_error("cannot read the database clock", e))?;
        let before = now_ms() as i64;
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| pg_error("cannot read the database clock", e))?;
        let after = now_ms() as i64;
        let db: i64 = row.get(0);
        self.clock_offset.store(db - (before + after) / 2, Ordering::Relaxed);
        Ok(())
    }

    /// The database's clock now, as this machine reckons it.
    fn db_now(&self) -> i64 {
        now_ms() as i64 + self.clock_offset.load(Ordering::Relaxed)
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.statements.get)
            .await
            .map_err(|e| pg_error("cannot read", e))?;
        let row = client
            .query_opt(&statement, &[&key])
            .await
            .map_err(|e| pg_error(&format!("cannot read key {key}"), e))?;
        row.as_ref().map(sql::decode).transpose()
    }

    async fn reserve(&self, record: Record) -> Result<Reserved, StoreError> {
        let values = Values::of(&record);
        let lease = self.lease_ms();
        loop {
            let inserted = {
                let client = self.client().await?;
                let statement = client
                    .prepare_cached(&self.statements.insert)
                    .await
                    .map_err(|e| pg_error("cannot reserve", e))?;
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    values.insert_params();
                params.push(&lease);
                client
                    .execute(&statement, &params)
                    .await
                    .map_err(|e| pg_error(&format!("cannot reserve key {}", record.key), e))?
            };
            if inserted == 1 {
                self.leases.hold(&record);
                return Ok(Reserved::Mine);
            }
            // Someone holds the key. Read it in a fresh statement: the insert's snapshot may not
            // show a row committed while it ran. If it is gone again, try the insert again.
            if let Some(existing) = self.get(&record.key).await? {
                return Ok(Reserved::Taken(existing));
            }
        }
    }

    async fn replace(&self, current: Record, new: Option<Record>) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let seen = current.fence();
        let (status, owner, attempts) =
            (seen.status.as_str(), seen.owner, i64::from(seen.attempts));
        let ours = current.owner.is_of(&self.owner);
        let fence: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&current.key, &status, &owner, &attempts, &ours];
        let changed = match &new {
            Some(new) => {
                let values = Values::of(new);
                let lease = self.lease_ms();
                let statement = client
                    .prepare_cached(&self.statements.update)
                    .await
                    .map_err(|e| pg_error("cannot write", e))?;
                let mut params = fence.to_vec();
                params.extend_from_slice(&values.update_params());
                params.push(&lease);
                client.execute(&statement, &params).await
            }
            None => {
                let statement = client
                    .prepare_cached(&self.statements.delete)
                    .await
                    .map_err(|e| pg_error("cannot write", e))?;
                client.execute(&statement, &fence).await
            }
        }
        .map_err(|e| pg_error(&format!("cannot write key {}", current.key), e))?;
        if changed == 0 {
            return Ok(false);
        }
        self.leases.drop_if(&current.key, &Holder::of(&current));
        if let Some(new) = new.filter(|n| n.status == idem_runtime::Status::InFlight) {
            self.leases.hold(&new);
        }
        Ok(true)
    }

    /// Renews the leases in `holding`; returns those renewed.
    async fn renew(
        &self,
        holding: &[(String, Holder)],
    ) -> Result<Vec<(String, Holder)>, StoreError> {
        let keys: Vec<&str> = holding.iter().map(|(k, _)| k.as_str()).collect();
        let owners: Vec<&str> = holding.iter().map(|(_, h)| h.owner.as_str()).collect();
        let attempts: Vec<i64> = holding.iter().map(|(_, h)| i64::from(h.attempts)).collect();
        let lease = self.lease_ms();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.statements.renew)
            .await
            .map_err(|e| pg_error("cannot renew", e))?;
        let rows = client
            .query(&statement, &[&keys, &owners, &attempts, &lease])
            .await
            .map_err(|e| pg_error("cannot renew leases", e))?;
        Ok(rows
            .iter()
            .map(|row| {
                let attempts: i64 = row.get(2);
                (
                    row.get(0),
                    Holder {
                        owner: row.get::<_, String>(1).into(),
                        attempts: u32::try_from(attempts).unwrap_or(0),
                    },
                )
            })
            .collect())
    }

    /// When `record`'s lease lapses, as an instant of this machine; `None` when it has.
    fn lease_left(&self, record: &Record) -> Option<Duration> {
        let until = i64::try_from(record.lease_until?).ok()?;
        let left = until - self.db_now();
        (left > 0).then(|| Duration::from_millis(left as u64))
    }

    async fn changed(
        &self,
        key: String,
        seen: Record,
        deadline: Instant,
    ) -> Result<Option<Record>, StoreError> {
        // Subscribe before reading, so that a change between the read and the wait is seen.
        let mut subscription = self.fanout.subscribe(&key);
        loop {
            let current = self.get(&key).await?;
            let record = match current {
                Some(record) if record.fence() == seen.fence() => record,
                other => return Ok(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Some(record));
            }
            // The owner may die without a word: wake when its lease lapses, to look again.
            let wake = match assess(Some(&record), now_ms(), |r| self.lease_left(r).is_some()) {
                Assessment::Running => match self.lease_left(&record) {
                    Some(left) => deadline.min(now + left + Duration::from_millis(5)),
                    None => return Ok(Some(record)),
                },
                // The lease lapsed: the owner is dead, and the caller must know now.
                Assessment::InDoubt => return Ok(Some(record)),
                _ => deadline,
            };
            let wake =
                if self.fanout.listening() { wake } else { wake.min(now + DEGRADED_RECHECK) };
            tokio::select! {
                () = subscription.next() => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    async fn scan(&self) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&self.statements.scan, &[])
            .await
            .map_err(|e| pg_error("cannot list records", e))?;
        rows.iter().map(sql::decode).collect()
    }

    async fn size(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(&self.statements.size, &[])
            .await
            .map_err(|e| pg_error("cannot read the table size", e))?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}

/// Renews held leases every heartbeat interval while any is held.
async fn heartbeat_loop(shared: Arc<Shared>) {
    loop {
        shared.leases.until_any().await;
        tokio::time::sleep(shared.heartbeat).await;
        let holding = shared.leases.snapshot();
        if holding.is_empty() {
            continue;
        }
        let _ = shared.measure_clock().await;
        match shared.renew(&holding).await {
            Ok(renewed) => {
                for (key, holder) in holding.iter().filter(|h| !renewed.contains(h)) {
                    // Settled meanwhile (then the lease is already dropped), or lost: either way
                    // the body's final write is fenced by the store.
                    shared.leases.drop_if(key, holder);
                    tracing::debug!(key = %key, owner = %holder.owner, "idem: lease not renewed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "idem: cannot renew leases; running calls lose their keys if this lasts past the lease")
            }
        }
    }
}

impl Store for PgStore {
    fn owner_id(&self) -> &str {
        &self.shared.owner
    }

    fn reserve<'a>(&'a self, record: &'a Record) -> StoreFuture<'a, Reserved> {
        let (shared, record) = (Arc::clone(&self.shared), record.clone());
        self.runtime.spawn_store(async move { shared.reserve(record).await })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        let (shared, key) = (Arc::clone(&self.shared), key.to_owned());
        self.runtime.spawn_store(async move { shared.get(&key).await })
    }

    fn replace<'a>(
        &'a self,
        current: &'a Record,
        new: Option<&'a Record>,
    ) -> StoreFuture<'a, bool> {
        let (shared, current, new) = (Arc::clone(&self.shared), current.clone(), new.cloned());
        self.runtime.spawn_store(async move { shared.replace(current, new).await })
    }

    fn replace_detached(&self, current: &Record, new: Option<Record>) {
        let (shared, current) = (Arc::clone(&self.shared), current.clone());
        let pending = self.shared.detached.start();
        // Not cancelled with the caller: a settling write must land.
        self.runtime.handle().spawn(async move {
            let _pending = pending;
            let key = current.key.clone();
            let tool = current.tool.clone();
            if let Err(e) = shared.replace(current, new).await {
                // The record keeps its lease, which lapses since nobody renews it: it becomes
                // in doubt, the same outcome as a crash.
                tracing::error!(key = %key, tool = %tool, error = %e, "idem: cannot settle record");
            }
        });
    }

    fn changed<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        let (shared, key, seen) = (Arc::clone(&self.shared), key.to_owned(), seen.clone());
        self.runtime.spawn_store(async move { shared.changed(key, seen, deadline).await })
    }

    fn owner_alive(&self, record: &Record) -> bool {
        self.shared.lease_left(record).is_some()
    }

    fn scan(&self) -> StoreFuture<'_, Vec<Record>> {
        let shared = Arc::clone(&self.shared);
        self.runtime.spawn_store(async move { shared.scan().await })
    }

    fn size_on_disk(&self) -> Option<u64> {
        let shared = Arc::clone(&self.shared);
        idem_runtime::for_stores::block_on(
            self.runtime.spawn_store(async move { shared.size().await }),
        )
        .ok()
    }

    fn default_wait(&self) -> Duration {
        self.shared.default_wait
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table())
            .field("owner", &self.shared.owner)
            .field("lease", &self.shared.lease)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Give settling writes from `Drop` paths a moment to land, where blocking is allowed.
        if Handle::try_current().is_err() {
            self.shared.detached.wait_idle(Duration::from_secs(5));
        }
    }
}
