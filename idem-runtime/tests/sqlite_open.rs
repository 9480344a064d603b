//! What the SQLite store refuses, and how: a file that is not an idem store, a store of a later
//! schema, a directory, a missing file the command names, a read-only file system, a full disk,
//! and a write lock another process keeps past the busy timeout. Each is an error that names
//! the file and says what to do; nothing is half-written and nothing runs twice.
//!
//! An empty file, and an SQLite database with nothing in it, are no idem store either: idem
//! gives a store its name only once it is whole, so neither can be one of its own.
//!
//! The read-only and full-disk cases mount a small tmpfs, which needs root and `mount`;
//! elsewhere they say so loudly and skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Call, Error, InDoubtPolicy, SqliteStore, Store};

mod children;

fn open_error(path: &Path) -> String {
    match SqliteStore::open(path) {
        Ok(_) => panic!("{} opened as a store", path.display()),
        Err(e) => {
            assert!(!e.is_retryable(), "nothing changes by opening again: {e}");
            e.to_string()
        }
    }
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "my notes, not a database\n").unwrap();
    let message = open_error(&path);
    assert!(message.contains("is not an SQLite database"), "{message}");
    assert!(message.contains(&path.display().to_string()), "names the file: {message}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "my notes, not a database\n");
}

#[test]
fn an_sqlite_database_of_another_program_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY)").unwrap();
    drop(other);
    let message = open_error(&path);
    assert!(message.contains("not an idem store"), "{message}");
    let other = rusqlite::Connection::open(&path).unwrap();
    let tables: Vec<String> = other
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(tables, ["invoices"], "no idem table was added");
}

/// An empty file (another database's `-wal`, a file a program has just created) is refused,
/// named, with what to do, and left empty: by an agent's open and by the command's
/// (`create(false)`) alike. Before, both adopted it and wrote a store into it.
#[test]
fn an_empty_file_is_refused_and_left_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db-wal");
    std::fs::write(&path, "").unwrap();
    for open in [SqliteStore::builder(&path), SqliteStore::builder(&path).create(false)] {
        let Err(e) = open.open() else { panic!("an empty file opened as a store") };
        let message = e.to_string();
        assert!(message.contains(&format!("{} is an empty file", path.display())), "{message}");
        assert!(message.contains("remove it if it is yours to remove"), "{message}");
        assert!(!e.is_retryable(), "{message}");
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing was written to it");
}

/// An SQLite database with no table and no mark is some program's new database, not a store
/// idem left half made: refused, and no idem table is added.
#[test]
fn an_sqlite_database_with_nothing_in_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new-app.db");
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("CREATE TABLE t (x); DROP TABLE t;").unwrap();
    drop(other);
    let message = open_error(&path);
    assert!(message.contains("no idem store") && message.contains("no table"), "{message}");
    assert!(message.contains(&path.display().to_string()), "names the file: {message}");
    let other = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 =
        other.query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0)).unwrap();
    assert_eq!(tables, 0, "no idem table was added");
}

/// Child mode of the test below: opens the store in the directory it is given, which stops at
/// the fail point, where the test kills it.
#[test]
fn sqlite_open_child() {
    let Some((_, dir)) = children::role() else { return };
    let opened = SqliteStore::open(dir.join("idem.sqlite"));
    println!("OPENED {}", opened.is_ok());
}

/// A process killed while it creates a store leaves nothing under the store's name: the file
/// appears there whole, tables and mark, or not at all. Otherwise an empty file would be left,
/// which the next open must refuse (it cannot tell it from another program's). The next open
/// creates the store and runs a call.
#[test]
fn a_store_killed_while_being_created_leaves_nothing_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let mut child = children::start(
        children::child("sqlite_open_child", "create", dir.path())
            .env("IDEM_FAILPOINT", "sqlite_creating"),
    );
    child.until_line("IDEM_FAILPOINT_REACHED sqlite_creating");
    child.kill();
    assert!(!path.exists(), "a store killed half made left a file under its name");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let got = Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .store(store)
        .run(|| Ok::<_, Error>("sent".to_owned()))
        .unwrap();
    assert_eq!(got, "sent");
}

