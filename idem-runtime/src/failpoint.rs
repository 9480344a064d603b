//! Test-only crash points. With the `failpoints` feature, `IDEM_FAILPOINT=<name>` makes the
//! process print `IDEM_FAILPOINT_REACHED <name>` on stdout and stop there, so that a crash test
//! can SIGKILL it at an exact point. Without the feature this compiles to nothing.

#[cfg(feature = "failpoints")]
pub(crate) fn failpoint(name: &str) {
    use std::io::Write;
    use std::sync::OnceLock;
    static WANTED: OnceLock<Option<String>> = OnceLock::new();
    let wanted = WANTED.get_or_init(|| std::env::var("IDEM_FAILPOINT").ok());
    if wanted.as_deref() == Some(name) {
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
