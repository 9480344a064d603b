//! What the path of `store = …` may name: a function or a static that gives the store, for a
//! plain tool (any [`Store`]), a sync transactional tool (the SQLite store) and an async
//! transactional tool (a store that lends its driver's transaction, [`AsyncTransactional`]).
//! Generated code calls `__idem_store()` (or its transactional kin) on the path, and method
//! resolution picks the trait for a function or the one for a static.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use crate::engine::Call;
use crate::error::Error;
use crate::store::Store;

/// What a store-giving function may return.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give a store",
    note = "`store = path` names a function returning `Arc<dyn idem::Store>` (or \
            `Result<Arc<dyn idem::Store>, idem::Error>`), or a static that derefs to \
            `Arc<dyn idem::Store>` such as a `LazyLock<Arc<dyn idem::Store>>`"
)]
pub trait IntoStore {
    /// The store.
    fn into_store(self) -> Result<Arc<dyn Store>, Error>;
}

impl IntoStore for Arc<dyn Store> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        Ok(self)
    }
}

impl<S: Store> IntoStore for Arc<S> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        Ok(self)
    }
}

impl<S: IntoStore> IntoStore for Result<S, Error> {
    fn into_store(self) -> Result<Arc<dyn Store>, Error> {
        self.and_then(IntoStore::into_store)
    }
}

/// `store = f` where `f` is a function: call it. Chosen by method resolution, so generated code
/// need not know whether the path names a function or a static.
pub trait StoreFromFn {
    /// The store the function gives.
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error>;
}

impl<F: Fn() -> R, R: IntoStore> StoreFromFn for F {
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error> {
        self().into_store()
    }
}

/// `store = STATIC` where the static derefs to a store (a `LazyLock<Arc<dyn Store>>`).
pub trait StoreFromStatic {
    /// The store the static holds.
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error>;
}

impl<T: Deref<Target = Arc<dyn Store>>> StoreFromStatic for T {
    fn __idem_store(&self) -> Result<Arc<dyn Store>, Error> {
        Ok(Arc::clone(self))
    }
}

/// What a transactional tool's `store = …` may give: the SQLite store whose file holds the
/// tool's tables.
#[cfg(feature = "sqlite")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give the SQLite store a transactional tool runs on",
    note = "`store = path` on a transactional tool names a function returning \
            `Arc<idem::SqliteStore>` (or `Result<Arc<idem::SqliteStore>, idem::Error>`), or a \
            static that derefs to `Arc<idem::SqliteStore>`: the tool's writes commit in that \
            store's file, with its record"
)]
pub trait IntoTxStore {
    /// The store.
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl IntoTxStore for Arc<crate::store::sqlite::SqliteStore> {
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        Ok(self)
    }
}

#[cfg(feature = "sqlite")]
impl<S: IntoTxStore> IntoTxStore for Result<S, Error> {
    fn into_tx_store(self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        self.and_then(IntoTxStore::into_tx_store)
    }
}

/// `store = f` on a transactional tool, where `f` is a function: call it.
#[cfg(feature = "sqlite")]
pub trait TxStoreFromFn {
    /// The store the function gives.
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl<F: Fn() -> R, R: IntoTxStore> TxStoreFromFn for F {
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        self().into_tx_store()
    }
}

/// `store = STATIC` on a transactional tool, where the static derefs to the store.
#[cfg(feature = "sqlite")]
pub trait TxStoreFromStatic {
    /// The store the static holds.
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error>;
}

#[cfg(feature = "sqlite")]
impl<T: Deref<Target = Arc<crate::store::sqlite::SqliteStore>>> TxStoreFromStatic for T {
    fn __idem_tx_store(&self) -> Result<Arc<crate::store::sqlite::SqliteStore>, Error> {
        Ok(Arc::clone(self))
    }
}

/// A store that runs an async transactional tool (`transactional = "tx"` on an `async fn`) whose
/// body is `B`: it lends the transaction `B` takes (`D`, the function type `fn(TX)` of the
/// parameter's type `TX` as the tool writes it, so that a store that lends another driver's
/// transaction is told apart by its type, before the body's signature is compared), and runs
/// the call on the engine's one transactional path (`Call::transact`). A store crate implements it for its store and its
/// drivers' transactions (idem-postgres: `PgStore` with `&mut tokio_postgres::Transaction<'_>`,
/// `SqlxStore` with `&mut sqlx::PgConnection`), so that the macros know no database.
#[diagnostic::on_unimplemented(
    message = "the store `{Self}` cannot run this async transactional tool",
    label = "the store `store = …` gives",
    note = "an async tool marked `transactional = \"tx\"` runs on a PostgreSQL store \
            (`Arc<idem_postgres::PgStore>`, from a function or a static) and takes \
            `tx: &mut tokio_postgres::Transaction<'_>`, that store's own driver; one taking \
            `tx: &mut sqlx::PgConnection` needs a store that carries the application's sqlx pool \
            (`Arc<idem_postgres::SqlxStore>`, feature `sqlx`); on a SQLite store a transactional \
            tool is a plain `fn` taking `tx: &rusqlite::Transaction<'_>`"
)]
pub trait AsyncTransactional<D, B, T, E> {
    /// Runs `call` with `body` in a transaction of this store: its writes commit with the call's
    /// record, or neither does.
    fn run_transactional(&self, call: Call, body: B) -> impl Future<Output = Result<T, E>>;
}

/// What a function named by `store = …` on an async transactional tool returns: the store, or
/// an error in getting it.
pub trait IntoStoreArc {
    /// The store's type.
    type Store: ?Sized;
    /// The store.
    fn into_store_arc(self) -> Result<Arc<Self::Store>, Error>;
}

impl<S: ?Sized> IntoStoreArc for Arc<S> {
    type Store = S;
    fn into_store_arc(self) -> Result<Arc<S>, Error> {
        Ok(self)
    }
}

impl<S: ?Sized> IntoStoreArc for Result<Arc<S>, Error> {
    type Store = S;
    fn into_store_arc(self) -> Result<Arc<S>, Error> {
        self
    }
}

/// `store = f` on an async transactional tool, where `f` is a function: call it.
pub trait AsyncTxStoreFromFn {
    /// The store's type.
    type Store: ?Sized;
    /// The store the function gives.
    fn __idem_async_tx_store(&self) -> Result<Arc<Self::Store>, Error>;
}

impl<F: Fn() -> R, R: IntoStoreArc> AsyncTxStoreFromFn for F {
    type Store = R::Store;
    fn __idem_async_tx_store(&self) -> Result<Arc<R::Store>, Error> {
        self().into_store_arc()
    }
}

/// `store = STATIC` on an async transactional tool, where the static derefs to an `Arc` of the
/// store.
pub trait AsyncTxStoreFromStatic {
    /// The store's type.
    type Store: ?Sized;
    /// The store the static holds.
    fn __idem_async_tx_store(&self) -> Result<Arc<Self::Store>, Error>;
}

impl<T: Deref<Target = Arc<S>>, S: ?Sized> AsyncTxStoreFromStatic for T {
    type Store = S;
    fn __idem_async_tx_store(&self) -> Result<Arc<S>, Error> {
        Ok(Arc::clone(self))
    }
}
