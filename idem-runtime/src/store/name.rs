//! How a store is named, written once: `$IDEM_STORE`, the `idem` command's `--store` and
//! `idem::open_store` all read a name with [`StoreName::parse`], and give it the same meaning.
//!
//! - `sqlite:PATH`: the SQLite store in the file `PATH` (feature `sqlite`);
//! - `postgres://…` or `postgresql://…`: the PostgreSQL store at that URL (`idem-postgres`);
//! - anything else: the sled store in the directory of that path.
//!
//! A path that begins with `~` (alone or before `/`) is in the home directory, `$HOME`, as a
//! shell would read it: a name in an MCP host's configuration reaches the store through no
//! shell, and a directory named `~` made in the working directory is one that `rm -rf ~`
//! removes with the home. `~user/…` is refused, and so is `~` with no `$HOME`.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::error::{Error, StoreError};
use crate::store::Store;

/// A store, as a name gives it.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreName {
    /// A sled store: the directory it lives in.
    Sled(PathBuf),
    /// A SQLite store (`sqlite:PATH`): its file.
    Sqlite(PathBuf),
    /// A PostgreSQL store: the URL as written (`postgres://…`).
    Postgres(String),
}

/// What a name of a SQLite store begins with.
pub const SQLITE_PREFIX: &str = "sqlite:";

impl StoreName {
    /// Reads `name` as `$IDEM_STORE` and `--store` take it (see the module docs). An empty
    /// name, or `sqlite:` with no path, is an error that says what a name looks like; so is a
    /// path beginning with `~user`, or with `~` while `$HOME` is unset.
    pub fn parse(name: impl AsRef<OsStr>) -> Result<StoreName, Error> {
        parse_with_home(name.as_ref(), std::env::var_os("HOME").as_deref())
    }

    /// The file or directory of a sled or SQLite store; `None` for PostgreSQL.
    pub fn path(&self) -> Option<&Path> {
        match self {
            StoreName::Sled(path) | StoreName::Sqlite(path) => Some(path),
            StoreName::Postgres(_) => None,
        }
    }
}

impl fmt::Display for StoreName {
    /// The name as it was given, except a PostgreSQL URL's password, which is never shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreName::Sled(path) => write!(f, "{}", path.display()),
            StoreName::Sqlite(path) => write!(f, "{SQLITE_PREFIX}{}", path.display()),
            StoreName::Postgres(url) => f.write_str(&without_password(url)),
        }
    }
}

impl fmt::Debug for StoreName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreName({self})")
    }
}

/// `url` with the password of its user part, if any, written as `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

/// [`StoreName::parse`], with `home` for `$HOME`.
fn parse_with_home(name: &OsStr, home: Option<&OsStr>) -> Result<StoreName, Error> {
    let text = name.to_str();
    let bad = |what: &str| {
        let message = format!(
            "{what}: name a store as sqlite:PATH (a SQLite file), postgres://… (a PostgreSQL \
                 database) or a plain path (a sled directory)"
        );
        Error::store(None, None, StoreError::new(message).lasting())
    };
    if name.is_empty() {
        return Err(bad("the store's name is empty"));
    }
    let path = |path: &OsStr| in_home(path, home, name);
    match text {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(StoreName::Postgres(url.to_owned()))
        }
        Some(text) if text.starts_with(SQLITE_PREFIX) => match &text[SQLITE_PREFIX.len()..] {
            "" => Err(bad("`sqlite:` names no file")),
            file => Ok(StoreName::Sqlite(path(file.as_ref())?)),
        },
        _ => Ok(StoreName::Sled(path(name)?)),
    }
}

/// `path`, a store's path in the name `name`, with a leading `~` (alone or before `/`) read as
/// `home`. A `~` that names no home idem can read is an error naming `name`: `~user` (whose
/// home only the system's user database knows) and `~` with no `$HOME`.
pub(crate) fn in_home(path: &OsStr, home: Option<&OsStr>, name: &OsStr) -> Result<PathBuf, Error> {
    if path.as_encoded_bytes().first() != Some(&b'~') {
        return Ok(PathBuf::from(path));
    }
    let refuse = |why: &str| {
        let message = format!(
            "the store name {} begins with {why}: write the full path",
            name.to_string_lossy()
        );
        Err(Error::store(None, None, StoreError::new(message).lasting()))
    };
    // `~` is a whole first component: `~user/…` is another.
    let Ok(rest) = Path::new(path).strip_prefix("~") else {
        return refuse("`~user`, another user's home, which idem does not look up");
    };
    match home.filter(|home| !home.is_empty()) {
        Some(home) if rest.as_os_str().is_empty() => Ok(PathBuf::from(home)),
        Some(home) => Ok(Path::new(home).join(rest)),
        None => refuse("`~`, the home directory, and $HOME is not set"),
    }
}

#[doc(hidden)]
/// What opens a PostgreSQL store by its URL: registered by a crate that has one (the `idem`
/// facade with its `postgres` feature), since this crate cannot depend on `idem-postgres`.
pub type PostgresOpener = fn(&str) -> Result<Arc<dyn Store>, Error>;

