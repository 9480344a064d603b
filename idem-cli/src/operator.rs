//! Who runs the command, as a key's history records an operator: `user@host`.

/// The operator's `user@host`: the login name (`$USER`, else `$LOGNAME`, else the numeric uid)
/// and the host name (`idem_runtime::admin::operator`). The history keeps it with every resolve and
/// purge.
pub(crate) fn operator() -> String {
    let user = ["USER", "LOGNAME"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        .or_else(uid)
        .unwrap_or_else(|| "unknown".to_owned());
    idem_runtime::admin::operator(&user)
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
