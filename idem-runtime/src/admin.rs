//! What an operator does with records: list, show, resolve, purge, count. These are blocking
//! calls, for the `idem` command and for scripts.
//!
//! The functions below are the operations themselves, run on a store this process opened.
//! [`Admin`] is the same operations as one interface, whatever carries them: [`Local`] runs the
//! functions below, [`crate::remote::Remote`] asks the process that holds a sled store to run
//! them. A caller (the `idem` command) chooses one and is done.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::history::Entry;
use crate::lifecycle::retention::{self, RetentionStatus};
use crate::lifecycle::transition;
use crate::lifecycle::{assess, in_doubt, Assessment, Guard, Record, Status};
use crate::meter::{self, ApprovalEvent};
use crate::store::walk::Walk;
use crate::store::{Store, Stored};

/// Which records [`list`] returns.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Filter {
    /// Only records with this status.
    pub status: Option<Status>,
    /// Only records of this tool.
    pub tool: Option<String>,
}

impl Filter {
    /// Every record: narrow it with [`Filter::status`] and [`Filter::tool`].
    pub fn new() -> Filter {
        Filter::default()
    }

    /// This filter, keeping only records with `status`.
    #[must_use]
    pub fn status(mut self, status: Status) -> Filter {
        self.status = Some(status);
        self
    }

    /// This filter, keeping only records of the tool `tool`.
    #[must_use]
    pub fn tool(mut self, tool: impl Into<String>) -> Filter {
        self.tool = Some(tool.into());
        self
    }

    fn matches(&self, record: &Record) -> bool {
        self.status.is_none_or(|s| record.status == s)
            && self.tool.as_deref().is_none_or(|t| record.tool == t)
    }
}

pub use crate::lifecycle::owner::operator;
pub use crate::lifecycle::transition::Decision;
pub use crate::lifecycle::Resolution;

/// Which finished records [`purge`] removes.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Purge {
    /// Those whose `ttl` has passed. No history of a key without a record goes: an entry has
    /// no `ttl`.
    Expired,
    /// Those finished longer ago than this, and the histories of keys with no record (released
    /// keys) whose last entry is older than this.
    OlderThan(Duration),
}

/// What [`purge`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Finished records, each with its history.
    pub records: usize,
    /// Histories of keys that had no record (released keys).
    pub histories: usize,
}

impl Purged {
    /// `records` finished records and `histories` histories of keys without one.
    pub fn new(records: usize, histories: usize) -> Purged {
        Purged { records, histories }
    }
}

/// What [`scan`] found: the records that match, and every record that could not be read.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Listing {
    /// The records that match the filter, newest first.
    pub records: Vec<Record>,
    /// One error per record that could not be read, naming its key and what to do.
    pub unreadable: Vec<Error>,
}

/// Counts by status and tool, and the store's size on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Stats {
    /// Records per status name (`in-flight`, `done`, `in-doubt`).
    pub by_status: BTreeMap<String, u64>,
    /// Records per tool.
    pub by_tool: BTreeMap<String, u64>,
    /// Bytes on disk, when whoever opened the store can tell ([`Local::with_size`]).
    pub size_on_disk: Option<u64>,
    /// Records that could not be read (counted in neither map); `idem ls` names them.
    pub unreadable: u64,
    /// The retention the store runs in the background, and what it removed, when it runs one
    /// (seen from the process that answered: a holder through its socket, or this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionStatus>,
}

/// The admin operations, wherever they run. Each gives the same values and errors as the
/// function of the same name in this module, so that a caller prints the same either way.
///
/// Sealed: its implementations are [`Local`] and [`crate::remote::Remote`], so that an
/// operation can be added to it in any release.
///
/// ```
/// use idem_runtime::admin::{Admin, Filter, Local};
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let store = idem_runtime::MemoryStore::new();
/// let mut admin: Box<dyn Admin> = Box::new(Local::new(std::sync::Arc::new(store)));
/// assert!(admin.list(&Filter::default())?.is_empty());
/// # Ok(()) }
/// ```
pub trait Admin: sealed::Sealed {
    /// Records matching `filter`, newest first, and every record that could not be read, as
    /// [`scan`].
    fn scan(&mut self, filter: &Filter) -> Result<Listing, Error>;

    /// Records matching `filter`, newest first, as [`list`]: those that could not be read are
    /// left out and logged.
    fn list(&mut self, filter: &Filter) -> Result<Vec<Record>, Error> {
        Ok(without_unreadable(self.scan(filter)?))
    }

    /// The record under `key`, as [`show`].
    fn show(&mut self, key: &Key) -> Result<Record, Error>;