/// The modes, in octal, of a store's files, each by its path suffix (`""` for the store's own
/// file), and of its `-idem/` directory and the files in it.
#[cfg(unix)]
fn modes(path: &Path) -> (Vec<(&'static str, String)>, String, Vec<String>) {
    use std::os::unix::fs::PermissionsExt;
    let mode =
        |at: &Path| format!("{:o}", std::fs::metadata(at).unwrap().permissions().mode() & 0o777);
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let files = ["", "-wal", "-shm"].map(|suffix| (suffix, mode(&beside(suffix)))).to_vec();
    let dir = beside("-idem");
    let inside = std::fs::read_dir(&dir).unwrap().map(|entry| mode(&entry.unwrap().path()));
    (files, mode(&dir), inside.collect())
}

/// Every file a new store makes is its user's alone (0600: the store's file, and the `-wal` and
/// `-shm` SQLite makes with that file's mode; the lock files), and its `-idem/` directory too
/// (0700), whatever the umask: they hold every result and history. Before, they took the
/// umask's modes (0644 and 0755 under the usual 022), and any local user could read them.
#[cfg(unix)]
#[test]
fn a_new_store_is_its_user_s_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .store(Arc::clone(&store))
        .run(|| Ok::<_, Error>("sent".to_owned()))
        .unwrap();
    let (files, dir_mode, inside) = modes(&path);
    let user = |suffix| (suffix, "600".to_owned());
    assert_eq!(files, [user(""), user("-wal"), user("-shm")]);
    assert_eq!(dir_mode, "700", "the -idem directory");
    assert!(!inside.is_empty() && inside.iter().all(|m| m == "600"), "lock files: {inside:?}");
}

/// With `group_access(true)`, what the store creates is its group's too (0660, 0770), whatever
/// the umask (which, at the usual 022, would take the group's write away); a waiter's socket
/// too, so that another user's process of the group can wake it.
#[cfg(unix)]
#[test]
fn a_store_with_group_access_is_its_group_s_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store = Arc::new(SqliteStore::builder(&path).group_access(true).open().unwrap());
    let call = || Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 })).unwrap();
    let (owner, waiter) = (call().store(Arc::clone(&store) as Arc<dyn Store>), call());
    let waiter = waiter.store(Arc::clone(&store) as Arc<dyn Store>).wait(Duration::from_secs(5));
    let (entered, release) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel::<()>());
    let running = std::thread::spawn(move || {
        owner.run(|| {
            entered.0.send(()).unwrap();
            release.1.recv().unwrap();
            Ok::<_, Error>("sent".to_owned())
        })
    });
    entered.1.recv().unwrap();
    let waiting = std::thread::spawn(move || waiter.run(|| Ok::<_, Error>("again".to_owned())));
    let socket = {
        let locks = dir.path().join("idem.sqlite-idem");
        let is_socket =
            |entry: &std::fs::DirEntry| entry.path().extension() == Some("wake".as_ref());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let found = std::fs::read_dir(&locks).unwrap().map(Result::unwrap).find(is_socket);
            match found {
                Some(entry) => break entry.path(),
                None if std::time::Instant::now() < deadline => std::thread::yield_now(),
                None => panic!("the waiter never listened"),
            }
        }
    };
    let (files, dir_mode, inside) = modes(&path);
    release.0.send(()).unwrap();
    assert_eq!(running.join().unwrap().unwrap(), "sent");
    assert_eq!(waiting.join().unwrap().unwrap(), "sent", "the waiter got the owner's result");
    let group = |suffix| (suffix, "660".to_owned());
    assert_eq!(files, [group(""), group("-wal"), group("-shm")]);
    assert_eq!(dir_mode, "770", "the -idem directory");
    assert!(inside.len() >= 2 && inside.iter().all(|m| m == "660"), "{inside:?} ({socket:?})");
}

