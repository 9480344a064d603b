//! Who holds a record, written once: the owner string a call writes into the records it
//! reserves or takes over, the instance string a store opens with, and the `user@host` an
//! operator's change is recorded as.
//!
//! An instance is `<kind>:<host>:<pid>:<n>:<random>`: the kind of store (`sled`, `pg`, …), the
//! machine and process that opened it, the how-many-th store this process opened, and 32 random
//! bits (two machines may share a host name, and a pid is reused). An owner is
//! `<instance>#<call>`, so that the fence tells two calls of one process apart.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Who holds a record: the store instance that reserved or took it over, and which of that
/// instance's calls did (`<instance>#<call>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Owner(String);

static CALL_SEQ: AtomicU64 = AtomicU64::new(0);
static INSTANCE_SEQ: AtomicU64 = AtomicU64::new(0);

impl Owner {
    /// A new call of the store instance `instance`, numbered apart from every other call of
    /// this process.
    pub(crate) fn new_call(instance: &str) -> Owner {
        Owner(format!("{instance}#{}", CALL_SEQ.fetch_add(1, Ordering::Relaxed)))
    }

    /// The store instance this owner is a call of: the text before `#` (all of it when there
    /// is no call number).
    pub fn instance(&self) -> &str {
        instance_of(&self.0)
    }

    /// Whether this owner is a call of the store instance `instance`.
    pub fn is_of(&self, instance: &str) -> bool {
        self.instance() == instance
    }

    /// The owner as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Owner {
    /// An owner as stored; any text reads (an owner written by hand has no call number).
    fn from(text: &str) -> Owner {
        Owner(text.to_owned())
    }
}

impl From<String> for Owner {
    fn from(text: String) -> Owner {
        Owner(text)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What this machine can tell of the process behind an owner.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// A process with the owner's pid runs on this host: the owner may still be running its
    /// body (stopped, or slow), or its pid was reused.
    Alive {
        /// The owner's process id.
        pid: u32,
    },
    /// No process has the owner's pid on this host: the owner is gone.
    Gone {
        /// The owner's process id.
        pid: u32,
    },
    /// The owner ran on another host, which this machine cannot look into.
    Elsewhere {
        /// The owner's host name.
        host: String,
    },
    /// The owner string names no host and process (written by an earlier idem, or by hand).
    Unknown,
}

impl Owner {
    /// The host and process id the owner's instance names
    /// (`<kind>:<host>:<pid>:<n>:<random>`), if it names them.
    pub fn process(&self) -> Option<(&str, u32)> {
        let mut parts = self.instance().split(':');
        let (_kind, host, pid) = (parts.next()?, parts.next()?, parts.next()?);
        let (_n, _random) = (parts.next()?, parts.next()?);
        Some((host, pid.parse().ok()?))
    }

