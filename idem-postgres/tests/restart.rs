//! A real server restart, on a private PostgreSQL cluster this test starts and stops itself (the
//! shared server must stay up for the other tests): a waiter waits through it, and a call made
//! while the server is down runs once it is back.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::{Call, Error, Store};

/// The directories that may hold the server programs, most likely first: what `pg_config
/// --bindir` names, each version's under Debian's `/usr/lib/postgresql` (newest first), then the
/// `PATH`'s usual places.
fn pg_bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|entry| entry.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort_by_key(|dir| std::cmp::Reverse(version_of(dir)));
    dirs.extend(versions);
    dirs.extend(["/usr/local/bin", "/usr/bin"].map(PathBuf::from));
    dirs
}

/// The major version in `/usr/lib/postgresql/<version>/bin` (0 when it is not a number).
fn version_of(bin: &Path) -> u32 {
    bin.parent()
        .and_then(|dir| dir.file_name())
        .and_then(|name| name.to_str())
        .and_then(|name| name.parse().ok())
        .unwrap_or(0)
}

/// Long enough that the owner's heartbeat carries its lease through a fast restart (which takes
/// well under a second on an idle cluster), so the waiter is still owed the owner's result.
const LEASE: Duration = Duration::from_secs(5);

/// The tests count the store's retries through one process-wide tracing subscriber, so they
/// take turns: one test's retries must not count as another's.
static TURN: Mutex<()> = Mutex::new(());

/// How many times a store retried a statement on a fresh connection.
static RETRIES: AtomicU64 = AtomicU64::new(0);

/// Counts the store's "retrying on a fresh connection" events, and ignores everything else.
struct CountRetries;

