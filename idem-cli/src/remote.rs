//! Where the admin operations run: on a store this command opened, or, when another process
//! holds a sled store, in that process through its admin socket. Both give the same values and
//! errors, so every subcommand prints the same either way.

use idem_runtime::admin::{self, Filter, Listing, Purge, Resolution, Stats};
use idem_runtime::history::Entry;
#[cfg(unix)]
use idem_runtime::remote::Remote;
use idem_runtime::{Error, Key, Record, Store};

pub(crate) enum Admin {
    /// A store this command opened itself.
    Local(Box<dyn Store>),
    /// The process holding a sled store answers for it.
    #[cfg(unix)]
    Remote(Remote),
}

impl Admin {
    /// Records matching `filter` and those that could not be read, either way.
    pub(crate) fn scan(&mut self, filter: &Filter) -> Result<Listing, Error> {
        match self {
            Admin::Local(store) => admin::scan(store.as_ref(), filter),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.scan(filter),
        }
    }

    /// Whether the owner of an in-flight record still runs it. The process that answers on
    /// the socket holds the store, so a record in flight there is its own, and alive.
    pub(crate) fn owner_alive(&self, record: &Record) -> bool {
        match self {
            Admin::Local(store) => store.owner_alive(record),
            #[cfg(unix)]
            Admin::Remote(_) => true,
        }
    }

    pub(crate) fn show(&mut self, key: &Key) -> Result<Record, Error> {
        match self {
            Admin::Local(store) => admin::show(store.as_ref(), key),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.show(key),
        }
    }

    pub(crate) fn history(&mut self, key: &Key) -> Result<Vec<Entry>, Error> {
        match self {
            Admin::Local(store) => admin::history(store.as_ref(), key),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.history(key),
        }
    }

    pub(crate) fn resolve(
        &mut self,
        key: &Key,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<Option<Record>, Error> {
        match self {
            Admin::Local(store) => admin::resolve(store.as_ref(), key, resolution, by, note),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.resolve(key, resolution, by, note),
        }
    }

    pub(crate) fn purge(&mut self, which: Purge, by: &str) -> Result<usize, Error> {
        match self {
            Admin::Local(store) => admin::purge(store.as_ref(), which, by),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.purge(which, by),
        }
    }

    pub(crate) fn stats(&mut self) -> Result<Stats, Error> {
        match self {
            Admin::Local(store) => admin::stats(store.as_ref()),
            #[cfg(unix)]
            Admin::Remote(remote) => remote.stats(),
        }
    }
}
