//! Whether the store instance behind an in-flight record still lives, as the operating system
//! tells it: every instance holds an exclusive lock on a file of its own (`flock`) for as long
//! as it is open, and the kernel lets go of it when the process ends, however it ends. Another
//! process asks by trying to take the same lock: refused, the owner lives; granted, it is gone.
//! No lease has to run out first, and a waiter learns of a death at once by blocking on that
//! lock in a thread of its own.
//!
//! An owner is taken for gone only on positive evidence: its lock free, or (when its lock file
//! is missing: a tmp cleaner, an operator tidying `*.lock`) its process gone from this host. A
//! missing file alone tells nothing, so such an owner whose process may still run is kept as
//! running: its records wait for it rather than turn in doubt under it.
//!
//! The files live in `<store>-idem/`, one per instance (`<instance>.lock`, with characters a
//! file name should not hold replaced). An instance lets go of its lock at close and leaves the
//! file, free, as the evidence of its end. An instance that opens the store removes the free
//! files of instances that own no record in flight: the others are kept for as long as they
//! are the evidence a record in flight needs.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::StoreError;
use crate::lifecycle::{Liveness, Owner};
use crate::store::access::Access;
use crate::store::notify::Notifier;

/// The locks of a store's instances, seen from one of them.
pub(super) struct Owners {
    dir: PathBuf,
    instance: String,
    /// The lock this instance holds for its life.
    own: Option<File>,
    /// Instances found gone: gone for good, since instance names are never reused.
    gone: Mutex<HashSet<String>>,
    /// Instances a thread of this store waits on, to wake the waiters when they end.
    watched: Arc<Mutex<HashSet<String>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The directory beside the database file that holds the instances' lock files.
pub(super) fn dir_of(database: &Path) -> PathBuf {
    let mut name = database.file_name().unwrap_or_default().to_owned();
    name.push("-idem");
    database.with_file_name(name)
}

/// The lock file of `instance` in `dir`.
fn file_of(dir: &Path, instance: &str) -> PathBuf {
    let name: String = instance
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .collect();
    dir.join(format!("{name}.lock"))
}

impl Owners {
    /// Takes the lock of `instance` in `dir` (created if missing), both with `access`, and
    /// removes the lock files of instances that are gone, except those of the instances in
    /// `in_flight` (which own records in flight: their free lock is the evidence of their end).
    pub(super) fn open(
        dir: &Path,
        instance: &str,
        in_flight: &HashSet<String>,
        access: Access,
    ) -> Result<Owners, StoreError> {
        access.create_dirs(dir).map_err(|e| {
            StoreError::with_source(
                format!(
                    "cannot create {}, where the processes sharing the store hold their locks: \
                     give this process write access to the store's directory",
                    dir.display()
                ),
                e,
            )
            .lasting()
        })?;
        let own = Some(imp::hold(&file_of(dir, instance), access).map_err(|e| {
            StoreError::with_source(format!("cannot lock {}", dir.display()), e).lasting()
        })?);
        let needed: HashSet<PathBuf> = in_flight.iter().map(|i| file_of(dir, i)).collect();
        imp::remove_gone(dir, &needed);
        Ok(Owners {
            dir: dir.to_owned(),
            instance: instance.to_owned(),
            own,
            gone: Mutex::default(),
            watched: Arc::default(),
        })
    }

    /// Whether the process that opened `instance` still has it open. This instance lives; an
    /// instance whose lock cannot be asked about (an error other than "held") is taken to live,
    /// the cautious answer: its records wait for it rather than turn in doubt. So is one whose
    /// lock file is missing while its process may still run on this host.
    pub(super) fn alive(&self, instance: &str) -> bool {
        if instance == self.instance {
            return true;
        }
        if lock(&self.gone).contains(instance) {
            return false;
        }
        let alive = match imp::held(&file_of(&self.dir, instance)) {
            Some(held) => held,
            None => !process_gone(instance),
        };
        if !alive {
            lock(&self.gone).insert(instance.to_owned());
        }
        alive
    }

