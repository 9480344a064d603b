//! The server side of the admin socket: the process that holds a sled store answers the
//! [`crate::admin`] operations for the `idem` command (the protocol is in `remote/wire.rs`).
//! Each request is handed to [`Local`], the implementation the command uses on a store it
//! opens, so this file only reads, dispatches and writes.
//!
//! One thread accepts; each connection gets a thread of its own with a deadline on every read,
//! so a client that connects and sends nothing, or sends slowly, holds up no one and is dropped.
//! Connections are served in at most 16 seats (`remote/seats.rs`), and an idle client gives its
//! seat up to a new one. Handlers hold the store only while they run an operation, so closing
//! the store is never held up by an idle client.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::seats::{self, Occupant, Seats};
use super::wire::{self, Answer, Request, WireError};
use crate::admin::{Admin, Filter, Local};
use crate::admin::{RetentionReport, SizeReport};
use crate::error::Error;
use crate::key::Key;
use crate::store::Store;

/// How long a client may take to send a whole request line, and to read the answer.
const DEADLINE: Duration = Duration::from_secs(10);

/// How long a client whose seat was given to another has to take the line that says so.
const GIVEN_UP_WRITE: Duration = Duration::from_millis(100);

/// A running admin socket; dropping it stops serving and removes the socket file.
pub(crate) struct Server {
    path: PathBuf,
    /// The socket file's device and inode, so that drop removes only the file this server made.
    identity: (u64, u64),
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `store` on `<dir>/admin.sock`, replacing a socket left by a dead process: the
    /// caller holds the store's exclusive lock, so no live process can be serving it.
    /// `idem stats` reports the retention passes `retention` reads, which this process runs.
    pub(crate) fn start(
        dir: &Path,
        store: Arc<dyn Store>,
        retention: Option<RetentionReport>,
    ) -> std::io::Result<Server> {
        let path = dir.join(wire::SOCKET_FILE);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(&path)?,
            Ok(_) => {
                return Err(std::io::Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket: move it away", path.display()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        // The peer check below is what keeps other users out; the mode says the same to anyone
        // looking, and refuses them before they reach the process at all.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let meta = std::fs::metadata(&path)?;
        let identity = (meta.dev(), meta.ino());
        let (wake, woken) = UnixStream::pair()?;
        let size: SizeReport = {
            let dir = dir.to_owned();
            Arc::new(move || crate::store::sled::size_on_disk(&dir))
        };
        let thread = std::thread::Builder::new()
            .name("idem-admin".to_owned())
            .spawn(move || accept_loop(&listener, &woken, &store, retention.as_ref(), &size))?;
        Ok(Server { path, identity, wake, thread: Some(thread) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.wake.write_all(b"x");
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Waits for a connection or the wake-up, without a timeout: `poll` on both, so that dropping
/// the server stops the thread even when no client ever comes.
fn accept_loop(
    listener: &UnixListener,
    woken: &UnixStream,
    store: &Arc<dyn Store>,
    retention: Option<&RetentionReport>,
    size: &SizeReport,
) {
    let mut seats = Seats::default();
    loop {
        let mut fds = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: woken.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(error = %std::io::Error::last_os_error(), "idem: the admin socket stopped serving");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::Interrupted || e.kind() == ErrorKind::WouldBlock => {
                continue
            }
            Err(e) => {
                tracing::warn!(error = %e, "idem: the admin socket could not accept a connection");
                continue;
            }
        };
        admit(stream, store, retention, size, &mut seats);
    }
}

/// Checks who connected, then hands the connection to a thread of its own.
fn admit(
    mut stream: UnixStream,
    store: &Arc<dyn Store>,
    retention: Option<&RetentionReport>,
    size: &SizeReport,
    seats: &mut Seats,
) {
    let refuse = |stream: &mut UnixStream, message: String| {
        let _ = stream.write_all(wire::error_line(WireError::Refused { message }).as_bytes());
    };
    let _ = stream.set_write_timeout(Some(DEADLINE));
    if let Err(message) = super::peer::check_same_user(&stream) {
        tracing::warn!(%message, "idem: the admin socket refused a connection");
        return refuse(&mut stream, message);
    }
    let seat = match seats.take(&stream) {
        Ok(Some(seat)) => seat,
        Ok(None) => {
            let message = format!(
                "{} admin operations are running already; try again in a moment",
                seats::MAX
            );
            return refuse(&mut stream, message);
        }
        Err(e) => return refuse(&mut stream, format!("no seat for this connection: {e}")),
    };
    let store = Arc::downgrade(store);
    let (retention, size) = (retention.cloned(), Arc::clone(size));
    let spawned = std::thread::Builder::new()
        .name("idem-admin-conn".to_owned())
        .spawn(move || serve(stream, &store, retention, &size, &seat));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "idem: no thread for an admin connection");
    }
}

/// Answers requests on one connection until the client closes it, misbehaves, is too slow, or
/// its seat is given to another client.
fn serve(
    mut stream: UnixStream,
    store: &Weak<dyn Store>,
    retention: Option<RetentionReport>,
    size: &SizeReport,
    seat: &Occupant,
) {
    let mut pending = Vec::new();
    loop {
        // Giving the seat up ends the reads (`None`), or comes between a request read and its
        // operation (then `work` refuses it): either way the client is told, and nothing runs.
        let line = match read_line(&mut stream, &mut pending) {
            Ok(Some(line)) if seat.work() => line,
            Ok(_) if seat.given_up() => {
                let message = format!(
                    "this connection was closed to make room: {} clients were connected and \
                     this one was waiting; nothing was done; connect again",
                    seats::MAX
                );
                let _ = stream.set_write_timeout(Some(GIVEN_UP_WRITE));
                let _ =
                    stream.write_all(wire::error_line(WireError::Refused { message }).as_bytes());
                return;
            }
            Ok(_) => return,
            Err(message) => {
                let _ =
                    stream.write_all(wire::error_line(WireError::Refused { message }).as_bytes());
                return;
            }
        };
        let response = match Request::from_line(&line) {
            Err(message) => wire::error_line(WireError::Refused { message }),
            Ok(request) => match store.upgrade() {
                Some(store) => {
                    let local = Local::with_retention(store, retention.clone());
                    match perform(&mut local.with_size(Arc::clone(size)), request) {
                        Ok(value) => wire::ok_line(value),
                        Err(error) => wire::error_line(error.into()),
                    }
                }
                None => wire::error_line(WireError::Refused {
                    message: "the store is closing; run the command again".to_owned(),
                }),
            },
        };
        // Waiting from before the answer goes out: a client holding its answer is waiting for
        // nothing, and one slow to read it holds no seat against a new client.
        seat.wait();
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// The next request line (without its newline); `Ok(None)` when the client closed the
/// connection or let the deadline pass without a byte, `Err` for a line too long or too slow.
fn read_line(stream: &mut UnixStream, pending: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    let deadline = Instant::now() + DEADLINE;
    let mut buffer = [0u8; 64 * 1024];
    // Only new bytes are searched for the newline, so a long line costs its length once.
    let mut searched = 0;
    loop {
        if let Some(end) = pending[searched..].iter().position(|&b| b == b'\n') {
            let end = searched + end;
            let line = pending[..end].to_vec();
            pending.drain(..=end);
            return Ok(Some(line));
        }
        searched = pending.len();
        if pending.len() > wire::MAX_REQUEST_BYTES {
            return Err(format!(
                "the request is larger than {} bytes; nothing was done",
                wire::MAX_REQUEST_BYTES
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return match pending.is_empty() {
                true => Ok(None),
                false => Err("the request did not arrive in time; nothing was done".to_owned()),
            };
        }
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(None),
            Ok(n) => pending.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(None),
        }
    }
}

/// Runs one operation on `admin` and gives its answer as it travels.
fn perform(admin: &mut dyn Admin, request: Request) -> Result<Answer, Error> {
    let value = match request {
        Request::Ls { status, tool } => {
            wire::records_to_value(&admin.list(&Filter { status, tool })?)
        }
        Request::Scan { status, tool } => {
            wire::listing_to_value(admin.scan(&Filter { status, tool })?)
        }
        Request::Show { key } => wire::record_to_value(&admin.show(&Key::parse(&key)?)?),
        Request::History { key } => wire::entries_to_value(&admin.history(&Key::parse(&key)?)?),
        Request::Resolve { key, resolution, by, note, force } => {
            let by = by.as_deref().unwrap_or(wire::UNNAMED);
            let key = Key::parse(&key)?;
            match admin.resolve(&key, resolution.into(), by, note.as_deref(), force)? {
                Some(record) => wire::record_to_value(&record),
                None => Value::Null,
            }
        }
        Request::Purge { which, by } => {
            let by = by.as_deref().unwrap_or(wire::UNNAMED);
            return Ok(admin.purge(which.into(), by)?.into());
        }
        Request::Decide { key, decision, by, note } => {
            let key = Key::parse(&key)?;
            wire::record_to_value(&admin.decide(&key, decision.into(), &by, note.as_deref())?)
        }
        Request::Stats => serde_json::to_value(admin.stats()?).expect("stats are plain JSON"),
    };
    Ok(value.into())
}
