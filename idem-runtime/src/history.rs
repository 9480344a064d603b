//! What a key's history holds, written once: the events that change a record's state, who made
//! them, and the note an operator may add.
//!
//! Every write a store makes to a record carries a [`Change`] describing it, and the store
//! appends an [`Entry`] for it in the same atomic step as the record's own change (the store
//! alone cannot tell a release from a purge, or a reconcile from a resolve, from the records).
//! A store adds storage, never semantics: which events keep the history and which end it is
//! decided here ([`Event::ends_history`]).
//!
//! An entry never holds a tool's arguments or result: only the time, the event, the state the
//! record was left in, who made the change, and a short note.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::protocol::Status;

/// The longest note an entry keeps, in bytes of UTF-8.
pub const MAX_NOTE: usize = 1024;

/// The longest `by` (an owner, or an operator's `user@host`) an entry keeps, in bytes.
pub const MAX_BY: usize = 512;

/// What a reconciler learnt when it asked the vendor whether an in-doubt effect landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// The effect landed: the record is settled as done with the vendor's result.
    Landed,
    /// The effect did not land: the record is released, so that the call runs again.
    NotLanded,
    /// The vendor cannot tell: the record stays in doubt.
    CannotTell,
    /// Asking failed: the record stays in doubt.
    Erred,
}

impl Answer {
    /// Every answer.
    pub const ALL: [Answer; 4] =
        [Answer::Landed, Answer::NotLanded, Answer::CannotTell, Answer::Erred];

    /// The one spelling of the answer: `landed`, `not-landed`, `cannot-tell`, `erred`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Answer::Landed => "landed",
            Answer::NotLanded => "not-landed",
            Answer::CannotTell => "cannot-tell",
            Answer::Erred => "erred",
        }
    }
}

/// A change of a record's state.
///
/// Spelled in kebab-case (`took-over`, `in-doubt`) everywhere: in the stores, the `idem`
/// command and its JSON, where an entry carries the event as `"event"` and a reconcile's answer
/// as `"answer"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// A call reserved the absent key (in flight).
    Reserved,
    /// A call took an expired or in-doubt record over to run again (in flight).
    TookOver,
    /// The body returned `Ok` and its result was recorded (done).
    Done,
    /// The body returned `Err` before its effect could land: the record is deleted (absent).
    Released,
    /// The call went away before its body started: a first reservation is deleted, a takeover
    /// puts back the record it replaced.
    Undone,
    /// The effect may have landed and no one can tell (in doubt); the note says why.
    InDoubt,
    /// An operator settled an in-doubt record (done, or released).
    Resolved,
    /// A reconciler asked the vendor about an in-doubt effect, with its answer.
    Reconciled {
        /// What the vendor said.
        answer: Answer,
    },
    /// An operator removed a finished record: its history goes with it.
    Purged,
}

impl Event {
    /// The one spelling of the event's kind (without a reconcile's answer).
    pub const fn as_str(self) -> &'static str {
        match self {
            Event::Reserved => "reserved",
            Event::TookOver => "took-over",
            Event::Done => "done",
            Event::Released => "released",
            Event::Undone => "undone",
            Event::InDoubt => "in-doubt",
            Event::Resolved => "resolved",
            Event::Reconciled { .. } => "reconciled",
            Event::Purged => "purged",
        }
    }

    /// The reconcile's answer, for [`Event::Reconciled`].
    pub const fn answer(self) -> Option<Answer> {
        match self {
            Event::Reconciled { answer } => Some(answer),
            _ => None,
        }
    }

    /// Whether this change removes the key's history with the record (a purge), rather than
    /// appending to it. A release deletes the record but keeps its history, which a later
    /// reservation of the key continues.
    pub const fn ends_history(self) -> bool {
        matches!(self, Event::Purged)
    }

    /// Every kind of event, with each answer of a reconcile: for stores that keep the event as
    /// a number (the sled store stores an event as its index here: append new events, never
    /// reorder), and for tests.
    pub const ALL: [Event; 12] = [
        Event::Reserved,
        Event::TookOver,
        Event::Done,
        Event::Released,
        Event::Undone,
        Event::InDoubt,
        Event::Resolved,
        Event::Reconciled { answer: Answer::Landed },
        Event::Reconciled { answer: Answer::NotLanded },
        Event::Reconciled { answer: Answer::CannotTell },
        Event::Reconciled { answer: Answer::Erred },
        Event::Purged,
    ];

    /// The event spelled `kind` with `answer` (which only `reconciled` takes), as a store reads
    /// them back.
    pub fn from_parts(kind: &str, answer: Option<&str>) -> Option<Event> {
        Event::ALL
            .into_iter()
            .find(|event| event.as_str() == kind && event.answer().map(Answer::as_str) == answer)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.answer() {
            Some(answer) => write!(f, "{} ({})", self.as_str(), answer.as_str()),
            None => f.write_str(self.as_str()),
        }
    }
}