    /// Wakes every waiter of `notifier` when `instance` ends: a thread blocks on its lock (one
    /// thread per instance waited on, which ends with it).
    pub(super) fn wake_at_end(&self, instance: &str, notifier: &crate::loom::Arc<Notifier>) {
        // Off Unix nothing tells of an end: waiters wake at their wait's end.
        if !cfg!(unix) || !lock(&self.watched).insert(instance.to_owned()) {
            return;
        }
        let (path, notifier) = (file_of(&self.dir, instance), crate::loom::Arc::clone(notifier));
        let (watched, instance) = (Arc::clone(&self.watched), instance.to_owned());
        let spawned =
            std::thread::Builder::new().name("idem-sqlite-owner".into()).spawn(move || {
                imp::wait_until_free(&path, || process_gone(&instance));
                lock(&watched).remove(&instance);
                notifier.notify_all();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "idem: cannot start a thread to watch an owner; waiters wake at their wait's end");
        }
    }
}

/// Whether the process behind `instance` is gone from this host: the evidence left when its
/// lock file is missing. An instance of another host, or one that names no process, cannot be
/// told gone.
fn process_gone(instance: &str) -> bool {
    matches!(Owner::from(instance).liveness(), Liveness::Gone { .. })
}

impl Drop for Owners {
    fn drop(&mut self) {
        // The file stays, free: a record this instance leaves in flight (a result that could
        // not be written) is then seen to have lost its owner. The next instance to open the
        // store removes the file once no record in flight needs it.
        drop(self.own.take());
    }
}

#[cfg(unix)]
mod imp {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    use std::path::Path;

    use crate::store::access::Access;

    fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
        loop {
            // SAFETY: flock on a file descriptor this `File` owns.
            if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }

    /// Creates `path` with `access` and holds an exclusive lock on it. A process cleaning up
    /// gone instances may remove the file between its creation and the lock: the lock is then
    /// on a file no one can find, so it is taken again on a new one.
    pub(super) fn hold(path: &Path, access: Access) -> io::Result<File> {
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(access.file_mode())
                .open(path)?;
            // The file is this instance's own (its name is): given the mode whatever the umask.
            access.give(&file)?;
            flock(&file, libc::LOCK_EX)?;
            let same = std::fs::metadata(path).is_ok_and(|meta| {
                file.metadata().is_ok_and(|own| own.ino() == meta.ino() && own.dev() == meta.dev())
            });
            if same {
                return Ok(file);
            }
        }
    }

    /// Whether someone holds the lock of `path`; `None` when there is no such file, which
    /// tells nothing either way.
    pub(super) fn held(path: &Path) -> Option<bool> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(_) => return Some(true),
        };
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => Some(false),
            // Held (EWOULDBLOCK), or the lock cannot be asked about: taken to live.
            Err(_) => Some(true),
        }
    }

    /// How often a watcher looks at the process table for an instance whose lock file is
    /// missing: there is no lock to block on.
    const PROCESS_LOOK: std::time::Duration = std::time::Duration::from_millis(250);

    /// Blocks until no one holds the lock of `path`, or, while it has no file, until `gone`
    /// says the instance's process has ended.
    pub(super) fn wait_until_free(path: &Path, gone: impl Fn() -> bool) {
        loop {
            match File::open(path) {
                Ok(file) => {
                    let _ = flock(&file, libc::LOCK_SH);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => return,
            }
            if gone() {
                return;
            }
            std::thread::sleep(PROCESS_LOOK);
        }
    }

    /// Removes every lock file in `dir` that no one holds (its instance is gone) and that is
    /// not in `needed`, taking the lock first so that a live instance's file is never removed.
    pub(super) fn remove_gone(dir: &Path, needed: &std::collections::HashSet<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "lock") || needed.contains(&path) {
                continue;
            }
            let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else { continue };
            if flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Off Unix the store cannot ask the system about another process's lock: every other instance
/// is taken to live, so its records wait for it (an operator settles those of a process that
/// died, with `idem resolve --force`).
#[cfg(not(unix))]
mod imp {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::path::Path;

    use crate::store::access::Access;

    pub(super) fn hold(path: &Path, _access: Access) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)
    }

    pub(super) fn held(_path: &Path) -> Option<bool> {
        Some(true)
    }

    pub(super) fn wait_until_free(_path: &Path, _gone: impl Fn() -> bool) {}

    pub(super) fn remove_gone(
        _dir: &Path,
        _needed: &std::collections::HashSet<std::path::PathBuf>,
    ) {
    }
}
