//! Opening a SQLite store's file: the builder's options, the checks that refuse what is not an
//! idem store, and the settings every connection gets.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::owners::{self, Owners};
use super::schema::{self, Found};
use super::wake::Wake;
use super::writer::Writer;
use super::{fault, Idle, Shared, SqliteStore};
use crate::error::StoreError;
use crate::store::access::Access;
use crate::store::beside::Beside;
use crate::store::notify::Notifier;
use crate::store::{CommonOptions, Durability, Instance};

/// How long a write waits for another process's write lock by default.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for opening a [`SqliteStore`]; from [`SqliteStore::builder`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct SqliteStoreBuilder {
    pub(super) path: PathBuf,
    /// The options every store's builder has (durability, create, group access, retention).
    pub(crate) common: CommonOptions,
    pub(super) busy_timeout: Duration,
}

crate::store_options! {
    SqliteStoreBuilder {
        /// `Fsync` is SQLite's `synchronous = FULL`, `Flush` is `NORMAL`, `None` is `OFF`.
        durability,
        create,
        /// SQLite gives its `-wal` and `-shm` the store file's mode.
        group_access,
        retention,
    }
}

impl SqliteStoreBuilder {
    pub(super) fn new(path: &Path) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.to_owned(),
            common: CommonOptions::default(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }

    /// How long a write waits while other processes hold the file's write lock (5 s by
    /// default). SQLite lets one writer in at a time; the others queue for this long, then the
    /// call fails with an error that says so, having written nothing.
    pub fn busy_timeout(mut self, wait: Duration) -> Self {
        self.busy_timeout = wait;
        self
    }
}

