//! `idem mcp-proxy`: an MCP server on stdin/stdout in front of an upstream MCP server that the
//! proxy spawns (with its own environment) and talks to over the child's pipes. Every call goes
//! through `idem_runtime::mcp::IdempotentClient`, so a write tool with a scope runs once per
//! intent, whichever proxy process of a shared store gets it. stdout carries the protocol only;
//! warnings and the upstream's own stderr go to stderr.

mod config;
mod handler;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::mcp::{IdempotentClient, Protection};
use idem_runtime::Store;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;

use self::config::Config;
use self::handler::Proxy;
use crate::failure::Failure;
use crate::store;

/// Checks the configuration, opens the store (not for `--check`, which needs none), starts the
/// upstream, and serves until the client closes stdin or the upstream exits.
pub(crate) fn run(
    location: Option<&OsStr>,
    config: &Path,
    check: bool,
    command: &[OsString],
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let config = config::load(config)?;
    let store = if check { None } else { Some(store::open_for_calls(location)?) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::failed(format!("cannot start the async runtime: {error}")))?;
    let served = runtime.block_on(proxy(config, store, check, command, out));
    // tokio reads stdin on a blocking thread that only EOF ends; an upstream that exited first
    // must not leave the command waiting for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

async fn proxy(
    config: Config,
    store: Option<Arc<dyn Store>>,
    check: bool,
    command: &[OsString],
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let upstream = start(command).await?;
    let mut client = IdempotentClient::new(upstream.peer().clone(), &config.server);
    if let Some(store) = store {
        client = client.store(store);
    }
    let configured: Vec<String> = config.tools.iter().map(|(name, _)| name.clone()).collect();
    for (name, policy) in config.tools {
        client = client.tool(name, policy);
    }
    let client = client.classify().await.map_err(|error| upstream_failed("tools/list", &error))?;
    let listed = upstream
        .peer()
        .list_all_tools()
        .await
        .map_err(|error| upstream_failed("tools/list", &error))?;
    let listed: Vec<String> = listed.iter().map(|tool| tool.name.to_string()).collect();
    if check {
        return print_check(&client, &listed, out);
    }
    warn(&client, &configured, &listed);

    let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        .with_server_info(Implementation::new(config.server, env!("CARGO_PKG_VERSION")));
    info.instructions = upstream.peer().peer_info().and_then(|peer| peer.instructions.clone());
    let server = Proxy { client, info }
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| Failure::failed(format!("the MCP client did not initialize: {error}")))?;
    tokio::select! {
        // The client closed stdin: dropping the upstream's session closes its stdin in turn.
        _ = server.waiting() => Ok(()),
        _ = upstream.waiting() => {
            Err(Failure::failed("the upstream server exited; restart the proxy"))
        }
    }
}

/// Spawns the upstream server and initializes a client session on its pipes. It inherits this
/// process's environment and stderr, so its logs reach the host's log as they would without
/// the proxy.
async fn start(command: &[OsString]) -> Result<RunningService<RoleClient, ()>, Failure> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::usage("give the upstream server's command after `--`"))?;
    let shown = program.to_string_lossy();
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    let (transport, _stderr) =
        TokioChildProcess::builder(child).stderr(Stdio::inherit()).spawn().map_err(|error| {
            Failure::failed(format!("cannot start the upstream server `{shown}`: {error}"))
        })?;
    ().serve(transport).await.map_err(|error| {
        Failure::failed(format!("the upstream server `{shown}` did not initialize: {error}"))
    })
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
