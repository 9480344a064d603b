//! The table, its migration, and the statements the store runs on it (rows and records are
//! mapped in `rows.rs`).

use idem_runtime::store::Guard;
use idem_runtime::{Status, StoreError};
use tokio_postgres::types::Type;

use crate::sql::Sql;

/// The database's clock in milliseconds since the Unix epoch: each store measures its offset
/// from this machine's (`Store::clock`, re-measured at every heartbeat), and every lease and
/// history time is written on that one clock, so that processes on machines with skewed clocks
/// agree on when a lease lapses.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

pub(crate) const COLUMNS: &str =
    "key, status, tool, scope, owner, attempts, created_at, updated_at, \
                       completed_at, expires_at, lease_until, args_fingerprint, result, function";

/// Where the records live: a schema and a table name, both checked to be plain identifiers.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub(crate) schema: String,
    pub(crate) table: String,
}

/// Schema and table names are plain lower-case identifiers, short enough that the notification
/// channel derived from them stays within PostgreSQL's 63-byte limit.
pub(crate) fn check_identifier(what: &str, name: &str) -> Result<(), StoreError> {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain || name.len() > 28 {
        return Err(StoreError::new(format!(
            "the {what} name `{name}` is not usable: use 1 to 28 characters among a-z, 0-9 and _, \
             not starting with a digit"
        )));
    }
    Ok(())
}