    /// What this machine can tell of the owner's process.
    pub fn liveness(&self) -> Liveness {
        match self.process() {
            None => Liveness::Unknown,
            Some((host, _)) if host != host_name() => Liveness::Elsewhere { host: host.to_owned() },
            Some((_, pid)) if process_exists(pid) => Liveness::Alive { pid },
            Some((_, pid)) => Liveness::Gone { pid },
        }
    }
}

/// Whether a process `pid` exists on this host (a signal 0 reaches it, or is refused for want
/// of permission, which also means it exists).
#[cfg(unix)]
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let sent = unsafe { libc::kill(pid, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Off Unix nothing is looked into: a process is taken to exist, the cautious answer.
#[cfg(not(unix))]
fn process_exists(_pid: u32) -> bool {
    true
}

/// The store instance the owner string `owner` is a call of.
pub(crate) fn instance_of(owner: &str) -> &str {
    owner.split_once('#').map_or(owner, |(instance, _)| instance)
}

/// The longest kind [`new_instance`] is given that [`MAX_OWNER`] leaves room for.
pub(crate) const MAX_KIND: usize = 16;

/// The longest owner a call writes: the kind (at most [`MAX_KIND`] bytes), the host name (at
/// most 200, see [`host_name`]), the pid (a u32), the instance's and the call's numbers (u64
/// each), 8 hex digits and five separators. A store whose records are bounded in size reserves
/// this much for the owner of any later write of a call, whichever instance takes it over.
pub(crate) const MAX_OWNER: usize = MAX_KIND + 200 + 10 + 20 + 8 + 20 + 5;

/// The longest instance whose calls' owners stay within [`MAX_OWNER`] (the `#` and a u64 call
/// number take the rest).
pub(crate) const MAX_INSTANCE: usize = MAX_OWNER - 1 - 20;

/// A new store instance's id, of `kind` (`sled`, `pg`): unique across processes and machines.
/// Each store makes one as it opens (`store::Instance::new`), and its calls write it into every
/// record they own.
pub(crate) fn new_instance(kind: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!(
        "{kind}:{}:{}:{}:{:08x}",
        host_name(),
        std::process::id(),
        INSTANCE_SEQ.fetch_add(1, Ordering::Relaxed),
        random.finish() as u32
    )
}

/// This machine's host name, read once; `host` when none can be found. Kept to letters, digits,
/// `.`, `-` and `_`, since it goes into owner strings (split on `:` and `#`) and one-line
/// history entries.
pub fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let found = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        let tidy: String = found
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .take(200)
            .collect();
        if tidy.is_empty() {
            "host".to_owned()
        } else {
            tidy
        }
    })
}

/// Who an operator is, as a history records them: `user@host`, with `user` kept to one line of
/// at most 200 characters.
pub fn operator(user: &str) -> String {
    let user: String = user.trim().chars().filter(|c| !c.is_control()).take(200).collect();
    format!("{user}@{}", host_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_a_call_of_one_instance() {
        let instance = new_instance("sled");
        let a = Owner::new_call(&instance);
        let b = Owner::new_call(&instance);
        assert_ne!(a, b, "two calls of one instance are told apart");
        assert!(a.is_of(&instance) && !a.is_of("sled:1:2"));
        assert_eq!(Owner::from("pg:host:1:2:ab").instance(), "pg:host:1:2:ab");
    }

    #[test]
    fn instances_are_unique_and_name_their_kind_host_and_process() {
        let (a, b) = (new_instance("pg"), new_instance("pg"));
        assert_ne!(a, b);
        let parts: Vec<&str> = a.split(':').collect();
        assert_eq!(parts.len(), 5, "{a}");
        assert_eq!((parts[0], parts[1]), ("pg", host_name()));
        assert_eq!(parts[2], std::process::id().to_string());
        assert!(!a.contains('#'));
    }

    #[test]
    fn an_owner_names_its_host_and_process_and_this_machine_looks_it_up() {
        let me = Owner::new_call(&new_instance("pg"));
        assert_eq!(me.process(), Some((host_name(), std::process::id())));
        assert_eq!(me.liveness(), Liveness::Alive { pid: std::process::id() });
        let gone = Owner::from(format!("pg:{}:{}:0:00000000#1", host_name(), i32::MAX as u32));
        assert_eq!(gone.liveness(), Liveness::Gone { pid: i32::MAX as u32 });
        let far = Owner::from("pg:another-host:1:0:00000000#1");
        assert_eq!(far.liveness(), Liveness::Elsewhere { host: "another-host".into() });
        assert_eq!(Owner::from("sled:1:2:3#4").liveness(), Liveness::Unknown);
    }

    #[test]
    fn the_longest_instance_and_owner_fit_their_bounds() {
        let kind = "k".repeat(MAX_KIND);
        let host = "h".repeat(200);
        let instance = format!("{kind}:{host}:{}:{}:{:08x}", u32::MAX, u64::MAX, u32::MAX);
        assert_eq!(instance.len(), MAX_INSTANCE);
        assert_eq!(format!("{instance}#{}", u64::MAX).len(), MAX_OWNER);
        assert!(Owner::new_call(&new_instance("sled")).as_str().len() <= MAX_OWNER);
    }

    #[test]
    fn an_operator_is_one_line() {
        let by = operator("ann\nsmith");
        assert_eq!(by, format!("annsmith@{}", host_name()));
    }
}
