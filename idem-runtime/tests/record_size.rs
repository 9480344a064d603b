//! A sled record holds at most 4 KiB, and a call's record grows as the call goes on (its
//! `Done` adds the time it finished, its expiry and its result or where the result's chunks
//! are; a takeover writes another owner). So a scope too long for a record is refused before
//! the body runs, never after, when the result could no longer be recorded: walked here byte by
//! byte across the limit, with and without `ttl`, and with a long function path.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{self, Resolution};
use idem_runtime::{may_have_landed, Call, Durability, Error, SledStore, Status, Store};

const TOOL: &str = "export_report";

fn open(dir: &Path) -> Arc<dyn Store> {
    let builder = SledStore::builder(dir).durability(Durability::None).admin_socket(false);
    Arc::new(builder.lock_wait(Duration::from_secs(5)).open().unwrap())
}

/// How a call is made, besides its scope.
#[derive(Clone, Copy, Debug)]
struct Shape {
    ttl: Option<Duration>,
    function: Option<&'static str>,
}

const LONG_FUNCTION: &str = "billing::payments::providers::stripe::charges::create_charge_with_\
                             idempotency_key_and_retries_for_the_checkout_flow_of_the_web_shop_\
                             in_every_region_we_sell_to";

const SHAPES: [Shape; 4] = [
    Shape { ttl: None, function: None },
    Shape { ttl: Some(Duration::from_secs(3600)), function: None },
    Shape { ttl: None, function: Some(LONG_FUNCTION) },
    Shape { ttl: Some(Duration::from_secs(3600)), function: Some(LONG_FUNCTION) },
];

fn call(store: &Arc<dyn Store>, scope: &str, shape: Shape) -> Call {
    let mut call = Call::new(TOOL, scope, &serde_json::json!({ "format": "csv" }))
        .unwrap()
        .store(Arc::clone(store));
    if let Some(ttl) = shape.ttl {
        call = call.ttl(ttl);
    }
    if let Some(function) = shape.function {
        call = call.function(function);
    }
    call
}

/// Asserts that a refused call ran nothing, recorded nothing, and says what to change.
fn assert_refused_before_the_body(store: &Arc<dyn Store>, call: &Call, error: &Error, runs: usize) {
    let message = error.to_string();
    assert_eq!(runs, 0, "the body ran, then the call failed: {message}");
    assert!(matches!(error, Error::Store { .. }), "{error:?}");
    assert!(message.contains(call.key().as_str()), "the key is not named: {message}");
    assert!(message.contains(TOOL), "the tool is not named: {message}");
    assert!(message.contains("shorter scope"), "no way out is given: {message}");
    let shown = admin::show(&**store, call.key());
    assert!(matches!(shown, Err(Error::NotFound { .. })), "something was recorded: {shown:?}");
}

/// Walks scope lengths `from..to` for `shape`: each call is refused before its body runs, or
/// finishes and replays. Returns the longest scope that finished.
fn walk(store: &Arc<dyn Store>, shape: Shape, lengths: std::ops::Range<usize>) -> usize {
    let mut longest = 0;
    let mut refused = 0;
    for len in lengths {
        let scope = "s".repeat(len);
        let runs = AtomicUsize::new(0);
        let body = || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("report of {len} bytes"))
        };
        let first = call(store, &scope, shape);
        match call(store, &scope, shape).run(body) {
            Err(error) => {
                assert_refused_before_the_body(store, &first, &error, runs.load(Ordering::SeqCst));
                refused += 1;
            }
            Ok(result) => {
                assert_eq!(result, format!("report of {len} bytes"));
                let again = call(store, &scope, shape).run(body).unwrap();
                assert_eq!(again, result, "scope of {len} bytes ({shape:?}): not replayed");
                assert_eq!(runs.load(Ordering::SeqCst), 1, "scope of {len} bytes: ran twice");
                assert_eq!(refused, 0, "a longer scope finished after a shorter was refused");
                longest = len;
            }
        }
    }
    assert!(longest > 0 && refused > 0, "{shape:?}: the walk does not cross the limit");
    longest
}

#[test]
fn a_scope_too_long_for_any_later_record_is_refused_before_the_body_runs() {
    for shape in SHAPES {
        let dir = tempfile::tempdir().unwrap();
        walk(&open(dir.path()), shape, 3500..4100);
    }
}

/// At the longest scope a call accepts, every later record of the key still fits: its result
/// expires and a later process (another owner) takes it over, that attempt is left in doubt,
/// and an operator resolves it done with a large result and a long note, which then replays.
#[test]
fn the_longest_accepted_scope_can_be_taken_over_left_in_doubt_and_resolved() {
    for shape in SHAPES {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let longest = walk(&store, shape, 3500..4100);
        let scope = "t".repeat(longest);
        let shape = Shape { ttl: Some(Duration::from_millis(1)), ..shape };
        let key = call(&store, &scope, shape).key().clone();
        call(&store, &scope, shape).run(|| Ok::<_, Error>("r".repeat(20_000))).unwrap();

        drop(store);
        let store = open(dir.path());
        let ran = AtomicUsize::new(0);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ran.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "the result never expired");
            let _ = call(&store, &scope, shape).run(|| {
                ran.fetch_add(1, Ordering::SeqCst);
                may_have_landed();
                Err::<String, _>(Error::Key { tool: TOOL.into(), reason: "timed out".into() })
            });
        }
        let record = admin::show(&*store, &key).unwrap();
        assert_eq!((record.status, record.attempts), (Status::InDoubt, 2));

        let result = serde_json::Value::String("r".repeat(10_000));
        let note = "checked with the vendor: the export landed; ".repeat(40);
        admin::resolve(
            &*store,
            &key,
            Resolution::Done(result.clone()),
            "ann@ops",
            Some(&note),
            false,
        )
        .unwrap();
        let replayed = call(&store, &scope, shape).run(|| Ok::<_, Error>(String::new()));
        assert_eq!(serde_json::Value::String(replayed.unwrap()), result);
    }
}
