//! The operations on the records table, as the store's tasks run them.
//!
//! Each rides out a broken connection by trying again on a fresh one within its deadline. A read
//! or a lease renewal can always be repeated. A write is repeated only because the fence makes it
//! safe: it names the state it replaces, and every owner string is unique to one call, so a
//! repeat whose first attempt did land finds the record in exactly the state it wrote, and is
//! reported as landed.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use idem_runtime::deadline_after;
use idem_runtime::history::Entry;
use idem_runtime::store::lease::{self, Held, Lease};
use idem_runtime::store::{now_ms, Guard, Inserted, Instance, Notifier, StoreError};
use idem_runtime::{Record, Status};

use crate::fault::{retrying, Fault, Retry};
use crate::listen::{Listener, UNHEARD_RECHECK};
use crate::rows::{self, ChangeValues};
use crate::runtime::Writes;
use crate::schema::{guard_param, Names, Statements};
use crate::sql::{Conn, Param, Sql, Typed};

/// What the store's tasks share with it.
pub(crate) struct Table {
    pub(crate) pool: Pool,
    pub(crate) statements: Statements,
    pub(crate) names: Names,
    /// Who the store is, with the terms of its leases ([`Store::instance`]): the engine stamps
    /// and renews the leases on them.
    ///
    /// [`Store::instance`]: idem_runtime::Store::instance
    pub(crate) instance: Instance,
    /// The instance's lease terms, at hand.
    pub(crate) terms: Lease,
    /// `terms.length`, which every write and every statement's deadline reads.
    pub(crate) lease: Duration,
    /// The database clock minus this machine's, in milliseconds.
    pub(crate) clock_offset: AtomicI64,
    pub(crate) listener: Arc<Listener>,
    pub(crate) writes: Arc<Writes>,
}

impl Table {
    /// How long one statement keeps trying through connection faults when its caller set no
    /// deadline: a lease, past which the leases this store holds have lapsed anyway.
    pub(crate) fn deadline(&self) -> Instant {
        deadline_after(Instant::now(), self.lease)
    }

