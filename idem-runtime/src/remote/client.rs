//! The client of the admin socket: [`Remote`].

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::Shutdown;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::wire::{self, Request, WireError};
use crate::admin::sealed::Sealed;
use crate::admin::{Admin, Filter, Listing, Purge, Purged, Stats};
use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::lifecycle::history::Entry;
use crate::lifecycle::transition::Decision;
use crate::lifecycle::{Assessment, Record, Resolution, Status};

/// A connection to the admin socket of the process that holds a sled store. Its [`Admin`]
/// operations run in that process, on [`crate::admin::Local`], and return the same values and
/// errors as on a store opened here.
#[derive(Debug)]
pub struct Remote {
    socket: PathBuf,
    stream: BufReader<UnixStream>,
    timeout: Duration,
}

/// How long a call waits for the process to take its request and to answer, by default. Long,
/// since a purge of a large store takes its time and the process answers only once it is
/// done; finite, so that a stopped or hung process fails the command instead of freezing it.
const TIMEOUT: Duration = Duration::from_secs(60);

impl Remote {
    /// Connects to the process serving the sled store in directory `store`. `Ok(None)` when no
    /// process serves it: there is no socket, one that a process left behind when it died, or
    /// a path no socket can have (too long for a Unix socket address, about 108 bytes), where no
    /// process can be listening either. Connecting, and then each operation, waits at most
    /// 60 s for the process (see [`Remote::connect_with_timeout`]).
    pub fn connect(store: impl AsRef<Path>) -> Result<Option<Remote>, Error> {
        Remote::connect_with_timeout(store, TIMEOUT)
    }

    /// As [`Remote::connect`], waiting at most `timeout` for the process to take the
    /// connection, and then for each operation (see [`Remote::set_timeout`]).
    pub fn connect_with_timeout(
        store: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<Option<Remote>, Error> {
        let socket = store.as_ref().join(wire::SOCKET_FILE);
        // The holder could not bind such a path and serves no socket (it logs a warning at
        // open); opening the store directly gives the right answer or the right error.
        if SocketAddr::from_pathname(&socket).is_err() {
            return Ok(None);
        }
        match super::connect::connect(&socket, timeout) {
            Ok(stream) => {
                let mut remote = Remote { socket, stream: BufReader::new(stream), timeout };
                remote.set_timeout(timeout);
                Ok(Some(remote))
            }
            // No socket, a stale one, or a path that is no directory: opening the store directly
            // gives the right answer or the right error.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::NotFound | ErrorKind::ConnectionRefused | ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => Err(failed(format!(
                "the process holding the store did not take a connection on its admin socket {} \
                 within {timeout:?}: it is stopped or hung. Stop that process (the command then \
                 opens the store itself), or wait for it and run the command again",
                socket.display()
            ))),
            Err(e) if e.kind() == ErrorKind::PermissionDenied => Err(failed(format!(
                "cannot connect to {}, the admin socket of the process holding the store: \
                 permission denied; run idem as the user that runs that process",
                socket.display()
            ))),
            Err(e) => Err(Error::store(
                None,
                None,
                StoreError::with_source(
                    format!(
                        "cannot connect to {}, the admin socket of the process holding the store",
                        socket.display()
                    ),
                    e,
                ),
            )),
        }
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// How long each operation may wait for the process to take its request, and then again to
    /// answer it, before it fails (60 s unless set; at least 1 ms). A process that is stopped,
    /// hung, or busy past it fails the operation with an error that names the socket, and the
    /// connection is closed.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.max(Duration::from_millis(1));
        let stream = self.stream.get_ref();
        // Only a zero duration is refused, and there is none here.
        let _ = stream.set_read_timeout(Some(self.timeout));
        let _ = stream.set_write_timeout(Some(self.timeout));
    }

    /// Sends `request` and reads its answer: the `ok` value, or the error rebuilt.
    fn call(&mut self, request: &Request) -> Result<Value, Error> {
        let mut response = self.exchange(request)?;
        match response.get_mut("ok") {
            Some(value) => Ok(value.take()),
            None => Err(failed("the admin socket answered with neither `ok` nor `error`")),
        }
    }

    /// Sends `request` and reads its answer whole (with the fields beside `ok`), or the error
    /// rebuilt.
    fn exchange(&mut self, request: &Request) -> Result<Value, Error> {
        let timeout = self.timeout;
        let broken = |e: std::io::Error| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                return failed(format!(
                    "the process holding the store did not answer on its admin socket {} within \
                     {timeout:?}: it is stopped, hung or busy with a long operation. A resolve or \
                     purge it was sent may still be under way: look with `idem show` or `idem \
                     stats` before you repeat it. If it stays silent, stop that process (the \
                     command then opens the store itself)",
                    self.socket.display()
                ));
            }
            Error::store(
                None,
                None,
                StoreError::with_source(
                    format!(
                        "the admin socket {} stopped answering (did the process holding the \
                         store exit? then run the command again)",
                        self.socket.display()
                    ),
                    e,
                ),
            )
        };
        let stream = self.stream.get_mut();
        // A server that refuses the connection (another user) answers and closes before it
        // reads: its answer is still there to read when the write fails, and says why.
        let sent = stream.write_all(request.to_line().as_bytes()).and_then(|()| stream.flush());
        let mut line = String::new();
        let read = self.stream.read_line(&mut line);
        let failure = match (sent, read) {
            (_, Ok(n)) if n > 0 => None,
            (Err(e), _) | (Ok(()), Err(e)) => Some(e),
            (Ok(()), Ok(_)) => Some(ErrorKind::UnexpectedEof.into()),
        };
        if let Some(e) = failure {
            // An answer may still come, or half of one may have: the connection can no longer
            // tell which request an answer is for, so no later call reads from it.
            let _ = self.stream.get_ref().shutdown(Shutdown::Both);
            return Err(broken(e));
        }
        let mut response: Value = serde_json::from_str(&line).map_err(|e| {
            failed(format!(
                "the admin socket {} answered with bad JSON: {e}",
                self.socket.display()
            ))
        })?;
        if let Some(error) = response.get_mut("error") {
            let error: WireError = serde_json::from_value(error.take()).map_err(|e| {
                failed(format!("the admin socket answered with an unknown error: {e}"))
            })?;
            return Err(error.into_error());
        }
        Ok(response)
    }
}