#[test]
fn a_store_of_a_later_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    rusqlite::Connection::open(&path).unwrap().execute_batch("PRAGMA user_version = 7").unwrap();
    let message = open_error(&path);
    assert!(message.contains("schema version 7") && message.contains("later idem"), "{message}");
}

#[test]
fn a_directory_and_a_missing_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let message = open_error(dir.path());
    assert!(message.contains("is a directory"), "{message}");
    let missing = dir.path().join("typo.sqlite");
    let Err(e) = SqliteStore::builder(&missing).create(false).open() else {
        panic!("a missing store opened under create(false)")
    };
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!missing.exists(), "nothing was created");
}

/// Holds the store's write lock from another connection (as another process's long write
/// would): a call waits out the busy timeout, then fails with an error that says so, and has
/// written nothing; once the lock goes, the same call runs.
#[test]
fn a_write_lock_held_past_the_busy_timeout_is_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::builder(&path).busy_timeout(Duration::from_millis(200)).open().unwrap(),
    );
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let runs = AtomicUsize::new(0);
    let call = || {
        Call::new("send_email", "welcome-42", &serde_json::json!({ "to": "ann" }))
            .unwrap()
            .store(Arc::clone(&store))
    };
    let body = || {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("sent".to_owned())
    };
    let Err(e) = call().run(body) else { panic!("a call ran while the write lock was held") };
    let message = e.to_string();
    assert!(message.contains("stayed locked by another writer"), "{message}");
    assert!(message.contains("nothing was written"), "{message}");
    assert!(e.is_retryable(), "the lock may go: {message}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    holder.execute_batch("ROLLBACK").unwrap();
    let key = call().key().clone();
    assert!(idem_runtime::block_on(store.get(key.as_str())).unwrap().is_none());
    assert_eq!(call().run(body).unwrap(), "sent");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, options: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).ok()?;
        let mounted =
            Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).output();
        mounted.ok()?.status.success().then(|| SmallDisk(at.to_owned()))
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn require_mount(disk: Option<SmallDisk>, test: &str) -> Option<SmallDisk> {
    if disk.is_none() {
        eprintln!("NOTICE: cannot mount a tmpfs (needs root): the {test} test is SKIPPED");
        assert!(std::env::var_os("CI").is_none(), "CI runs as root: the {test} test must run");
    }
    disk
}

#[test]
fn a_store_on_a_read_only_file_system_is_a_clear_error_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) =
        require_mount(SmallDisk::mount(&dir.path().join("disk"), "size=8m"), "read-only")
    else {
        return;
    };
    let path = disk.0.join("idem.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    disk.remount("ro");
    let message = open_error(&path);
    assert!(message.contains("read-only"), "{message}");
    assert!(message.contains(&path.display().to_string()), "names the file: {message}");
}

#[test]
fn a_full_disk_is_a_clear_error_and_nothing_runs_twice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) =
        require_mount(SmallDisk::mount(&dir.path().join("disk"), "size=2m"), "full-disk")
    else {
        return;
    };
    let path = disk.0.join("idem.sqlite");
    let runs: Vec<AtomicUsize> = (0..200).map(|_| AtomicUsize::new(0)).collect();
    let call = |store: &Arc<dyn Store>, n: usize| {
        Call::new("export_report", format!("report-{n}"), &serde_json::json!({ "n": n }))
            .unwrap()
            .store(Arc::clone(store))
            .in_doubt(InDoubtPolicy::Fail)
    };
    let body = |n: usize| {
        runs[n].fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(format!("{n:06}").repeat(10_000))
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let mut failed = None;
    for n in 0..200 {
        if let Err(e) = call(&store, n).run(|| body(n)) {
            failed = Some((n, e));
            break;
        }
    }
    let (n, e) = failed.expect("a 2 MiB disk fills up");
    assert!(e.to_string().contains("the disk is full"), "{e}");
    drop(store);
    disk.remount("size=64m");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    for earlier in 0..n {
        let got: String = call(&store, earlier).run(|| body(earlier)).unwrap();
        assert_eq!(got, format!("{earlier:06}").repeat(10_000), "report {earlier} replays");
    }
    let again = call(&store, n).run(|| body(n));
    match runs[n].load(Ordering::SeqCst) {
        // The body ran before the disk filled: its key is in doubt, not run again.
        1 => assert!(matches!(again, Err(Error::InDoubt { .. })), "{again:?}"),
        // The reservation itself failed: nothing was written, and the call runs now.
        0 => assert!(again.is_ok(), "{again:?}"),
        more => panic!("report {n} ran {more} times"),
    }
    assert!(runs.iter().all(|r| r.load(Ordering::SeqCst) <= 1), "no body ran twice");
}

