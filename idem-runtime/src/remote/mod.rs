//! The [`crate::admin`] operations on a sled store that another process holds.
//!
//! sled lets one process open a store at a time, so the process that holds it (an agent, an MCP
//! server) answers the admin operations on a Unix socket in the store's directory, `admin.sock`,
//! readable and writable by its user only (see [`SledStoreBuilder::admin_socket`]). [`Remote`]
//! is its client, one implementation of [`crate::admin::Admin`]; the `idem` command uses it
//! whenever a process serves the store. The server answers each request with the other one,
//! [`crate::admin::Local`], so that every operation is written once per transport.
//!
//! [`SledStoreBuilder::admin_socket`]: crate::SledStoreBuilder::admin_socket

mod client;
mod connect;
mod peer;
mod seats;
mod server;
pub(crate) mod wire;

pub use self::client::Remote;
pub(crate) use self::server::Server;
