//! Transactional calls on the SQLite store: its public API (`SqliteStore::transactional`, and
//! what `#[idem::idempotent(…, transactional = "tx")]` runs), over the engine's one path. The
//! store lends the transaction (`store/sqlite/transaction.rs`); an attempt runs on a thread of
//! its own for an async caller (the transaction may wait for the file's write lock up to the
//! busy timeout, which must not hold up an async runtime's thread), or on the caller's thread
//! for a sync tool.

use std::any::Any;
use std::cell::RefCell;
use std::future::ready;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::Codec;
use super::transact::{Attempt, Retries, Site};
use super::Call;
use crate::error::{Error, StoreError};
use crate::exec::block_on;
use crate::lifecycle::now_ms;
use crate::retry::Carried;
use crate::store::sqlite::transaction::Lender;
use crate::store::sqlite::SqliteStore;

/// A transactional call on a [`SqliteStore`]: [`SqliteStore::transactional`] makes one, and
/// [`SqliteTransactional::run`] runs it. See the README's "Effects in your own database".
///
/// **The body must write only to the store's file, through the transaction it is given.** What
/// it does elsewhere (an HTTP request, an email, another file) is not rolled back with it;
/// such effects belong in an ordinary idem call. A tool whose effects are all in the
/// transaction is idempotent in the strict sense. In a tool, prefer the attribute
/// (`#[idem::idempotent(scope = "…", transactional = "tx", store = …)]`), which classifies it
/// too; never wrap this call in a second `#[idem::idempotent]`, which would write two records.
#[must_use = "a transactional call does nothing until it is run"]
pub struct SqliteTransactional<'s> {
    store: &'s SqliteStore,
    call: Call,
}

impl SqliteStore {
    /// A transactional call of `call` on this store: its body gets a `rusqlite::Transaction` on
    /// the store's file, and its writes commit with the call's record, or not at all. The
    /// call's `.store(…)` is ignored: the record is written to this store.
    ///
    /// ```
    /// # async fn refund() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{Call, SqliteStore};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("shop.sqlite");
    /// let store = SqliteStore::open(&path)?;
    /// # rusqlite::Connection::open(&path)?
    /// #     .execute_batch("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id, cents)")?;
    /// let call = Call::new("refund", "order-17", &serde_json::json!({ "cents": 1250 }))?;
    /// let refund_id: i64 = store
    ///     .transactional(call)
    ///     .run(|tx| {
    ///         tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
    ///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(tx.last_insert_rowid())
    ///     })
    ///     .await?;
    /// # assert_eq!(refund_id, 1); Ok(()) }
    /// # idem_runtime::block_on(refund()).unwrap();
    /// ```
    pub fn transactional(&self, call: Call) -> SqliteTransactional<'_> {
        SqliteTransactional { store: self, call }
    }
}

impl SqliteTransactional<'_> {
    /// Runs the call: `body` gets a transaction on a connection of the store's own to its
    /// file, for its writes; the call's record is written in the same transaction, which
    /// commits when `body` returns `Ok`. A replay returns the committed result without running
    /// `body`. On `Err` or a panic (which then goes on to the caller), nothing commits and the
    /// key is free; a process that dies leaves nothing of the run either.
    ///
    /// `body` runs at most once, on a thread of its own (so that it may wait for the file's
    /// write lock without holding up an async runtime), which is why it and its value must be
    /// `Send + 'static`. A dropped future does not stop a run that has begun: it runs to its
    /// end, and what it commits replays. There is no retry: `BEGIN IMMEDIATE` takes the write
    /// lock before the first read, so SQLite has no serialization failure or deadlock to
    /// report; a lock another writer keeps past the store's
    /// [busy timeout](crate::store::sqlite::SqliteStoreBuilder::busy_timeout) fails the call with an error
    /// that says so, having written nothing.
    ///
    /// The body holds the file's write lock while it runs, and every other writer of the file
    /// waits: keep it to its writes.
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        let (store, call, codec) = (self.store, &self.call, Codec::<T, E>::serde());
        // Lent to each attempt's thread, and given back when the attempt did not run it.
        let body = Mutex::new(Some(body));
        let attempt = || {
            let (lender, call) = (store.lender(), call.clone());
            let taken = body.lock().unwrap_or_else(|e| e.into_inner()).take();
            let body = &body;
            async move {
                let (ended, unused) = on_a_thread(lender, call, codec, taken).await;
                *body.lock().unwrap_or_else(|e| e.into_inner()) = unused;
                ended
            }
        };
        call.transact(codec, store, Retries::once(), attempt).await
    }
}

