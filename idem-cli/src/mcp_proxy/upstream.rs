//! The server the proxy stands in front of: a command it starts and talks to over the child's
//! pipes, or a streamable HTTP endpoint it connects to. Either way the proxy is an rmcp client
//! session whose handler only notes that the upstream's tool list changed.

use std::ffi::{OsStr, OsString};
use std::process::Stdio;
use std::sync::Arc;

use rmcp::model::ClientConfig;
use rmcp::service::{ClientInitializeError, NotificationContext, RoleClient, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use tokio::sync::Notify;

use crate::failure::Failure;

/// The upstream server, as the command line gives it: exactly one of `--upstream URL` and
/// `-- COMMAND [ARGS…]`.
pub(crate) enum Upstream {
    Command { program: OsString, args: Vec<OsString> },
    Http(String),
}

/// The proxy's client session on the upstream server.
pub(crate) type Session = RunningService<RoleClient, Watcher>;

impl Upstream {
    /// Checks what the command line gave. clap already refuses both and neither; this says why
    /// in the proxy's own words if it ever lets one through, and checks the URL's scheme.
    pub(crate) fn new(url: Option<String>, command: Vec<OsString>) -> Result<Upstream, Failure> {
        let mut command = command.into_iter();
        match (url, command.next()) {
            (Some(url), None) => http(url),
            (None, Some(program)) => Ok(Upstream::Command { program, args: command.collect() }),
            (Some(_), Some(_)) => Err(Failure::usage(
                "give the upstream server either as --upstream URL or as `-- COMMAND`, not both",
            )),
            (None, None) => Err(Failure::usage(
                "give the upstream server as --upstream URL (its streamable HTTP endpoint) or \
                 as its command line after `--`",
            )),
        }
    }

    /// Starts or reaches the upstream and initializes a client session with it. `changed` is
    /// told whenever the upstream says its tool list changed.
    pub(crate) async fn connect(&self, changed: Arc<Notify>) -> Result<Session, Failure> {
        let watcher = Watcher { changed };
        match self {
            Upstream::Command { program, args } => spawn(watcher, program, args).await,
            Upstream::Http(url) => reach(watcher, url).await,
        }
    }

    /// What the messages call the upstream.
    pub(crate) fn describe(&self) -> String {
        match self {
            Upstream::Command { program, .. } => format!("`{}`", program.to_string_lossy()),
            Upstream::Http(url) => url.clone(),
        }
    }
}

/// Spawns the upstream and initializes a session on its pipes. It inherits this process's
/// environment and stderr, so that its logs reach the host's log as they would without the
/// proxy.
async fn spawn(watcher: Watcher, program: &OsStr, args: &[OsString]) -> Result<Session, Failure> {
    let shown = program.to_string_lossy();
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    let (transport, _stderr) =
        TokioChildProcess::builder(child).stderr(Stdio::inherit()).spawn().map_err(|error| {
            Failure::failed(format!("cannot start the upstream server `{shown}`: {error}"))
        })?;
    watcher.serve(transport).await.map_err(|error| {
        Failure::failed(format!("the upstream server `{shown}` did not initialize: {error}"))
    })
}

/// Initializes a session with the upstream at `url` over streamable HTTP.
async fn reach(watcher: Watcher, url: &str) -> Result<Session, Failure> {
    let transport = StreamableHttpClientTransport::from_uri(url);
    watcher.serve(transport).await.map_err(|error| {
        Failure::failed(format!(
            "cannot reach the upstream server at {url}: {}; start it, or give --upstream the \
             URL of its streamable HTTP endpoint (often ending in /mcp)",
            reason(&error)
        ))
    })
}

/// `--upstream`'s URL, checked before anything starts. This build has no TLS (reqwest without
/// a TLS backend: no OpenSSL, no rustls), so an `https://` URL is refused here rather than
/// failing at the first request.
fn http(url: String) -> Result<Upstream, Failure> {
    if url.starts_with("http://") && url.len() > "http://".len() {
        return Ok(Upstream::Http(url));
    }
    if url.starts_with("https://") {
        return Err(Failure::usage(format!(
            "--upstream {url}: this idem speaks plain HTTP only (it is built without TLS); give \
             an http:// URL, such as a server on this machine or a TLS-terminating proxy in \
             front of the remote one"
        )));
    }
    Err(Failure::usage(format!(
        "--upstream {url}: not an http:// URL; give the upstream's streamable HTTP endpoint, \
         such as http://127.0.0.1:8000/mcp"
    )))
}

/// Why the session could not start, in an operator's terms: for a transport's error, its
/// innermost cause (a refused connection, an HTTP status), since rmcp's own message names the
/// transport's types.
fn reason(error: &ClientInitializeError) -> String {
    let ClientInitializeError::TransportError { error, .. } = error else {
        return error.to_string();
    };
    let mut cause: &(dyn std::error::Error + 'static) = &*error.error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// The client side of the upstream session. It does no work in the notification's handler:
/// rmcp runs each handler in a task of its own, so two changes in a row could re-read the list
/// concurrently and the older answer land last. The proxy's loop re-reads it instead, once per
/// wake-up (`Notify` keeps one permit however many changes came), after the last change it saw.
#[derive(Clone)]
pub(crate) struct Watcher {
    changed: Arc<Notify>,
}

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}
