//! The `idem` binary run as an operator runs it, against real sled stores that the runtime
//! filled in temporary directories.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;
use std::sync::{Arc, Once};
use std::time::Duration;

use idem_runtime::{Call, Error, Key, SledStore, Store};
use serde_json::{json, Value};
use tempfile::TempDir;

mod common;

use self::common::{idem, idem_in, idem_in_with, open, place};

/// A call that finished with `result`; returns its key.
fn finish(store: &Arc<dyn Store>, tool: &str, scope: &str, args: Value, result: &str) -> Key {
    let call = Call::new(tool, scope, &args).unwrap().store(Arc::clone(store));
    let key = call.key().clone();
    let got: Result<String, Error> = call.run(|| Ok(result.to_owned()));
    assert_eq!(got.unwrap(), result);
    key
}

const CRASH: &str = "the process crashes mid-effect";

/// Keeps the test output readable: the bodies that panic on purpose print nothing.
fn quiet_intended_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&CRASH) {
                default(info);
            }
        }));
    });
}

/// A call whose body panicked, which leaves its record in doubt; returns its key.
fn interrupt(store: &Arc<dyn Store>, tool: &str, scope: &str, args: Value) -> Key {
    quiet_intended_panics();
    let call = Call::new(tool, scope, &args).unwrap().store(Arc::clone(store));
    let key = call.key().clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<String, Error> = call.run(|| std::panic::panic_any(CRASH));
    }));
    assert!(outcome.is_err(), "the body's panic goes on");
    key
}

/// Spaces records out so that their creation times differ and "newest first" is well defined.
fn tick() {
    std::thread::sleep(Duration::from_millis(3));
}

/// A store holding two done charges, one in-doubt charge and one done email, oldest first.
struct Fixture {
    _dir: TempDir,
    path: std::path::PathBuf,
    charge_1: Key,
    charge_2: Key,
    charge_doubt: Key,
    email: Key,
}

fn fixture() -> Fixture {
    let (dir, path) = place();
    let store = open(&path);
    let charge_1 = finish(&store, "charge_card", "order-1", json!({"amount": 100}), "ch_1");
    tick();
    let charge_2 = finish(&store, "charge_card", "order-2", json!({"amount": 200}), "ch_2");
    tick();
    let charge_doubt = interrupt(&store, "charge_card", "order-3", json!({"amount": 300}));
    tick();
    let email = finish(&store, "send_email", "order-1", json!({"to": "ada@example.com"}), "msg_1");
    drop(store);
    Fixture { _dir: dir, path, charge_1, charge_2, charge_doubt, email }
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect()
}

fn keys_of(records: &[Value]) -> Vec<String> {
    records.iter().map(|r| r["key"].as_str().expect("a record has a key").to_owned()).collect()
}

/// The count on the line of a stats table that starts with `name`.
fn stat(stats: &str, name: &str) -> u64 {
    stats
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(name)).then(|| words.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no `{name}` line in stats:\n{stats}"))
}

// --- idem key ---------------------------------------------------------------------------------

#[test]
fn key_matches_every_vector() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/keys.jsonl");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("cannot read the key vectors at {path}: {e}; they are part of the repository (vectors/keys.jsonl): restore the file from git")
    });
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let vector: Value = serde_json::from_str(line).unwrap();
        let (tool, scope) = (vector["tool"].as_str().unwrap(), vector["scope"].as_str().unwrap());
        let args = vector["args"].to_string();
        let out = idem_in(dir.path(), &["key", "--tool", tool, "--scope", scope, "--args", &args]);
        assert_eq!(
            out.ok().trim_end(),
            vector["key"].as_str().unwrap(),
            "vector on line {}",
            line_no + 1
        );

        let out = idem_in(
            dir.path(),
            &["key", "--tool", tool, "--scope", scope, "--args", &args, "--json"],
        );
        let printed: Value = serde_json::from_str(out.ok()).unwrap();
        assert_eq!(printed["key"], vector["key"], "vector on line {}", line_no + 1);
        assert_eq!(printed["canonical"], vector["canonical"], "vector on line {}", line_no + 1);
        checked += 1;
    }
    assert!(checked > 0, "{path} holds no vectors");
}

