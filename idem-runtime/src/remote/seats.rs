//! The admin socket's seats: at most [`MAX`] connections are served at once, and when all are
//! taken a new client gets the seat of the one that has waited longest without an operation
//! running (between requests, or sending one slowly). So idle clients, however many and however
//! they time their requests, never lock an operator out: only running operations fill the
//! socket.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::PoisonError;
use std::time::Instant;

use crate::loom::{Arc, Mutex, MutexGuard};

/// Connections served at once, so that a runaway script cannot exhaust the agent's threads.
pub(crate) const MAX: usize = 16;

/// The seats taken, kept by the thread that accepts connections.
pub(crate) struct Seats {
    taken: Vec<Arc<Seat>>,
    max: usize,
}

/// One connection's seat, shared by its thread and [`Seats`].
pub(crate) struct Seat {
    hold: Mutex<Hold>,
}

struct Hold {
    state: State,
    /// A second handle to the connection, to end its reads when the seat is given up; dropped
    /// once the seat is given up or left, so that it never keeps the connection open.
    stream: Option<UnixStream>,
}

/// A connection's hold on its seat, owned by the connection's thread: dropping it (when the
/// thread ends, however it ends) frees the seat.
pub(crate) struct Occupant(Arc<Seat>);

#[derive(Clone, Copy)]
enum State {
    /// Waiting for the client's next request since then: the seat can be given up.
    Waiting(Instant),
    /// An operation is running: the seat is kept until it is answered.
    Working,
    /// Given to another client: the connection is told so and closed.
    GivenUp,
    /// The connection is closed.
    Left,
}

impl Default for Seats {
    fn default() -> Seats {
        Seats::with_max(MAX)
    }
}

impl Seats {
    fn with_max(max: usize) -> Seats {
        Seats { taken: Vec::new(), max }
    }

    /// A seat for the connection on `stream`, giving up the seat that has waited longest when
    /// all are taken; `None` when every seat has an operation running.
    pub(crate) fn take(&mut self, stream: &UnixStream) -> std::io::Result<Option<Occupant>> {
        self.taken.retain(|seat| seat.held());
        if self.taken.len() >= self.max {
            if !self.give_up_one() {
                return Ok(None);
            }
            self.taken.retain(|seat| seat.held());
        }
        let hold =
            Hold { state: State::Waiting(Instant::now()), stream: Some(stream.try_clone()?) };
        let seat = Arc::new(Seat { hold: Mutex::new(hold) });
        self.taken.push(Arc::clone(&seat));
        Ok(Some(Occupant(seat)))
    }

    /// Gives up the seat that has waited longest, if any is waiting.
    fn give_up_one(&self) -> bool {
        let mut waiting: Vec<(Instant, &Arc<Seat>)> = self
            .taken
            .iter()
            .filter_map(|seat| match seat.hold().state {
                State::Waiting(since) => Some((since, seat)),
                State::Working | State::GivenUp | State::Left => None,
            })
            .collect();
        waiting.sort_by_key(|(since, _)| *since);
        // A seat may have started an operation since it was looked at: then the next one.
        waiting.into_iter().any(|(_, seat)| seat.give_up())
    }
}

impl Seat {
    fn hold(&self) -> MutexGuard<'_, Hold> {
        // Each change is one assignment, so the hold is whole after any panic.
        self.hold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a connection holds the seat: it was neither given up nor left.
    fn held(&self) -> bool {
        matches!(self.hold().state, State::Waiting(_) | State::Working)
    }

    /// Gives up a waiting seat: its connection's reads end, so that its thread tells the client
    /// why and goes. `false` when an operation is running.
    fn give_up(&self) -> bool {
        let mut hold = self.hold();
        match hold.state {
            State::Waiting(_) => {
                hold.state = State::GivenUp;
                // Wakes the thread blocked reading the next request, which then sees the end.
                if let Some(stream) = hold.stream.take() {
                    let _ = stream.shutdown(Shutdown::Read);
                }
                true
            }
            State::Working | State::GivenUp | State::Left => false,
        }
    }
}

impl Occupant {
    /// Marks an operation as running; `false` when the seat was given to another client, and
    /// the request must not run.
    pub(crate) fn work(&self) -> bool {
        let mut hold = self.0.hold();
        match hold.state {
            State::Waiting(_) | State::Working => {
                hold.state = State::Working;
                true
            }
            State::GivenUp | State::Left => false,
        }
    }

    /// Marks the operation as answered: the client is waiting again.
    pub(crate) fn wait(&self) {
        let mut hold = self.0.hold();
        if let State::Working = hold.state {
            hold.state = State::Waiting(Instant::now());
        }
    }

    /// Whether the seat was given to another client.
    pub(crate) fn given_up(&self) -> bool {
        matches!(self.0.hold().state, State::GivenUp)
    }
}

impl Drop for Occupant {
    fn drop(&mut self) {
        let mut hold = self.0.hold();
        hold.state = State::Left;
        hold.stream = None;
    }
}

/// Models of the seats under loom (`cargo test -p idem-agent-runtime --features loom --lib loom_`):
/// a connection's thread runs a request while the accepting thread makes room for a new client.
/// Whatever the interleaving, no request runs on a seat that was given up, a new client always
/// finds a seat while another client waits, and no more seats are held than there are.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::thread;

    use super::*;

    fn stream() -> UnixStream {
        UnixStream::pair().expect("a socket pair").0
    }

    #[test]
    fn loom_a_request_never_runs_on_a_seat_given_up() {
        crate::loom::model(|| {
            let mut seats = Seats::with_max(2);
            let first = seats.take(&stream()).unwrap().expect("a free seat");
            let _second = seats.take(&stream()).unwrap().expect("a free seat");
            let connection = thread::spawn(move || {
                if first.work() {
                    assert!(!first.given_up(), "a request runs on a seat given up");
                    first.wait();
                }
            });
            let third = seats.take(&stream()).unwrap();
            assert!(third.is_some(), "a client waits, so a new one gets its seat");
            assert!(seats.taken.len() <= 2, "more seats held than there are");
            connection.join().unwrap();
        });
    }

    #[test]
    fn loom_a_seat_is_freed_when_its_connection_ends() {
        crate::loom::model(|| {
            let mut seats = Seats::with_max(1);
            let only = seats.take(&stream()).unwrap().expect("a free seat");
            assert!(only.work());
            let connection = thread::spawn(move || drop(only));
            // Running, then gone: refused while it runs, seated once it has left.
            let next = seats.take(&stream()).unwrap();
            connection.join().unwrap();
            let seated = next.is_some() || seats.take(&stream()).unwrap().is_some();
            assert!(seated, "a seat whose connection ended is free again");
        });
    }
}
