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

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use super::*;

    /// A write of one row, or (`fails`) a statement SQLite refuses; it reports how its group
    /// ended.
    struct Row {
        value: i64,
        fails: bool,
        hold: Option<Receiver<()>>,
        ended: Sender<(i64, bool, bool)>,
        ran: bool,
    }

    impl Write for Row {
        fn run(&mut self, tx: &Transaction<'_>) -> bool {
            if let Some(hold) = self.hold.take() {
                hold.recv().unwrap();
            }
            let sql = if self.fails {
                "INSERT INTO nowhere VALUES (?1)"
            } else {
                "INSERT INTO t VALUES (?1)"
            };
            self.ran = tx.execute(sql, [self.value]).is_ok();
            self.ran
        }

        fn finish(self: Box<Self>, outcome: Result<(), &rusqlite::Error>) {
            self.ended.send((self.value, self.ran, outcome.is_ok())).unwrap();
        }
    }

    #[test]
    fn a_failing_write_is_rolled_back_alone_and_its_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
        let writer = Writer::start(conn).unwrap();
        let (ended, ends) = channel();
        let (release, hold) = channel();
        let row = |value, fails, hold| {
            Box::new(Row { value, fails, hold, ended: ended.clone(), ran: false })
        };
        // The first write holds the thread while the next three queue: they form one group.
        writer.queue(row(0, false, Some(hold)));
        writer.queue(row(1, false, None));
        writer.queue(row(2, true, None));
        writer.queue(row(3, false, None));
        release.send(()).unwrap();
        drop(writer);
        let mut got: Vec<_> = ends.try_iter().collect();
        got.sort();
        assert_eq!(
            got,
            [(0, true, true), (1, true, true), (2, false, true), (3, true, true)],
            "the failed write ran alone into its error; the group committed"
        );
        let check = Connection::open(&path).unwrap();
        let values: Vec<i64> = check
            .prepare("SELECT v FROM t ORDER BY v")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(values, [0, 1, 3]);
    }
}