/// `--flatten` (and `--ignore`) derive a flattened tool's key from the arguments a client sent,
/// by the rule of `vectors/reference.py`.
#[test]
fn key_with_flatten_matches_every_flattened_vector() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/flattened.jsonl");
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}; restore it from git"));
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let vector: Value = serde_json::from_str(line).unwrap();
        let (tool, scope) = (vector["tool"].as_str().unwrap(), vector["scope"].as_str().unwrap());
        let args = vector["arguments"].to_string();
        let mut command = vec!["key", "--tool", tool, "--scope", scope, "--args", &args];
        command.extend(["--flatten", "--json"]);
        for field in vector["ignore"].as_array().unwrap() {
            command.extend(["--ignore", field.as_str().unwrap()]);
        }
        let printed: Value = serde_json::from_str(idem_in(dir.path(), &command).ok()).unwrap();
        assert_eq!(printed["key"], vector["key"], "vector on line {}", line_no + 1);
        assert_eq!(printed["canonical"], vector["canonical"], "vector on line {}", line_no + 1);
        checked += 1;
    }
    assert!(checked > 0, "{path} holds no vectors");
}

#[test]
fn key_keeps_integers_wider_than_64_bits() {
    let dir = tempfile::tempdir().unwrap();
    let wide = 1u128 << 100;
    let args = format!(r#"{{"n": {wide}}}"#);
    let out = idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", &args]);
    let expected = Key::derive("t", "s", &std::collections::BTreeMap::from([("n", wide)])).unwrap();
    assert_eq!(out.ok().trim_end(), expected.as_str());
}

#[test]
fn key_writes_floats_halfway_between_two_spellings_as_python_does() {
    // Both doubles lie exactly halfway between two shortest spellings; Python keeps the even
    // digit. Canonical text and key from `python3 vectors/reference.py --batch`.
    let dir = tempfile::tempdir().unwrap();
    let args = r#"{"a": -627677689651098.2, "b": 241804605705217.62}"#;
    let out =
        idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", args, "--json"]);
    let printed: Value = serde_json::from_str(out.ok()).unwrap();
    assert_eq!(printed["canonical"], r#"{"a":-627677689651098.2,"b":241804605705217.62}"#);
    assert_eq!(printed["key"], "ff3c7e3a9e49f4c5c7acd0f002a1dfbf");
}

#[test]
fn key_refuses_a_lone_surrogate_escape_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = r#"{"a": "x\ud800y"}"#;
    let line = idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", args])
        .fails(2)
        .to_owned();
    assert!(line.contains(r"`\ud800`, a lone UTF-16 surrogate"), "{line}");
}

#[test]
fn key_needs_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = idem_in(
        dir.path(),
        &[
            "--store",
            "/nonexistent/idem.sled",
            "key",
            "--tool",
            "noop",
            "--scope",
            "",
            "--args",
            "{}",
        ],
    );
    assert_eq!(out.ok(), "363d96d70c0e4e0cc4612aaaf7f84ad7\n");
}

#[test]
fn key_refuses_bad_json_as_usage() {
    let dir = tempfile::tempdir().unwrap();
    let line = idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", "{\"a\":"])
        .fails(2)
        .to_owned();
    assert!(line.contains("--args is not valid JSON"), "{line}");
    let line = idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", "[1, 2]"])
        .fails(2)
        .to_owned();
    assert!(line.contains("must be a JSON object"), "{line}");
    let line =
        idem_in(dir.path(), &["key", "--tool", "t", "--scope", "s", "--args", r#"{"kg": 1e999}"#])
            .fails(2)
            .to_owned();
    assert!(line.contains("no canonical JSON"), "{line}");
}

#[test]
fn missing_arguments_are_usage_errors_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let line = idem_in(dir.path(), &["key", "--tool", "t"]).fails(2).to_owned();
    assert!(line.contains("--scope") && line.contains("usage: idem key"), "{line}");
    let line = idem_in(dir.path(), &["frobnicate"]).fails(2).to_owned();
    assert!(line.contains("frobnicate"), "{line}");
    idem_in(dir.path(), &[]).fails(2);
}

