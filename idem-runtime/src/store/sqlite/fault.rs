//! What a failure of SQLite means to the caller, in words that say what to do. A write that
//! fails leaves nothing of itself: its savepoint, or its whole transaction, is rolled back.

use rusqlite::ErrorCode;

use crate::error::StoreError;

/// The error of `doing` (such as "cannot write key K") on the store `what` names, for `error`.
/// A store that another writer keeps locked past the bounded wait is retryable; a full disk, a
/// read-only file and a damaged one stay until someone acts.
pub(super) fn store_error(what: &str, doing: &str, error: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::ToSqlConversionFailure(inner) = error {
        return match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => StoreError::new(format!("{doing} in {what}: {other}")),
        };
    }
    let (message, lasting) = describe(what, doing, &error);
    finish(StoreError::with_source(message, error), lasting)
}

/// [`store_error`] for an error the caller shares with others (the commit of a group of
/// writes, or a transaction that did not begin): its text is in the message.
pub(super) fn shared_error(what: &str, doing: &str, error: &rusqlite::Error) -> StoreError {
    let (message, lasting) = describe(what, doing, error);
    finish(StoreError::new(format!("{message}: {error}")), lasting)
}

/// Whether SQLite's answer behind `error` was `SQLITE_BUSY` (or `SQLITE_LOCKED`).
pub(super) fn is_busy(error: &StoreError) -> bool {
    let code = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<rusqlite::Error>())
        .and_then(rusqlite::Error::sqlite_error_code);
    matches!(code, Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

fn finish(error: StoreError, lasting: bool) -> StoreError {
    if lasting {
        error.lasting()
    } else {
        error
    }
}

/// The message for `error`, and whether it lasts until someone acts.
fn describe(what: &str, doing: &str, error: &rusqlite::Error) -> (String, bool) {
    let code = error.sqlite_error_code();
    let advice = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            return (
                format!(
                    "{doing}: {what} stayed locked by another writer for the whole busy \
                     timeout; nothing was written: try again (raise \
                     SqliteStoreBuilder::busy_timeout if other processes hold it that long)"
                ),
                false,
            )
        }
        Some(ErrorCode::DiskFull) => {
            "the disk is full; nothing was written: free space, then call again"
        }
        Some(ErrorCode::ReadOnly) => {
            "the file or its directory is read-only: give this process write access to both \
             (SQLite writes the -wal and -shm files beside it)"
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            "the file is not an SQLite database, or it is damaged: move it aside and name \
             another file"
        }
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            "the file cannot be opened: check that its directory exists and that this process \
             may read and write both"
        }
        _ => "",
    };
    let lasting = matches!(
        code,
        Some(
            ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::NotADatabase
                | ErrorCode::DatabaseCorrupt
                | ErrorCode::CannotOpen
                | ErrorCode::PermissionDenied
        )
    );
    let message = if advice.is_empty() {
        format!("{doing} in {what}")
    } else {
        format!("{doing} in {what}: {advice}")
    };
    (message, lasting)
}

/// The error of opening the store `what` names.
pub(super) fn open_error(what: &str, error: rusqlite::Error) -> StoreError {
    store_error(what, "cannot open", error)
}
