//! The admin socket's seats: at most [`MAX`] connections are served at once, and when all are
//! taken a new client gets the seat of the one that has waited longest without an operation
//! running (between requests, or sending one slowly). So idle clients, however many and however
//! they time their requests, never lock an operator out: only running operations fill the
//! socket.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

/// Connections served at once, so that a runaway script cannot exhaust the agent's threads.
pub(crate) const MAX: usize = 16;

/// The seats taken, kept by the thread that accepts connections.
#[derive(Default)]
pub(crate) struct Seats {
    taken: Vec<Weak<Seat>>,
}

/// One connection's seat, shared by its thread and [`Seats`].
pub(crate) struct Seat {
    state: Mutex<State>,
    /// A second handle to the connection, to end its reads when the seat is given up.
    stream: UnixStream,
}

#[derive(Clone, Copy)]
enum State {
    /// Waiting for the client's next request since then: the seat can be given up.
    Waiting(Instant),
    /// An operation is running: the seat is kept until it is answered.
    Working,
    /// Given to another client: the connection is told so and closed.
    GivenUp,
}

impl Seats {
    /// A seat for the connection on `stream`, giving up the seat that has waited longest when
    /// all are taken; `None` when every seat has an operation running.
    pub(crate) fn take(&mut self, stream: &UnixStream) -> std::io::Result<Option<Arc<Seat>>> {
        self.taken.retain(|seat| seat.upgrade().is_some_and(|seat| !seat.given_up()));
        if self.taken.len() >= MAX && !self.give_up_one() {
            return Ok(None);
        }
        let seat = Arc::new(Seat {
            state: Mutex::new(State::Waiting(Instant::now())),
            stream: stream.try_clone()?,
        });
        self.taken.push(Arc::downgrade(&seat));
        Ok(Some(seat))
    }

    /// Gives up the seat that has waited longest, if any is waiting.
    fn give_up_one(&mut self) -> bool {
        let mut waiting: Vec<(Instant, Arc<Seat>)> = self
            .taken
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|seat| match *seat.state() {
                State::Waiting(since) => Some((since, Arc::clone(&seat))),
                State::Working | State::GivenUp => None,
            })
            .collect();
        waiting.sort_by_key(|(since, _)| *since);
        // A seat may have started an operation since it was looked at: then the next one.
        waiting.into_iter().any(|(_, seat)| seat.give_up())
    }
}

impl Seat {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is one enum, whole after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks an operation as running; `false` when the seat was given to another client, and
    /// the request must not run.
    pub(crate) fn work(&self) -> bool {
        let mut state = self.state();
        match *state {
            State::GivenUp => false,
            State::Waiting(_) | State::Working => {
                *state = State::Working;
                true
            }
        }
    }

    /// Marks the operation as answered: the client is waiting again.
    pub(crate) fn wait(&self) {
        let mut state = self.state();
        if let State::Working = *state {
            *state = State::Waiting(Instant::now());
        }
    }

    /// Whether the seat was given to another client.
    pub(crate) fn given_up(&self) -> bool {
        matches!(*self.state(), State::GivenUp)
    }

    /// Gives up a waiting seat: its connection's reads end, so that its thread tells the client
    /// why and goes. `false` when an operation is running.
    fn give_up(&self) -> bool {
        let mut state = self.state();
        match *state {
            State::Waiting(_) => {
                *state = State::GivenUp;
                // Wakes the thread blocked reading the next request, which then sees the end.
                let _ = self.stream.shutdown(Shutdown::Read);
                true
            }
            State::Working | State::GivenUp => false,
        }
    }
}