#[test]
fn help_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let out = idem_in(dir.path(), &["--help"]);
    assert!(out.ok().contains("resolve"));
}

// --- opening the store ------------------------------------------------------------------------

#[test]
fn missing_store_is_an_error_not_a_new_store() {
    let (_dir, path) = place();
    let line = idem(&path, &["ls"]).fails(1).to_owned();
    assert!(line.contains("no idem store at") && line.contains("idem.sled"), "{line}");
    assert!(!path.exists(), "idem created a store at a path that had none");
    for args in
        [&["stats"][..], &["show", "82e1e1a327aa97bb3929e05cc4ca3bd5"], &["purge", "--expired"]]
    {
        idem(&path, args).fails(1);
    }
    assert!(!path.exists());
}

#[test]
fn store_held_by_a_process_that_serves_no_admin_socket_is_reported() {
    let fx = fixture();
    let held: Arc<dyn Store> = Arc::new(
        SledStore::builder(&fx.path)
            .lock_wait(Duration::from_secs(5))
            .admin_socket(false)
            .open()
            .expect("the store opens"),
    );
    let line = idem(&fx.path, &["ls"]).fails(1).to_owned();
    assert!(
        line.contains("open in another process")
            && line.contains("admin socket")
            && line.contains("stop that process"),
        "{line}"
    );
    let line =
        idem(&fx.path, &["resolve", fx.charge_doubt.as_str(), "--release"]).fails(1).to_owned();
    assert!(line.contains("open in another process"), "{line}");
    drop(held);
    idem(&fx.path, &["ls"]).ok();
}

#[test]
fn store_defaults_to_idem_store_then_the_current_directory() {
    let fx = fixture();
    let dir = fx.path.parent().unwrap();

    // ./idem.sled in the current directory.
    assert_eq!(json_lines(idem_in(dir, &["ls", "--json"]).ok()).len(), 4);

    // $IDEM_STORE wins over the current directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["ls", "--json"])
        .current_dir(elsewhere.path())
        .env("IDEM_STORE", &fx.path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout).unwrap().lines().count(), 4);

    // No store in the current directory and no $IDEM_STORE: the data directory's, which the
    // command does not create.
    let data = elsewhere.path().join("data");
    let data_env = data.to_str().unwrap();
    let line =
        idem_in_with(elsewhere.path(), &["ls"], &[("XDG_DATA_HOME", data_env)]).fails(1).to_owned();
    let expected = data.join("idem").join("idem.sled");
    assert!(line.contains(&format!("no idem store at {}", expected.display())), "{line}");
}

#[test]
fn postgres_url_opens_the_postgresql_store() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1: nothing listens there, so the connection is refused at once.
    let line = idem_in(dir.path(), &["--store", "postgres://idem@127.0.0.1:1/idem", "ls"])
        .fails(1)
        .to_owned();
    assert!(line.contains("PostgreSQL"), "{line}");
}

/// Runs when `DATABASE_URL` names a PostgreSQL database, as the idem-postgres tests do.
#[cfg(feature = "postgres")]
#[test]
fn shows_and_resolves_records_in_a_postgresql_store() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    // The command uses the default schema and table, which connecting creates.
    let store: Arc<dyn Store> =
        Arc::new(idem_postgres::PgStore::connect(&url).expect("PostgreSQL is reachable"));
    let scope = format!("cli-test-{}-{}", std::process::id(), idem_runtime::store::now_ms());
    let done = finish(&store, "charge_card", &scope, json!({"amount": 1}), "ch_pg");
    let doubt = interrupt(&store, "charge_card", &scope, json!({"amount": 2}));
    let dir = tempfile::tempdir().unwrap();

    let record: Value = serde_json::from_str(
        idem_in(dir.path(), &["--store", &url, "show", done.as_str(), "--json"]).ok(),
    )
    .unwrap();
    assert_eq!(record["result"], "ch_pg");
    idem_in(dir.path(), &["--store", &url, "resolve", doubt.as_str(), "--done", "\"ch_pg2\""]).ok();
    let mut runs = 0;
    let got: Result<String, Error> = Call::new("charge_card", &scope, &json!({"amount": 2}))
        .unwrap()
        .store(Arc::clone(&store))
        .run(|| {
            runs += 1;
            Ok("again".to_owned())
        });
    assert_eq!((got.unwrap(), runs), ("ch_pg2".to_owned(), 0));
}

