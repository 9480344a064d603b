//! Test-only crash points. With the `failpoints` feature, `IDEM_FAILPOINT=<name>` makes the
//! process print `IDEM_FAILPOINT_REACHED <name>` on stdout and stop there, so that a crash test
//! can SIGKILL it at an exact point; `IDEM_PAUSE=<name>` makes it print `IDEM_PAUSED <name>` the
//! first time it gets there and go on once a line arrives on its stdin, so that a race test can
//! make another process act at that exact point. Without the feature this compiles to nothing.

#[cfg(feature = "failpoints")]
fn wanted() -> Option<&'static str> {
    use std::sync::OnceLock;
    static WANTED: OnceLock<Option<String>> = OnceLock::new();
    WANTED.get_or_init(|| std::env::var("IDEM_FAILPOINT").ok()).as_deref()
}

/// Whether the process stops at `name`: a caller that must make something durable first (so
/// that the crash finds it on disk) does so only then.
#[cfg(feature = "failpoints")]
pub(crate) fn armed(name: &str) -> bool {
    wanted() == Some(name)
}

#[cfg(feature = "failpoints")]
pub(crate) fn failpoint(name: &str) {
    use std::io::Write;
    if wanted() == Some(name) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "IDEM_FAILPOINT_REACHED {name}");
        let _ = out.flush();
        drop(out);
        loop {
            std::thread::park();
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn failpoint(_name: &str) {}

/// Pauses the process the first time it reaches `name` when `IDEM_PAUSE` names it, until a
/// line arrives on its stdin. Only the SQLite store pauses (`sqlite_read_before_probe`).
#[cfg(feature = "failpoints")]
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn pause(name: &str) {
    use std::io::{BufRead, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    static PAUSED: AtomicBool = AtomicBool::new(false);
    if std::env::var("IDEM_PAUSE").is_ok_and(|wanted| wanted == name)
        && !PAUSED.swap(true, Ordering::SeqCst)
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "IDEM_PAUSED {name}");
        let _ = out.flush();
        drop(out);
        let _ = std::io::stdin().lock().read_line(&mut String::new());
    }
}

#[cfg(not(feature = "failpoints"))]
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
#[inline(always)]
pub(crate) fn pause(_name: &str) {}
