//! What the code that opened a store runs beside it: the engine's retention passes, the admin
//! socket. A store only keeps them, so that they stop before it closes; it never starts,
//! reads or decides anything about them (see the engine's `open/`).

use std::any::Any;

/// What runs beside a store, in the order it was started; dropped first to last, before the
/// rest of the store. A backend outside this crate (PostgreSQL) gets one from the engine's
/// opener, `Beside::start`, and keeps it as its store's first field, so that it drops first.
#[derive(Default)]
pub struct Beside(Vec<Box<dyn Any + Send + Sync>>);

impl std::fmt::Debug for Beside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beside").field("running", &self.0.len()).finish()
    }
}

impl Beside {
    /// Keeps `running` until the store closes.
    pub(crate) fn keep(&mut self, running: impl Any + Send + Sync) {
        self.0.push(Box::new(running));
    }

    /// The first thing of type `T` kept here, for the opener that kept it.
    pub(crate) fn find<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|running| running.downcast_ref())
    }
}