// --- ls ---------------------------------------------------------------------------------------

#[test]
fn ls_lists_newest_first_in_an_aligned_table() {
    let fx = fixture();
    let out = idem(&fx.path, &["ls"]);
    let lines: Vec<&str> = out.ok().lines().collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["KEY", "TOOL", "SCOPE", "STATUS", "ATTEMPTS", "AGE"]
    );
    let first_column: Vec<&str> =
        lines[1..].iter().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(
        first_column,
        [fx.email.as_str(), fx.charge_doubt.as_str(), fx.charge_2.as_str(), fx.charge_1.as_str()]
    );
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>()[1..5],
        ["charge_card", "order-3", "in-doubt", "1"]
    );
    // Aligned: every column starts at the same offset on every line.
    let status_at = lines[0].find("STATUS").unwrap();
    for line in &lines[1..] {
        assert!(
            line[status_at..].starts_with("done") || line[status_at..].starts_with("in-doubt"),
            "{line}"
        );
    }
}

#[test]
fn ls_json_prints_one_record_per_line() {
    let fx = fixture();
    let records = json_lines(idem(&fx.path, &["ls", "--json"]).ok());
    assert_eq!(
        keys_of(&records),
        [fx.email.as_str(), fx.charge_doubt.as_str(), fx.charge_2.as_str(), fx.charge_1.as_str()]
    );
    assert_eq!(records[0]["tool"], "send_email");
    assert_eq!(records[0]["status"], "done");
    assert_eq!(records[0]["result"], "msg_1");
    assert_eq!(records[1]["status"], "in-doubt");
}

#[test]
fn ls_filters_by_status_and_tool() {
    let fx = fixture();
    let keys = |args: &[&str]| keys_of(&json_lines(idem(&fx.path, args).ok()));
    assert_eq!(keys(&["ls", "--status", "in-doubt", "--json"]), [fx.charge_doubt.as_str()]);
    assert_eq!(
        keys(&["ls", "--status", "done", "--json"]),
        [fx.email.as_str(), fx.charge_2.as_str(), fx.charge_1.as_str()]
    );
    assert!(keys(&["ls", "--status", "in-flight", "--json"]).is_empty());
    assert_eq!(keys(&["ls", "--tool", "send_email", "--json"]), [fx.email.as_str()]);
    assert_eq!(
        keys(&["ls", "--tool", "charge_card", "--status", "done", "--json"]),
        [fx.charge_2.as_str(), fx.charge_1.as_str()]
    );
    assert!(keys(&["ls", "--tool", "nope", "--json"]).is_empty());
    assert_eq!(idem(&fx.path, &["ls", "--tool", "nope"]).ok(), "no records\n");

    let line = idem(&fx.path, &["ls", "--status", "broken"]).fails(2).to_owned();
    assert!(
        line.contains("in-flight, done, in-doubt, awaiting-approval, approved, denied"),
        "{line}"
    );
}

// --- show -------------------------------------------------------------------------------------