/// The description of a write that a store records in the key's history with it: what happened,
/// who did it, and why. Cheap to build at a call site:
///
/// ```
/// use idem_runtime::history::{Answer, Change, Event};
/// let owner = "sled:1:2:3#4";
/// let change = Change::new(Event::Reconciled { answer: Answer::Landed }, owner)
///     .note("the vendor has charge ch_1 under this key");
/// assert_eq!(change.event.as_str(), "reconciled");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change<'a> {
    /// What happened.
    pub event: Event,
    /// Who made the change: the owner of the call, the store instance that opened the store,
    /// or an operator's `user@host`.
    pub by: &'a str,
    /// Why, when there is something to say: the reason a key is in doubt, an operator's note.
    pub note: Option<&'a str>,
}

impl<'a> Change<'a> {
    /// A change `event` made by `by`, with no note.
    pub const fn new(event: Event, by: &'a str) -> Change<'a> {
        Change { event, by, note: None }
    }

    /// This change with `note`.
    pub const fn note(self, note: &'a str) -> Change<'a> {
        Change { note: Some(note), ..self }
    }

    /// Refuses what a history does not keep: a `by` or a note too long, or with control
    /// characters (an entry is printed on one line). Stores call it before they write anything;
    /// the message names the input.
    pub fn check(&self) -> Result<(), String> {
        check_text("the author of the change", self.by, MAX_BY)?;
        if let Some(note) = self.note {
            check_note(note)?;
        }
        Ok(())
    }
}

/// Refuses a note the history would not keep: longer than [`MAX_NOTE`] bytes, or holding a
/// control character (a newline, a tab, an escape sequence), since an entry prints on one line.
pub fn check_note(note: &str) -> Result<(), String> {
    check_text("the note", note, MAX_NOTE)
}

fn check_text(what: &str, text: &str, max: usize) -> Result<(), String> {
    if text.len() > max {
        return Err(format!(
            "{what} is {} bytes, more than the {max} a history entry keeps: shorten it",
            text.len()
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what} holds the control character {:?} (U+{:04X}); a history entry is one line of \
             text: remove it",
            c, c as u32
        ));
    }
    Ok(())
}

/// One change in a key's history, as a store reads it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since the Unix epoch when the change was made (the store's clock).
    pub at: u64,
    /// What happened (serialized flat: `"event"`, and `"answer"` for a reconcile).
    #[serde(flatten)]
    pub event: Event,
    /// The status the change left the record in; `None` when it deleted the record.
    pub status: Option<Status>,
    /// Who made the change.
    pub by: String,
    /// Why, when the change said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Entry {
    /// The entry a store records for `change`, made at `at`, which left the record in `status`.
    pub fn of(change: &Change<'_>, status: Option<Status>, at: u64) -> Entry {
        Entry {
            at,
            event: change.event,
            status,
            by: change.by.to_owned(),
            note: change.note.map(str::to_owned),
        }
    }

    /// The state the entry left the record in, spelled as the `idem` command prints it:
    /// a status, or `absent`.
    pub fn state(&self) -> &'static str {
        self.status.map_or("absent", Status::as_str)
    }
}

/// Who an operator is, as a history records them: `user@host`.
pub fn operator(user: &str, host: &str) -> String {
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back_from_its_parts_and_its_json() {
        for event in Event::ALL {
            let answer = event.answer().map(Answer::as_str);
            assert_eq!(Event::from_parts(event.as_str(), answer), Some(event));
            let entry = Entry::of(&Change::new(event, "me"), None, 1);
            let json = serde_json::to_value(&entry).unwrap();
            assert_eq!(json["event"], event.as_str());
            assert_eq!(serde_json::from_value::<Entry>(json).unwrap(), entry);
        }
        assert_eq!(Event::from_parts("reconciled", None), None);
        assert_eq!(Event::from_parts("done", Some("landed")), None);
    }

    #[test]
    fn only_a_purge_ends_a_history() {
        let ending: Vec<_> = Event::ALL.into_iter().filter(|e| e.ends_history()).collect();
        assert_eq!(ending, [Event::Purged]);
    }

    #[test]
    fn a_note_is_bounded_and_one_line() {
        assert!(check_note("called the vendor: no charge").is_ok());
        assert!(check_note(&"é".repeat(MAX_NOTE / 2)).is_ok());
        let long = check_note(&"x".repeat(MAX_NOTE + 1)).unwrap_err();
        assert!(long.contains("the note") && long.contains("1025 bytes"), "{long}");
        let odd = check_note("two\nlines").unwrap_err();
        assert!(odd.contains("the note") && odd.contains("U+000A"), "{odd}");
        assert!(check_note("bell\u{7}").is_err() && check_note("esc\u{1b}[2J").is_err());
        let by = Change::new(Event::Resolved, &"u".repeat(MAX_BY + 1)).check().unwrap_err();
        assert!(by.contains("author"), "{by}");
    }
}