/// A record damaged behind the store's back fails the calls of its own key, with an error that
/// names the key, and no other call of the store.
#[test]
fn a_damaged_record_fails_its_own_key_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let call = |n: usize| {
        Call::new("export_report", format!("report-{n}"), &serde_json::json!({ "n": n }))
            .unwrap()
            .store(Arc::clone(&store))
            .in_doubt(InDoubtPolicy::Fail)
    };
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        call(0).run(|| -> Result<String, Error> { panic!("left in doubt") })
    }));
    assert!(panicked.is_err());
    let damaged = call(0).key().to_string();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute("UPDATE idem_records SET status = 'pending' WHERE key = ?1", [&damaged]).unwrap();
    drop(other);
    let runs = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let calls: Vec<_> = (0..16)
            .map(|n| {
                let (call, runs) = (call(n), &runs);
                scope.spawn(move || {
                    call.run(|| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(format!("report {n}"))
                    })
                })
            })
            .collect();
        for (n, handle) in calls.into_iter().enumerate() {
            match (n, handle.join().unwrap()) {
                (0, Err(e)) => {
                    let message = e.to_string();
                    assert!(message.contains(&damaged) && message.contains("pending"), "{message}");
                }
                (0, Ok(got)) => panic!("the damaged key ran: {got}"),
                (n, got) => assert_eq!(got.unwrap(), format!("report {n}")),
            }
        }
    });
    assert_eq!(runs.load(Ordering::SeqCst), 15, "every other key ran once");
}

/// Stores opened on one new file at once, over and over: each either creates the layout or finds
/// it whole. The marks and the tables are read from one state of the file, so an open never sees
/// another's creation half done (its tables and not yet its mark), which it would refuse as
/// "another program's database".
#[test]
fn stores_opened_at_once_on_a_new_file_all_open() {
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let path = Arc::new(dir.path().join("idem.sqlite"));
        let start = Arc::new(std::sync::Barrier::new(8));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let (path, start) = (Arc::clone(&path), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(&*path).map(drop)
                })
            })
            .collect();
        for open in opens {
            if let Err(e) = open.join().unwrap() {
                panic!("round {round}: an open of a store being created failed: {e}");
            }
        }
    }
}

#[test]
fn a_store_whose_wake_socket_file_was_removed_still_closes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    // A wait makes the store listen for other processes' writes, on a socket beside the file.
    let call = Call::new("export", "report-1", &1).unwrap();
    let key = call.key().clone();
    let _: u32 =
        call.store(Arc::new(SqliteStore::open(&path).unwrap())).run(|| Ok::<_, Error>(1)).unwrap();
    let done = idem_runtime::block_on(store.get(key.as_str())).unwrap().unwrap();
    let now = std::time::Instant::now();
    idem_runtime::block_on(store.watch(key.as_str(), &done, now)).unwrap();
    // A tmp cleaner, or an operator, removes the files beside the store: its wake socket too.
    let beside = dir.path().join("idem.sqlite-idem");
    let sockets: Vec<_> = std::fs::read_dir(&beside)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wake"))
        .collect();
    assert_eq!(sockets.len(), 1, "the store listens on one socket: {sockets:?}");
    std::fs::remove_file(&sockets[0]).unwrap();
    let (closed, is_closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(store);
        let _ = closed.send(());
    });
    is_closed.recv_timeout(Duration::from_secs(30)).expect("the store closed");
}
