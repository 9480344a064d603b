//! A key's history through the `idem` binary: `show` prints it (and `--json` holds it), an
//! operator's resolve is in it with the operator's name and note, `purge` removes it, and a note
//! the history would not keep is refused as bad usage. Real sled stores in temporary directories.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Call, Error, Key, Store};
use serde_json::{json, Value};

mod common;

use self::common::{idem_with, open, place, Run};

/// Runs `idem --store <store> args…` as the user `ann` (on whatever host this is).
fn idem(store: &Path, args: &[&str]) -> Run {
    idem_with(store, args, &[("USER", "ann")])
}

fn charge(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("charge_card", scope, &json!({"amount": 4200})).unwrap().store(Arc::clone(store))
}

/// A charge whose request may have landed before its answer timed out: left in doubt.
fn doubt(store: &Arc<dyn Store>, scope: &str) -> Key {
    let call = charge(store, scope);
    let key = call.key().clone();
    let got: Result<String, Error> = call.run(|| {
        idem_runtime::may_have_landed();
        Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
    });
    assert!(got.is_err());
    key
}

fn show_json(path: &Path, key: &Key) -> Value {
    serde_json::from_str(idem(path, &["show", key.as_str(), "--json"]).ok()).unwrap()
}

fn events(record: &Value) -> Vec<String> {
    record["history"]
        .as_array()
        .expect("show --json has a history")
        .iter()
        .map(|e| {
            format!("{} {}", e["event"].as_str().unwrap(), e["status"].as_str().unwrap_or("absent"))
        })
        .collect()
}

#[test]
fn an_operators_resolve_with_a_note_is_in_show_json_and_the_replay_adds_nothing() {
    let (_dir, path) = place();
    let store = open(&path);
    let key = doubt(&store, "order-17");
    let owner = store.instance().id().to_owned();
    drop(store);

    let note = "vendor dashboard: charge ch_1 for order-17, 42.00 € — paid";
    let out = idem(&path, &["resolve", key.as_str(), "--done", "\"ch_1\"", "--note", note]);
    assert!(out.ok().contains("later calls replay \"ch_1\""), "{out:?}");

    let store = open(&path);
    let replayed: String =
        charge(&store, "order-17").run(|| Ok::<_, Error>("ch_2".into())).unwrap();
    assert_eq!(replayed, "ch_1");
    drop(store);

    let record = show_json(&path, &key);
    assert_eq!(record["status"], "done");
    assert_eq!(events(&record), ["reserved in-flight", "in-doubt in-doubt", "resolved done"]);
    let history = record["history"].as_array().unwrap();
    assert!(history[0]["by"].as_str().unwrap().starts_with(&owner), "{record}");
    assert!(history[1]["note"].as_str().unwrap().contains("may have landed"), "{record}");
    let resolved = &history[2];
    assert_eq!(resolved["note"], note);
    let by = resolved["by"].as_str().unwrap();
    assert!(by.starts_with("ann@") && by.len() > 4, "the operator's user@host: {by}");
    assert!(resolved["at"].as_u64().unwrap() >= history[1]["at"].as_u64().unwrap());
    assert!(record.get("args").is_none() && !record.to_string().contains("4200"), "no arguments");

    // The text form prints the same history, one change per line.
    let text = idem(&path, &["show", key.as_str()]).ok().to_owned();
    let lines: Vec<&str> = text.lines().skip_while(|l| *l != "history").collect();
    assert_eq!(lines.len(), 5, "a title, a header and three changes: {text}");
    assert!(lines[4].contains("resolved") && lines[4].contains(by) && lines[4].contains("paid"));
}

#[test]
fn a_released_key_shows_its_history_and_a_purge_removes_it() {
    let (_dir, path) = place();
    let store = open(&path);
    let released = doubt(&store, "order-1");
    // Expired as soon as it is done, so that `purge --expired` takes it without waiting.
    let done = charge(&store, "order-2").ttl(Duration::ZERO);
    let done_key = done.key().clone();
    let _: String = done.run(|| Ok::<_, Error>("ch_2".into())).unwrap();
    drop(store);

    idem(&path, &["resolve", released.as_str(), "--release", "--note", "no charge at the vendor"])
        .ok();
    let record = show_json(&path, &released);
    assert_eq!(record["status"], Value::Null, "no record: {record}");
    assert_eq!(
        events(&record),
        ["reserved in-flight", "in-doubt in-doubt", "resolved absent"],
        "a released key keeps its history"
    );
    let text = idem(&path, &["show", released.as_str()]).ok().to_owned();
    assert!(text.contains("absent") && text.contains("no charge at the vendor"), "{text}");

    assert_eq!(idem(&path, &["purge", "--expired"]).ok(), "removed 1 done record (expired)\n");
    let line = idem(&path, &["show", done_key.as_str()]).fails(1).to_owned();
    assert!(line.contains("no record"), "a purged key has neither record nor history: {line}");
    let store = open(&path);
    assert!(idem_runtime::admin::history(store.as_ref(), &done_key).unwrap().is_empty());
    assert_eq!(idem_runtime::admin::history(store.as_ref(), &released).unwrap().len(), 3);

    // A purge by age takes the released key's history once it is older than the bound.
    let last = idem_runtime::admin::history(store.as_ref(), &released).unwrap()[2].at;
    while store.clock() <= last + 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(store);
    assert_eq!(
        idem(&path, &["purge", "--older-than", "1ms"]).ok(),
        "removed 0 done records (finished more than 1ms ago)\n\
         removed 1 history of released keys (last changed more than 1ms ago)\n"
    );
    let store = open(&path);
    assert!(idem_runtime::admin::history(store.as_ref(), &released).unwrap().is_empty());
}

#[test]
fn a_note_too_long_or_with_control_characters_is_bad_usage_and_changes_nothing() {
    let (_dir, path) = place();
    let store = open(&path);
    let key = doubt(&store, "order-3");
    drop(store);
    let before = show_json(&path, &key);

    let long = "n".repeat(1025);
    for (note, says) in [
        (long.as_str(), "1025 bytes"),
        ("first line\nsecond line", "U+000A"),
        ("\u{1b}[31mred", "U+001B"),
    ] {
        let line = idem(&path, &["resolve", key.as_str(), "--release", "--note", note])
            .fails(2)
            .to_owned();
        assert!(line.contains("--note") && line.contains(says), "{line}");
    }
    assert_eq!(show_json(&path, &key), before, "nothing was written");
    // At the bound, and with any printable text, it is kept as given.
    let at_bound = "é".repeat(512);
    idem(&path, &["resolve", key.as_str(), "--release", "--note", &at_bound]).ok();
    let record = show_json(&path, &key);
    assert_eq!(record["history"][2]["note"], at_bound.as_str());
}