impl Names {
    /// The table, schema-qualified and quoted.
    pub(crate) fn qualified(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// The channel every change to the table is announced on, with the key as payload: a hash
    /// of the schema and table, so that `a_b.c` and `a.b_c` do not share one. (The first
    /// release used `idem_{schema}_{table}`, from a trigger the migration now drops; processes of
    /// that release cannot share a migrated table anyway: its statuses are spelled anew.)
    pub(crate) fn channel(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{}.{}", self.schema, self.table));
        let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
        format!("idem_{hex}")
    }

    /// The table of every key's history, schema-qualified and quoted: `<table>_history`.
    pub(crate) fn history(&self) -> String {
        format!("\"{}\".\"{}_history\"", self.schema, self.table)
    }

    /// The notify function of an earlier release's triggers, schema-qualified and quoted, which
    /// the migration drops with them.
    pub(crate) fn notify_function(&self) -> String {
        format!("\"{}\".\"{}_notify\"", self.schema, self.table)
    }

    /// The statements that create the table; idempotent, and run under an
    /// advisory lock so that a fleet starting at once does not race on `CREATE … IF NOT EXISTS`.
    ///
    /// Tables of the first release spelled two statuses `in_flight` and `in_doubt`; the
    /// migration rewrites those rows and their check into the one spelling
    /// ([`Status::as_str`]), once, in the same transaction. The history table is created for
    /// a table of an earlier release too, empty: its records' earlier changes were not kept.
    pub(crate) fn migration(&self) -> String {
        let (schema, table, t) = (&self.schema, &self.table, self.qualified());
        let h = self.history();
        let function = self.notify_function();
        let (in_flight, in_doubt) = (Status::InFlight.as_str(), Status::InDoubt.as_str());
        // Every status the lifecycle spells, so that the check follows `Status::ALL`.
        let statuses: Vec<String> = Status::ALL.iter().map(|s| format!("'{s}'")).collect();
        let statuses = statuses.join(", ");
        let newest = Status::ALL[Status::ALL.len() - 1].as_str();
        format!(
            r#"
CREATE SCHEMA IF NOT EXISTS "{schema}";
CREATE TABLE IF NOT EXISTS {t} (
    key              text PRIMARY KEY,
    status           text NOT NULL
                     CONSTRAINT "{table}_status_check"
                     CHECK (status IN ({statuses})),
    tool             text NOT NULL,
    scope            text NOT NULL,
    owner            text NOT NULL,
    attempts         bigint NOT NULL,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    completed_at     bigint,
    expires_at       bigint,
    lease_until      bigint,
    args_fingerprint text NOT NULL,
    result           text,
    function         text,
    -- Set by a caller that waits for the record to change: a write that finds it set announces
    -- its change (`Statements::notify`), and one that does not announces nothing.
    waiters          boolean NOT NULL DEFAULT false
);
-- One row per change of a record, written by the statement that makes the change. `seq` orders
-- a key's rows; a purge deletes them with the record, a release keeps them.
CREATE TABLE IF NOT EXISTS {h} (
    key              text NOT NULL,
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    at               bigint NOT NULL,
    event            text NOT NULL,
    answer           text,
    status           text,
    by               text NOT NULL,
    note             text,
    PRIMARY KEY (key, seq)
);
DO $migrate$
DECLARE
    old_check text;
BEGIN
    -- Checked first: ALTER TABLE locks the table even when it has nothing to do.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = '{t}'::regclass AND attname = 'function' AND NOT attisdropped)
    THEN
        ALTER TABLE {t} ADD COLUMN function text;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = '{t}'::regclass AND attname = 'waiters' AND NOT attisdropped)
    THEN
        ALTER TABLE {t} ADD COLUMN waiters boolean NOT NULL DEFAULT false;
    END IF;
    FOR old_check IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = '{t}'::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%in\_flight%'
    LOOP
        EXECUTE format('ALTER TABLE {t} DROP CONSTRAINT %I', old_check);
        UPDATE {t} SET status = '{in_flight}' WHERE status = 'in_flight';
        UPDATE {t} SET status = '{in_doubt}' WHERE status = 'in_doubt';
        ALTER TABLE {t} ADD CONSTRAINT "{table}_status_check"
            CHECK (status IN ({statuses}));
    END LOOP;
    -- A table from before approvals checks for fewer statuses: widen its check, once (the
    -- newest status spelled is in every check written since).
    IF EXISTS (SELECT 1 FROM pg_constraint
               WHERE conrelid = '{t}'::regclass AND conname = '{table}_status_check'
                 AND pg_get_constraintdef(oid) NOT LIKE '%''{newest}''%')
    THEN
        ALTER TABLE {t} DROP CONSTRAINT "{table}_status_check";
        ALTER TABLE {t} ADD CONSTRAINT "{table}_status_check" CHECK (status IN ({statuses}));
    END IF;
    -- Earlier releases announced each change from a trigger, inside the writing transaction. A
    -- transaction that notifies holds a database-wide lock through its commit, WAL flush
    -- included, so the fleet's writes committed one at a time. The writer now announces its
    -- change after the commit (`Statements::notify`). Checked first, as above: dropping a
    -- trigger locks the table.
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{t}'::regclass
               AND tgname IN ('{table}_notify_insert_delete', '{table}_notify_update'))
    THEN
        DROP TRIGGER IF EXISTS "{table}_notify_insert_delete" ON {t};
        DROP TRIGGER IF EXISTS "{table}_notify_update" ON {t};
        DROP FUNCTION IF EXISTS {function}();
    END IF;
END
$migrate$;
"#
        )
    }
}

