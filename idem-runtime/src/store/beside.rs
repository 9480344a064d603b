//! What the code that opened a store runs beside it: the engine's retention passes, the admin
//! socket. A store only keeps them, so that they stop before it closes; it never starts,
//! reads or decides anything about them (see the engine's `open/`).

use std::any::Any;

/// What runs beside a store, in the order it was started; dropped first to last, before the
/// rest of the store.
#[derive(Default)]
pub(crate) struct Beside(Vec<Box<dyn Any + Send + Sync>>);

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
