//! [`PgStore`]: the [`Store`] interface over a PostgreSQL table, and connecting to it.

use std::str::FromStr;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idem_runtime::deadline_after;
use idem_runtime::history::{Change, Entry};
use idem_runtime::retention::RetentionStatus;
use idem_runtime::store::lease::{Held, Lease};
use idem_runtime::store::{Beside, Guard, Inserted, Instance, Page, StoreError};
use idem_runtime::{Record, Store, StoreFuture};
use tokio::runtime::Handle;
use tokio_postgres::NoTls;

use crate::builder::PgStoreBuilder;
use crate::listen::Listener;
use crate::operations::Table;
use crate::rows::ChangeValues;
use crate::runtime::{OwnRuntime, Writes};
use crate::schema::{self, Names, Statements};

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
/// - **Leases**: an owner's record carries a lease, which the engine stamps on the instance's
///   terms ([`Instance::lease`]: the builder's `lease` and `heartbeat`) and its heartbeat renews while the body runs, every lease this
///   process holds in one statement per interval ([`Store::renew`]). Lease times are read on
///   the database's clock. When an owner dies, its lease lapses and
///   every caller then treats the record as in doubt.
/// - **Fencing**: every write names the state it replaces (status, owner, attempts) and a lapsed
///   lease is never renewed, so an owner whose record was taken over cannot write to it.
/// - **Waiting without polling**: a caller that waits marks the record (its `waiters` column),
///   and a settling write that finds the mark is announced with `NOTIFY` once it has committed
///   (not from a trigger, whose notifying commits would go one at a time across the fleet; and
///   not for writes no one waits for, which would wake every process of the fleet for
///   nothing); one listening connection per store wakes the waiters of this process. It is
///   trusted while a notification it sends itself comes back; otherwise waiters re-read every
///   50 ms. Another program that writes the table must announce its changes likewise:
///   `SELECT pg_notify(channel, key)`.
///
/// - **Faults**: a read, a wait or a heartbeat that hits a broken connection tries again on a
///   fresh one within its deadline; a write is repeated only where the fence makes it safe. An
///   owner whose last write fails stops renewing its lease, so its key turns in doubt for others
///   as after a crash, rather than looking busy for as long as the store lives.
///
/// To remove a store, drop its table and its history table: `DROP TABLE idem.records,
/// idem.records_history;`.
///
/// Every change of a record appends a row to `<table>_history` (`idem.records_history`) in the
/// statement that makes the change, so the two commit together in one round trip; a purge
/// deletes the key's rows in its statement.
///
/// The store runs its I/O on a small tokio runtime of its own, so its futures work from plain
/// threads (sync tools) and from inside any async runtime alike.
///
/// **Through a pooler** in transaction mode (PgBouncer's `pool_mode = transaction`, hosted
/// databases' poolers) the store is correct as it is directly: it sends no named prepared
/// statement and keeps no session state. `LISTEN` hears nothing there; the store finds that
/// out (a notification it sends itself does not come back) and its waiters re-read every 50 ms
/// instead. [`PgStoreBuilder::listen_url`] gives the listening connection a direct or
/// session-mode URL, and waiters wake at once again.
///
/// ```no_run
/// # fn main() -> Result<(), idem_runtime::Error> {
/// use std::sync::Arc;
/// let store = idem_postgres::PgStore::connect("postgres://agent@db.internal/agents")?;
/// idem_runtime::set_default_store(Arc::new(store));
/// # Ok(()) }
/// ```
pub struct PgStore {
    /// What the engine's opener runs beside the store (the retention passes, on a second
    /// handle): the first field, so that it stops before the rest goes away.
    beside: Beside,
    shared: Arc<Table>,
    runtime: Arc<OwnRuntime>,
}

pub(crate) fn store_error(source: StoreError) -> idem_runtime::Error {
    idem_runtime::Error::Store { key: None, tool: None, source }
}

impl PgStoreBuilder {
    /// Connects, blocking this thread until the store is ready. Safe to call from any thread,
    /// including one inside an async runtime (the work runs on the store's own runtime); in
    /// async code [`PgStoreBuilder::connect_async`] does not hold the thread.
    pub fn connect(self) -> Result<PgStore, idem_runtime::Error> {
        idem_runtime::block_on(self.connect_async())
    }