/// The statements of one table, built once.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) now: Sql,
    pub(crate) exists: Sql,
    pub(crate) insert: Sql,
    pub(crate) get: Sql,
    /// Key $1's record, read by a caller that waits for it to change, which marks it so that
    /// the write that changes it announces the change.
    pub(crate) watch: Sql,
    pub(crate) update: Sql,
    pub(crate) delete: Sql,
    pub(crate) purge: Sql,
    /// The history of key $1, removed while the key has no record.
    pub(crate) remove_history: Sql,
    pub(crate) history: Sql,
    /// The key's last history row: the fencing token of a write whose answer was lost.
    pub(crate) token: Sql,
    /// A history row alone, for a change of no record (`Store::append_history`).
    pub(crate) append: Sql,
    pub(crate) renew: Sql,
    pub(crate) size: Sql,
    /// Announces a change of key $2 on channel $1, to the waiters of every process, when the
    /// write found the record marked as waited for. Sent after the write, in a transaction of
    /// its own, which writes nothing and so commits without waiting for a WAL flush: the
    /// database-wide lock a notifying commit takes is held for moments, not for the write's
    /// flush.
    pub(crate) notify: Sql,
    /// The table's channel ([`Names::channel`]), the first parameter of `notify`.
    pub(crate) channel: String,
    /// `insert`, for a transactional call: the write that makes the key the transaction's also
    /// marks the transaction as the call's (`idem.call`, which ends with the transaction).
    pub(crate) call_insert: String,
    /// `update`, for a transactional call, marking the transaction so too.
    pub(crate) call_update: String,
    /// `update`, for a transactional call's result: it writes only inside the transaction the
    /// claim marked, never in one the body began after ending that one itself.
    pub(crate) call_complete: String,
    /// Key $1's record as one JSON text column, so that both drivers read it alike.
    pub(crate) call_get: String,
    /// Fails with SQLSTATE 22012 (a division by zero) unless the transaction is still the one
    /// marked for key $1: the body has not committed or rolled it back itself.
    pub(crate) call_check: String,
}

/// The SQL of a transactional call's claim, from the store's `insert` and `update`: each also
/// marks its transaction as key's, in the row it returns.
fn marking(insert: &str, update: &str) -> (String, String) {
    const MARK: &str = "set_config('idem.call', key, true)";
    let insert = match insert.rfind("RETURNING seq") {
        Some(at) => format!("{}RETURNING seq, {MARK}{}", &insert[..at], &insert[at + 13..]),
        None => insert.to_owned(),
    };
    let update = update.replace(
        "SELECT e.seq, r.waiters FROM e, r",
        "SELECT e.seq, r.waiters, set_config('idem.call', r.key, true) FROM e, r",
    );
    (insert, update)
}

/// The fence of `update`, `delete` and `purge`, the SQL form of `Guard::passes`, which
/// compares stored columns with the guard the engine gave the write and decides nothing: the
/// stored record must still be in the state the caller saw ($2 status, $3 owner, $4 attempts),
/// and, when the guard asks for it ($5 not NULL, see [`guard_param`]), its lease must have
/// lapsed at `${now}`, the writer's reading of the store's clock (`Store::clock`, the one clock
/// every lease is set and read on), a row with no lease passing only when $5 is true.
fn fence(now: u8) -> String {
    format!(
        "key = $1 AND status = $2 AND owner = $3 AND attempts = $4 \
         AND ($5 IS NULL OR lease_until <= ${now}::bigint OR (lease_until IS NULL AND $5))"
    )
}

/// A write's guard as the fence's $5: `NULL` for the fence alone, else whether a row with no
/// lease passes (`Guard::Lapsed { unleased }`).
pub(crate) fn guard_param(guard: Guard) -> Option<bool> {
    match guard {
        Guard::Lapsed { unleased } => Some(unleased),
        _ => None,
    }
}

/// The history row of a write: one `INSERT … SELECT … FROM r`, where `r` is the write's CTE,
/// so that the row is written only when the change happened. Its parameters are `$event` and
/// the three after it (event, answer, by, note), and `$now`, the writer's reading of the store's
/// clock (so that a lease is set, renewed and checked on one clock). The row's `seq` comes back:
/// the fencing token of an in-flight record's owner (the identity grows over every key, is never
/// handed out twice, and outlives a purge).
fn entry(h: &str, event: u8, status: &str, now: u8) -> String {
    format!(
        "INSERT INTO {h} (key, at, event, answer, status, by, note) \
         SELECT key, ${now}::bigint, ${event}, ${}, {status}, ${}, ${} FROM r \
         RETURNING seq",
        event + 1,
        event + 2,
        event + 3
    )
}

/// The writes of a record, each one statement: the record's change and its history row commit
/// together, in the round trip the change took before histories were kept.
struct Writes {
    insert: Sql,
    update: Sql,
    delete: Sql,
    purge: Sql,
}

