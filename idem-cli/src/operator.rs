//! Who runs the command, as a key's history records an operator: `user@host`.

/// The operator's `user@host`: the login name (`$USER`, else `$LOGNAME`, else the numeric uid)
/// and the host name. The history keeps it with every resolve and purge.
pub(crate) fn operator() -> String {
    let user = ["USER", "LOGNAME"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        .or_else(uid)
        .unwrap_or_else(|| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    // An entry is one line of bounded text; a name that is not is kept legible and short.
    let tidy =
        |text: &str| -> String { text.chars().filter(|c| !c.is_control()).take(200).collect() };
    idem_runtime::history::operator(&tidy(user.trim()), &tidy(&host))
}

#[cfg(unix)]
fn uid() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // The owner of a file this process just made would need a write; /proc/self is owned by
    // the process's user.
    std::fs::metadata("/proc/self").ok().map(|m| format!("uid {}", m.uid()))
}

#[cfg(not(unix))]
fn uid() -> Option<String> {
    None
}
