//! The sweep: asking the reconcilers of a few tools about every key of theirs in doubt, as an
//! agent does at start-up, through the same transitions a call makes.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::Codec;
use super::machine::encode_for_replay;
use super::reconciler::{ask, erred, Reconciled};
use super::reservation::{Reservation, Taken};
use crate::error::Error;
use crate::error::StoreError;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::history::Answer;
use crate::lifecycle::{in_doubt, Record};
use crate::store::walk::Walk;
use crate::store::{Store, Stored};

/// The reconciler of one tool in a [`Sweep`], its answer's result already JSON that reads back.
type Ask<'a> = Box<
    dyn FnMut(Key) -> Pin<Box<dyn Future<Output = Result<Reconciled<String>, String>> + Send + 'a>>
        + Send
        + 'a,
>;

/// Asks the reconcilers of a few tools about every key of theirs in doubt, as an agent does at
/// start-up, and reports what it settled.
///
/// A sweep has only the records, not the calls' arguments: that is why a reconciler takes just
/// the key (and, for a method, the receiver that holds the vendor's client). Each key in doubt
/// (or in flight under a dead owner) of a listed tool is taken over as a call would take it,
/// asked about, and settled: **landed** is recorded `Done` (with no `ttl`: kept until purged),
/// **not landed** is released (the next call runs the body), and **cannot tell**, an error or
/// a panic leaves it in doubt. A key that a call is settling meanwhile is left to it.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// # let store: std::sync::Arc<dyn idem_runtime::Store> =
/// #     std::sync::Arc::new(idem_runtime::MemoryStore::new());
/// use idem_runtime::{Key, Reconciled, Sweep};
///
/// fn find_charge(_key: &Key) -> Result<Reconciled<String>, String> {
///     Ok(Reconciled::NotLanded)
/// }
///
/// let report = Sweep::new().store(store).tool("charge_card", find_charge).run()?;
/// assert!(report.still_in_doubt().next().is_none());
/// # Ok(()) }
/// ```
pub struct Sweep<'a> {
    store: Option<Arc<dyn Store>>,
    tools: Vec<(String, Ask<'a>)>,
}

impl std::fmt::Debug for Sweep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tools: Vec<&str> = self.tools.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Sweep").field("tools", &tools).finish_non_exhaustive()
    }
}

impl Default for Sweep<'_> {
    fn default() -> Self {
        Sweep::new()
    }
}

impl<'a> Sweep<'a> {
    /// A sweep of no tools yet, over the process default store.
    pub fn new() -> Sweep<'a> {
        Sweep { store: None, tools: Vec::new() }
    }

    /// The store to sweep instead of the process default.
    pub fn store(mut self, store: Arc<dyn Store>) -> Sweep<'a> {
        self.store = Some(store);
        self
    }

    /// Asks `reconcile`, a sync reconciler, about the keys in doubt of the tool named `tool`
    /// (the name in its keys: the function's, or the one pinned with `tool = "…"`).
    pub fn tool<T, R, F>(mut self, tool: &str, mut reconcile: F) -> Sweep<'a>
    where
        F: FnMut(&Key) -> Result<Reconciled<T>, R> + Send + 'a,
        T: Serialize + DeserializeOwned,
        R: Display,
    {
        let ask: Ask<'a> = Box::new(move |key: Key| {
            let answer = recorded(reconcile(&key).map_err(erred));
            Box::pin(std::future::ready(answer))
        });
        self.tools.push((tool.to_owned(), ask));
        self
    }

    /// Asks `reconcile`, an async reconciler, about the keys in doubt of the tool named `tool`.
    /// It takes the key by value, so that its future may keep it:
    /// `|key| async move { find_charge(&key).await }`.
    pub fn tool_async<T, R, F, Fut>(mut self, tool: &str, mut reconcile: F) -> Sweep<'a>
    where
        F: FnMut(Key) -> Fut + Send + 'a,
        Fut: Future<Output = Result<Reconciled<T>, R>> + Send + 'a,
        T: Serialize + DeserializeOwned,
        R: Display,
    {
        let ask: Ask<'a> = Box::new(move |key: Key| {
            let answer = reconcile(key);
            Box::pin(async move { recorded(answer.await.map_err(erred)) })
        });
        self.tools.push((tool.to_owned(), ask));
        self
    }

    /// Runs the sweep, blocking; needs no async runtime (do not call it from async code: use
    /// [`Sweep::run_async`]).
    pub fn run(self) -> Result<SweepReport, Error> {
        block_on(self.run_async())
    }

    /// Runs the sweep. Fails only when the store cannot be listed; a key the sweep cannot
    /// settle is reported in doubt, with the reason.
    pub async fn run_async(mut self) -> Result<SweepReport, Error> {
        let store = match self.store.take() {
            Some(store) => store,
            None => super::open::default::default_store()?,
        };
        let mut report = SweepReport::default();
        let mut walk = Walk::default();
        while let Some(page) =
            walk.next(store.as_ref()).await.map_err(|e| Error::store(None, None, e))?
        {
            for (_, stored) in page {
                if let Stored::Record(record) = stored {
                    self.sweep_record(&store, record, &mut report).await;
                }
            }
        }
        Ok(report)
    }

    /// Settles `record` if it is in doubt and its tool has a reconciler, into `report`.
    async fn sweep_record(
        &mut self,
        store: &Arc<dyn Store>,
        record: Result<Record, StoreError>,
        report: &mut SweepReport,
    ) {
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(error = %e, "idem: sweep: a record cannot be read; skipped");
                return;
            }
        };
        let Some((_, reconcile)) = self.tools.iter_mut().find(|(tool, _)| *tool == record.tool)
        else {
            return;
        };
        if Key::parse(&record.key).is_err() {
            // Another writer of a shared store can leave such a row: it is no call's.
            tracing::warn!(key = %record.key, tool = %record.tool, "idem: sweep: a record's key is not an idem key; skipped");
            return;
        }
        if !in_doubt(&record, store.clock(), store.instance().id()) {
            return;
        }
        let outcome = sweep_one(store, &record, reconcile).await;
        report.keys.push(Swept {
            key: record.key,
            tool: record.tool,
            scope: record.scope,
            function: record.function,
            outcome,
        });
    }
}