impl tracing::Subscriber for CountRetries {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("idem_postgres")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Retrying(bool);
        impl tracing::field::Visit for Retrying {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 |= format!("{value:?}").contains("retrying on a fresh connection");
                }
            }
        }
        let mut retrying = Retrying(false);
        event.record(&mut retrying);
        if retrying.0 {
            RETRIES.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Takes this test's turn, with the retry counter installed.
fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    // Set once per process; a second attempt fails harmlessly.
    let _ = tracing::subscriber::set_global_default(CountRetries);
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A private PostgreSQL cluster in a temporary directory, stopped and removed when dropped.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The user to run the server programs as, when this process is root (PostgreSQL refuses
    /// to run as root).
    run_as: Option<(u32, u32)>,
}

/// Says loudly why the test does not run.
fn skip(why: &str) -> Option<Cluster> {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI must run the restart tests: {why}");
    eprintln!("NOTICE: the restart tests are SKIPPED: {why}");
    None
}

impl Cluster {
    /// Creates and starts a cluster, or says why it cannot (`None`). Under `CI=true`, a cluster
    /// that cannot start although the programs exist fails the test.
    fn start(name: &str) -> Option<Cluster> {
        let dirs = pg_bin_dirs();
        let Some(bin) =
            dirs.iter().find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
        else {
            return skip(&format!("initdb and pg_ctl were not found (looked in {dirs:?})"));
        };
        let bin = bin.clone();
        let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        let run_as = if root {
            match postgres_user() {
                Some(ids) => Some(ids),
                None => return skip("running as root and there is no `postgres` user to run as"),
            }
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!(
            "idem-pg-restart-{name}-{}-{}",
            std::process::id(),
            idem_runtime::store::now_ms()
        ));
        let cluster = Cluster { bin, dir, port: free_port(), run_as };
        match cluster.create() {
            Ok(()) => Some(cluster),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("cannot start a private PostgreSQL cluster (required under CI=true): {e}")
            }
            Err(e) => skip(&format!("cannot start a private PostgreSQL cluster: {e}")),
        }
    }

    fn create(&self) -> Result<(), String> {
        let sockets = self.dir.join("sockets");
        std::fs::create_dir_all(&sockets).map_err(|e| format!("{}: {e}", sockets.display()))?;
        if let Some((uid, gid)) = self.run_as {
            for path in [&self.dir, &sockets] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))
                    .map_err(|e| format!("cannot give {} to postgres: {e}", path.display()))?;
            }
        }
        let data = self.data();
        self.run(
            "initdb",
            &["-D", path_str(&data)?, "-A", "trust", "-U", "postgres", "--no-sync"],
        )?;
        // Only this test uses the cluster: it needs no durability, and it listens nowhere else.
        let settings = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
            self.port,
            path_str(&sockets)?
        );
        let conf = data.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(|e| format!("{}: {e}", conf.display()))?;
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        self.pg_ctl(&["start"])
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `pg_ctl` on the cluster, waiting for it to finish what it was asked (`-w`).
    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let data = self.data();
        let log = self.dir.join("server.log");
        let mut all = vec!["-D", path_str(&data)?, "-l", path_str(&log)?, "-w", "-t", "60"];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all).map_err(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            format!("{e}\nthe server's log:\n{log}")
        })
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let mut command = Command::new(self.bin.join(program));
        command.args(args).current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        let out = command.output().map_err(|e| format!("cannot run {program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]).expect("the server stops");
    }

    fn start_again(&self) {
        self.pg_ctl(&["start"]).expect("the server starts again");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Whatever happened to the test: no server may outlive it.
        let _ = self.pg_ctl(&["-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str().ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

/// The uid and gid of the `postgres` user, from `/etc/passwd`.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    })
}

/// A port nothing listens on at the moment.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn connect(url: &str) -> Arc<dyn Store> {
    Arc::new(
        PgStore::builder(url)
            .lease(LEASE)
            .pool_size(2)
            .connect()
            .expect("the store connects to the private cluster"),
    )
}

fn call(store: &Arc<dyn Store>) -> Call {
    Call::new("restart", "r", &1).unwrap().store(Arc::clone(store)).wait(Duration::from_secs(60))
}

/// Returns once some caller of this process waits for `key`.
fn until_waiting(key: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while idem_runtime::waiting(key) == 0 {
        assert!(Instant::now() < until, "the waiter never began to wait");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_waiter_gets_the_owners_result_across_a_server_restart() {
    let _turn = take_turn();
    let Some(cluster) = Cluster::start("wait") else {
        return;
    };
    let url = cluster.url();
    // Two instances, as two processes would be: the owner's and the waiter's.
    let (owner_store, waiter_store) = (connect(&url), connect(&url));
    let runs = Arc::new(AtomicU32::new(0));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let (call, runs) = (call(&owner_store), Arc::clone(&runs));
        std::thread::spawn(move || {
            call.run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                started_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Ok::<_, Error>("the owner's result".to_owned())
            })
        })
    };
    started_rx.recv().unwrap();
    let waiter = {
        let (call, runs) = (call(&waiter_store), Arc::clone(&runs));
        std::thread::spawn(move || {
            call.run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>("the waiter's result".to_owned())
            })
        })
    };
    until_waiting(call(&waiter_store).key().as_str());
    let retries = RETRIES.load(Ordering::SeqCst);

    // The server goes down under both, and the owner's last write is sent while it is down, so
    // that a statement is sure to meet it (a restart that is over before anyone sends one could
    // test nothing: the pool would hand out fresh connections); it comes back once the store
    // has been seen retrying.
    cluster.stop();
    finish_tx.send(()).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while RETRIES.load(Ordering::SeqCst) == retries {
        assert!(!owner.is_finished(), "the owner ended without retrying: {:?}", owner.join());
        assert!(Instant::now() < until, "no statement met the server while it was down");
        std::thread::sleep(Duration::from_millis(1));
    }
    cluster.start_again();

    assert_eq!(owner.join().unwrap().expect("the owner finishes"), "the owner's result");
    assert_eq!(
        waiter.join().unwrap().expect("the waiter waits through the restart, without an error"),
        "the owner's result",
        "the waiter replays the owner's result"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert!(
        RETRIES.load(Ordering::SeqCst) > retries,
        "no statement met a broken connection, so the restart tested nothing"
    );
}

#[test]
fn a_call_made_while_the_server_is_down_runs_once_it_is_back() {
    let _turn = take_turn();
    let Some(cluster) = Cluster::start("down") else {
        return;
    };
    let store = connect(&cluster.url());
    let runs = Arc::new(AtomicU32::new(0));

    cluster.stop();
    // With no lease held, nothing else in the store retries statements: a retry now is the call
    // finding the server down.
    let retries = RETRIES.load(Ordering::SeqCst);
    let calling = {
        let (call, runs) = (call(&store), Arc::clone(&runs));
        std::thread::spawn(move || {
            call.run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>("ran".to_owned())
            })
        })
    };
    let until = Instant::now() + Duration::from_secs(30);
    while RETRIES.load(Ordering::SeqCst) == retries {
        if calling.is_finished() {
            panic!(
                "the call ended without retrying while the server was down: {:?}",
                calling.join()
            );
        }
        assert!(Instant::now() < until, "the call never tried to reach the server");
        std::thread::sleep(Duration::from_millis(1));
    }
    cluster.start_again();

    assert_eq!(calling.join().unwrap().expect("the call succeeds once the server is back"), "ran");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}
