//! One function per command. Usage is checked before the store is opened, so that a typo is
//! reported as such even when the store is missing or held.

use std::io::Write;
use std::time::Duration;

use idem_runtime::admin::{Admin, Decision, Filter, Purge, Resolution};
use idem_runtime::history::{check_note, Entry};
use idem_runtime::retention::RetentionStatus;
use idem_runtime::store::{now_ms, Assessment, Liveness};
use idem_runtime::{Error, Key, Record, Status};

use crate::cli::{Cli, Command};
use crate::failure::Failure;
use crate::operator::operator;
use crate::output::{age, cell, size, table, timestamp};
use crate::{args, mcp_proxy, store};

type Out<'a> = &'a mut dyn Write;

pub(crate) fn run(cli: Cli, out: Out<'_>) -> Result<(), Failure> {
    let location = cli.store.as_deref();
    match cli.command {
        Command::Key { tool, scope, args, flatten, ignore, json } => {
            let flattened = flatten.then_some(ignore.as_slice());
            key(&tool, &scope, &args, flattened, json, out)
        }
        Command::Ls { status, tool, json } => {
            ls(store::open(location)?.as_mut(), filter(status, tool), json, out)
        }
        Command::Show { key, json } => {
            let key = Key::parse(&key)?;
            show(store::open(location)?.as_mut(), &key, json, out)
        }
        Command::Resolve { key, release, done, note, force } => {
            let key = Key::parse(&key)?;
            if let Some(note) = &note {
                check_note(note).map_err(|why| Failure::usage(format!("--note: {why}")))?;
            }
            let resolution = match (release, done) {
                (true, None) => Resolution::Release,
                (false, Some(result)) => Resolution::Done(
                    serde_json::from_str(&result)
                        .map_err(|e| Failure::usage(format!("--done is not valid JSON: {e}; quote a string result, as in --done '\"ch_1\"'")))?,
                ),
                _ => return Err(Failure::usage("give exactly one of --release and --done JSON")),
            };
            let mut admin = store::open(location)?;
            resolve(admin.as_mut(), &key, resolution, note.as_deref(), force, out)
        }
        Command::Approve { key, note } => {
            decide(location, &key, Decision::Approve, note.as_deref(), out)
        }
        Command::Deny { key, note } => decide(location, &key, Decision::Deny, Some(&note), out),
        Command::Purge { older_than, expired } => {
            let which = match (older_than, expired) {
                (Some(age), false) => Purge::OlderThan(age),
                (None, true) => Purge::Expired,
                _ => {
                    return Err(Failure::usage(
                        "give exactly one of --older-than DURATION and --expired",
                    ))
                }
            };
            purge(store::open(location)?.as_mut(), which, out)
        }
        Command::Stats { json } => stats(store::open(location)?.as_mut(), json, out),
        Command::McpProxy { config, check, upstream, command } => {
            mcp_proxy::run(location, &config, check, upstream, command, out)
        }
    }
}

fn write_failed(e: std::io::Error) -> Failure {
    Failure::failed(format!("cannot write the output: {e}"))
}

/// `flattened` holds the ignored fields when the arguments are a flattened tool's object.
fn key(
    tool: &str,
    scope: &str,
    args: &str,
    flattened: Option<&[String]>,
    json: bool,
    out: Out<'_>,
) -> Result<(), Failure> {
    let args = args::parse_args(args).map_err(Failure::usage)?;
    // A flattened tool's key is over its argument object, by the rule `Args::flatten` keeps.
    let canonical = match flattened {
        Some(ignore) => idem_runtime::Args::new(tool)
            .flatten("arguments", &args)
            .map(|object| object.ignoring(ignore).canonical()),
        None => idem_runtime::canonical_json(&args),
    };
    let canonical = canonical.map_err(|e| match e {
        Error::Key { reason, .. } => {
            Failure::usage(format!("--args has no canonical JSON: {reason}"))
        }
        other => other.into(),
    })?;
    let key = Key::derive_canonical(tool, scope, &canonical);
    if json {
        let line = serde_json::json!({
            "key": key.as_str(),
            "tool": tool,
            "scope": scope,
            "canonical": canonical,
        });
        writeln!(out, "{line}").map_err(write_failed)
    } else {
        writeln!(out, "{key}").map_err(write_failed)
    }
}

/// Lists what reads; a record that does not is reported after the rest, and the command then
/// fails, so that a script notices.
/// The filter of `idem ls --status … --tool …`.
fn filter(status: Option<Status>, tool: Option<String>) -> Filter {
    let mut filter = Filter::new();
    filter.status = status;
    filter.tool = tool;
    filter
}