static POSTGRES: RwLock<Option<PostgresOpener>> = RwLock::new(None);

/// How `postgres://` names are opened, once a crate that has a PostgreSQL store registered it.
pub(crate) fn postgres_opener() -> Option<PostgresOpener> {
    *POSTGRES.read().unwrap_or_else(|e| e.into_inner())
}

#[doc(hidden)]
/// Registers how `postgres://` names are opened. Not a public API: the facade calls it.
pub fn register_postgres(opener: PostgresOpener) {
    *POSTGRES.write().unwrap_or_else(|e| e.into_inner()) = Some(opener);
}

impl StoreName {
    /// Refuses a name whose path holds a store of another kind: a sled store is a directory,
    /// and a file there (a SQLite one is named `sqlite:PATH`) is an error that says so.
    pub fn check_kind(&self) -> Result<(), Error> {
        let StoreName::Sled(path) = self else { return Ok(()) };
        if !path.is_file() {
            return Ok(());
        }
        let sqlite = if is_sqlite_file(path) {
            format!(" (it is a SQLite file: name it {SQLITE_PREFIX}{})", path.display())
        } else {
            String::new()
        };
        let message =
            format!("{} is a file, and a sled store is a directory{sqlite}", path.display());
        Err(Error::store(None, None, StoreError::new(message).lasting()))
    }
}

/// Whether `path` is a file that begins as an SQLite database does, as SQLite reads it (never
/// through a descriptor of this crate's own: see `begins_as_database`). An empty file is none:
/// SQLite would read it as a new database, and the hint would send the user to adopt it.
#[cfg(feature = "sqlite")]
fn is_sqlite_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.len() > 0)
        && crate::store::sqlite::begins_as_database(path).unwrap_or(false)
}

/// Without the `sqlite` feature nothing here can tell, and nothing opens the file to guess.
#[cfg(not(feature = "sqlite"))]
fn is_sqlite_file(_path: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_means_one_store_kind() {
        let parse = |name: &str| StoreName::parse(name).unwrap();
        assert_eq!(
            parse("sqlite:/srv/agent.sqlite"),
            StoreName::Sqlite("/srv/agent.sqlite".into())
        );
        assert_eq!(parse("sqlite:rel/a.db"), StoreName::Sqlite("rel/a.db".into()));
        assert_eq!(parse("/srv/agent.sled"), StoreName::Sled("/srv/agent.sled".into()));
        assert_eq!(parse("idem.sled"), StoreName::Sled("idem.sled".into()));
        let url = "postgres://agent@db/agents?idem_table=a.b";
        assert_eq!(parse(url), StoreName::Postgres(url.into()));
        assert_eq!(parse("postgresql://db/x"), StoreName::Postgres("postgresql://db/x".into()));
        assert!(StoreName::parse("sqlite:").is_err());
        assert!(StoreName::parse("").is_err());
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn only_a_sqlite_database_is_named_one_in_the_hint() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, text, store) =
            (dir.path().join("empty"), dir.path().join("notes"), dir.path().join("idem.sqlite"));
        std::fs::write(&empty, "").unwrap();
        std::fs::write(&text, "not a database").unwrap();
        let builder = crate::store::sqlite::SqliteStore::builder(&store);
        drop(crate::store::sqlite::SqliteStore::open_storage(builder).unwrap());
        assert!(!is_sqlite_file(&empty) && !is_sqlite_file(&text));
        assert!(is_sqlite_file(&store));
        assert_eq!(std::fs::read_to_string(&text).unwrap(), "not a database", "left as it was");
    }

    #[test]
    fn a_leading_tilde_is_the_home_directory_and_no_other_is_read() {
        let home = Some(OsStr::new("/home/ann"));
        let parse = |name: &str| parse_with_home(name.as_ref(), home).unwrap();
        assert_eq!(parse("sqlite:~/a.sqlite"), StoreName::Sqlite("/home/ann/a.sqlite".into()));
        assert_eq!(parse("~/x/idem.sled"), StoreName::Sled("/home/ann/x/idem.sled".into()));
        assert_eq!(parse("~"), StoreName::Sled("/home/ann".into()));
        assert_eq!(parse("x/~/y"), StoreName::Sled("x/~/y".into()), "only a leading one");
        let refused = |name: &str, home| parse_with_home(OsStr::new(name), home).unwrap_err();
        let other = refused("sqlite:~bob/a.sqlite", home).to_string();
        assert!(other.contains("sqlite:~bob/a.sqlite") && other.contains("full path"), "{other}");
        let homeless = refused("~/idem.sled", None).to_string();
        assert!(homeless.contains("$HOME is not set"), "{homeless}");
        assert!(refused("~/idem.sled", Some(OsStr::new(""))).to_string().contains("$HOME"));
    }

    #[test]
    fn a_name_shows_no_password() {
        let name = StoreName::parse("postgres://ann:s3cret@db:5432/agents").unwrap();
        assert_eq!(name.to_string(), "postgres://ann:***@db:5432/agents");
        assert_eq!(StoreName::parse("sqlite:/a").unwrap().to_string(), "sqlite:/a");
    }
}