impl Sealed for Remote {}

impl Admin for Remote {
    fn scan(&mut self, filter: &Filter) -> Result<Listing, Error> {
        let value = self.call(&Request::scan(filter))?;
        wire::listing_from_value(value)
            .map_err(|e| failed(format!("the admin socket answered with a bad listing: {e}")))
    }

    fn show(&mut self, key: &Key) -> Result<Record, Error> {
        record(self.call(&Request::Show { key: key.as_str().to_owned() })?)
    }

    fn history(&mut self, key: &Key) -> Result<Vec<Entry>, Error> {
        let value = self.call(&Request::History { key: key.as_str().to_owned() })?;
        serde_json::from_value(value.clone()).map_err(|_| unexpected(&value))
    }

    fn resolve(
        &mut self,
        key: &Key,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
        force: bool,
    ) -> Result<Option<Record>, Error> {
        match self.call(&Request::resolve(key.as_str(), resolution, by, note, force))? {
            Value::Null => Ok(None),
            value => record(value).map(Some),
        }
    }

    fn decide(
        &mut self,
        key: &Key,
        decision: Decision,
        by: &str,
        note: Option<&str>,
    ) -> Result<Record, Error> {
        record(self.call(&Request::decide(key.as_str(), decision, by, note))?)
    }

    fn purge(&mut self, which: Purge, by: &str) -> Result<Purged, Error> {
        let response = self.exchange(&Request::purge(which, by))?;
        let count = |field: &str| response.get(field).and_then(Value::as_u64);
        let records = count("ok").and_then(|n| usize::try_from(n).ok());
        let records = records.ok_or_else(|| unexpected(&response))?;
        // A holder of an earlier release answers with the records alone: it purges no history
        // of a released key.
        let histories = count("histories").map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        Ok(Purged::new(records, histories))
    }

    fn stats(&mut self) -> Result<Stats, Error> {
        let value = self.call(&Request::Stats)?;
        serde_json::from_value(value.clone()).map_err(|_| unexpected(&value))
    }

    /// The process that answers holds the store, and marked every record a dead process left
    /// in flight as in doubt when it opened it: a record in flight there is its own, running.
    fn assess(&self, record: &Record) -> Assessment {
        match record.status {
            Status::InFlight => Assessment::Running,
            _ => crate::lifecycle::assess(Some(record), crate::lifecycle::now_ms(), ""),
        }
    }
}

fn record(value: Value) -> Result<Record, Error> {
    wire::record_from_value(value)
        .map_err(|e| failed(format!("the admin socket answered with a bad record: {e}")))
}

fn unexpected(value: &Value) -> Error {
    failed(format!("the admin socket answered with an unexpected value: {value}"))
}

fn failed(message: impl Into<String>) -> Error {
    Error::store(None, None, StoreError::new(message))
}
