//! A statement of the store with its parameters' types, and running it unnamed or named.
//!
//! Unnamed, the default: a statement goes out as one unnamed Parse, Bind, Describe, Execute and
//! Sync, in one message and one round trip, with the parameters' types given rather than asked
//! of the server. No named prepared statement is left on a server connection, so nothing the
//! store sends depends on the connection it reaches: a pooler in transaction mode (PgBouncer's
//! `pool_mode = transaction`) may hand each statement to a different server connection, and no
//! other client's statement can be run in place of ours. An unnamed statement lives until the
//! Sync that ends its message, which the pooler keeps on one server connection.
//!
//! The server parses and plans an unnamed statement at every execution, which made a replay
//! on a direct connection about three times as slow (BENCHMARKS.md, "Through a pooler"). So once the
//! store has seen that its URL gives sessions of their own (the listening connection, on the
//! same URL, heard its own probe: something a pooler in transaction mode never delivers), its
//! connections prepare each statement once, named, and run it by name.

use deadpool_postgres::Object;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A parameter of a statement, as tokio-postgres takes it.
pub(crate) type Param<'a> = &'a (dyn ToSql + Sync);

/// A parameter with its PostgreSQL type, as every statement can take it: the store's own, and a
/// transaction's through either driver (which binds its type by name).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Typed<'a> {
    /// `text`, or `NULL`.
    Text(Option<&'a str>),
    /// `bigint`, or `NULL`.
    Int(Option<i64>),
    /// `boolean`, or `NULL`.
    Bool(Option<bool>),
}

impl Typed<'_> {
    /// The value as tokio-postgres takes it.
    pub(crate) fn param(&self) -> Param<'_> {
        match self {
            Typed::Text(value) => value,
            Typed::Int(value) => value,
            Typed::Bool(value) => value,
        }
    }

    /// Its type, for a statement sent unnamed.
    pub(crate) fn sql_type(&self) -> Type {
        match self {
            Typed::Text(_) => Type::TEXT,
            Typed::Int(_) => Type::INT8,
            Typed::Bool(_) => Type::BOOL,
        }
    }
}

/// A statement's text and the type of each of its parameters (`$1` first).
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) text: String,
    types: Vec<Type>,
}

/// A pooled connection, and whether it may keep named statements: only once the store has seen
/// that its URL gives sessions of their own (`Listener::sessions`).
pub(crate) struct Conn {
    client: Object,
    named: bool,
}

impl Conn {
    pub(crate) fn new(client: Object, named: bool) -> Conn {
        Conn { client, named }
    }

    /// Prepares `statements` now where they are named, so that the statements pipelined next
    /// go out in the order they are called (a statement still being prepared would let the
    /// one after it overtake it).
    pub(crate) async fn ready(&self, statements: &[&Sql]) -> Result<(), Error> {
        if self.named {
            for sql in statements {
                self.client.prepare_typed_cached(&sql.text, &sql.types).await?;
            }
        }
        Ok(())
    }

    /// Runs a batch of statements without parameters in one message (simple query protocol).
    pub(crate) async fn batch(&self, text: &str) -> Result<(), Error> {
        self.client.batch_execute(text).await
    }
}

impl Sql {
    pub(crate) fn new(text: String, types: &[Type]) -> Sql {
        Sql { text, types: types.to_vec() }
    }

    /// The parameters paired with their types. A count that does not match is a bug of this
    /// crate, which the server reports ("bind message supplies N parameters").
    fn typed<'a>(&self, params: &[Param<'a>]) -> Vec<(Param<'a>, Type)> {
        debug_assert_eq!(params.len(), self.types.len(), "the parameters of {}", self.text);
        params.iter().copied().zip(self.types.iter().cloned()).collect()
    }

    pub(crate) async fn query(&self, conn: &Conn, params: &[Param<'_>]) -> Result<Vec<Row>, Error> {
        if conn.named {
            let statement = conn.client.prepare_typed_cached(&self.text, &self.types).await?;
            return conn.client.query(&statement, params).await;
        }
        conn.client.query_typed(&self.text, &self.typed(params)).await
    }

    pub(crate) async fn query_opt(
        &self,
        conn: &Conn,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, Error> {
        if conn.named {
            let statement = conn.client.prepare_typed_cached(&self.text, &self.types).await?;
            return conn.client.query_opt(&statement, params).await;
        }
        conn.client.query_typed_opt(&self.text, &self.typed(params)).await
    }

    pub(crate) async fn query_one(&self, conn: &Conn, params: &[Param<'_>]) -> Result<Row, Error> {
        if conn.named {
            let statement = conn.client.prepare_typed_cached(&self.text, &self.types).await?;
            return conn.client.query_one(&statement, params).await;
        }
        conn.client.query_typed_one(&self.text, &self.typed(params)).await
    }

    pub(crate) async fn execute(&self, conn: &Conn, params: &[Param<'_>]) -> Result<u64, Error> {
        if conn.named {
            let statement = conn.client.prepare_typed_cached(&self.text, &self.types).await?;
            return conn.client.execute(&statement, params).await;
        }
        conn.client.execute_typed(&self.text, &self.typed(params)).await
    }
}
