//! The thread that makes every write of a store instance, on its own connection. rusqlite is
//! synchronous: the callers' futures only wait for the answer, so a write never blocks an async
//! runtime's thread, and a write whose caller went away (a dropped future) still runs to its end,
//! as it may be on its way to commit anyway. Writes run in the order they were asked for, so a
//! settling write from a `Drop` path never overtakes the write it settles.
//!
//! Group commit: the writes waiting when the thread comes round (at most [`GROUP`]) share one
//! transaction, and so one sync of the log. Each runs inside a savepoint of its own: one whose
//! statements fail is rolled back alone and answered with its error, and the others commit.
//! When the transaction cannot begin (another process kept the lock past the busy timeout) or
//! its commit fails, every write of the group is answered with that error, and none landed.

use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::StoreError;

/// One write, as the writer thread runs it.
pub(super) trait Write: Send {
    /// Runs the write's statements in the group's transaction; whether they succeeded (when
    /// not, the writer rolls them back).
    fn run(&mut self, tx: &Transaction<'_>) -> bool;

    /// Answers the write's caller once the group's transaction has ended: `Ok` when it
    /// committed, else what stopped it (it did not begin, or did not commit).
    fn finish(self: Box<Self>, outcome: Result<(), &rusqlite::Error>);
}

/// The most writes one transaction takes.
const GROUP: usize = 64;

/// The writing thread of one store instance.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Box<dyn Write>>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread, which owns `conn` until the writer is dropped.
    pub(super) fn start(mut conn: Connection) -> Result<Writer, StoreError> {
        let (jobs, queue) = mpsc::channel::<Box<dyn Write>>();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || {
                while let Ok(first) = queue.recv() {
                    let mut group = vec![first];
                    while group.len() < GROUP {
                        match queue.try_recv() {
                            Ok(write) => group.push(write),
                            Err(_) => break,
                        }
                    }
                    run_group(&mut conn, group);
                }
            })
            .map_err(|e| StoreError::with_source("cannot start the SQLite store's writer", e))?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Queues `write`; its [`Write::finish`] answers.
    pub(super) fn queue(&self, write: Box<dyn Write>) {
        if let Some(jobs) = &self.jobs {
            // The thread lives as long as the sender: the send fails only if it panicked, and
            // then the write's answer is dropped, which its caller reads as a stopped writer.
            let _ = jobs.send(write);
        }
    }
}

fn run_group(conn: &mut Connection, mut group: Vec<Box<dyn Write>>) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            group.into_iter().for_each(|write| write.finish(Err(&e)));
            return;
        }
    };
    for write in &mut group {
        let savepoint = tx.execute_batch("SAVEPOINT idem_write");
        let ok = savepoint.is_ok() && write.run(&tx);
        let end =
            if ok { "RELEASE idem_write" } else { "ROLLBACK TO idem_write; RELEASE idem_write" };
        if let Err(e) = savepoint.and_then(|()| tx.execute_batch(end)) {
            // A savepoint that cannot be taken or ended leaves the group's state unknown:
            // nothing of it is committed.
            drop(tx);
            group.into_iter().for_each(|write| write.finish(Err(&e)));
            return;
        }
    }
    let committed = tx.commit();
    group.into_iter().for_each(|write| write.finish(committed.as_ref().map(|_| ())));
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Every write asked for is made before the store closes (the thread drains the queue).
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
