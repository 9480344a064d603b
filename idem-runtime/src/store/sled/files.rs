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

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) struct Files {
    data: File,
    /// The entries of the store directory and of `blobs/` as of their last sync.
    synced: [(PathBuf, BTreeSet<OsString>); 2],
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
        let data = File::open(dir.join("db"))?;
        data.sync_all()?;
        File::open(dir.join("conf"))?.sync_all()?;
        let blobs = dir.join("blobs");
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
        Ok(Files { data, synced })
    }

    /// Makes what sled has flushed durable: new blob files, then changed directories, then the
    /// data file, so that nothing the log points to can be lost while the log survives.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
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
        self.data.sync_data()
    }
}