#[test]
fn show_prints_the_record_with_its_result() {
    let fx = fixture();
    let out = idem(&fx.path, &["show", fx.charge_1.as_str()]);
    let text = out.ok();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).filter(|rest| rest.starts_with(' ')).map(str::trim))
            .unwrap_or_else(|| panic!("no `{name}` in:\n{text}"))
            .to_owned()
    };
    assert_eq!(field("key"), fx.charge_1.as_str());
    assert_eq!(field("status"), "done");
    assert_eq!(field("tool"), "charge_card");
    assert_eq!(field("scope"), "order-1");
    assert_eq!(field("attempts"), "1");
    assert_eq!(field("result"), "\"ch_1\"");
    assert!(field("created").ends_with("ago)"), "{text}");

    let record: Value =
        serde_json::from_str(idem(&fx.path, &["show", fx.charge_1.as_str(), "--json"]).ok())
            .unwrap();
    assert_eq!(record["key"], fx.charge_1.as_str());
    assert_eq!(record["result"], "ch_1");
    assert_eq!(record["status"], "done");
    assert!(record.get("args_fingerprint").is_none(), "no hash of the arguments beside the key");
}

#[test]
fn show_of_a_malformed_key_is_usage() {
    let fx = fixture();
    let line = idem(&fx.path, &["show", "not-a-key"]).fails(2).to_owned();
    assert!(line.contains("32 lower-case hex digits"), "{line}");
    let upper = fx.charge_1.as_str().to_uppercase();
    idem(&fx.path, &["show", &upper]).fails(2);
}

#[test]
fn show_of_an_unknown_key_fails() {
    let fx = fixture();
    let line = idem(&fx.path, &["show", "00000000000000000000000000000000"]).fails(1).to_owned();
    assert!(line.contains("no record") && line.contains("idem ls"), "{line}");
}

// --- resolve ----------------------------------------------------------------------------------

#[test]
fn resolve_done_makes_the_next_call_replay_without_running() {
    let (_dir, path) = place();
    let args = json!({"amount": 4200, "customer": "cus_123"});
    let store = open(&path);
    let key = interrupt(&store, "charge_card", "order-17", args.clone());
    // While in doubt, a call refuses to run.
    let refused: Result<String, Error> = Call::new("charge_card", "order-17", &args)
        .unwrap()
        .store(Arc::clone(&store))
        .run(|| Ok("ch_2".to_owned()));
    assert!(matches!(refused, Err(Error::InDoubt { .. })), "{refused:?}");
    drop(store);

    let before: Value =
        serde_json::from_str(idem(&path, &["show", key.as_str(), "--json"]).ok()).unwrap();
    assert_eq!(before["status"], "in-doubt");

    let out = idem(&path, &["resolve", key.as_str(), "--done", "\"ch_1\""]);
    assert!(out.ok().contains("later calls replay \"ch_1\""), "{out:?}");

    let store = open(&path);
    let mut runs = 0;
    let got: Result<String, Error> =
        Call::new("charge_card", "order-17", &args).unwrap().store(Arc::clone(&store)).run(|| {
            runs += 1;
            Ok("ch_2".to_owned())
        });
    assert_eq!(got.unwrap(), "ch_1");
    assert_eq!(runs, 0, "the body ran again after the operator said it had landed");
}

#[test]
fn resolve_release_lets_the_next_call_run() {
    let (_dir, path) = place();
    let args = json!({"to": "ada@example.com"});
    let store = open(&path);
    let key = interrupt(&store, "send_email", "order-5", args.clone());
    drop(store);

    let out = idem(&path, &["resolve", key.as_str(), "--release"]);
    assert!(out.ok().contains("released"), "{out:?}");
    // The record is gone; its history stays, and says so.
    let shown = idem(&path, &["show", key.as_str()]).ok().to_owned();
    assert!(shown.contains("absent") && shown.contains("resolved"), "{shown}");

    let store = open(&path);
    let mut runs = 0;
    let got: Result<String, Error> =
        Call::new("send_email", "order-5", &args).unwrap().store(Arc::clone(&store)).run(|| {
            runs += 1;
            Ok("msg_2".to_owned())
        });
    assert_eq!(got.unwrap(), "msg_2");
    assert_eq!(runs, 1);
}

#[test]
fn resolve_of_a_done_record_is_refused() {
    let fx = fixture();
    let line = idem(&fx.path, &["resolve", fx.charge_1.as_str(), "--done", "\"other\""])
        .fails(1)
        .to_owned();
    assert!(line.contains("is done and cannot be resolved"), "{line}");
    idem(&fx.path, &["resolve", fx.charge_1.as_str(), "--release"]).fails(1);
    let record: Value =
        serde_json::from_str(idem(&fx.path, &["show", fx.charge_1.as_str(), "--json"]).ok())
            .unwrap();
    assert_eq!(record["result"], "ch_1", "a refused resolve changed the record");
}