    /// Connects without blocking; the future runs on any executor.
    pub async fn connect_async(self) -> Result<PgStore, idem_runtime::Error> {
        let common = self.common.clone();
        let mut store = PgStore::open_storage(self).await.map_err(store_error)?;
        // What runs beside the store is the engine's, as for sled and SQLite.
        store.beside = Beside::start(&common, || store.handle()).map_err(store_error)?;
        Ok(store)
    }
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

    /// Opens the table (nothing runs beside it yet: see [`PgStoreBuilder::connect_async`]).
    async fn open_storage(options: PgStoreBuilder) -> Result<PgStore, StoreError> {
        schema::check_identifier("schema", &options.schema)?;
        schema::check_identifier("table", &options.table)?;
        let terms = Lease::new(options.lease, options.heartbeat)?;
        let config = client_config(&options.url)?;
        // The listening connection's own URL is parsed now, so that a mistyped one fails the
        // connect rather than a background task.
        let listen = match &options.listen_url {
            Some(url) => client_config(url)?,
            None => config.clone(),
        };
        let runtime = OwnRuntime::new()?;
        let names = Names { schema: options.schema.clone(), table: options.table.clone() };
        let shared = Arc::new(Table {
            pool: pool(&config, options.pool_size, runtime.handle().clone())?,
            statements: Statements::new(&names),
            names,
            instance: Instance::new("pg").with_lease(terms).with_remote_reads(),
            terms,
            lease: terms.length,
            clock_offset: AtomicI64::new(0),
            listener: Arc::new(Listener::default()),
            writes: Arc::new(Writes::default()),
        });
        let setup = Arc::clone(&shared);
        let create = options.common.create;
        let pool_url = options.listen_url.is_none();
        runtime.spawn_store(async move { setup.start(listen, pool_url, create).await }).await?;
        Ok(PgStore { beside: Beside::default(), shared, runtime: Arc::new(runtime) })
    }

    /// A second handle on the same table, with nothing beside it: for what runs beside the
    /// store.
    fn handle(&self) -> PgStore {
        PgStore {
            beside: Beside::default(),
            shared: Arc::clone(&self.shared),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// Creates the schema and table if they are missing, and migrates a table of an earlier
    /// release. [`PgStore::connect`] does
    /// this already unless the builder said `create(false)`; run it from a deploy step to keep
    /// DDL out of the agents' start-up.
    pub fn migrate(&self) -> Result<(), idem_runtime::Error> {
        let shared = Arc::clone(&self.shared);
        idem_runtime::block_on(
            self.runtime.spawn_store(async move { shared.migrate(shared.deadline()).await }),
        )
        .map_err(store_error)
    }

    /// The store's table and pool, for transactional calls.
    pub(crate) fn table_state(&self) -> &Arc<Table> {
        &self.shared
    }

    /// The store's runtime, for transactional calls.
    pub(crate) fn own_runtime(&self) -> &OwnRuntime {
        &self.runtime
    }

    /// Bytes the records table and its indexes take (`pg_total_relation_size`; what `idem
    /// stats` prints), or `None` when the database cannot be asked.
    pub fn size_on_disk(&self) -> Option<u64> {
        let shared = Arc::clone(&self.shared);
        idem_runtime::block_on(self.runtime.spawn_store(async move { shared.size().await })).ok()
    }

    /// The records table, schema-qualified.
    pub fn table(&self) -> String {
        format!("{}.{}", self.shared.names.schema, self.shared.names.table)
    }

    /// The retention policy this store runs in the background, and what its passes removed
    /// so far; `None` when it runs none.
    pub fn retention(&self) -> Option<RetentionStatus> {
        self.beside.retention()
    }
}

/// The client configuration of `url`, with a connect timeout and the application name set
/// unless the URL sets them.
fn client_config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
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
    Ok(config)
}

/// The connection pool of the store. Its connections are made on the store's runtime, where
/// their tasks run, whoever asks the pool for one.
fn pool(config: &tokio_postgres::Config, size: usize, runtime: Handle) -> Result<Pool, StoreError> {
    let manager = Manager::from_connect(
        config.clone(),
        OnRuntime(runtime),
        // A connection is handed out again with no round trip to check it: one the server
        // closed while it sat in the pool (idle_session_timeout, a terminated backend) has
        // usually been seen closed by its task already, and when not, the statement fails as
        // broken and is tried again on a fresh connection (every read, fenced write and
        // transactional call does). A check would cost a round trip per statement.
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(15)))
        .build()
        .map_err(|e| StoreError::with_source("cannot build the PostgreSQL pool", e))
}

