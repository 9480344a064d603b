//! What the facade's tests that run child processes share: reading a child's lines with a
//! deadline, so that a stuck child fails its test instead of hanging the suite.

// Each test binary uses its own share of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a test waits for a child's line, or for its end, before it fails: far beyond any
/// step of these children, even on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The lines a child writes to one of its pipes, read on a thread of their own so that every
/// wait for one ends at [`DEADLINE`].
pub struct Lines {
    lines: Receiver<String>,
    /// Every line read so far, to show when a wait fails.
    printed: Vec<String>,
}

impl Lines {
    /// Reads `output` (a child's piped stderr, say) line by line.
    pub fn read(output: impl Read + Send + 'static) -> Lines {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { lines, printed: Vec::new() }
    }

    /// The next line, or `None` once the output has ended. Fails the test, showing what the
    /// child wrote, if no line and no end comes by `deadline`; `awaited` says what for.
    fn next_line(&mut self, deadline: Instant, awaited: &str) -> Option<String> {
        match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                self.printed.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                let printed = self.printed.join("\n");
                panic!("no {awaited} from the child within {DEADLINE:?}; it wrote:\n{printed}")
            }
        }
    }

    /// Waits for a line that contains `text` and returns it. Fails the test, showing what the
    /// child wrote, if its output ends first or no such line comes within [`DEADLINE`].
    pub fn until(&mut self, text: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let Some(line) = self.next_line(deadline, &format!("{text:?}")) else {
                let printed = self.printed.join("\n");
                panic!("the child ended without writing {text:?}; it wrote:\n{printed}")
            };
            if line.contains(text) {
                return line;
            }
        }
    }

    /// The lines not read yet, up to the end of the output (the child exits, or is exiting).
    /// Fails the test if the end does not come within [`DEADLINE`].
    pub fn rest(&mut self) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut rest = Vec::new();
        while let Some(line) = self.next_line(deadline, "end") {
            rest.push(line);
        }
        rest
    }
}

/// The binary of example `name`, built with `features` by the cargo that runs these tests (so
/// that it is never stale), once per test binary and name.
pub fn example(name: &str, features: &str) -> std::path::PathBuf {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static BUILT: Mutex<BTreeMap<String, std::path::PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--features", features, "--example", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --features {features} --example {name} failed");
    let exe = std::env::current_exe().expect("the test binary's path");
    let debug = exe.parent().and_then(|deps| deps.parent()).expect("target/debug/deps/…");
    let path = debug.join("examples").join(name);
    built.insert(name.to_owned(), path.clone());
    path
}

/// An rmcp client session on a child MCP server's stdout and stdin (both piped), initialized.
#[cfg(all(feature = "rmcp", unix))]
pub async fn mcp_client(
    child: &mut std::process::Child,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    use rmcp::ServiceExt;
    use std::os::fd::OwnedFd;
    let stdout = OwnedFd::from(child.stdout.take().expect("piped stdout"));
    let stdin = OwnedFd::from(child.stdin.take().expect("piped stdin"));
    let reading = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).expect("a pipe");
    let writing = tokio::net::unix::pipe::Sender::from_owned_fd(stdin).expect("a pipe");
    ().serve((reading, writing)).await.expect("the client initializes")
}