    /// The history of `key`, oldest first, as [`history`].
    fn history(&mut self, key: &Key) -> Result<Vec<Entry>, Error>;

    /// Settles an in-doubt record, as [`resolve`], with the same fence wherever it runs.
    fn resolve(
        &mut self,
        key: &Key,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
        force: bool,
    ) -> Result<Option<Record>, Error>;

    /// Approves or denies a key that awaits approval, as [`decide`], with the same fence
    /// wherever it runs.
    fn decide(
        &mut self,
        key: &Key,
        decision: Decision,
        by: &str,
        note: Option<&str>,
    ) -> Result<Record, Error>;

    /// Removes finished records with their histories, and old histories of released keys, as
    /// [`purge`].
    fn purge(&mut self, which: Purge, by: &str) -> Result<Purged, Error>;

    /// Counts records by status and tool, as [`stats`].
    fn stats(&mut self) -> Result<Stats, Error>;

    /// What a call would make of `record` now (`idem_runtime::store::assess`, on the
    /// store's clock, seen from the process that holds it), for telling an operator.
    fn assess(&self, record: &Record) -> Assessment;
}

/// Seals [`Admin`]: each transport implements `Sealed` beside its `Admin` impl.
pub(crate) mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Local {}
}

/// The admin operations on a store this process opened: the functions of this module.
#[derive(Clone)]
pub struct Local {
    store: Arc<dyn Store>,
    /// The retention passes this process runs on the store, which `stats` reports.
    retention: Option<RetentionReport>,
    /// The bytes the store takes on disk, which `stats` reports.
    size: Option<SizeReport>,
}

/// Reads the status of the retention passes this process runs on a store, for `idem stats`:
/// given by whoever runs them (`RetainerView::status`), since a store runs none.
pub type RetentionReport = Arc<dyn Fn() -> RetentionStatus + Send + Sync>;

/// Reads the bytes a store takes on disk, for `idem stats`: given by whoever opened it
/// (`SledStore::size_on_disk`, `SqliteStore::size_on_disk`, `PgStore::size_on_disk`), since
/// only the opener knows where the store keeps its bytes.
pub type SizeReport = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

impl Local {
    /// Runs the operations on `store`.
    pub fn new(store: Arc<dyn Store>) -> Local {
        Local { store, retention: None, size: None }
    }

    /// Runs the operations on `store`, on which this process runs the retention passes that
    /// `retention` reads: [`Admin::stats`] reports them.
    pub fn with_retention(store: Arc<dyn Store>, retention: Option<RetentionReport>) -> Local {
        Local { store, retention, size: None }
    }

    /// The same operations, with [`Admin::stats`] reporting the size `size` reads.
    pub fn with_size(mut self, size: SizeReport) -> Local {
        self.size = Some(size);
        self
    }
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").finish_non_exhaustive()
    }
}

impl Admin for Local {
    fn scan(&mut self, filter: &Filter) -> Result<Listing, Error> {
        scan(self.store.as_ref(), filter)
    }

    fn show(&mut self, key: &Key) -> Result<Record, Error> {
        show(self.store.as_ref(), key)
    }

    fn history(&mut self, key: &Key) -> Result<Vec<Entry>, Error> {
        history(self.store.as_ref(), key)
    }

    fn resolve(
        &mut self,
        key: &Key,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
        force: bool,
    ) -> Result<Option<Record>, Error> {
        resolve(self.store.as_ref(), key, resolution, by, note, force)
    }

    fn decide(
        &mut self,
        key: &Key,
        decision: Decision,
        by: &str,
        note: Option<&str>,
    ) -> Result<Record, Error> {
        decide(self.store.as_ref(), key, decision, by, note)
    }

    fn purge(&mut self, which: Purge, by: &str) -> Result<Purged, Error> {
        purge(self.store.as_ref(), which, by)
    }

    fn stats(&mut self) -> Result<Stats, Error> {
        let retention = self.retention.as_ref().map(|status| status());
        let size_on_disk = self.size.as_ref().and_then(|size| size());
        Ok(Stats { retention, size_on_disk, ..stats(self.store.as_ref())? })
    }

    fn assess(&self, record: &Record) -> Assessment {
        assess(Some(record), self.store.clock(), self.store.instance().id())
    }
}

fn store_error(key: Option<&str>, source: crate::error::StoreError) -> Error {
    Error::store(key, None, source)
}

