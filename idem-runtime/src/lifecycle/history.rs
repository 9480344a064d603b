//! What a key's history holds, written once (the public module `history` re-exports it): the
//! events that change a record's state, who made them, and the note an operator may add. It
//! lives in the lifecycle because only a transition makes a [`Change`].

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::status::Status;

/// The longest note an entry keeps, in bytes of UTF-8.
pub const MAX_NOTE: usize = 1024;

/// The longest `by` (an owner, or an operator's `user@host`) an entry keeps, in bytes.
pub const MAX_BY: usize = 512;

/// What a reconciler learnt when it asked the vendor whether an in-doubt effect landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// An owner whose key moved on while its body ran (it was paused past its lease, and the
    /// key was taken over or settled meanwhile) finished, and its final write was refused: its
    /// effect ran after the key moved on. No change of the record; `by` is the stale owner.
    LateWriteRefused,
    /// A call of a tool that needs approval recorded its key as awaiting a person's decision
    /// (from absent, from an expired result, or from an approval that expired: the note says).
    ApprovalRequested,
    /// A person approved the key (`by` is their `user@host`); the next call runs the body.
    Approved,
    /// A person denied the key, with their note; no call runs the body.
    Denied,
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
            Event::LateWriteRefused => "late-write-refused",
            Event::ApprovalRequested => "approval-requested",
            Event::Approved => "approved",
            Event::Denied => "denied",
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

    /// Every kind of event, with each answer of a reconcile. A store that keeps an event as a
    /// number gives each its own explicit tag (the order here is no format).
    pub const ALL: [Event; 16] = [
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
        Event::LateWriteRefused,
        Event::ApprovalRequested,
        Event::Approved,
        Event::Denied,
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
/// who did it, and why. Only the lifecycle makes one (see `lifecycle/transition.rs`), so a
/// history holds only changes that a transition made; a store reads it with [`Change::event`],
/// [`Change::by`] and [`Change::note`].
///
/// Any text that reaches a change from user code (a reconciler's error, a panic message, an
/// operator's note) is made to fit as it is given: a control character is written as its escape
/// (`\n`), and text past the bound is cut at a character boundary and ends with [`TRUNCATED`].
/// A note never makes a write fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change<'a> {
    event: Event,
    by: Cow<'a, str>,
    note: Option<Cow<'a, str>>,
}

impl<'a> Change<'a> {
    /// A change `event` made by `by`, with no note.
    pub(crate) fn new(event: Event, by: &'a str) -> Change<'a> {
        Change { event, by: fit(by, MAX_BY), note: None }
    }

    /// This change with `note`.
    pub(crate) fn with_note(self, note: impl Into<Cow<'a, str>>) -> Change<'a> {
        let note = match note.into() {
            Cow::Borrowed(text) => fit(text, MAX_NOTE),
            Cow::Owned(text) => Cow::Owned(fit(&text, MAX_NOTE).into_owned()),
        };
        Change { note: Some(note), ..self }
    }

    /// This change, owning its text: for a write that outlives the call that made it.
    pub(crate) fn into_owned(self) -> Change<'static> {
        let Change { event, by, note } = self;
        Change {
            event,
            by: Cow::Owned(by.into_owned()),
            note: note.map(|n| Cow::Owned(n.into_owned())),
        }
    }

    /// What happened.
    pub fn event(&self) -> Event {
        self.event
    }

    /// Who made the change: the owner of the call, the store instance that opened the store,
    /// or an operator's `user@host`. At most [`MAX_BY`] bytes, on one line.
    pub fn by(&self) -> &str {
        &self.by
    }

    /// Why, when there is something to say: the reason a key is in doubt, an operator's note.
    /// At most [`MAX_NOTE`] bytes, on one line.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}

/// Whether `note` fits a history entry as it is (at most [`MAX_NOTE`] bytes, no control
/// character), for a front end that would rather refuse an operator's note than have it cut and
/// escaped (the `idem` command does, before it writes anything); the message names the input.
pub fn check_note(note: &str) -> Result<(), String> {
    if note.len() > MAX_NOTE {
        return Err(format!(
            "the note is {} bytes, more than the {MAX_NOTE} a history entry keeps: shorten it",
            note.len()
        ));
    }
    match note.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!(
            "the note holds the control character {c:?} (U+{:04X}); a history entry is one line \
             of text: remove it",
            c as u32
        )),
        None => Ok(()),
    }
}

/// What ends a text that was cut to fit a history entry.
pub const TRUNCATED: &str = "…(truncated)";

/// `text` as a history entry keeps it: one line of at most `max` bytes (see [`Change`]).
fn fit(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max && !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(max + 16));
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > max {
            break;
        }
    }
    if out.len() > max {
        let mut end = max - TRUNCATED.len();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str(TRUNCATED);
    }
    Cow::Owned(out)
}

/// One change in a key's history, as a store reads it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// An entry as a store reads it back from what it stored.
    pub fn new(
        at: u64,
        event: Event,
        status: Option<Status>,
        by: String,
        note: Option<String>,
    ) -> Entry {
        Entry { at, event, status, by, note }
    }

    /// The entry a store records for `change`, made at `at`, which left the record in `status`.
    pub fn of(change: &Change<'_>, status: Option<Status>, at: u64) -> Entry {
        Entry {
            at,
            event: change.event,
            status,
            by: change.by().to_owned(),
            note: change.note().map(str::to_owned),
        }
    }

    /// The state the entry left the record in, spelled as the `idem` command prints it:
    /// a status, or `absent`.
    pub fn state(&self) -> &'static str {
        self.status.map_or("absent", Status::as_str)
    }
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
    fn text_from_user_code_is_made_to_fit_never_refused() {
        let plain = Change::new(Event::InDoubt, "me").with_note("called the vendor: no charge");
        assert_eq!(plain.note(), Some("called the vendor: no charge"));
        let odd = Change::new(Event::InDoubt, "me").with_note("two\nlines\u{1b}[2J");
        assert_eq!(odd.note(), Some("two\\nlines\\u{1b}[2J"));
        let long = "é".repeat(MAX_NOTE);
        let cut = Change::new(Event::InDoubt, "me").with_note(long.as_str());
        let note = cut.note().unwrap();
        assert!(note.len() <= MAX_NOTE && note.ends_with(TRUNCATED), "{}", note.len());
        assert!(note.starts_with("éé"));
        let by = "u".repeat(MAX_BY + 1);
        assert!(Change::new(Event::Resolved, &by).by().len() <= MAX_BY);
    }
}