/// A landed result as the JSON a `Done` record keeps, only if it reads back into `T`.
fn recorded<T: Serialize + DeserializeOwned>(
    answer: Result<Reconciled<T>, String>,
) -> Result<Reconciled<String>, String> {
    match answer? {
        Reconciled::Landed(value) => encode_for_replay(Codec::<T, Error>::serde(), &value)
            .map(Reconciled::Landed)
            .map_err(|reason| format!("its answer cannot be recorded: {reason}")),
        Reconciled::NotLanded => Ok(Reconciled::NotLanded),
        Reconciled::CannotTell => Ok(Reconciled::CannotTell),
    }
}

/// Takes one record in doubt over, asks about it and settles it, through the same transitions
/// a call makes.
async fn sweep_one(
    store: &Arc<dyn Store>,
    record: &Record,
    reconcile: &mut Ask<'_>,
) -> SweepOutcome {
    let in_doubt = |reason: String| SweepOutcome::InDoubt { reason };
    let store_failed = |e| in_doubt(format!("the store failed: {e}"));
    // Another writer of a shared store may have left a key that is not one: it is skipped, as
    // every unreadable record is, rather than asked about.
    let Ok(key) = Key::parse(&record.key) else {
        tracing::warn!(key = %record.key, tool = %record.tool, "idem: sweep: the record's key is not an idem key; skipped");
        return in_doubt(format!(
            "its key {:?} is not an idem key, so it was not asked about",
            record.key
        ));
    };
    let pending = match Reservation::take_to_reconcile(store, record.clone(), None).await {
        Ok(Taken::Mine(pending)) => pending,
        Ok(Taken::Moved(_)) => return SweepOutcome::Moved,
        Err(e) => return store_failed(e),
    };
    let (answer, reason) = match ask(reconcile, key).await {
        Ok(Reconciled::Landed(json)) => {
            return match pending.settle_reconciled(Ok(Some(json)), None).await {
                Ok((true, _)) => SweepOutcome::Landed,
                Ok((false, _)) => SweepOutcome::Moved,
                Err(e) => store_failed(e),
            }
        }
        Ok(Reconciled::NotLanded) => {
            return match pending.settle_reconciled(Ok(None), None).await {
                Ok((true, _)) => SweepOutcome::NotLanded,
                Ok((false, _)) => SweepOutcome::Moved,
                Err(e) => store_failed(e),
            }
        }
        Ok(Reconciled::CannotTell) => (Answer::CannotTell, "it could not tell".to_owned()),
        Err(reason) => (Answer::Erred, reason),
    };
    match pending.settle_reconciled(Err((answer, &reason)), None).await {
        Ok(_) => in_doubt(reason),
        Err(e) => store_failed(e),
    }
}

/// What a [`Sweep`] did, key by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Every key in doubt of a listed tool that the sweep found, with what became of it.
    pub keys: Vec<Swept>,
}

impl SweepReport {
    /// The keys the sweep settled: landed (recorded `Done`) or not landed (released).
    pub fn settled(&self) -> impl Iterator<Item = &Swept> {
        self.keys
            .iter()
            .filter(|swept| matches!(swept.outcome, SweepOutcome::Landed | SweepOutcome::NotLanded))
    }

    /// The keys still in doubt, each with the reason.
    pub fn still_in_doubt(&self) -> impl Iterator<Item = &Swept> {
        self.keys.iter().filter(|swept| matches!(swept.outcome, SweepOutcome::InDoubt { .. }))
    }
}

/// One key a [`Sweep`] found in doubt: the record's identity (no arguments: records keep none)
/// and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Swept {
    /// The key.
    pub key: String,
    /// Its tool.
    pub tool: String,
    /// Its scope.
    pub scope: String,
    /// The function that wrote it, when its record names one.
    pub function: Option<String>,
    /// What the sweep did with it.
    pub outcome: SweepOutcome,
}

/// What a [`Sweep`] did with one key in doubt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SweepOutcome {
    /// The effect landed: the key is recorded `Done` with the reconciler's result.
    Landed,
    /// The effect did not land: the key is released.
    NotLanded,
    /// The key is still in doubt: the reconciler could not tell, failed or panicked, or the
    /// store failed (`reason` says which).
    InDoubt {
        /// Why.
        reason: String,
    },
    /// A call took the key over or settled it before the sweep could: left to it.
    Moved,
}
