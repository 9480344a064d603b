//! What a durable point syncs besides sled's own flush, with
//! [`Durability::Fsync`](crate::Durability::Fsync).
//!
//! sled 0.34 flushes its log with `sync_file_range`, which leaves the device's write cache
//! alone, writes its `conf` file at first open without syncing it, and never syncs a directory
//! after creating a file in it (`blobs/`, its snapshots). A power loss can then take back a
//! file, or a name, that a synced record depends on. So at open every file and directory sled
//! created is synced, and every durable point syncs the data file, plus each directory whose
//! entries changed since it was last synced and any blob file not yet synced (the store writes
//! no blobs, see `chunks.rs`; a store written before it kept results in chunks may hold some,
//! and sled can rewrite them).
//!
//! Which entries changed is known by listing both directories, which took two dozen system
//! calls at every durable point while nothing had changed. So the listing is skipped when the
//! kernel says no name was created, removed or renamed in either directory since the last
//! look ([`Changes`], inotify on Linux). The watches are in place before the listing at open,
//! and the kernel queues an event before the call that made the name returns: a name sled made
//! before a record's flush ended is reported by the time that record's durable point looks.
//! Where the kernel cannot tell (another system, or no inotify instance left), every durable
//! point lists, as before.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) struct Files {
    data: File,
    /// The entries of the store directory and of `blobs/` as of their last sync.
    synced: [(PathBuf, BTreeSet<OsString>); 2],
    changes: Changes,
    /// A listing was due and did not finish (an error): the next durable point lists whatever
    /// the kernel says, its news having been read already.
    due: bool,
    /// How many times the directories were listed since open, for the tests.
    #[cfg(test)]
    listings: usize,
}