impl SqliteStore {
    /// A sync transactional call on the caller's thread: what `#[idem::idempotent(…,
    /// transactional = "tx")]` runs for a sync tool. Not a public API.
    #[doc(hidden)]
    pub fn run_transactional<T, E, F>(
        &self,
        call: Call,
        codec: Codec<T, E>,
        body: F,
    ) -> Result<T, E>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
    {
        let body = RefCell::new(Some(body));
        let lender = self.lender();
        block_on(
            call.transact(codec, self, Retries::once(), || attempt(&lender, &call, codec, &body)),
        )
    }
}

/// One attempt on a thread of its own (so that it may wait for the file's write lock without
/// holding up an async runtime): how it ended, and the body unless it ran. A panic of the body
/// goes on to the caller, after its transaction rolled back.
async fn on_a_thread<T, E, F>(
    lender: Lender,
    call: Call,
    codec: Codec<T, E>,
    body: Option<F>,
) -> (Attempt<T, E>, Option<F>)
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
{
    type Answer<T, E, F> = Result<(Attempt<T, E>, Option<F>), Box<dyn Any + Send>>;
    let named = call.clone();
    // An error raised on the attempt's thread is noted on the caller's `retry!` attempt.
    let carried = Carried::here();
    let (answer, answered) = tokio::sync::oneshot::channel::<Answer<T, E, F>>();
    let spawned =
        std::thread::Builder::new().name("idem-sqlite-transaction".into()).spawn(move || {
            let ran = catch_unwind(AssertUnwindSafe(move || {
                let _attempting = carried.enter();
                let body = RefCell::new(body);
                let ended = block_on(attempt(&lender, &call, codec, &body));
                (ended, body.into_inner())
            }));
            // The caller may have gone: the attempt has ended all the same.
            let _ = answer.send(ran);
        });
    let stopped = |reason: StoreError| (Attempt::failed(&named, codec, reason), None);
    if let Err(e) = spawned {
        return stopped(StoreError::with_source(
            "cannot start a thread for the transaction: the system refused one",
            e,
        ));
    }
    match answered.await {
        Ok(Ok(ended)) => ended,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => stopped(StoreError::new("the transaction's thread stopped before it answered")),
    }
}

/// One attempt of `call` on a connection the store lends. `body` is taken only if it runs.
async fn attempt<T, E, F>(
    lender: &Lender,
    call: &Call,
    codec: Codec<T, E>,
    body: &RefCell<Option<F>>,
) -> Attempt<T, E>
where
    F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
{
    let failed = |e: StoreError| Attempt::failed(call, codec, e);
    let lent = match lender.lend() {
        Ok(lent) => lent,
        Err(e) => return failed(e),
    };
    let tx = match lent.begin() {
        Ok(tx) => tx,
        Err(e) => return failed(e),
    };
    let clock = now_ms;
    let site = Site { instance: lender.instance(), clock: &clock };
    // Borrows `body`, so that a body the attempt does not run stays there.
    let unused = body.borrow().is_some();
    let mut run = unused.then_some(|tx: &mut rusqlite::Transaction<'_>| {
        let taken = body.borrow_mut().take();
        ready(match taken {
            Some(body) => body(tx),
            None => Err((codec.error)(Error::store(
                Some(call.key().as_str()),
                Some(call.parts().tool),
                StoreError::new("the transactional body was taken by an earlier attempt"),
            ))),
        })
    });
    call.attempt(codec, &site, tx, &mut run, None, |_| false).await
}