#[test]
fn resolve_of_an_unknown_key_fails() {
    let fx = fixture();
    let line = idem(&fx.path, &["resolve", "00000000000000000000000000000000", "--release"])
        .fails(1)
        .to_owned();
    assert!(line.contains("no record"), "{line}");
}

#[test]
fn resolve_needs_exactly_one_of_release_and_done() {
    let fx = fixture();
    let key = fx.charge_doubt.as_str();
    let line = idem(&fx.path, &["resolve", key, "--release", "--done", "1"]).fails(2).to_owned();
    assert!(line.contains("cannot be used with"), "{line}");
    let line = idem(&fx.path, &["resolve", key]).fails(2).to_owned();
    assert!(line.contains("--release") && line.contains("--done"), "{line}");
    let line = idem(&fx.path, &["resolve", key, "--done", "ch_1"]).fails(2).to_owned();
    assert!(line.contains("--done is not valid JSON"), "{line}");
    idem(&fx.path, &["resolve", "xyz", "--release"]).fails(2);
    let records = json_lines(idem(&fx.path, &["ls", "--status", "in-doubt", "--json"]).ok());
    assert_eq!(keys_of(&records), [key], "a refused resolve changed the record");
}

// --- purge ------------------------------------------------------------------------------------

#[test]
fn purge_older_than_removes_only_old_done_records() {
    let fx = fixture();
    assert_eq!(
        idem(&fx.path, &["purge", "--older-than", "30d"]).ok(),
        "removed 0 done records (finished more than 30d ago)\n\
         removed 0 histories of released keys (last changed more than 30d ago)\n"
    );
    std::thread::sleep(Duration::from_millis(20));
    let out = idem(&fx.path, &["purge", "--older-than", "10ms"]);
    assert!(out.ok().starts_with("removed 3 done records"), "{out:?}");
    let left = json_lines(idem(&fx.path, &["ls", "--json"]).ok());
    assert_eq!(keys_of(&left), [fx.charge_doubt.as_str()], "purge removed an in-doubt record");
}

#[test]
fn purge_expired_removes_only_expired_records() {
    let fx = fixture();
    let store = open(&fx.path);
    let call = Call::new("lookup", "s", &json!({}))
        .unwrap()
        .store(Arc::clone(&store))
        .ttl(Duration::from_millis(1));
    let short_lived = call.key().clone();
    let _: String = call.run(|| Ok::<_, Error>("v".to_owned())).unwrap();
    drop(store);
    std::thread::sleep(Duration::from_millis(10));

    assert_eq!(idem(&fx.path, &["purge", "--expired"]).ok(), "removed 1 done record (expired)\n");
    let left = keys_of(&json_lines(idem(&fx.path, &["ls", "--json"]).ok()));
    assert_eq!(left.len(), 4);
    assert!(!left.contains(&short_lived.to_string()));
    assert!(left.contains(&fx.charge_doubt.to_string()));
}

#[test]
fn purge_refuses_bad_durations_and_needs_one_mode() {
    let fx = fixture();
    for bad in ["30", "1fortnight", "-1d", "d", "30D"] {
        let line = idem(&fx.path, &["purge", "--older-than", bad]).fails(2).to_owned();
        assert!(line.contains("not a duration"), "{bad}: {line}");
    }
    idem(&fx.path, &["purge"]).fails(2);
    idem(&fx.path, &["purge", "--expired", "--older-than", "1d"]).fails(2);
    assert_eq!(
        json_lines(idem(&fx.path, &["ls", "--json"]).ok()).len(),
        4,
        "a refused purge removed records"
    );
    for good in ["30d", "12h", "15m", "90s", "500ms"] {
        idem(&fx.path, &["purge", "--older-than", good]).ok();
    }
    let left = keys_of(&json_lines(idem(&fx.path, &["ls", "--json"]).ok()));
    assert!(left.contains(&fx.charge_doubt.to_string()), "purge removed an in-doubt record");
}

