//! Child processes for the SQLite tests that share one store between processes: each child is
//! the test binary run again with one test selected (which does nothing unless
//! [`CHILD`] names its mode), talking to the parent through its stdin and stdout.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

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
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Reads `child`'s stdout until a line holding `want`; the lines up to it.
pub fn until_line(stdout: &mut BufReader<ChildStdout>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).unwrap();
        assert!(read > 0, "the child ended before printing {want:?}; it printed {seen:?}");
        seen.push(line.trim_end().to_owned());
        if line.contains(want) {
            return seen;
        }
    }
}

/// A child started, with its stdout to read.
pub struct Running {
    pub process: Child,
    pub stdout: BufReader<ChildStdout>,
}

/// A child still running when its test ends (a failed assertion, say) is killed, so that it
/// does not hold the test's output open and hang the suite.
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

pub fn start(command: &mut Command) -> Running {
    let mut process = command.spawn().unwrap();
    let stdout = BufReader::new(process.stdout.take().unwrap());
    Running { process, stdout }
}