/// Makes the pool's connections on the store's runtime: the connection's socket and its task
/// belong to that runtime, so a connection taken from a caller's executor (a transactional
/// call) outlives the caller's runtime, and any executor may ask for one.
struct OnRuntime(Handle);

type Connected =
    Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>;

impl deadpool_postgres::Connect for OnRuntime {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Connected> + Send + '_>> {
        let config = config.clone();
        let connecting = self.0.spawn(async move {
            let (client, connection) = config.connect(NoTls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "idem: a pooled PostgreSQL connection ended");
                }
            });
            Ok((client, task))
        });
        Box::pin(async move {
            match connecting.await {
                Ok(connected) => connected,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime cancels its tasks only when it shuts down, which it does when the
                // last handle on the store goes; nobody can be asking the pool then.
                Err(_) => std::future::pending().await,
            }
        })
    }
}

impl Store for PgStore {
    fn instance(&self) -> &Instance {
        &self.shared.instance
    }

    fn insert_if_absent<'a>(
        &'a self,
        record: &'a Record,
        change: Change<'a>,
    ) -> StoreFuture<'a, Inserted> {
        let (shared, record) = (Arc::clone(&self.shared), record.clone());
        let change = ChangeValues::of(&change);
        let writing = self.shared.writes.start(record.owner.as_str());
        self.runtime.spawn_write(async move {
            let _writing = writing;
            shared.reserve(&record, &change).await
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        let (shared, key) = (Arc::clone(&self.shared), key.to_owned());
        self.runtime.spawn_store(async move {
            let deadline = deadline_after(Instant::now(), shared.lease);
            shared.get(&key, deadline).await
        })
    }

    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>> {
        let (shared, current, new) = (Arc::clone(&self.shared), expected.clone(), new.cloned());
        let change = ChangeValues::of(&change);
        // Taken before this write counts itself: it goes out after the writes the owner it
        // replaces still has in progress, which it would otherwise overtake, and not after its own.
        let earlier = self.shared.writes.settled(current.owner.as_str());
        let writing =
            self.shared.writes.start(new.as_ref().map_or(&current.owner, |n| &n.owner).as_str());
        // Not cancelled with the caller: the write lands (a settling write from `Drop` must).
        self.runtime.spawn_write(async move {
            let _writing = writing;
            earlier.await;
            shared.replace(&current, guard, new.as_ref(), &change).await
        })
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        let (shared, key, seen) = (Arc::clone(&self.shared), key.to_owned(), seen.clone());
        self.runtime.spawn_store(async move { shared.watch(&key, &seen, deadline).await })
    }

    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool> {
        let (shared, key) = (Arc::clone(&self.shared), key.to_owned());
        if change.event().ends_history() {
            // Nothing of the purge is kept: the history goes whole, as with a purged record,
            // and only from a key with no record (the statement's own condition).
            return self.runtime.spawn_write(async move { shared.remove_history(&key).await });
        }
        let change = ChangeValues::of(&change);
        self.runtime.spawn_write(async move { shared.append(&key, &change).await.map(|()| true) })
    }

    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        let (shared, key) = (Arc::clone(&self.shared), key.to_owned());
        self.runtime.spawn_store(async move {
            let deadline = deadline_after(Instant::now(), shared.lease);
            shared.history(&key, deadline).await
        })
    }

    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page> {
        let (shared, after) = (Arc::clone(&self.shared), after.map(str::to_owned));
        self.runtime.spawn_store(async move { shared.scan_page(after.as_deref(), limit).await })
    }

    fn renew<'a>(&'a self, held: &'a [Held], until: u64) -> StoreFuture<'a, Vec<bool>> {
        let (shared, held) = (Arc::clone(&self.shared), held.to_vec());
        self.runtime.spawn_store(async move { shared.renew(&held, until).await })
    }

    fn clock(&self) -> u64 {
        self.shared.db_now()
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table())
            .field("owner", &self.shared.instance.id())
            .field("lease", &self.shared.lease)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Give writes in progress (a settling write from a `Drop` path sent a moment ago) a
        // moment to land, where blocking is allowed.
        if Handle::try_current().is_err() {
            self.shared.writes.wait_idle(Duration::from_secs(5));
        }
    }
}
