//! What a key's history holds, written once: the events that change a record's state, who made
//! them, and the note an operator may add.
//!
//! Every write a store makes to a record carries a [`Change`] describing it, and the store
//! appends an [`Entry`] for it in the same atomic step as the record's own change (the store
//! alone cannot tell a release from a purge, or a reconcile from a resolve, from the records).
//! One event changes no record, [`Event::LateWriteRefused`]: a store appends it alone
//! (`Store::append_history`).
//! A store adds storage, never semantics: which events keep the history and which end it is
//! decided here ([`Event::ends_history`]).
//!
//! An entry never holds a tool's arguments or result: only the time, the event, the state the
//! record was left in, who made the change, and a short note.
//!
//! The types are the lifecycle's (a [`Change`] is made only by a transition); this module is
//! where users and store implementors find them.

pub use crate::lifecycle::history::{
    check_note, Answer, Change, Entry, Event, MAX_BY, MAX_NOTE, TRUNCATED,
};
