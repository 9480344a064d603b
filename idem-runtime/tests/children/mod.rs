//! Child processes for the tests that run the test binary again with one test selected: a
//! child's stdout is read on a thread of its own, so that every wait for a line ends at a
//! deadline and a stuck child fails its test instead of hanging the suite. The SQLite tests
//! that share one store between processes also use [`child`], which does nothing unless
//! [`CHILD`] names its mode, talking to the parent through its stdin and stdout.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The child's mode: set in a child, unset in the parent.
pub const CHILD: &str = "IDEM_SQLITE_CHILD";
/// The directory of the shared store.
pub const DIR: &str = "IDEM_SQLITE_DIR";

/// In a child, its mode and the store's directory; `None` in the parent.
pub fn role() -> Option<(String, PathBuf)> {
    let mode = std::env::var(CHILD).ok()?;
    Some((mode, PathBuf::from(std::env::var(DIR).ok()?)))
}

/// This test binary, to run the test `entry` alone in child mode `mode` on the store in `dir`,
/// with piped stdin and stdout and no fail point unless the caller sets one.
pub fn child(entry: &str, mode: &str, dir: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env(DIR, dir)
        .env_remove("IDEM_FAILPOINT")
        .env_remove("IDEM_PAUSE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// How long a test waits for a child's line, or for its end, before it fails: far beyond any
/// step of these children, even on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// A child started, with its stdout read line by line on a thread of its own.
pub struct Running {
    pub process: Child,
    lines: Receiver<String>,
    /// Every line the child printed so far, to show when a wait fails.
    printed: Vec<String>,
}

/// Starts `command`, whose stdout must be piped.
pub fn start(command: &mut Command) -> Running {
    let mut process = command.spawn().unwrap();
    let stdout = process.stdout.take().expect("the child's stdout is piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running { process, lines, printed: Vec::new() }
}

impl Running {
    /// The child's next line, or `None` once its output has ended. Fails the test, showing what
    /// the child printed, if no line and no end comes by `deadline`; `awaited` says what for.
    fn next_line(&mut self, deadline: Instant, awaited: &str) -> Option<String> {
        match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                self.printed.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                let printed = &self.printed;
                panic!("no {awaited} from the child within {DEADLINE:?}; it printed {printed:?}")
            }
        }
    }

    /// Reads until a line holding `want`; the lines read, up to and with it. Fails the test if
    /// the child ends first, or prints no such line within [`DEADLINE`].
    pub fn until_line(&mut self, want: &str) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut read = Vec::new();
        loop {
            let Some(line) = self.next_line(deadline, &format!("{want:?}")) else {
                let printed = &self.printed;
                panic!("the child ended before printing {want:?}; it printed {printed:?}")
            };
            let found = line.contains(want);
            read.push(line);
            if found {
                return read;
            }
        }
    }

    /// Reads to the end of the child's output and waits for it to exit; what it printed since
    /// the last read, and how it exited. Fails the test if that takes longer than [`DEADLINE`].
    pub fn finish(&mut self) -> (Vec<String>, ExitStatus) {
        let deadline = Instant::now() + DEADLINE;
        let mut read = Vec::new();
        while let Some(line) = self.next_line(deadline, "end") {
            read.push(line);
        }
        // Its stdout is closed: the child has exited, or is exiting.
        (read, self.process.wait().unwrap())
    }

    /// SIGKILLs the child, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        self.process.kill().expect("SIGKILL the child");
        self.process.wait().unwrap();
    }
}

/// A child still running when its test ends (a failed assertion, say) is killed, so that it
/// does not hold the test's output open and hang the suite.
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