fn entries(dir: &Path) -> io::Result<BTreeSet<OsString>> {
    std::fs::read_dir(dir)?.map(|entry| entry.map(|e| e.file_name())).collect()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Files {
    /// Syncs what sled wrote while opening the store in `dir`.
    pub(crate) fn open(dir: &Path) -> io::Result<Files> {
        let blobs = dir.join("blobs");
        // Before the listing below: a name made after it is then reported.
        let changes = Changes::watch(&[dir, &blobs]);
        let data = File::open(dir.join("db"))?;
        data.sync_all()?;
        File::open(dir.join("conf"))?.sync_all()?;
        for name in entries(&blobs)? {
            File::open(blobs.join(name))?.sync_all()?;
        }
        sync_dir(&blobs)?;
        sync_dir(dir)?;
        // sled may have created the store directory itself (a relative path's parent is the
        // working directory).
        match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
        let synced = [(dir.to_owned(), entries(dir)?), (blobs.clone(), entries(&blobs)?)];
        Ok(Files {
            data,
            synced,
            changes,
            due: false,
            #[cfg(test)]
            listings: 0,
        })
    }

    /// Makes what sled has flushed durable: new blob files, then changed directories, then the
    /// data file, so that nothing the log points to can be lost while the log survives.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        // Read the news even when a listing is due anyway, so that it is not read again.
        let changed = self.changes.since_last_look();
        if changed || self.due {
            self.due = true;
            self.sync_changed_dirs()?;
            self.due = false;
        }
        self.data.sync_data()
    }

    /// Lists both directories, syncs the blob files that appeared, then each directory whose
    /// entries changed.
    fn sync_changed_dirs(&mut self) -> io::Result<()> {
        #[cfg(test)]
        {
            self.listings += 1;
        }
        for (dir, synced) in &mut self.synced {
            let now = entries(dir)?;
            if now == *synced {
                continue;
            }
            if dir.file_name() == Some("blobs".as_ref()) {
                for name in now.difference(synced) {
                    match File::open(dir.join(name)) {
                        Ok(file) => file.sync_all()?,
                        // sled removed it since the listing: nothing to keep.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            sync_dir(dir)?;
            *synced = now;
        }
        Ok(())
    }
}

/// Whether a name may have been created, removed or renamed in the watched directories since
/// the last look: an inotify instance on Linux, read without blocking.
#[cfg(target_os = "linux")]
struct Changes {
    /// `None` when the kernel would not watch (no instance left, say): always "maybe".
    events: Option<File>,
}

#[cfg(target_os = "linux")]
impl Changes {
    /// What makes a directory's entries change, and the directory itself going.
    const NAMES: u32 = libc::IN_CREATE
        | libc::IN_DELETE
        | libc::IN_MOVED_FROM
        | libc::IN_MOVED_TO
        | libc::IN_DELETE_SELF
        | libc::IN_MOVE_SELF;

    fn watch(dirs: &[&Path]) -> Changes {
        match Changes::instance(dirs) {
            Ok(events) => Changes { events: Some(events) },
            Err(e) => {
                tracing::debug!(error = %e, "idem: cannot watch the sled store's directories; every durable point lists them");
                Changes { events: None }
            }
        }
    }

    fn instance(dirs: &[&Path]) -> io::Result<File> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;

        // SAFETY: no pointers; the result is checked before use.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns; the `File` closes it.
        let events = unsafe { File::from_raw_fd(fd) };
        for dir in dirs {
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
            // SAFETY: `path` is a NUL-terminated string that outlives the call.
            let watch = unsafe {
                libc::inotify_add_watch(fd, path.as_ptr(), Changes::NAMES | libc::IN_ONLYDIR)
            };
            if watch < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(events)
    }

    /// Reads every event queued since the last look: whether there was any (an overflow of the
    /// queue is an event too), or whether it cannot be known.
    fn since_last_look(&mut self) -> bool {
        use std::io::Read;

        let Some(events) = &mut self.events else { return true };
        // Room for several events, each at most 16 bytes and a name of up to 255.
        let mut buffer = [0u8; 4096];
        let mut any = false;
        loop {
            match events.read(&mut buffer) {
                Ok(0) => return true,
                Ok(_) => any = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return any,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

/// Elsewhere nothing watches: every durable point lists the directories.
#[cfg(not(target_os = "linux"))]
struct Changes;

#[cfg(not(target_os = "linux"))]
impl Changes {
    fn watch(_: &[&Path]) -> Changes {
        Changes
    }

    fn since_last_look(&mut self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sled store's files, as sled leaves them at open, and `Files` opened on them.
    fn opened() -> (tempfile::TempDir, PathBuf, sled::Db, Files) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let db = sled::Config::new().path(&path).flush_every_ms(None).open().unwrap();
        db.insert("k", "v").unwrap();
        db.flush().unwrap();
        let files = Files::open(&path).unwrap();
        (dir, path, db, files)
    }

    #[test]
    fn a_durable_point_lists_nothing_while_no_name_changed() {
        let (_dir, _path, db, mut files) = opened();
        for i in 0..20u32 {
            db.insert(i.to_be_bytes(), "v").unwrap();
            db.flush().unwrap();
            files.sync().unwrap();
        }
        if cfg!(target_os = "linux") {
            assert_eq!(files.listings, 0, "the directories were listed with nothing new in them");
        }
    }

    #[test]
    fn a_name_made_after_open_is_synced_at_the_next_durable_point() {
        let (_dir, path, _db, mut files) = opened();
        files.sync().unwrap();
        // As sled writes a blob, then a snapshot: at once, within one tick of the clock.
        let blob = path.join("blobs").join("12345");
        std::fs::write(&blob, b"a blob").unwrap();
        std::fs::write(path.join("snap.0000000000000042"), b"a snapshot").unwrap();
        files.sync().unwrap();
        let [(_, store), (_, blobs)] = &files.synced;
        assert!(blobs.contains(&OsString::from("12345")), "the new blob was not synced");
        assert!(store.contains(&OsString::from("snap.0000000000000042")), "{store:?}");
        // Removed again: the next point sees that too, and then nothing more.
        std::fs::remove_file(&blob).unwrap();
        files.sync().unwrap();
        let listed = files.listings;
        files.sync().unwrap();
        let [_, (_, blobs)] = &files.synced;
        assert!(!blobs.contains(&OsString::from("12345")), "{blobs:?}");
        if cfg!(target_os = "linux") {
            assert_eq!(files.listings, listed, "listed again with nothing new");
        }
    }
}
