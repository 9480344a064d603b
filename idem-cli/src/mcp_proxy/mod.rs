//! `idem mcp-proxy`: an MCP server on stdin/stdout in front of an upstream MCP server, which the
//! proxy either spawns (with its own environment) and talks to over the child's pipes, or
//! reaches over streamable HTTP (`--upstream URL`). Every call goes through
//! `idem_runtime::mcp::IdempotentClient`, so a write tool with a scope runs once per intent,
//! whichever proxy process of a shared store gets it. stdout carries the protocol only; warnings
//! and a spawned upstream's own stderr go to stderr.

mod config;
mod handler;
mod idempotency_key;
mod upstream;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::mcp::{IdempotentClient, Protection};
use idem_runtime::Store;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::ServiceExt;
use tokio::sync::Notify;

use self::config::Config;
use self::handler::{Classified, Proxy};
use self::upstream::Upstream;
use crate::failure::Failure;
use crate::store;

/// Checks the command line and the configuration, opens the store (not for `--check`, which
/// needs none), starts or reaches the upstream, and serves until the client closes stdin or the
/// upstream's session ends.
pub(crate) fn run(
    location: Option<&OsStr>,
    config: &Path,
    check: bool,
    url: Option<String>,
    command: Vec<OsString>,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let upstream = Upstream::new(url, command)?;
    let config = config::load(config)?;
    let store = if check { None } else { Some(store::open_for_calls(location)?) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::failed(format!("cannot start the async runtime: {error}")))?;
    let served = runtime.block_on(proxy(config, store, check, &upstream, out));
    // tokio reads stdin on a blocking thread that only EOF ends; an upstream that exited first
    // must not leave the command waiting for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

async fn proxy(
    config: Config,
    store: Option<Arc<dyn Store>>,
    check: bool,
    upstream: &Upstream,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let changed = Arc::new(Notify::new());
    let session = upstream.connect(Arc::clone(&changed)).await?;
    let mut client = IdempotentClient::new(session.peer().clone(), &config.server);
    if let Some(store) = store {
        client = client.store(store);
    }
    let configured: Vec<String> = config.tools.iter().map(|(name, _)| name.clone()).collect();
    for (name, policy) in config.tools {
        client = client.tool(name, policy);
    }
    let client = client.classify().await.map_err(|error| upstream_failed("tools/list", &error))?;
    let listed = session
        .peer()
        .list_all_tools()
        .await
        .map_err(|error| upstream_failed("tools/list", &error))?;
    let listed: Vec<String> = listed.iter().map(|tool| tool.name.to_string()).collect();
    if check {
        return print_check(&client, &listed, out);
    }
    warn(&client, &configured, &listed);

    let capabilities = ServerCapabilities::builder().enable_tools().enable_tool_list_changed();
    let mut info = ServerConfig::new(capabilities.build())
        .with_server_info(Implementation::new(config.server, env!("CARGO_PKG_VERSION")));
    info.instructions = session.peer().peer_info().and_then(|peer| peer.instructions.clone());
    let classified = Classified::new(client);
    let handler = Proxy { client: classified.clone(), info };
    let server = handler
        .serve((idempotency_key::client_input(), tokio::io::stdout()))
        .await
        .map_err(|error| Failure::failed(format!("the MCP client did not initialize: {error}")))?;
    let downstream = server.peer().clone();
    let served = server.waiting();
    let ended = session.waiting();
    tokio::pin!(served, ended);
    loop {
        tokio::select! {
            // The client closed stdin: dropping the upstream's session closes a spawned
            // upstream's stdin in turn, and ends an HTTP one's session.
            _ = &mut served => return Ok(()),
            _ = &mut ended => {
                return Err(Failure::failed(format!(
                    "the upstream server {} ended the session; restart the proxy",
                    upstream.describe()
                )));
            }
            () = changed.notified() => {
                reclassify(&classified).await;
                // After the new classification is in place, so that a client that reads
                // tools/list and calls at once is treated by it.
                if let Err(error) = downstream.notify_tool_list_changed().await {
                    eprintln!(
                        "idem mcp-proxy: warning: cannot pass the upstream's \
                         notifications/tools/list_changed on to the client: {error}"
                    );
                }
            }
        }
    }
}

/// The upstream said its tool list changed: re-reads it, so that its hints classify the tools
/// it lists now, and warns of the writes that now pass through unprotected. If it cannot be
/// read, the tools keep the classification they had.
async fn reclassify(classified: &Classified) {
    let current = classified.current();
    match IdempotentClient::clone(&current).classify().await {
        Ok(fresh) => {
            let before = current.unprotected();
            let newly: Vec<&str> =
                fresh.unprotected().into_iter().filter(|name| !before.contains(name)).collect();
            if !newly.is_empty() {
                eprintln!(
                    "idem mcp-proxy: warning: the upstream's tool list changed, and these write \
                     tools have no scope and pass through unprotected (give each a `scope`, or \
                     `read = true`, in the configuration): {}",
                    newly.join(", ")
                );
            }
            classified.replace(fresh);
        }
        Err(error) => eprintln!(
            "idem mcp-proxy: warning: the upstream's tool list changed, but reading it again \
             failed ({error}); its tools keep their earlier classification"
        ),
    }
}

fn upstream_failed(request: &str, error: &rmcp::service::ServiceError) -> Failure {
    Failure::failed(format!("the upstream server did not answer {request}: {error}"))
}

/// `--check`: one line per upstream tool, in the upstream's order, with what idem does with it.
fn print_check(
    client: &IdempotentClient,
    listed: &[String],
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let width = listed.iter().map(String::len).max().unwrap_or(0);
    for name in listed {
        let what = match client.protection(name) {
            Protection::Read => "read: passed through every time".to_owned(),
            Protection::Keyed { scope } => format!("keyed by {}", scope.join(", ")),
            _ => "unprotected: a write with no scope, passed through".to_owned(),
        };
        writeln!(out, "{name:width$}  {what}")
            .map_err(|e| Failure::failed(format!("cannot write the output: {e}")))?;
    }
    Ok(())
}

/// The start-up warnings, on stderr: writes that pass through unprotected, and configured tools
/// the upstream does not list (a typo there would leave the real tool unprotected).
fn warn(client: &IdempotentClient, configured: &[String], listed: &[String]) {
    let unprotected = client.unprotected();
    if !unprotected.is_empty() {
        eprintln!(
            "idem mcp-proxy: warning: these write tools have no scope and pass through \
             unprotected (give each a `scope`, or `read = true`, in the configuration): {}",
            unprotected.join(", ")
        );
    }
    let unknown: Vec<&str> =
        configured.iter().filter(|name| !listed.contains(name)).map(String::as_str).collect();
    if !unknown.is_empty() {
        eprintln!(
            "idem mcp-proxy: warning: the configuration names tools the upstream server does \
             not list: {}",
            unknown.join(", ")
        );
    }
}
