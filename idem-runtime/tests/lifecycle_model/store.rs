//! The store of the model: one atomic operation per step, as the PostgreSQL store makes it. A
//! write is an insert if absent or a compare-and-swap that `admits` (the fence) lets through,
//! on the writer's reading of the clock and through its instance; a record is stored as the
//! transition made it (an in-flight one with the lease the transition stamped from the writer's
//! reading), and its running owner's heartbeat renews the lease at every tick. Where a write
//! lands, the ghost counters the properties read are kept.

use idem_runtime::{Record, Status};

use super::model::{result_of, Lifecycle};
use super::state::{Effect, Rec, Slot, State};

/// Who writes (`writer`: an owner, an operator, a person, a store instance), on which reading
/// of the store's clock, through which store instance: what the fence asks of a write.
#[derive(Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub(crate) writer: &'a str,
    pub(crate) now: u64,
    pub(crate) instance: &'a str,
}

impl Lifecycle {
    /// `insert_if_absent`: the token, or `Err` when a record is there.
    pub(crate) fn insert(&self, s: &mut State, k: usize, new: Record) -> Result<u64, ()> {
        if s.keys[k].record.is_some() {
            return Err(());
        }
        Ok(self.land(s, k, Some(new)))
    }

    /// `compare_and_swap`, fenced by `admits` on the writer's clock and instance: the token, or
    /// `None` when refused.
    pub(crate) fn swap(
        &self,
        s: &mut State,
        k: usize,
        expected: &Record,
        new: Option<Record>,
        by: Writer<'_>,
    ) -> Option<u64> {
        let Writer { writer, now, instance } = by;
        let stored = s.keys[k].record.clone()?;
        if !self.admits(expected, &stored.0, writer, now, instance) {
            return None;
        }
        // An owner's own write (a settling write) must find its own record as it left it.
        if expected.owner.as_str() == writer && stored.0.fence() != expected.fence() {
            s.broken.stale_write = true;
        }
        Some(self.land(s, k, new))
    }

    /// Makes the write, the record stored as given (its lease is the transition's): the next
    /// token, and the ghost record of results.
    pub(crate) fn land(&self, s: &mut State, k: usize, new: Option<Record>) -> u64 {
        s.seq += 1;
        let slot = &mut s.keys[k];
        if let Some(done) = new.as_ref().filter(|r| r.status == Status::Done) {
            slot.recorded.insert(done.result.clone().unwrap_or_default());
        }
        slot.record = new.map(Rec);
        s.seq
    }

    /// The system of record takes the effect of the run with `token`; one that deduplicates the
    /// key answers a repeat with the first answer, and no second effect.
    pub(crate) fn send_effect(&self, slot: &mut Slot, token: u64) -> Effect {
        if let (true, Some(first)) = (self.scenario.keyed_vendor, &slot.landed) {
            return Effect::Landed(first.clone());
        }
        slot.effects += 1;
        slot.landed = Some(result_of(token));
        Effect::Landed(result_of(token))
    }

    /// The store's clock advances 1 ms.
    pub(crate) fn tick(&self, s: &mut State) {
        s.now += 1;
        // Each running owner's heartbeat renews its lease, as the PostgreSQL store's renewal
        // does: only a lease that has not lapsed, on the owner's reading of the clock.
        for k in 0..s.keys.len() {
            let Some(Rec(record)) = &s.keys[k].record else { continue };
            if record.status != Status::InFlight {
                continue;
            }
            let owner = s.callers.iter().enumerate().find(|(i, c)| {
                c.alive() && !c.paused && self.instance(s, *i) == record.owner.instance()
            });
            if let Some((i, _)) = owner {
                let now = self.clock(s, i);
                if record.lease_until.is_some_and(|until| until > now) {
                    let renewed = now + self.scenario.bounds.lease;
                    if let Some(Rec(r)) = &mut s.keys[k].record {
                        r.lease_until = Some(renewed);
                    }
                }
            }
        }
    }
}
