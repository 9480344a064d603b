//! Waking the waiters of other processes: SQLite tells no one of a commit, so each writer
//! announces its settling writes itself, as PostgreSQL's writers `NOTIFY`. An instance that has
//! waiters listens on a Unix datagram socket of its own, `<store>-idem/<instance>.wake`; a
//! writer, once its change has committed, sends the key to every such socket but its own (a
//! listing of the directory, a few microseconds). The listening thread hands each key to the
//! process's [`Notifier`], whose waiters read the record again. Nothing polls; a datagram lost
//! (a listener whose queue stayed full for the send's 10 ms) is made up by the waiters' re-read
//! every [`RECHECK`](super::RECHECK).

use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::sync::Mutex;

use crate::store::access::Access;
use crate::store::notify::Notifier;

/// The cross-process announcements of one store instance.
pub(super) struct Wake {
    dir: PathBuf,
    own: PathBuf,
    notifier: crate::loom::Arc<Notifier>,
    /// Who may send to this instance's socket: whoever may open the store.
    access: Access,
    #[cfg(unix)]
    listening: Mutex<Option<imp::Listening>>,
    #[cfg(unix)]
    sender: Option<std::os::unix::net::UnixDatagram>,
}

fn socket_of(dir: &Path, instance: &str) -> PathBuf {
    let name: String = instance
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .collect();
    dir.join(format!("{name}.wake"))
}

impl Wake {
    pub(super) fn new(
        dir: &Path,
        instance: &str,
        notifier: crate::loom::Arc<Notifier>,
        access: Access,
    ) -> Wake {
        Wake {
            dir: dir.to_owned(),
            own: socket_of(dir, instance),
            notifier,
            access,
            #[cfg(unix)]
            listening: Mutex::new(None),
            #[cfg(unix)]
            sender: imp::sender(),
        }
    }

    /// Makes sure this instance hears of other processes' writes from now on: call before
    /// reading the record a waiter waits on.
    pub(super) fn listen(&self) {
        #[cfg(unix)]
        {
            let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
            if listening.is_none() {
                *listening = imp::Listening::start(
                    &self.own,
                    self.access,
                    crate::loom::Arc::clone(&self.notifier),
                );
            }
        }
    }

    /// Tells the listening instances of other processes that `key` changed: call once the
    /// change has committed.
    pub(super) fn announce(&self, key: &str) {
        #[cfg(unix)]
        if let Some(sender) = &self.sender {
            imp::announce(sender, &self.dir, &self.own, key);
        }
        #[cfg(not(unix))]
        let _ = (key, &self.dir, self.access);
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(listening) = self.listening.lock().unwrap_or_else(|e| e.into_inner()).take() {
            listening.stop(&self.own);
        }
    }
}

#[cfg(unix)]
mod imp {
    use std::io::ErrorKind;
    use std::os::unix::net::UnixDatagram;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::Duration;

    use crate::store::access::Access;
    use crate::store::notify::Notifier;

    /// A key is at most this long (idem's are 32 hex digits); a longer datagram is cut.
    const MAX_KEY: usize = 1024;

    /// How long the listener waits for a datagram before it looks whether it is to stop.
    const STOP_CHECK: Duration = Duration::from_millis(500);

    pub(super) struct Listening {
        stopping: Arc<AtomicBool>,
        thread: JoinHandle<()>,
    }

    pub(super) fn sender() -> Option<UnixDatagram> {
        let socket = UnixDatagram::unbound().ok()?;
        // A listener whose queue is full holds a writer back 10 ms at most.
        socket.set_write_timeout(Some(Duration::from_millis(10))).ok()?;
        Some(socket)
    }

    impl Listening {
        pub(super) fn start(
            path: &Path,
            access: Access,
            notifier: crate::loom::Arc<Notifier>,
        ) -> Option<Listening> {
            // A file left by a process that reused this name cannot exist (names are unique),
            // but one left by this instance's earlier listener could: bind afresh.
            let _ = std::fs::remove_file(path);
            // Bound with the umask's mode, then given the store's access: the processes that may
            // open the store may send to it (in `-idem/`, which keeps everyone else out).
            let socket = match UnixDatagram::bind(path).and_then(|socket| {
                access.give_socket(path)?;
                Ok(socket)
            }) {
                Ok(socket) => socket,
                Err(e) => {
                    let _ = std::fs::remove_file(path);
                    tracing::warn!(path = %path.display(), error = %e, "idem: cannot listen for other processes' writes; waiters look again every second");
                    return None;
                }
            };
            // Woken by `stop`'s datagram, or at the latest after this: the socket's file may be
            // gone (a tmp cleaner, a removed directory), and then no datagram reaches it.
            if let Err(e) = socket.set_read_timeout(Some(STOP_CHECK)) {
                tracing::warn!(path = %path.display(), error = %e, "idem: cannot listen for other processes' writes; waiters look again every second");
                return None;
            }
            let stopping = Arc::new(AtomicBool::new(false));
            let stop = Arc::clone(&stopping);
            let thread = std::thread::Builder::new()
                .name("idem-sqlite-wake".into())
                .spawn(move || {
                    let mut buffer = [0u8; MAX_KEY];
                    while !stop.load(Ordering::Acquire) {
                        match socket.recv(&mut buffer) {
                            Ok(n) => match std::str::from_utf8(&buffer[..n]) {
                                Ok(key) if !key.is_empty() => notifier.notify(key),
                                _ => {}
                            },
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::Interrupted
                                        | ErrorKind::WouldBlock
                                        | ErrorKind::TimedOut
                                ) => {}
                            Err(_) => break,
                        }
                    }
                })
                .ok()?;
            Some(Listening { stopping, thread })
        }

        pub(super) fn stop(self, path: &Path) {
            self.stopping.store(true, Ordering::Release);
            if let Ok(socket) = UnixDatagram::unbound() {
                let _ = socket.send_to(b"", path);
            }
            let _ = self.thread.join();
            let _ = std::fs::remove_file(path);
        }
    }

    pub(super) fn announce(sender: &UnixDatagram, dir: &Path, own: &Path, key: &str) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let listeners: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "wake") && path != own)
            .collect();
        for path in listeners {
            match sender.send_to(key.as_bytes(), &path) {
                Ok(_) => {}
                // No one listens there: its process is gone.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "idem: a listener did not take an announcement");
                }
            }
        }
    }
}
