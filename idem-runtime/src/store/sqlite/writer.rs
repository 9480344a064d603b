//! The thread that makes every write of a store instance, one after the other, on its own
//! connection. rusqlite is synchronous: the callers' futures only wait for the answer, so a
//! write never blocks an async runtime's thread, and a write whose caller went away (a dropped
//! future) still runs to its end, as it may be on its way to commit anyway. Writes leave in the
//! order they were asked for, so a settling write from a `Drop` path never overtakes the write
//! it settles.

use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The writing thread of one store instance.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread, which owns `conn` until the writer is dropped.
    pub(super) fn start(mut conn: Connection) -> Result<Writer, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || {
                for job in queue {
                    job(&mut conn);
                }
            })
            .map_err(|e| StoreError::with_source("cannot start the SQLite store's writer", e))?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Runs `job` on the writing thread; the future waits for its answer. Dropping the future
    /// does not stop the job.
    pub(super) fn run<T, F>(&self, job: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        self.detach(move |conn| {
            // The caller may have gone: its answer then goes nowhere.
            let _ = answer.send(job(conn));
        });
        async move {
            answered
                .await
                .unwrap_or_else(|_| Err(StoreError::new("the SQLite store's writer has stopped")))
        }
    }

    /// Runs `job` on the writing thread, and waits for nothing.
    pub(super) fn detach(&self, job: impl FnOnce(&mut Connection) + Send + 'static) {
        if let Some(jobs) = &self.jobs {
            // The thread lives as long as the sender: the send fails only if it panicked.
            let _ = jobs.send(Box::new(job));
        }
    }
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
