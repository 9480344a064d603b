//! Who may read what a store creates on disk. A store holds every result and history it was
//! given, so each file and directory a store creates is its user's alone (files 0600,
//! directories 0700), or its group's too when the builder asks (0660, 0770). The mode is set on
//! the new file itself as it is created (never wider, so no other user can open it even for a
//! moment), then again exactly, whatever the umask took away: changing the umask instead would
//! change it for the whole process. A file or
//! directory that exists already is left as it is: its modes may be the user's choice.

use std::io;
use std::path::Path;

/// Who may read and write what a store creates: its user (the default) or its group too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Access {
    /// The user alone: files 0600, directories 0700.
    #[default]
    User,
    /// The user and the group: files 0660, directories 0770.
    Group,
}

impl Access {
    /// The access `group_access(group)` asks for (see `options.rs`).
    pub(crate) fn with_group(group: bool) -> Access {
        if group {
            Access::Group
        } else {
            Access::User
        }
    }

    fn dir_mode(self) -> u32 {
        match self {
            Access::User => 0o700,
            Access::Group => 0o770,
        }
    }

    /// Creates `dir` and those of its parents that are missing, each with this access; the
    /// ones that exist are left as they are.
    pub(crate) fn create_dirs(self, dir: &Path) -> io::Result<()> {
        let missing: Vec<&Path> = dir
            .ancestors()
            .filter(|at| !at.as_os_str().is_empty())
            .take_while(|at| std::fs::symlink_metadata(at).is_err())
            .collect();
        for at in missing.into_iter().rev() {
            let mut builder = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, self.dir_mode());
            match builder.create(at) {
                Ok(()) => self.set_mode(at, self.dir_mode())?,
                // Another process made it meanwhile: theirs, as it is.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(io::Error::new(io::ErrorKind::AlreadyExists, "a file, not a directory")),
            Err(e) => Err(e),
        }
    }

    /// Gives the file or directory at `path`, which this store has just made, `mode`.
    fn set_mode(self, path: &Path, mode: u32) -> io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        #[cfg(not(unix))]
        let _ = (path, mode);
        Ok(())
    }
}

/// What only the SQLite store makes: files of its own beside its directory (the database, the
/// owners' lock files) and the sockets that wake other processes.
#[cfg(feature = "sqlite")]
impl Access {
    /// The mode of a file this access gives (off Unix, files have no mode to give).
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn file_mode(self) -> u32 {
        match self {
            Access::User => 0o600,
            Access::Group => 0o660,
        }
    }

    /// Creates the file `path`, which must not exist, with this access.
    pub(crate) fn create_file(self, path: &Path) -> io::Result<std::fs::File> {
        let mut options = std::fs::File::options();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, self.file_mode());
        let file = options.open(path)?;
        self.give(&file)?;
        Ok(file)
    }

    /// Gives `file`, which this store made, this access's file mode.
    pub(crate) fn give(self, file: &std::fs::File) -> io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(self.file_mode()))?;
        }
        #[cfg(not(unix))]
        let _ = file;
        Ok(())
    }

    /// Gives the socket this store has just bound at `path` this access's file mode, so that
    /// the processes this access admits may send to it.
    #[cfg(unix)]
    pub(crate) fn give_socket(self, path: &Path) -> io::Result<()> {
        self.set_mode(path, self.file_mode())
    }
}