fn ls(admin: &mut dyn Admin, filter: Filter, json: bool, out: Out<'_>) -> Result<(), Failure> {
    let listing = admin.scan(&filter)?;
    let mut unreadable: Vec<String> = listing.unreadable.iter().map(Error::to_string).collect();
    if json {
        for record in &listing.records {
            match serde_json::to_string(record) {
                Ok(line) => writeln!(out, "{line}").map_err(write_failed)?,
                Err(e) => unreadable.push(format!(
                    "key {}: its record cannot be written as JSON ({e}); inspect it with `idem \
                     show {}`",
                    record.key, record.key
                )),
            }
        }
    } else if listing.records.is_empty() && unreadable.is_empty() {
        writeln!(out, "no records").map_err(write_failed)?;
    } else {
        ls_table(&listing.records, out)?;
    }
    match unreadable.len() {
        0 => Ok(()),
        n => Err(Failure::failed(format!(
            "{n} record(s) could not be listed (the others were): {}",
            unreadable.join("; ")
        ))),
    }
}

fn ls_table(records: &[Record], out: Out<'_>) -> Result<(), Failure> {
    let now = now_ms();
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.key.clone(),
                cell(&r.tool),
                cell(&r.scope),
                r.status.to_string(),
                r.attempts.to_string(),
                age(now, r.created_at),
            ]
        })
        .collect();
    let text = table(&["KEY", "TOOL", "SCOPE", "STATUS", "ATTEMPTS", "AGE"], &rows);
    out.write_all(text.as_bytes()).map_err(write_failed)
}