/// Calls `each` with every key the store holds, a page at a time, each with its record as read
/// (or the error that names it: one bad record never fails a listing as a whole) or its
/// history's last time; no listing holds more of the store than a page besides what `each`
/// keeps.
fn each_key(
    store: &dyn Store,
    mut each: impl FnMut(&str, Stored) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut walk = Walk::default();
    while let Some(page) = block_on(walk.next(store)).map_err(|e| store_error(None, e))? {
        for (key, stored) in page {
            each(&key, stored)?;
        }
    }
    Ok(())
}

/// Calls `each` with every record the store holds, as [`each_key`] reads them.
fn each_record(
    store: &dyn Store,
    mut each: impl FnMut(Result<Record, Error>) -> Result<(), Error>,
) -> Result<(), Error> {
    each_key(store, |_, stored| match stored {
        Stored::Record(record) => each(record.map_err(|e| store_error(None, e))),
        Stored::History { .. } => Ok(()),
    })
}

/// `record` with the status a call would act on: a record in flight whose owner is gone (its
/// process died, its lease lapsed) is in doubt, as `show` and every call say, so that a listing
/// by status and the counts find the keys an operator must settle.
fn as_assessed(store: &dyn Store, mut record: Record) -> Record {
    if record.status == Status::InFlight && in_doubt(&record, store.clock(), store.instance().id())
    {
        record.status = Status::InDoubt;
    }
    record
}

/// Records matching `filter`, newest first, and every record that could not be read. A record
/// in flight whose owner is gone is listed in doubt, as a call assesses it.
pub fn scan(store: &dyn Store, filter: &Filter) -> Result<Listing, Error> {
    let mut listing = Listing::default();
    each_record(store, |record| {
        match record.map(|record| as_assessed(store, record)) {
            Ok(record) if filter.matches(&record) => listing.records.push(record),
            Ok(_) => {}
            Err(e) => listing.unreadable.push(e),
        }
        Ok(())
    })?;
    listing.records.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.key.cmp(&b.key)));
    Ok(listing)
}

/// Records matching `filter`, newest first. A record that cannot be read is left out and
/// logged; [`scan`] returns those too.
pub fn list(store: &dyn Store, filter: &Filter) -> Result<Vec<Record>, Error> {
    Ok(without_unreadable(scan(store, filter)?))
}

/// The records of `listing`; those that could not be read are logged.
fn without_unreadable(listing: Listing) -> Vec<Record> {
    for error in &listing.unreadable {
        tracing::warn!(error = %error, "idem: a record cannot be read; left out of the list");
    }
    listing.records
}

/// The record under `key`.
pub fn show(store: &dyn Store, key: &Key) -> Result<Record, Error> {
    block_on(store.get(key.as_str()))
        .map_err(|e| store_error(Some(key.as_str()), e))?
        .ok_or_else(|| Error::NotFound { key: key.to_string() })
}

/// The history of `key`, oldest first (see [`Store::history`]); empty when it has none.
pub fn history(store: &dyn Store, key: &Key) -> Result<Vec<Entry>, Error> {
    block_on(store.history(key.as_str())).map_err(|e| store_error(Some(key.as_str()), e))
}

/// Settles an in-doubt record (or an in-flight one whose owner is gone); anything else is
/// refused with [`Error::NotResolvable`]. Returns the record as it now stands (`None` when
/// released). The key's history records it as resolved `by` (an operator: `user@host`, see
/// [`operator`]) with `note`, each made to fit a history entry (one line, bounded).
///
/// A record still in flight whose owner's lease ran out, but whose owner is a process that
/// still runs on this host (stopped, or slow), is refused with [`Error::OwnerAlive`] unless
/// `force`: settling it could let the effect happen twice when the owner resumes.
pub fn resolve(
    store: &dyn Store,
    key: &Key,
    resolution: Resolution,
    by: &str,
    note: Option<&str>,
    force: bool,
) -> Result<Option<Record>, Error> {
    let current = show(store, key)?;
    if !in_doubt(&current, store.clock(), store.instance().id()) {
        return Err(Error::NotResolvable {
            key: key.to_string(),
            tool: current.tool,
            status: current.status,
        });
    }
    if let (Some(pid), false) =
        (transition::owner_may_resume(&current, &current.owner.liveness()), force)
    {
        return Err(Error::OwnerAlive { key: key.to_string(), tool: current.tool, pid });
    }
    let step = transition::resolve(&current, &resolution, by, note, store.clock());
    let guard = Guard::of(current.fence(), step.change.by(), store.instance().id());
    let swapped = block_on(store.compare_and_swap(&current, guard, step.new.as_ref(), step.change))
        .map_err(|e| store_error(Some(key.as_str()), e))?;
    if swapped.is_none() {
        return Err(Error::store(
            Some(key.as_str()),
            Some(&current.tool),
            crate::error::StoreError::new(
                "the record changed while it was being resolved; look at it again with `idem show`",
            ),
        ));
    }
    tracing::info!(key = %key, tool = %current.tool, "idem: resolved by an operator");
    Ok(step.new)
}

