//! The state machine of one call, every transition in this file:
//!
//! ```text
//! absent ──reserve──▶ in-flight ──complete──▶ done ──(ttl passes)──▶ taken over ──▶ in-flight
//!                        │  ▲
//!           release ◀────┤  └──take over (in_doubt = "rerun")── in-doubt
//!  (Err; dropped before  │
//!   the body: undone)    └──leave_in_doubt──▶ in-doubt
//!                           (Err after may_have_landed(), a panic, a future dropped while
//!                            the body ran, a result that cannot be stored)
//! ```
//!
//! [`Call::acquire`] is one `loop { match … }` over the [`assess`]ment of the record found.
//! A [`Reservation`] is what a call holds while it owns the key; it is settled by an explicit
//! call ([`Reservation::complete`], [`Reservation::release`],
//! [`Reservation::leave_in_doubt`]), and its `Drop` is only a safety net that calls the same
//! transitions without waiting. Outside the engine, two more transitions exist: a sled store
//! marks at open the in-flight records a dead process left in doubt, and an operator settles an
//! in-doubt record (`admin::resolve`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Call, Codec, InDoubtPolicy};
use crate::error::Error;
use crate::history::{Change, Event};
use crate::meter::{self, Outcome};
use crate::protocol::{assess, Assessment, Owner, Status};
use crate::record::{now_ms, Record};
use crate::store::{Reserved, Store};
use crate::time::deadline_after;

/// What [`Call::acquire`] ends with.
pub(super) enum Acquired<T> {
    /// The key's recorded result, for the caller to return.
    Replay(T),
    /// The key is this call's: run the body.
    Owned(Box<Reservation>),
}

/// The reservation a call holds while it owns the key: a first reservation and a takeover
/// alike, from the moment the write that makes it is sent.
pub(super) struct Reservation {
    store: Arc<dyn Store>,
    record: Record,
    /// The record this one replaced (a takeover's), put back if the call ends before its body
    /// starts; `None` for a first reservation, which is then deleted.
    before: Option<Record>,
    /// Whether the body has started: from then on the effect may have landed.
    started: bool,
    settled: bool,
}

impl Reservation {
    fn new(store: &Arc<dyn Store>, record: Record, before: Option<Record>) -> Reservation {
        Reservation { store: Arc::clone(store), record, before, started: false, settled: false }
    }

    /// From here on, the body runs: dropping the reservation leaves the key in doubt.
    pub(super) fn start(&mut self) {
        self.started = true;
    }

    /// The description of a change this call makes to its record, for the key's history.
    fn change(&self, event: Event) -> Change<'_> {
        Change::new(event, self.record.owner.as_str())
    }

    /// in-flight → done: records `json`, the body's result. Returns whether it was stored
    /// (`false`: the record changed hands while the body ran, and that write stands).
    async fn complete(&mut self, json: String, ttl: Option<Duration>) -> Result<bool, Error> {
        let done = self.record.done_json(json, now_ms(), ttl);
        let change = self.change(Event::Done);
        let stored = self.store.replace(&self.record, Some(&done), change).await.map_err(|e| {
            // Unsettled, the reservation leaves the key in doubt as it drops.
            Error::store(Some(&self.record.key), Some(&self.record.tool), e)
        })?;
        self.settled = true;
        Ok(stored)
    }

    /// in-flight → absent: nothing landed, so the next call runs the body.
    async fn release(&mut self) {
        // Nothing landed: should the release fail, the reservation tries the release once more
        // as it drops, rather than marking the key in doubt.
        self.started = false;
        meter::call(&self.record.tool, Outcome::Released, Duration::ZERO);
        match self.store.replace(&self.record, None, self.change(Event::Released)).await {
            Ok(_) => {
                self.settled = true;
                tracing::debug!(key = %self.record.key, tool = %self.record.tool, "idem: released after an error")
            }
            Err(e) => {
                tracing::error!(key = %self.record.key, tool = %self.record.tool, error = %e, "idem: cannot release the key after an error")
            }
        }
    }

    /// in-flight → in-doubt: the effect may have landed, and only an operator or the
    /// `in_doubt` policy may decide; `why` goes into the key's history.
    async fn leave_in_doubt(&mut self, why: &str) {
        let doubt = self.record.in_doubt(now_ms());
        let change = self.change(Event::InDoubt).note(why);
        match self.store.replace(&self.record, Some(&doubt), change).await {
            Ok(_) => {
                self.settled = true;
                meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
                tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body failed after its effect may have landed");
            }
            // Unsettled, the reservation tries once more as it drops.
            Err(e) => {
                tracing::error!(key = %self.record.key, tool = %self.record.tool, error = %e, "idem: cannot mark the key in doubt")
            }
        }
    }

    /// in-flight → as it was before this call, without waiting, for `Drop`: the body never
    /// started, so nothing landed. A first reservation is deleted; a takeover puts back the
    /// record it replaced (an in-doubt key stays in doubt, an expired result stays expired).
    fn undo_detached(&mut self) {
        self.settled = true;
        let change = Change::new(Event::Undone, self.record.owner.as_str())
            .note("the call ended before its body started");
        self.store.replace_detached(&self.record, self.before.take(), change);
    }

    /// [`Reservation::leave_in_doubt`] without waiting, for `Drop`.
    fn leave_in_doubt_detached(&mut self) {
        self.settled = true;
        meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
        tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body panicked or its future was dropped");
        let change = self
            .change(Event::InDoubt)
            .note("the body panicked, its future was dropped, or its result could not be stored");
        self.store.replace_detached(&self.record, Some(self.record.in_doubt(now_ms())), change);
    }
}

