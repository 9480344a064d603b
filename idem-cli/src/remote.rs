//! Where the admin operations run: on a store this command opened, or, when another process
//! holds a sled store, in that process through its admin socket. Both give the same values and
//! errors, so every subcommand prints the same either way.

use idem_runtime::admin::{self, Filter, Listing, Purge, Resolution, Stats};
use idem_runtime::history::Entry;
#[cfg(unix)]
use idem_runtime::remote::Remote;
use idem_runtime::store::{now_ms, Assessment};
use idem_runtime::{Error, Key, Record, Status, Store};

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

    /// What a call would make of `record` now. The process that answers on the socket holds
    /// the store, so a record in flight there is its own, and running.
    pub(crate) fn assess(&self, record: &Record) -> Assessment {
        match self {
            Admin::Local(store) => {
                idem_runtime::store::assess(Some(record), store.clock(), store.instance())
            }
            #[cfg(unix)]
            Admin::Remote(_) => match record.status {
                Status::InFlight => Assessment::Running,
                _ => idem_runtime::store::assess(Some(record), now_ms(), ""),
            },
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