/// A person (`by`, their `user@host`, see [`operator`]) approves or denies a key that awaits
/// approval, with `note`; anything else is refused with [`Error::NotAwaitingApproval`] and
/// nothing changes. Returns the record as it now stands. The key's history records the decision,
/// who made it, when, and the note. Of two decisions racing, the fence lets one through; the
/// other finds the key decided. A call waiting for the decision wakes at once.
pub fn decide(
    store: &dyn Store,
    key: &Key,
    decision: Decision,
    by: &str,
    note: Option<&str>,
) -> Result<Record, Error> {
    let mut current = show(store, key)?;
    loop {
        if current.status != Status::AwaitingApproval {
            return Err(Error::NotAwaitingApproval {
                key: key.to_string(),
                tool: current.tool,
                status: current.status,
            });
        }
        let step = transition::decide(&current, decision, by, note, store.clock());
        let decided = step.new.expect("a decision leaves a record");
        let guard = Guard::of(current.fence(), step.change.by(), store.instance().id());
        let swapped =
            block_on(store.compare_and_swap(&current, guard, Some(&decided), step.change))
                .map_err(|e| store_error(Some(key.as_str()), e))?;
        if swapped.is_some() {
            crate::failpoint::failpoint("after_decision");
            let counted = match decision {
                Decision::Approve => ApprovalEvent::Approved,
                Decision::Deny => ApprovalEvent::Denied,
            };
            meter::approval(&decided.tool, counted);
            tracing::info!(key = %key, tool = %decided.tool, decision = decision.as_str(), by, "idem: decided by a person");
            return Ok(decided);
        }
        // Changed meanwhile (decided by someone else, or asked again): look again.
        current = show(store, key)?;
    }
}

/// Removes finished records as `which` says, with their histories: done ones, and denied ones
/// by age (a later call asks for approval anew); never an in-flight, in-doubt, awaiting or
/// approved one. With [`Purge::OlderThan`], also the histories of keys that have no record (a
/// release keeps its key's history) whose last entry is older than the bound. `by` is who purges
/// (an operator's `user@host`). Returns how many records and histories were removed.
pub fn purge(store: &dyn Store, which: Purge, by: &str) -> Result<Purged, Error> {
    let now = store.clock();
    let mut purged = Purged::default();
    each_key(store, |key, stored| {
        let step = transition::purge(by);
        let record = match stored {
            Stored::Record(Ok(record)) => record,
            // A record that cannot be read is not known to be finished: it is kept, and logged.
            Stored::Record(Err(error)) => {
                tracing::warn!(error = %error, "idem: a record cannot be read; not purged");
                return Ok(());
            }
            Stored::History { last_at } => {
                let Purge::OlderThan(age) = which else { return Ok(()) };
                if retention::history_outlived(last_at, age, now)
                    && block_on(store.append_history(key, step.change))
                        .map_err(|e| store_error(Some(key), e))?
                {
                    purged.histories += 1;
                }
                return Ok(());
            }
        };
        let remove = record.status.is_finished()
            && match which {
                Purge::Expired => record.is_expired(now),
                Purge::OlderThan(age) => retention::outlived(&record, age, now),
            };
        let guard = Guard::of(record.fence(), by, store.instance().id());
        if remove
            && block_on(store.compare_and_swap(&record, guard, None, step.change))
                .map_err(|e| store_error(Some(&record.key), e))?
                .is_some()
        {
            purged.records += 1;
        }
        Ok(())
    })?;
    Ok(purged)
}

/// Counts records by status (a record in flight whose owner is gone counts in doubt, as a call
/// assesses it) and by tool. The store runs no retention and knows no size on disk: whoever
/// runs the passes and opened the store reports them ([`Local::with_retention`],
/// [`Local::with_size`]).
pub fn stats(store: &dyn Store) -> Result<Stats, Error> {
    let mut stats = Stats::default();
    each_record(store, |record| {
        match record.map(|record| as_assessed(store, record)) {
            Ok(record) => {
                *stats.by_status.entry(record.status.to_string()).or_default() += 1;
                *stats.by_tool.entry(record.tool).or_default() += 1;
            }
            Err(_) => stats.unreadable += 1,
        }
        Ok(())
    })?;
    Ok(stats)
}