impl Drop for Reservation {
    /// The safety net of a call that ended without settling: a panic, a dropped future, or a
    /// settling write that failed.
    fn drop(&mut self) {
        if !self.settled {
            if self.started {
                self.leave_in_doubt_detached();
            } else {
                self.undo_detached();
            }
        }
    }
}

impl Call {
    /// A record for this call, owned by a new call of `store`.
    fn fresh_record(&self, store: &dyn Store) -> Record {
        let mut record = Record::reserve(
            self.key.as_str(),
            &self.tool,
            &self.scope,
            Owner::new_call(store.owner_id()),
            now_ms(),
        );
        record.function.clone_from(&self.function);
        record
    }

    /// Refuses a record another function wrote: the two share a tool name, and so its keys.
    /// Records that name no function (written by `Call` without one, or by another language's
    /// client) are taken as this call's.
    fn check_function(&self, found: &Record) -> Result<(), Error> {
        match (&found.function, &self.function) {
            (Some(recorded), Some(calling)) if recorded != calling => Err(Error::SharedToolName {
                key: self.key.to_string(),
                tool: self.tool.clone(),
                recorded: recorded.clone(),
                calling: calling.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn replay<T, E>(&self, record: &Record, codec: Codec<T, E>) -> Result<T, Error> {
        // A unit result of the first (JSON) sled format reads back as no result: `null`.
        let json = record.result.as_deref().unwrap_or("null");
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: replay");
        (codec.decode)(json).map_err(|source| Error::Replay {
            key: self.key.to_string(),
            tool: self.tool.clone(),
            source,
        })
    }

    /// Reserves the key, or finds its result, or waits for its owner; `waited_since` is set
    /// when a wait for another owner begins.
    pub(super) async fn acquire<T, E>(
        &self,
        codec: Codec<T, E>,
        store: &Arc<dyn Store>,
        waited_since: &mut Option<Instant>,
    ) -> Result<Acquired<T>, Error> {
        let key = self.key.as_str();
        let failed = |e| self.store_error(e);
        // Taken when the first wait begins: a replay never needs the clock for it.
        let mut deadline = None;
        let mut found = store.peek(key).await.map_err(failed)?;
        loop {
            if let Some(found) = &found {
                self.check_function(found)?;
            }
            let takeover = match assess(found.as_ref(), now_ms(), |r| store.owner_alive(r)) {
                Assessment::Absent => {
                    let fresh = self.fresh_record(store.as_ref());
                    let mut pending = Reservation::new(store, fresh, None);
                    let change = Change::new(Event::Reserved, pending.record.owner.as_str());
                    match store.reserve(&pending.record, change).await {
                        Ok(Reserved::Mine) => {
                            tracing::debug!(key = %self.key, tool = %self.tool, "idem: reserved");
                            return Ok(Acquired::Owned(Box::new(pending)));
                        }
                        Ok(Reserved::Taken(existing)) => {
                            pending.settled = true;
                            found = Some(existing);
                            continue;
                        }
                        // The insert may or may not have happened: the reservation undoes it if
                        // it did.
                        Err(e) => return Err(failed(e)),
                    }
                }
                Assessment::Replay => {
                    let existing = found.as_ref().expect("assessed a found record");
                    return self.replay(existing, codec).map(Acquired::Replay);
                }
                Assessment::Expired => self.fresh_record(store.as_ref()),
                Assessment::Running => {
                    let existing = found.take().expect("assessed a found record");
                    tracing::debug!(key = %self.key, tool = %self.tool, "idem: waiting for the owner");
                    let deadline = *deadline.get_or_insert_with(|| {
                        let now = *waited_since.insert(Instant::now());
                        deadline_after(now, self.wait.unwrap_or_else(|| store.default_wait()))
                    });
                    found = store.changed(key, &existing, deadline).await.map_err(failed)?;
                    let unchanged =
                        found.as_ref().is_some_and(|now| now.fence() == existing.fence());
                    if unchanged && Instant::now() >= deadline {
                        return Err(Error::InFlight {
                            key: self.key.to_string(),
                            tool: self.tool.clone(),
                            since_ms: existing.created_at,
                        });
                    }
                    continue;
                }
                Assessment::InDoubt => {
                    let existing = found.as_ref().expect("assessed a found record");
                    match self.in_doubt {
                        InDoubtPolicy::Fail => {
                            tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: not running");
                            return Err(Error::InDoubt {
                                key: self.key.to_string(),
                                tool: self.tool.clone(),
                                since_ms: existing.updated_at,
                            });
                        }
                        InDoubtPolicy::Rerun => {
                            let mut takeover =
                                existing.taken_over(Owner::new_call(store.owner_id()), now_ms());
                            if self.function.is_some() {
                                takeover.function.clone_from(&self.function);
                            }
                            takeover
                        }
                    }
                }
            };
            // Expired or in doubt: take the record over, if it is still as it was found. Guarded
            // like a first reservation from before the write is sent, so that a call dropped
            // while it waits for the write undoes it instead of leaving the key in flight.
            let existing = found.take().expect("assessed a found record");
            let mut pending = Reservation::new(store, takeover, Some(existing));
            let before = pending.before.as_ref().expect("a takeover replaces a record");
            let why = match before.status {
                Status::Done => "its result expired",
                _ => "in doubt, and the call reruns it (in_doubt = \"rerun\")",
            };
            let change = Change::new(Event::TookOver, pending.record.owner.as_str()).note(why);
            match store.replace(before, Some(&pending.record), change).await {
                Ok(true) => {
                    meter::takeover(&self.tool);
                    tracing::info!(key = %self.key, tool = %self.tool, attempts = pending.record.attempts, "idem: took over");
                    return Ok(Acquired::Owned(Box::new(pending)));
                }
                Ok(false) => pending.settled = true,
                // The write may or may not have happened: the reservation undoes it if it did.
                Err(e) => return Err(failed(e)),
            }
            found = store.get(key).await.map_err(failed)?;
        }
    }

    /// Records `value` as the call's result. The effect has landed by now, so a failure leaves
    /// the record in doubt. Only a result that reads back into `T` is recorded: what is recorded
    /// `Done` must replay, and JSON cannot carry some values (NaN is written as `null`, and a
    /// value nested past serde_json's 128 levels does not read back).
    pub(super) async fn complete<T, E>(
        &self,
        codec: Codec<T, E>,
        mut owned: Box<Reservation>,
        value: &T,
    ) -> Result<(), Error> {
        let json = (codec.encode)(value).map_err(|e| e.to_string()).and_then(|json| match (codec
            .decode)(
            &json
        ) {
            Ok(_) => Ok(json),
            Err(e) => Err(format!(
                "it would not replay: its JSON does not read back into the return type \
                     ({e}); JSON has no NaN or infinity and reads at most 128 levels deep, so \
                     return a type that fits"
            )),
        });
        let json = match json {
            Ok(json) => json,
            Err(reason) => {
                owned.leave_in_doubt("its result could not be stored").await;
                return Err(Error::Result {
                    key: self.key.to_string(),
                    tool: self.tool.clone(),
                    reason,
                });
            }
        };
        if owned.complete(json, self.ttl).await? {
            tracing::debug!(key = %self.key, tool = %self.tool, "idem: done");
        } else {
            // Someone settled or took the record over while the body ran (an operator, or a
            // fleet peer after our lease lapsed): their write stands, ours is refused.
            tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the body ran; its result was not stored");
        }
        Ok(())
    }

    /// Settles the record after the body returned `Err`: released, unless the body said its
    /// effect may have landed, in which case it is left in doubt.
    pub(super) async fn after_error(&self, mut owned: Box<Reservation>, may_have_landed: bool) {
        if may_have_landed {
            owned.leave_in_doubt("the body failed after it said its effect may have landed").await
        } else {
            owned.release().await
        }
    }
}