// --- stats ------------------------------------------------------------------------------------

#[test]
fn stats_counts_by_status_and_tool() {
    let fx = fixture();
    let out = idem(&fx.path, &["stats"]);
    let text = out.ok();
    assert_eq!(stat(text, "done"), 3, "{text}");
    assert_eq!(stat(text, "in-doubt"), 1, "{text}");
    assert_eq!(stat(text, "in-flight"), 0, "{text}");
    assert_eq!(stat(text, "total"), 4, "{text}");
    assert_eq!(stat(text, "charge_card"), 3, "{text}");
    assert_eq!(stat(text, "send_email"), 1, "{text}");
    let size_line = text.lines().find(|l| l.starts_with("size on disk: ")).expect("a size line");
    let bytes: u64 =
        size_line["size on disk: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    assert!(bytes > 0, "{size_line}");
}

#[test]
fn stats_json_gives_the_same_counts_for_scripts() {
    let fx = fixture();
    let out = idem(&fx.path, &["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(out.ok().trim()).expect("one JSON object");
    assert_eq!(stats["by_status"]["done"], 3, "{stats}");
    assert_eq!(stats["by_status"]["in-doubt"], 1, "{stats}");
    assert_eq!(stats["by_status"]["in-flight"], 0, "{stats}");
    assert_eq!(stats["by_tool"]["charge_card"], 3, "{stats}");
    assert_eq!(stats["by_tool"]["send_email"], 1, "{stats}");
    assert_eq!(stats["total"], 4, "{stats}");
    assert!(stats["size_on_disk"].as_u64().is_some_and(|bytes| bytes > 0), "{stats}");
}

#[test]
fn ls_lists_what_reads_and_names_a_damaged_record_after_the_rest() {
    let (_dir, path) = place();
    let (good, bad) = {
        let store = open(&path);
        let good = finish(&store, "charge_card", "order-1", json!({"amount": 1}), "ch_1");
        let bad = finish(&store, "charge_card", "order-2", json!({"amount": 2}), "ch_2");
        (good, bad)
    };
    {
        // sled lets go of its lock a moment after the store is dropped: wait for it, as the
        // command does.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let db = loop {
            match sled::open(&path) {
                Ok(db) => break db,
                Err(e) if std::time::Instant::now() >= deadline => panic!("cannot reopen: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        db.open_tree("idem.records").unwrap().insert(bad.as_str(), &b"{not json"[..]).unwrap();
        db.flush().unwrap();
    }
    for args in [&["ls"][..], &["ls", "--json"]] {
        let run = idem(&path, args);
        assert_eq!(run.code, 1, "a damaged record fails the command: {run:?}");
        assert!(run.stdout.contains(good.as_str()), "the readable record is listed: {run:?}");
        assert!(run.stderr.contains(bad.as_str()), "the damaged one is named: {run:?}");
    }
}

/// A store whose path is too long for a Unix socket address (about 108 bytes) cannot be served
/// on a socket; the command opens it itself rather than fail on the socket's path.
#[test]
fn a_store_too_deep_for_a_socket_is_opened_directly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d".repeat(120)).join("idem.sled");
    assert!(path.join("admin.sock").as_os_str().len() > 108);
    let store = open(&path);
    let key = finish(&store, "charge_card", "order-1", json!({"amount": 100}), "ch_1");
    assert!(!path.join("admin.sock").exists(), "no socket can be made there");

    // Held by this process, which serves no socket: the command says the store is held.
    let held = idem(&path, &["ls"]);
    assert!(held.fails(1).contains("is open in another process"), "{held:?}");
    drop(store);

    let listed = idem(&path, &["ls"]);
    assert!(listed.ok().contains(key.as_str()), "{listed:?}");
    let shown = idem(&path, &["show", key.as_str()]);
    assert!(shown.ok().contains("\"ch_1\""), "{shown:?}");
}