const TEXT: Type = Type::TEXT;
const INT8: Type = Type::INT8;

/// The types of the fence's parameters ($1..$5: key, status, owner, attempts, the guard).
const FENCE: [Type; 5] = [TEXT, TEXT, TEXT, INT8, Type::BOOL];

/// The types of a record's columns as the insert and the update write them (status, tool,
/// scope, owner, attempts, created_at, updated_at, completed_at, expires_at, args_fingerprint,
/// result).
const RECORD: [Type; 11] = [TEXT, TEXT, TEXT, TEXT, INT8, INT8, INT8, INT8, INT8, TEXT, TEXT];

/// The types of a change's parameters (event, answer, by, note).
const CHANGE: [Type; 4] = [TEXT, TEXT, TEXT, TEXT];

/// `parts` one after the other: the types of a statement's parameters, `$1` first.
fn types(parts: &[&[Type]]) -> Vec<Type> {
    parts.concat()
}

impl Writes {
    fn new(t: &str, h: &str) -> Writes {
        Writes {
            // $13 is the record's lease_until, as the engine stamped it (NULL for a record not
            // in flight), $14 the function, $15..$18 the change (event, answer, by, note), $19
            // now.
            insert: Sql::new(
                format!(
                    "WITH r AS (INSERT INTO {t} ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
                     $8, $9, $10, $13, $11, $12, $14) ON CONFLICT (key) DO NOTHING \
                     RETURNING key, status) {}",
                    entry(h, 15, "status", 19)
                ),
                &types(&[&[TEXT], &RECORD, &[INT8, TEXT], &CHANGE, &[INT8]]),
            ),
            // $6.. are the new record; $17 its lease_until as the engine stamped it, $18 the
            // function, $19..$22 the change, $23 now. Returns the history row's `seq`, then whether a
            // caller waits for the record to change.
            update: Sql::new(
                format!(
                    "WITH r AS (UPDATE {t} SET status = $6, tool = $7, scope = $8, owner = $9, \
                     attempts = $10, created_at = $11, updated_at = $12, completed_at = $13, \
                     expires_at = $14, args_fingerprint = $15, result = $16, function = $18, \
                     lease_until = $17 \
                     WHERE {} RETURNING key, status, waiters), e AS ({}) \
                     SELECT e.seq, r.waiters FROM e, r",
                    fence(23),
                    entry(h, 19, "status", 23)
                ),
                &types(&[&FENCE, &RECORD, &[INT8, TEXT], &CHANGE, &[INT8]]),
            ),
            // $6..$9 the change, $10 now; the record is gone, so the row's state is absent. As
            // `update`, the row's `seq`, then whether a caller waited.
            delete: Sql::new(
                format!(
                    "WITH r AS (DELETE FROM {t} WHERE {} RETURNING key, waiters), e AS ({}) \
                     SELECT e.seq, r.waiters FROM e, r",
                    fence(10),
                    entry(h, 6, "NULL", 10)
                ),
                &types(&[&FENCE, &CHANGE, &[INT8]]),
            ),
            // A purge removes the history with the record, in the same statement; $6 now.
            purge: Sql::new(
                format!(
                    "WITH r AS (DELETE FROM {t} WHERE {} RETURNING key), \
                     gone AS (DELETE FROM {h} WHERE key IN (SELECT key FROM r)) \
                     SELECT count(*) FROM r",
                    fence(6)
                ),
                &types(&[&FENCE, &[INT8]]),
            ),
        }
    }
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Statements {
        let t = names.qualified();
        let h = names.history();
        let in_flight = Status::InFlight.as_str();
        let Writes { insert, update, delete, purge } = Writes::new(&t, &h);
        let (call_insert, call_update) = marking(&insert.text, &update.text);
        let call_complete = update.text.replace(
            " RETURNING key, status, waiters",
            " AND current_setting('idem.call', true) = $1 RETURNING key, status, waiters",
        );
        let of_key = |text: String| Sql::new(text, &[TEXT]);
        let bare = |text: String| Sql::new(text, &[]);
        Statements {
            now: bare(format!("SELECT {NOW_MS}")),
            exists: Sql::new(
                "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL".to_owned(),
                &[TEXT, TEXT],
            ),
            insert,
            get: of_key(format!("SELECT {COLUMNS} FROM {t} WHERE key = $1")),
            // One statement: marks the record as waited for (once: a mark already there is not
            // written again), and reads it as the mark left it, or as it is.
            watch: of_key(format!(
                "WITH u AS (UPDATE {t} SET waiters = true WHERE key = $1 AND NOT waiters \
                 RETURNING {COLUMNS}) \
                 SELECT {COLUMNS} FROM u UNION ALL \
                 SELECT {COLUMNS} FROM {t} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM u)"
            )),
            update,
            delete,
            purge,
            // One statement: a reservation committed before it keeps the history (the record
            // is there), one committed after it starts afresh, and its own row, which this
            // statement's snapshot does not see, is never deleted.
            remove_history: of_key(format!(
                "WITH gone AS (DELETE FROM {h} WHERE key = $1 \
                 AND NOT EXISTS (SELECT 1 FROM {t} WHERE key = $1) RETURNING 1) \
                 SELECT count(*) FROM gone"
            )),
            history: of_key(format!(
                "SELECT at, event, answer, status, by, note FROM {h} WHERE key = $1 ORDER BY seq"
            )),
            token: of_key(format!("SELECT max(seq) FROM {h} WHERE key = $1")),
            // $2..$5 the change, $6 now; the row's state is the record's as it stands.
            append: Sql::new(
                format!(
                    "INSERT INTO {h} (key, at, event, answer, status, by, note) \
                     SELECT $1, $6::bigint, $2, $3, (SELECT status FROM {t} WHERE key = $1), $4, $5"
                ),
                &types(&[&[TEXT], &CHANGE, &[INT8]]),
            ),
            // Renews every lease in one statement, to $4 (the engine's heartbeat reckons it on
            // the store's clock), $5 now; a lease that has already lapsed is never revived, so
            // a peer that saw it lapse may take the record over safely.
            renew: Sql::new(
                format!(
                    "UPDATE {t} AS r SET lease_until = $4::bigint \
                     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS h(key, owner, attempts) \
                     WHERE r.key = h.key AND r.owner = h.owner AND r.attempts = h.attempts \
                     AND r.status = '{in_flight}' AND r.lease_until > $5::bigint \
                     RETURNING r.key, r.owner, r.attempts"
                ),
                &[Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8_ARRAY, INT8, INT8],
            ),
            size: bare(format!("SELECT pg_total_relation_size('{t}')")),
            notify: Sql::new("SELECT pg_notify($1, $2)".to_owned(), &[TEXT, TEXT]),
            channel: names.channel(),
            call_insert,
            call_update,
            call_complete,
            call_get: format!("SELECT row_to_json(r)::text FROM {t} AS r WHERE r.key = $1"),
            call_check:
                "SELECT (1 / coalesce((current_setting('idem.call', true) = $1)::int, 0))::bigint"
                    .to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Names;

    fn names(schema: &str, table: &str) -> Names {
        Names { schema: schema.to_owned(), table: table.to_owned() }
    }

    #[test]
    fn a_transactional_claim_marks_its_transaction() {
        let statements = super::Statements::new(&names("idem", "records"));
        for marked in [&statements.call_insert, &statements.call_update] {
            assert!(marked.contains("set_config('idem.call', "), "{marked}");
        }
        assert!(statements
            .call_insert
            .ends_with("RETURNING seq, set_config('idem.call', key, true)"));
    }

    #[test]
    fn tables_whose_names_join_alike_get_distinct_channels() {
        assert_ne!(names("a_b", "c").channel(), names("a", "b_c").channel());
        assert_eq!(names("idem", "records").channel(), names("idem", "records").channel());
        assert!(names(&"s".repeat(28), &"t".repeat(28)).channel().len() <= 63);
    }
}
