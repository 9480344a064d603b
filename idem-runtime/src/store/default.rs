//! Where the process default store lives when no one says, and its name. Installing and
//! opening it is the engine's (`engine/open/default.rs`), which starts what runs beside it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::store::name::{in_home, StoreName};

/// The store directory's name, under the data directory or in the working directory.
const STORE_DIR: &str = "idem.sled";

/// Where the default store lives when none is installed:
///
/// 1. `$IDEM_STORE`;
/// 2. else `./idem.sled` if a store is already there (where idem put it before it used the
///    data directory: its records, some perhaps in doubt, stay in use);
/// 3. else the user's data directory: `$XDG_DATA_HOME/idem/idem.sled`, else
///    `~/.local/share/idem/idem.sled` (`%LOCALAPPDATA%\idem\idem.sled` on Windows);
/// 4. else, with no home directory known, `./idem.sled`.
///
/// So a server that an MCP host starts in a directory the user did not choose finds the same
/// store on every start, and so does the `idem` command run from anywhere.
pub fn default_store_path() -> PathBuf {
    let here_has_a_store = Path::new(STORE_DIR).join("conf").exists();
    store_path(|name| std::env::var_os(name), here_has_a_store)
}

/// The default store, named: `$IDEM_STORE` read as [`StoreName::parse`] reads any name
/// (`sqlite:PATH`, `postgres://…`, or a sled directory), else the sled store at
/// [`default_store_path`].
pub fn default_store_name() -> Result<StoreName, Error> {
    match std::env::var_os("IDEM_STORE").filter(|name| !name.is_empty()) {
        Some(name) => StoreName::parse(name),
        None => Ok(StoreName::Sled(default_store_path())),
    }
}

/// [`default_store_path`] over the environment `env` and whether `./idem.sled` holds a store.
fn store_path(env: impl Fn(&str) -> Option<OsString>, here_has_a_store: bool) -> PathBuf {
    if let Some(path) = env("IDEM_STORE").filter(|path| !path.is_empty()) {
        // A `~` is the home, as in every store name; one that names none is left as written,
        // for the open to refuse with its reason.
        let home = env("HOME");
        return in_home(&path, home.as_deref(), &path).unwrap_or_else(|_| PathBuf::from(path));
    }
    if here_has_a_store {
        return PathBuf::from(STORE_DIR);
    }
    // Relative values are ignored, as the XDG base directory specification asks.
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|path| path.is_absolute());
    let data_dir = if cfg!(windows) {
        absolute("LOCALAPPDATA")
    } else {
        absolute("XDG_DATA_HOME").or_else(|| absolute("HOME").map(|home| home.join(".local/share")))
    };
    match data_dir {
        Some(dir) => dir.join("idem").join(STORE_DIR),
        None => PathBuf::from(STORE_DIR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, value)| value.into())
    }

    #[test]
    #[cfg(not(windows))]
    fn the_default_store_is_in_the_data_directory_unless_told_or_already_here() {
        let home = [("HOME", "/home/ann")];
        assert_eq!(
            store_path(env(&home), false),
            Path::new("/home/ann/.local/share/idem/idem.sled")
        );
        let xdg = [("HOME", "/home/ann"), ("XDG_DATA_HOME", "/data")];
        assert_eq!(store_path(env(&xdg), false), Path::new("/data/idem/idem.sled"));
        let relative = [("HOME", "/home/ann"), ("XDG_DATA_HOME", "data")];
        assert_eq!(
            store_path(env(&relative), false),
            Path::new("/home/ann/.local/share/idem/idem.sled"),
            "a relative XDG_DATA_HOME is ignored"
        );
        assert_eq!(store_path(env(&home), true), Path::new("idem.sled"), "an existing store");
        let told = [("HOME", "/home/ann"), ("IDEM_STORE", "/srv/agent.sled")];
        assert_eq!(store_path(env(&told), true), Path::new("/srv/agent.sled"));
        let tilde = [("HOME", "/home/ann"), ("IDEM_STORE", "~/agent.sled")];
        assert_eq!(store_path(env(&tilde), false), Path::new("/home/ann/agent.sled"));
        assert_eq!(store_path(env(&[]), false), Path::new("idem.sled"), "no home known");
    }
}