/// The record and its history; a key with no record but a history (released) prints the
/// history, and one with neither is not found.
fn show(admin: &mut dyn Admin, key: &Key, json: bool, out: Out<'_>) -> Result<(), Failure> {
    let record = match admin.show(key) {
        Ok(record) => Some(record),
        Err(Error::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let history = admin.history(key)?;
    let Some(record) = record else {
        if history.is_empty() {
            return Err(Error::NotFound { key: key.to_string() }.into());
        }
        return show_absent(key, &history, json, out);
    };
    if json {
        let mut value =
            serde_json::to_value(&record).map_err(|e| Failure::failed(e.to_string()))?;
        value["history"] = serde_json::to_value(&history).expect("an entry is plain JSON");
        return writeln!(out, "{value}").map_err(write_failed);
    }
    let now = now_ms();
    let assessment = admin.assess(&record);
    let mut text = describe(&record, assessment, now);
    text.push_str(&describe_history(&history, now));
    out.write_all(text.as_bytes()).map_err(write_failed)
}

/// A key whose record is gone (released) but whose history is kept.
fn show_absent(key: &Key, history: &[Entry], json: bool, out: Out<'_>) -> Result<(), Failure> {
    if json {
        let line = serde_json::json!({ "key": key.as_str(), "status": null, "history": history });
        return writeln!(out, "{line}").map_err(write_failed);
    }
    let text = format!(
        "key     {key}\nstatus  absent (no record: the next call runs the body)\n{}",
        describe_history(history, now_ms())
    );
    out.write_all(text.as_bytes()).map_err(write_failed)
}

/// The history for people: one change per line, oldest first.
fn describe_history(history: &[Entry], now: u64) -> String {
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|entry| {
            vec![
                format!("{} ({} ago)", timestamp(entry.at), age(now, entry.at)),
                entry.event.to_string(),
                entry.state().to_owned(),
                cell(&entry.by),
                entry.note.as_deref().map_or_else(|| "-".to_owned(), cell),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "\nhistory: none kept (written before histories were kept)\n".to_owned();
    }
    format!("\nhistory\n{}", table(&["WHEN", "EVENT", "STATE", "BY", "NOTE"], &rows))
}

/// A record for people: one field per line, times with their age.
fn describe(record: &Record, assessment: Assessment, now: u64) -> String {
    let when = |ms: u64| format!("{} ({} ago)", timestamp(ms), age(now, ms));
    let mut rows = vec![
        ("key", record.key.clone()),
        ("status", status_text(record, assessment)),
        ("tool", cell(&record.tool)),
        ("function", record.function.as_deref().map_or_else(|| "-".to_owned(), cell)),
        ("scope", cell(&record.scope)),
        ("attempts", record.attempts.to_string()),
        ("owner", record.owner.to_string()),
        ("created", when(record.created_at)),
        ("updated", when(record.updated_at)),
        ("completed", record.completed_at.map_or_else(|| "-".to_owned(), when)),
        (
            "expires",
            match record.expires_at {
                Some(at) if at <= now => format!("{} (expired)", timestamp(at)),
                Some(at) => timestamp(at),
                None => "never (kept until purged)".to_owned(),
            },
        ),
    ];
    if let Some(lease) = record.lease_until {
        let left = match lease.checked_sub(now) {
            Some(left) if left > 0 => format!("holds for {}", age(left, 0)),
            _ => format!("ran out {} ago", age(now, lease)),
        };
        rows.push(("lease until", format!("{} ({left})", timestamp(lease))));
    }
    if record.status == Status::InFlight {
        rows.push(("owner process", owner_process(&record.owner.liveness())));
    }
    rows.push((
        "result",
        record.result.as_ref().map_or_else(|| "-".to_owned(), |result| result.to_string()),
    ));
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    rows.iter().map(|(name, value)| format!("{name:<width$}  {value}\n")).collect()
}

/// The status, with what a call would make of it where the status alone does not say.
/// What this machine can tell of an in-flight record's owner process, for `idem show`.
fn owner_process(liveness: &Liveness) -> String {
    match liveness {
        Liveness::Alive { pid } => format!("{pid}, still running on this host"),
        Liveness::Gone { pid } => format!("{pid}, gone from this host"),
        Liveness::Elsewhere { host } => format!("on host {host}, which this machine cannot see"),
        _ => "unknown (the owner names no process)".to_owned(),
    }
}

fn status_text(record: &Record, assessment: Assessment) -> String {
    match (record.status, assessment) {
        (Status::InFlight, Assessment::InDoubt)
            if matches!(record.owner.liveness(), Liveness::Alive { .. }) =>
        {
            format!(
                "{} (its lease ran out, but its owner's process still runs on this host: it may \
                 be stopped or slow; `idem resolve` settles it only with --force)",
                record.status
            )
        }
        (Status::InFlight, Assessment::InDoubt) => {
            format!(
                "{} (its owner is gone, so it is in doubt: settle it with `idem resolve`)",
                record.status
            )
        }
        (Status::Done, Assessment::Expired) => {
            format!("{} (expired: the next call runs the body again)", record.status)
        }
        (Status::AwaitingApproval, _) => format!(
            "{} (nothing ran: `idem approve {}` or `idem deny {} --note …`)",
            record.status, record.key, record.key
        ),
        (Status::Approved, _) => {
            format!("{} (the next call with these arguments runs it once)", record.status)
        }
        _ => record.status.to_string(),
    }
}

fn resolve(
    admin: &mut dyn Admin,
    key: &Key,
    resolution: Resolution,
    note: Option<&str>,
    force: bool,
    out: Out<'_>,
) -> Result<(), Failure> {
    match admin.resolve(key, resolution, &operator(), note, force)? {
        None => writeln!(out, "released {key}: the next call runs the body"),
        Some(record) => {
            let result = record.result.map_or_else(|| "null".to_owned(), |r| r.to_string());
            writeln!(out, "settled {key} as done: later calls replay {result}")
        }
    }
    .map_err(write_failed)
}

/// `idem approve` and `idem deny`: usage is checked before the store is opened.
fn decide(
    location: Option<&std::ffi::OsStr>,
    key: &str,
    decision: Decision,
    note: Option<&str>,
    out: Out<'_>,
) -> Result<(), Failure> {
    let key = Key::parse(key)?;
    if let Some(note) = note {
        check_note(note).map_err(|why| Failure::usage(format!("--note: {why}")))?;
    }
    let record = store::open(location)?.decide(&key, decision, &operator(), note)?;
    let (tool, scope) = (&record.tool, &record.scope);
    match decision {
        Decision::Approve => writeln!(
            out,
            "approved {key} (tool `{tool}`, scope `{scope}`): the next call with these arguments \
             runs it once"
        ),
        _ => writeln!(
            out,
            "denied {key} (tool `{tool}`, scope `{scope}`): every call with these arguments is \
             refused with your note"
        ),
    }
    .map_err(write_failed)
}

fn purge(admin: &mut dyn Admin, which: Purge, out: Out<'_>) -> Result<(), Failure> {
    let purged = admin.purge(which, &operator())?;
    let plural = |n: usize, one: &'static str, many: &'static str| if n == 1 { one } else { many };
    let (records, histories) = (purged.records, purged.histories);
    let noun = plural(records, "record", "records");
    let text = match which {
        Purge::Expired => format!("removed {records} done {noun} (expired)\n"),
        Purge::OlderThan(age) => {
            let age = human_duration(age);
            let histories_noun = plural(histories, "history", "histories");
            format!(
                "removed {records} done {noun} (finished more than {age} ago)\n\
                 removed {histories} {histories_noun} of released keys (last changed more than \
                 {age} ago)\n"
            )
        }
        // A kind of purge this command does not know: say what was removed, plainly.
        _ => format!("removed {records} done {noun}\n"),
    };
    out.write_all(text.as_bytes()).map_err(write_failed)
}

fn human_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        ms if ms % 86_400_000 == 0 && ms > 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 && ms > 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 && ms > 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

fn stats(admin: &mut dyn Admin, json: bool, out: Out<'_>) -> Result<(), Failure> {
    let stats = admin.stats()?;
    let count = |status: Status| stats.by_status.get(status.as_str()).copied().unwrap_or(0);
    if json {
        let by_status: serde_json::Map<String, serde_json::Value> = Status::ALL
            .into_iter()
            .map(|status| (status.to_string(), count(status).into()))
            .collect();
        let line = serde_json::json!({
            "by_status": by_status,
            "by_tool": stats.by_tool,
            "total": stats.by_status.values().sum::<u64>(),
            "size_on_disk": stats.size_on_disk,
            "unreadable": stats.unreadable,
            "retention": stats.retention,
        });
        return writeln!(out, "{line}").map_err(write_failed);
    }
    let mut by_status: Vec<Vec<String>> = Status::ALL
        .into_iter()
        .map(|status| vec![status.to_string(), count(status).to_string()])
        .collect();
    let total: u64 = stats.by_status.values().sum();
    by_status.push(vec!["total".to_owned(), total.to_string()]);
    let by_tool: Vec<Vec<String>> =
        stats.by_tool.iter().map(|(tool, n)| vec![cell(tool), n.to_string()]).collect();
    let mut text = table(&["STATUS", "RECORDS"], &by_status);
    text.push('\n');
    text.push_str(&table(&["TOOL", "RECORDS"], &by_tool));
    text.push('\n');
    if stats.unreadable > 0 {
        text.push_str(&format!(
            "unreadable: {} (counted in neither table; `idem ls` names them)\n",
            stats.unreadable
        ));
    }
    match stats.size_on_disk {
        Some(bytes) => text.push_str(&format!("size on disk: {}\n", size(bytes))),
        None => text.push_str("size on disk: unknown (this store cannot tell)\n"),
    }
    text.push_str(&retention_text(stats.retention.as_ref()));
    out.write_all(text.as_bytes()).map_err(write_failed)
}

/// What `idem stats` says of the retention of the process that answered.
fn retention_text(status: Option<&RetentionStatus>) -> String {
    let Some(status) = status else {
        return "retention: none here (a process holding a sled store reports its own; set \
                IDEM_RETAIN or the store builder's `retain` in the agents)\n"
            .to_owned();
    };
    let keep = human_duration(Duration::from_millis(status.keep_ms));
    let every = human_duration(Duration::from_millis(status.every_ms));
    let mut text = format!(
        "retention: finished records and released keys' histories older than {keep} are \
         removed, {} at a time, a pass every {every}\n  since it opened: {} passes ended; {} records and {} \
         histories removed\n",
        status.batch, status.passes, status.removed.records, status.removed.histories
    );
    for pass in &status.recent_passes {
        text.push_str(&format!(
            "  pass ended {}: {} records and {} histories removed in {} batches ({} ms)\n",
            idem_runtime::utc_timestamp(pass.ended_at),
            pass.removed.records,
            pass.removed.histories,
            pass.batches,
            pass.took_ms
        ));
    }
    if let Some(error) = &status.last_error {
        text.push_str(&format!("  last failure: {error}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_says_what_a_call_would_make_of_an_in_flight_record_whose_owner_is_gone() {
        let record: Record = serde_json::from_value(serde_json::json!({
            "key": "k", "status": "in-flight", "tool": "charge_card", "scope": "o-1",
            "owner": "pg:host:1:2:ab#3", "attempts": 1, "created_at": 1, "updated_at": 1,
            "completed_at": null, "expires_at": null, "lease_until": 5, "result": null
        }))
        .unwrap();
        let assess = |now| idem_runtime::store::assess(Some(&record), now, "pg:other:1:0:0");
        let gone = status_text(&record, assess(6));
        assert!(gone.starts_with("in-flight (its owner is gone, so it is in doubt"), "{gone}");
        assert_eq!(status_text(&record, assess(4)), "in-flight");
    }

    #[test]
    fn names_purge_ages_in_their_largest_unit() {
        assert_eq!(human_duration(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(human_duration(Duration::from_secs(90)), "90s");
        assert_eq!(human_duration(Duration::from_secs(900)), "15m");
        assert_eq!(human_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(human_duration(Duration::ZERO), "0s");
    }
}