    /// The one value of `statement`'s one row.
    pub(crate) async fn query_value<T: for<'r> tokio_postgres::types::FromSql<'r>>(
        &self,
        statement: &Sql,
        params: &[Param<'_>],
    ) -> Result<T, Fault> {
        let client = self.connection().await?;
        Ok(statement.query_one(&client, params).await?.try_get(0)?)
    }

    /// A connection from the pool; its statements are named only while the listening
    /// connection, on the pool's own URL, shows that the URL gives sessions of their own.
    pub(crate) async fn connection(&self) -> Result<Conn, Fault> {
        let client = self.pool.get().await?;
        Ok(Conn::new(client, self.listener.sessions()))
    }

    /// The database's clock now, as this machine reckons it: the clock leases are read on.
    pub(crate) fn db_now(&self) -> u64 {
        u64::try_from(now_ms() as i64 + self.clock_offset.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// [`Table::db_now`] as a statement's parameter.
    fn db_now_param(&self) -> i64 {
        i64::try_from(self.db_now()).unwrap_or(i64::MAX)
    }

    pub(crate) async fn get(
        &self,
        key: &str,
        deadline: Instant,
    ) -> Result<Option<Record>, StoreError> {
        retrying!(
            deadline,
            format!("cannot read key {key}"),
            self.try_read(&self.statements.get, key)
        )
    }

    /// Key `key`'s record, read by `statement` (`get`, or `watch`, which also marks it as
    /// waited for).
    async fn try_read(&self, statement: &Sql, key: &str) -> Result<Option<Record>, Fault> {
        let client = self.connection().await?;
        let row = statement.query_opt(&client, &[&key]).await?;
        row.as_ref().map(rows::decode).transpose().map_err(Fault::Store)
    }

    pub(crate) async fn reserve(
        &self,
        record: &Record,
        change: &ChangeValues,
    ) -> Result<Inserted, StoreError> {
        let deadline = self.deadline();
        loop {
            let (inserted, found) = retrying!(
                deadline,
                format!("cannot reserve key {}", record.key),
                self.try_insert(record, change)
            )?;
            return match (inserted, found) {
                (Some(token), _) => Ok(Inserted::New { token }),
                // Our own insert, committed by an attempt whose connection broke before the
                // answer came: the key's last row is its entry (the record is held, so no one
                // else wrote since).
                (None, Some(existing)) if existing.is_as(record) => {
                    Ok(Inserted::New { token: self.token(&record.key, deadline).await? })
                }
                (None, Some(existing)) => Ok(Inserted::Existing(existing)),
                // Released again meanwhile: try the insert again.
                (None, None) => continue,
            };
        }
    }

    /// Inserts the record if the key is absent, and reads what the key holds, in one round
    /// trip: the read is pipelined behind the insert on the same connection, so the server runs
    /// it as a statement of its own once the insert is done, whose snapshot shows a row that
    /// was committed while the insert ran (the insert's own would not). A replay, the common
    /// case of a key that is there, is that one round trip; a fresh call pays one index lookup
    /// more on the server and no round trip.
    async fn try_insert(
        &self,
        record: &Record,
        change: &ChangeValues,
    ) -> Result<(Option<u64>, Option<Record>), Fault> {
        let now = self.db_now_param();
        let client = self.connection().await?;
        let written = rows::written(record);
        let mut params: Vec<Param> = vec![&record.key];
        params.extend(written.iter().map(Typed::param));
        params.extend_from_slice(&change.params());
        params.push(&now);
        let key: [Param; 1] = [&record.key];
        client.ready(&[&self.statements.insert, &self.statements.get]).await?;
        // One history row, written only when the record was.
        let (inserted, found) = tokio::try_join!(
            self.statements.insert.query_opt(&client, &params),
            self.statements.get.query_opt(&client, &key)
        )?;
        let found = found.as_ref().map(rows::decode).transpose().map_err(Fault::Store)?;
        Ok((inserted.map(|row| seq_of(&row)).transpose()?, found))
    }

    /// The `seq` of the key's last history row, trying until `deadline`.
    async fn token(&self, key: &str, deadline: Instant) -> Result<u64, StoreError> {
        let seq: Option<i64> = retrying!(
            deadline,
            format!("cannot read the history of key {key}"),
            self.query_value(&self.statements.token, &[&key])
        )?;
        Ok(seq.map_or(0, |seq| u64::try_from(seq).unwrap_or(0)))
    }

    pub(crate) async fn replace(
        &self,
        current: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: &ChangeValues,
    ) -> Result<Option<u64>, StoreError> {
        // The engine's guard, which the fence's `WHERE` compares with the row (`schema::fence`).
        let outcome = self.replace_fenced(current, guard, new, change).await;
        if let Ok(Some(_)) = outcome {
            // The waiters of this process need not wait for the announcement's round trip.
            self.listener.notifier.notify(&current.key);
        }
        outcome
    }

    async fn replace_fenced(
        &self,
        current: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: &ChangeValues,
    ) -> Result<Option<u64>, StoreError> {
        let deadline = self.deadline();
        let mut retry = Retry::until(deadline);
        let mut repeated = false;
        loop {
            // A repeat whose first attempt landed is refused by the fence: its history row was
            // committed with that attempt, once.
            match self.try_replace(current, guard, new, change).await {
                Ok(Some(token)) => return Ok(Some(token)),
                Ok(None) if !repeated => return Ok(None),
                Ok(None) => {
                    // The fence refused the repeat: did the first attempt land?
                    let now = self.get(&current.key, deadline).await?;
                    let landed = match (now, new) {
                        (None, None) => true,
                        (Some(now), Some(new)) => now.is_as(new),
                        _ => false,
                    };
                    if !landed {
                        return Ok(None);
                    }
                    // Its row is the key's last: a record it left in flight is held.
                    return self.token(&current.key, deadline).await.map(Some);
                }
                Err(fault) if retry.again(&fault).await => repeated = true,
                Err(fault) => {
                    return Err(fault.into_store_error(&format!("cannot write key {}", current.key)))
                }
            }
        }
    }

    async fn try_replace(
        &self,
        current: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: &ChangeValues,
    ) -> Result<Option<u64>, Fault> {
        let client = self.connection().await?;
        let seen = current.fence();
        let (status, owner, attempts) =
            (seen.status.as_str(), seen.owner, i64::from(seen.attempts));
        let now = self.db_now_param();
        let guard = guard_param(guard);
        let fence: [Param; 5] = [&current.key, &status, &owner, &attempts, &guard];
        let changed = match new {
            Some(new) => {
                let written = rows::written(new);
                let mut params = fence.to_vec();
                params.extend(written.iter().map(Typed::param));
                params.extend_from_slice(&change.params());
                params.push(&now);
                self.statements.update.query_opt(&client, &params).await?
            }
            None if change.ends_history => {
                let mut params = fence.to_vec();
                params.push(&now);
                let removed: i64 =
                    self.statements.purge.query_one(&client, &params).await?.try_get(0)?;
                // A purge leaves no row to number: its token means nothing.
                return Ok((removed == 1).then_some(0));
            }
            None => {
                let mut params = fence.to_vec();
                params.extend_from_slice(&change.params());
                params.push(&now);
                self.statements.delete.query_opt(&client, &params).await?
            }
        };
        let Some(row) = changed else { return Ok(None) };
        // A caller in some process waits for this record to change (it marked the record
        // before it read it, `watch`): tell every process, once the write has committed. A
        // write that finds no mark announces nothing: no caller waits, and each announcement
        // wakes the listening connection of every process of the fleet. One lost with a crash
        // between the two is made up by the waiter's re-read at the lease's end.
        let waited: bool = row.try_get(1)?;
        if waited {
            let announced: [Param; 2] = [&self.statements.channel, &current.key];
            self.statements.notify.execute(&client, &announced).await?;
        }
        seq_of(&row).map(Some)
    }

    /// One heartbeat's renewal (`Store::renew`): every lease of `held` extended to `until` in
    /// one statement, then the clock measured again, since leases are read on it. Answers, for
    /// each of `held`, whether it was extended.
    pub(crate) async fn renew(&self, held: &[Held], until: u64) -> Result<Vec<bool>, StoreError> {
        // A renewal that keeps failing is worth trying for as long as the leases it renews can
        // still be saved: until a lease after the beat before, less this beat's interval.
        let deadline =
            deadline_after(Instant::now(), self.lease.saturating_sub(self.terms.renew_every));
        let until = i64::try_from(until).unwrap_or(i64::MAX);
        let renewed = retrying!(deadline, "cannot renew leases", self.try_renew(held, until));
        if let Err(e) = self.measure_clock(deadline).await {
            tracing::debug!(error = %e, "idem: cannot measure the database clock; keeping the last measure");
        }
        let renewed = renewed?;
        let extended = |h: &Held| {
            renewed.iter().any(|(key, owner, attempts)| {
                *key == h.key && owner.as_str() == h.owner.as_str() && *attempts == h.attempts
            })
        };
        Ok(held.iter().map(extended).collect())
    }

    /// The leases of `held` the statement extended, as (key, owner, attempts).
    async fn try_renew(
        &self,
        held: &[Held],
        until: i64,
    ) -> Result<Vec<(String, String, u32)>, Fault> {
        let keys: Vec<&str> = held.iter().map(|h| h.key.as_str()).collect();
        let owners: Vec<&str> = held.iter().map(|h| h.owner.as_str()).collect();
        let attempts: Vec<i64> = held.iter().map(|h| i64::from(h.attempts)).collect();
        let now = self.db_now_param();
        let client = self.connection().await?;
        let rows = self
            .statements
            .renew
            .query(&client, &[&keys, &owners, &attempts, &until, &now])
            .await?;
        rows.iter()
            .map(|row| {
                let attempts: i64 = row.try_get(2)?;
                Ok((row.try_get(0)?, row.try_get(1)?, u32::try_from(attempts).unwrap_or(0)))
            })
            .collect()
    }

    pub(crate) async fn watch(
        &self,
        key: &str,
        seen: &Record,
        deadline: Instant,
    ) -> Result<Option<Record>, StoreError> {
        loop {
            // Watch before reading, so that a change between the read and the wait is seen; the
            // read marks the record, so that the write that changes it announces it to every
            // process. A read that hits a broken connection keeps trying for the whole wait
            // (and at least a lease): a restarting server must not end a wait early.
            let watch = Notifier::watch(&self.listener.notifier, key);
            let current = retrying!(
                deadline.max(self.deadline()),
                format!("cannot read key {key}"),
                self.try_read(&self.statements.watch, key)
            )?;
            let record = match current {
                Some(record) if record.is_as(seen) => record,
                other => return Ok(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Some(record));
            }
            // The owner may die without a word: wake when its lease lapses, to look again.
            let wake = match (record.status, lease::left(&record, self.db_now())) {
                (Status::InFlight, Some(left)) => {
                    deadline.min(deadline_after(now, left + Duration::from_millis(5)))
                }
                // The lease lapsed: the owner is dead, and the caller must know now.
                (Status::InFlight, None) => return Ok(Some(record)),
                _ => deadline,
            };
            let wake = if self.listener.listening() {
                wake
            } else {
                wake.min(deadline_after(now, UNHEARD_RECHECK))
            };
            tokio::select! {
                () = watch => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// Appends the history row of `change` to `key`, changing no record. An attempt whose
    /// connection broke after it committed may leave the row twice: an entry that says what
    /// happened, once more, rather than none.
    pub(crate) async fn append(&self, key: &str, change: &ChangeValues) -> Result<(), StoreError> {
        let now = self.db_now_param();
        let mut params: Vec<Param> = vec![&key];
        params.extend_from_slice(&change.params());
        params.push(&now);
        retrying!(
            self.deadline(),
            format!("cannot write the history of key {key}"),
            self.try_append(&params)
        )
    }

    async fn try_append(&self, params: &[Param<'_>]) -> Result<(), Fault> {
        let client = self.connection().await?;
        self.statements.append.execute(&client, params).await?;
        Ok(())
    }

    pub(crate) async fn history(
        &self,
        key: &str,
        deadline: Instant,
    ) -> Result<Vec<Entry>, StoreError> {
        retrying!(deadline, format!("cannot read the history of key {key}"), self.try_history(key))
    }

    async fn try_history(&self, key: &str) -> Result<Vec<Entry>, Fault> {
        let client = self.connection().await?;
        let rows = self.statements.history.query(&client, &[&key]).await?;
        rows.iter()
            .map(|row| rows::decode_entry(key, row))
            .collect::<Result<_, _>>()
            .map_err(Fault::Store)
    }

    /// Removes the history of `key` while it has no record; whether there was one. A repeat
    /// after a broken connection whose first attempt landed finds nothing, and says so.
    pub(crate) async fn remove_history(&self, key: &str) -> Result<bool, StoreError> {
        retrying!(
            self.deadline(),
            format!("cannot remove the history of key {key}"),
            self.query_value::<i64>(&self.statements.remove_history, &[&key])
        )
        .map(|removed| removed > 0)
    }

    pub(crate) async fn size(&self) -> Result<u64, StoreError> {
        let size: i64 = retrying!(
            self.deadline(),
            "cannot read the table size",
            self.query_value(&self.statements.size, &[])
        )?;
        Ok(u64::try_from(size).unwrap_or(0))
    }
}

/// The `seq` a write's history row came back with.
fn seq_of(row: &tokio_postgres::Row) -> Result<u64, Fault> {
    let seq: i64 = row.try_get(0)?;
    Ok(u64::try_from(seq).unwrap_or(0))
}
