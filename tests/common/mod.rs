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

    /// Waits for a line that contains `text` and returns it. Fails the test, showing what the
    /// child wrote, if its output ends first or no such line comes within [`DEADLINE`].
    pub fn until(&mut self, text: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.printed.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let printed = self.printed.join("\n");
                    panic!("the child ended without writing {text:?}; it wrote:\n{printed}")
                }
                Err(RecvTimeoutError::Timeout) => {
                    let printed = self.printed.join("\n");
                    panic!("the child wrote no {text:?} within {DEADLINE:?}; it wrote:\n{printed}")
                }
            }
        }
    }

    /// The lines not read yet, up to the end of the output (the child exits, or is exiting).
    /// Fails the test if the end does not come within [`DEADLINE`].
    pub fn rest(&mut self) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut rest = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.printed.push(line.clone());
                    rest.push(line);
                }
                Err(RecvTimeoutError::Disconnected) => return rest,
                Err(RecvTimeoutError::Timeout) => {
                    let printed = self.printed.join("\n");
                    panic!("the child did not end within {DEADLINE:?}; it wrote:\n{printed}")
                }
            }
        }
    }
}
