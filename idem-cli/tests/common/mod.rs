//! What the tests of the `idem` binary share: running it, reading what it gave, reading a child
//! process's lines with a deadline, and a sled store in a temporary directory.

// Each test binary uses its own share of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{SledStore, Store};
use tempfile::TempDir;

#[cfg(unix)]
pub mod proxy;
pub mod rmcp_upstream;

/// What one run of the binary gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "idem failed: {self:?}");
        assert!(self.stderr.is_empty(), "idem wrote to stderr on success: {self:?}");
        &self.stdout
    }

    /// Asserts a failure with `code` and one line on stderr, and returns that line.
    pub fn fails(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "wrong exit status: {self:?}");
        assert!(self.stdout.is_empty(), "idem wrote to stdout on failure: {self:?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "an error must be one line on stderr: {self:?}");
        assert!(lines[0].starts_with("idem: "), "an error must start with `idem: `: {self:?}");
        lines[0]
    }
}

/// Runs `idem args…` in `dir`, with `envs` set and `$IDEM_STORE` unset.
pub fn idem_in_with(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .current_dir(dir)
        .env_remove("IDEM_STORE")
        .envs(envs.iter().copied())
        .output()
        .expect("the idem binary runs");
    Run {
        code: output.status.code().expect("idem exited, not killed by a signal"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// Runs `idem args…` in `dir`.
pub fn idem_in(dir: &Path, args: &[&str]) -> Run {
    idem_in_with(dir, args, &[])
}

/// Runs `idem --store <store> args…` with `envs` set, beside the store.
pub fn idem_with(store: &Path, args: &[&str], envs: &[(&str, &str)]) -> Run {
    let mut all = vec!["--store", store.to_str().expect("temp paths are UTF-8")];
    all.extend_from_slice(args);
    idem_in_with(store.parent().expect("a store has a parent directory"), &all, envs)
}

/// Runs `idem --store <store> args…`.
pub fn idem(store: &Path, args: &[&str]) -> Run {
    idem_with(store, args, &[])
}

/// A temporary directory and the path of a store in it (not yet created).
pub fn place() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("idem.sled");
    (dir, path)
}

/// Opens the store in this process. sled lets go of its lock a moment after a store is dropped,
/// so reopening waits for it as the `idem` command does.
pub fn open(path: &Path) -> Arc<dyn Store> {
    Arc::new(
        SledStore::builder(path).lock_wait(Duration::from_secs(5)).open().expect("the store opens"),
    )
}

/// How long a test waits for a child process's line, or for its end, before it fails: far beyond
/// any step of these children, even on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The lines a child process prints, read on a thread of their own so that every wait for one
/// ends at [`DEADLINE`]: a stuck child fails its test instead of hanging the suite.
pub struct Lines {
    lines: Receiver<String>,
    /// Every line read so far, to show when a wait fails.
    printed: Vec<String>,
}

impl Lines {
    /// Reads `output` (a child's piped stdout, say) line by line.
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

    /// The next line, for which the test waits as `awaited` says. Fails the test if the output
    /// ends first, or no line comes within [`DEADLINE`].
    pub fn next(&mut self, awaited: &str) -> String {
        match self.lines.recv_timeout(DEADLINE) {
            Ok(line) => {
                self.printed.push(line.clone());
                line
            }
            Err(RecvTimeoutError::Disconnected) => {
                let printed = &self.printed;
                panic!("the child ended before printing {awaited}; it printed {printed:?}")
            }
            Err(RecvTimeoutError::Timeout) => {
                let printed = &self.printed;
                panic!("the child printed no {awaited} within {DEADLINE:?}; it printed {printed:?}")
            }
        }
    }

    /// Waits for the end of the output (the child exits, or is exiting); fails the test if it
    /// does not come within [`DEADLINE`].
    pub fn end(&mut self) {
        let until = std::time::Instant::now() + DEADLINE;
        loop {
            match self
                .lines
                .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
            {
                Ok(line) => self.printed.push(line),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let printed = &self.printed;
                    panic!("the child did not end within {DEADLINE:?}; it printed {printed:?}")
                }
            }
        }
    }
}