impl SqliteStore {
    /// Another handle of this store, with nothing beside it (what the opener runs the
    /// retention passes on): the same writer, connections and notifier.
    pub(crate) fn handle(&self) -> SqliteStore {
        SqliteStore {
            beside: Beside::default(),
            writer: Arc::clone(&self.writer),
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The store's file named in messages.
pub(super) fn what(path: &Path) -> String {
    format!("the SQLite store at {}", path.display())
}

impl SqliteStore {
    /// Opens the file `options` give: nothing runs beside the store yet (its opener,
    /// `SqliteStoreBuilder::open` in the engine's `open/sqlite.rs`, starts the retention
    /// passes).
    pub(crate) fn open_storage(options: SqliteStoreBuilder) -> Result<SqliteStore, StoreError> {
        open_file(options)
    }
}

fn open_file(options: SqliteStoreBuilder) -> Result<SqliteStore, StoreError> {
    let what = what(&options.path);
    if !check_file(&options, &what)? {
        create_file(&options, &what)?;
    }
    let writer = prepare(&options, &what)?;
    let instance = Instance::new("sqlite");
    let in_flight = schema::in_flight_instances(&writer, &what)?;
    let dir = owners::dir_of(&options.path);
    let owners = Owners::open(&dir, instance.id(), &in_flight, options.common.access())?;
    let notifier = crate::loom::Arc::new(Notifier::default());
    let shared = Arc::new(Shared {
        wake: Wake::new(
            &dir,
            instance.id(),
            crate::loom::Arc::clone(&notifier),
            options.common.access(),
        ),
        what,
        instance,
        owners,
        notifier,
        readers: Idle::default(),
        transacting: Idle::default(),
        options,
    });
    let reader = connect(&shared.options, &shared.what)?;
    shared.readers.give_back(reader);
    Ok(SqliteStore { beside: Beside::default(), writer: Arc::new(Writer::start(writer)?), shared })
}

/// The writer's connection to a file that holds an idem store. A database with no table and
/// no mark is refused: idem never names a store before it is whole (see `create_file`), so
/// such a file is another program's. Processes that open a file at once may race to read it
/// in WAL mode; SQLite answers the losers `SQLITE_BUSY` at once there, without its busy
/// handler (a first read of a file in rollback mode may not wait), so the open tries again,
/// every 10 ms, until the busy timeout has passed.
fn prepare(options: &SqliteStoreBuilder, what: &str) -> Result<Connection, StoreError> {
    let deadline = std::time::Instant::now() + options.busy_timeout;
    loop {
        let attempt = connect(options, what).and_then(|writer| {
            if let Found::Empty = schema::inspect(&writer, what)? {
                return Err(StoreError::new(format!(
                    "{what} is an SQLite database with no table and no idem mark, so no idem \
                     store (idem names a store only once its tables and mark are written): \
                     name another file for the store, or remove this one if it is yours to \
                     remove; idem never writes to it"
                ))
                .lasting());
            }
            schema::index_in_flight(&writer, what)?;
            Ok(writer)
        });
        match attempt {
            Err(e) if fault::is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Refuses, before the store writes to it, a path that is a directory (a sled store, say), an
/// empty file or one that is not an SQLite database, and a missing file under `create(false)`;
/// whether the file exists.
fn check_file(options: &SqliteStoreBuilder, what: &str) -> Result<bool, StoreError> {
    let path = &options.path;
    check_writable(path, what)?;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(StoreError::new(format!(
            "{what} is a directory: a SQLite store is one file (a sled store is a directory: \
             name it without `sqlite:`)"
        ))
        .lasting()),
        Ok(meta) if meta.len() == 0 => Err(StoreError::new(format!(
            "{what} is an empty file, so no idem store (idem names a store only once it is \
             written whole): it may be another program's, such as a database's -wal; name \
             another file for the store, or remove it if it is yours to remove; idem never \
             writes to it"
        ))
        .lasting()),
        Ok(_) => match begins_as_database(path) {
            Ok(true) => Ok(true),
            Ok(false) => Err(StoreError::new(format!(
                "{what} is not an SQLite database (it does not begin as one): name another \
                 file for the store; idem never writes to this one"
            ))
            .lasting()),
            Err(e) => Err(fault::open_error(what, e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !options.common.create => {
            Err(StoreError::new(format!(
                "{what} does not exist: check the path (an agent's first call creates the store)"
            ))
            .lasting())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::with_source(format!("cannot read {what}"), e).lasting()),
    }
}

/// Creates the store whole, then names it: the tables and marks are written to a new file in
/// the store's `-idem/` directory, which is then linked under the store's name. `link` never
/// replaces a file: when another process's new store got there first, that one is used. So
/// the name never holds a store half made (an empty file there can only be another
/// program's), and a process killed before the link leaves a file in `-idem/` that nothing
/// reads.
fn create_file(options: &SqliteStoreBuilder, what: &str) -> Result<(), StoreError> {
    let fail = |e| StoreError::with_source(format!("cannot create {what}"), e).lasting();
    let dir = owners::dir_of(&options.path);
    options.common.access().create_dirs(&dir).map_err(fail)?;
    let new = new_file_in(&dir, options.common.access()).map_err(fail)?;
    crate::failpoint::failpoint("sqlite_creating");
    let made = write_layout(&SqliteStoreBuilder { path: new.clone(), ..options.clone() }, what)
        .and_then(|()| match std::fs::hard_link(&new, &options.path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(fail(e)),
            _ => Ok(()),
        });
    for leftover in ["", "-wal", "-shm", "-journal"] {
        let mut name = new.clone().into_os_string();
        name.push(leftover);
        let _ = std::fs::remove_file(name);
    }
    made?;
    if options.common.durability == Durability::Fsync {
        // The new name is durable once its directory is.
        let parent = match options.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        std::fs::File::open(parent).and_then(|dir| dir.sync_all()).map_err(fail)?;
    }
    Ok(())
}

/// A file of its own, new and empty, with `access`, in `dir`: named after this process and a
/// count, skipping a name a dead process with the same id left. SQLite gives the files it
/// makes beside a database (`-wal`, `-shm`, `-journal`) the database file's mode, so this is
/// the mode of all of them.
fn new_file_in(dir: &Path, access: Access) -> std::io::Result<PathBuf> {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("new-{}-{n}.sqlite", std::process::id()));
        match access.create_file(&path) {
            Ok(_) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes the layout and the marks into the new, empty file `options.path`, and closes it:
/// closing the last connection moves the log into the file and removes it.
fn write_layout(options: &SqliteStoreBuilder, what: &str) -> Result<(), StoreError> {
    let mut conn = connect(options, what)?;
    schema::create(&mut conn, what)?;
    conn.close().map_err(|(_, e)| fault::open_error(what, e))
}

/// Whether the file at `path` begins as an SQLite database does, as SQLite itself reads it
/// (`SQLITE_NOTADB` means no). The file is never opened any other way: closing a descriptor of
/// a file drops every POSIX lock this process holds on it, SQLite's own included, and another
/// process closing the store would then take itself for the last one and delete the live
/// `-wal` and `-shm`. SQLite's own connections share their locks per file, so opening and
/// closing one here leaves the locks of the process's other connections as they were.
pub(crate) fn begins_as_database(path: &Path) -> Result<bool, rusqlite::Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    match conn.query_row("PRAGMA schema_version", [], |row| row.get::<_, i64>(0)) {
        Ok(_) => Ok(true),
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Refuses a file, or a directory, that this process may not write: SQLite would open the
/// file read-only and fail at the first call, and it writes its `-wal` and `-shm` files beside
/// the store. (`access` reports a read-only file system to root too.)
#[cfg(unix)]
fn check_writable(path: &Path, what: &str) -> Result<(), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let writable = |at: &Path| -> Result<(), std::io::Error> {
        let name = std::ffi::CString::new(at.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a NUL-terminated path that lives across the call.
        match unsafe { libc::access(name.as_ptr(), libc::W_OK) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let checks = [(path, "the file"), (parent, "its directory")];
    for (at, which) in checks {
        match writable(at) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::with_source(
                    format!(
                        "{what} cannot be written: {which} ({}) is read-only to this process; \
                         a store is written at every call, and SQLite writes its -wal and -shm \
                         files beside it: give this process write access, or name another file",
                        at.display()
                    ),
                    e,
                )
                .lasting())
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_writable(_path: &Path, _what: &str) -> Result<(), StoreError> {
    Ok(())
}

/// A connection to the store's file with the store's settings: WAL, the durability's
/// `synchronous`, and the busy timeout.
pub(super) fn connect(options: &SqliteStoreBuilder, what: &str) -> Result<Connection, StoreError> {
    // Never `SQLITE_OPEN_CREATE`: the store's file is created whole (`create_file`).
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let fail = |e| fault::open_error(what, e);
    let conn = Connection::open_with_flags(&options.path, flags).map_err(fail)?;
    conn.busy_timeout(options.busy_timeout).map_err(fail)?;
    let mode: String =
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(format!(
            "{what} cannot use SQLite's write-ahead log (journal mode {mode}): a store that \
             several processes share needs it; put the file on a local disk"
        ))
        .lasting());
    }
    let synchronous = match options.common.durability {
        Durability::Fsync => "FULL",
        Durability::Flush => "NORMAL",
        Durability::None => "OFF",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {synchronous};")).map_err(fail)?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}
