//! The admin socket of a process that holds a sled store, spoken to directly: what it refuses,
//! that bad input changes no record, that an idle client holds up no one, that a socket left by
//! a dead process is replaced. The `idem` command's use of it is tested in idem-cli.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{self, Admin, Filter, Resolution};
use idem_runtime::remote::Remote;
use idem_runtime::{may_have_landed, Call, Durability, Error, Key, Record, SledStore, Store};
use serde_json::{json, Value};

fn open(path: &Path) -> Arc<SledStore> {
    Arc::new(
        SledStore::builder(path)
            .durability(Durability::Flush)
            .lock_wait(Duration::from_secs(5))
            .open()
            .expect("the store opens"),
    )
}

fn socket(path: &Path) -> PathBuf {
    path.join("admin.sock")
}

/// A call that finished with `result`; returns its key.
fn finish(store: &Arc<SledStore>, scope: &str, result: &str) -> Key {
    let call = Call::new("charge_card", scope, &json!({}))
        .unwrap()
        .store(Arc::clone(store) as Arc<dyn Store>);
    let key = call.key().clone();
    let got: Result<String, Error> = call.run(|| Ok(result.to_owned()));
    assert_eq!(got.unwrap(), result);
    key
}

/// A call whose request may have landed before it failed: its key is left in doubt.
fn doubt(store: &Arc<SledStore>, scope: &str) -> Key {
    let call = Call::new("charge_card", scope, &json!({}))
        .unwrap()
        .store(Arc::clone(store) as Arc<dyn Store>);
    let key = call.key().clone();
    let got: Result<String, Error> = call.run(|| {
        may_have_landed();
        Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
    });
    assert!(got.is_err());
    key
}

fn records(store: &SledStore) -> Vec<Record> {
    admin::list(store, &Filter::default()).unwrap()
}

/// Sends `bytes` and reads one answer line, as JSON.
fn exchange(stream: &mut UnixStream, bytes: &[u8]) -> Value {
    // The server may answer and close before it has read everything (a request too large): the
    // answer is what matters, so a failed write is not the test's failure.
    let _ = stream.write_all(bytes);
    let mut line = String::new();
    BufReader::new(&*stream).read_line(&mut line).expect("the server answers");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn refusal(answer: &Value) -> &str {
    assert_eq!(answer["v"], 1, "{answer}");
    assert_eq!(answer["error"]["kind"], "refused", "{answer}");
    answer["error"]["message"].as_str().expect("a refusal says why")
}

#[test]
fn socket_is_the_users_alone_and_goes_away_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    let meta = std::fs::symlink_metadata(socket(&path)).expect("the store serves a socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    drop(store);
    assert!(!socket(&path).exists(), "closing the store removes its socket");
    assert!(Remote::connect(&path).unwrap().is_none());

    let quiet = SledStore::builder(&path)
        .lock_wait(Duration::from_secs(5))
        .admin_socket(false)
        .open()
        .unwrap();
    assert!(!socket(&path).exists(), "admin_socket(false) serves nothing");
    drop(quiet);
}

#[test]
fn remote_operations_act_on_the_running_process_as_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    let done = finish(&store, "order-1", "ch_1");
    let released = doubt(&store, "order-2");
    let settled = doubt(&store, "order-3");

    let mut remote = Remote::connect(&path).unwrap().expect("the store is served");
    assert_eq!(remote.list(&Filter::default()).unwrap(), records(&store));
    assert_eq!(remote.show(&done).unwrap().result.as_deref(), Some("\"ch_1\""));
    let mut stats = admin::stats(store.as_ref()).unwrap();
    assert_eq!(stats.size_on_disk, None, "a store knows no size on disk");
    stats.size_on_disk = store.size_on_disk();
    assert_eq!(remote.stats().unwrap(), stats, "the holder reports its size");
    assert!(remote
        .resolve(&released, Resolution::Release, "ann@ops", None, false)
        .unwrap()
        .is_none());
    let now_done = remote
        .resolve(&settled, Resolution::Done(json!("ch_3")), "ann@ops", None, false)
        .unwrap()
        .unwrap();
    assert_eq!(now_done.result.as_deref(), Some("\"ch_3\""));
    let refused = remote.resolve(&done, Resolution::Release, "ann@ops", None, false).unwrap_err();
    assert!(matches!(refused, Error::NotResolvable { .. }), "{refused}");
    let unknown = Key::derive("charge_card", "order-404", &json!({})).unwrap();
    assert!(matches!(remote.show(&unknown).unwrap_err(), Error::NotFound { .. }));

    // The released key runs its body again; the settled one replays the operator's result.
    let mut runs = 0;
    let mut call = |scope: &str| -> String {
        Call::new("charge_card", scope, &json!({}))
            .unwrap()
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .run(|| {
                runs += 1;
                Ok::<_, Error>(format!("ran {scope}"))
            })
            .unwrap()
    };
    assert_eq!(call("order-2"), "ran order-2");
    assert_eq!(call("order-3"), "ch_3");
    assert_eq!(runs, 1, "only the released key ran its body");
}

#[test]
fn bad_requests_get_clear_errors_and_change_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    finish(&store, "order-1", "ch_1");
    let in_doubt = doubt(&store, "order-2");
    let before = records(&store);

    let mut stream = UnixStream::connect(socket(&path)).unwrap();
    let answer = exchange(&mut stream, b"resolve everything\n");
    assert!(refusal(&answer).contains("not one JSON object"), "{answer}");
    let answer = exchange(&mut stream, b"{\"v\":7,\"op\":\"stats\"}\n");
    assert!(refusal(&answer).contains("version 7"), "{answer}");
    let answer = exchange(&mut stream, b"{\"op\":\"stats\"}\n");
    assert!(refusal(&answer).contains("no protocol version"), "{answer}");
    let line = format!("{{\"v\":1,\"op\":\"resolve\",\"key\":\"{in_doubt}\"}}\n");
    let answer = exchange(&mut stream, line.as_bytes());
    assert!(refusal(&answer).contains("resolution"), "names what is missing: {answer}");
    let line =
        format!("{{\"v\":1,\"op\":\"resolve\",\"key\":\"{in_doubt}\",\"resolution\":\"maybe\"}}\n");
    let answer = exchange(&mut stream, line.as_bytes());
    assert!(refusal(&answer).contains("maybe"), "{answer}");
    let answer = exchange(&mut stream, b"{\"v\":1,\"op\":\"show\",\"key\":\"../etc\"}\n");
    assert_eq!(answer["error"]["kind"], "not-a-key", "{answer}");
    assert_eq!(answer["error"]["text"], "../etc", "{answer}");
    // The connection survived all of that and still answers a good request.
    let answer = exchange(&mut stream, b"{\"v\":1,\"op\":\"stats\"}\n");
    assert_eq!(answer["ok"]["by_status"]["in-doubt"], 1, "{answer}");

    // A request past the bound is refused without being buffered to its end.
    let mut stream = UnixStream::connect(socket(&path)).unwrap();
    let huge = format!(
        "{{\"v\":1,\"op\":\"resolve\",\"key\":\"{in_doubt}\",\"resolution\":{{\"done\":\"{}\"}}}}\n",
        "x".repeat(5 << 20)
    );
    let answer = exchange(&mut stream, huge.as_bytes());
    assert!(refusal(&answer).contains("larger than"), "{answer}");

    assert_eq!(records(&store), before, "no record was lost or changed");
    let through_remote = Remote::connect(&path).unwrap().unwrap().list(&Filter::default());
    assert_eq!(through_remote.unwrap(), before);
}

#[test]
fn an_idle_client_holds_up_neither_other_clients_nor_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    finish(&store, "order-1", "ch_1");
    let silent = UnixStream::connect(socket(&path)).unwrap();
    let mut halfway = UnixStream::connect(socket(&path)).unwrap();
    halfway.write_all(b"{\"v\":1,\"op\":").unwrap();

    let mut remote = Remote::connect(&path).unwrap().unwrap();
    assert_eq!(remote.list(&Filter::default()).unwrap().len(), 1);
    drop(remote);
    assert_eq!(finish(&store, "order-2", "ch_2").as_str().len(), 32);

    // Closing the store is not held up by the clients either, and lets go of the database:
    // the store opens again while they are still connected.
    drop(store);
    let again = open(&path);
    assert_eq!(records(&again).len(), 2);
    drop((silent, halfway));
}

#[test]
fn an_idle_client_is_disconnected_after_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let _store = open(&path);
    let mut silent = UnixStream::connect(socket(&path)).unwrap();
    // Blocks until the server gives up on the client; a server that waited forever would hang
    // this test rather than pass it.
    let mut rest = Vec::new();
    silent.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "a client that sent nothing is closed without an answer");
}

#[test]
fn a_socket_left_by_a_dead_process_is_replaced_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    finish(&store, "order-1", "ch_1");
    drop(store);
    // What a killed process leaves: the socket file, with no one listening.
    drop(UnixListener::bind(socket(&path)).unwrap());
    assert!(socket(&path).exists());
    assert!(Remote::connect(&path).unwrap().is_none(), "a stale socket is not a server");

    let store = open(&path);
    let mut remote = Remote::connect(&path).unwrap().expect("the new holder serves");
    assert_eq!(remote.list(&Filter::default()).unwrap().len(), 1);
    drop(remote);
    drop(store);

    // A file that is not a socket is not the store's to remove: the store opens without one.
    std::fs::write(socket(&path), "notes").unwrap();
    let store = open(&path);
    assert_eq!(std::fs::read_to_string(socket(&path)).unwrap(), "notes");
    assert_eq!(records(&store).len(), 1);
}

#[test]
fn the_socket_reports_unreadable_records_as_a_local_listing_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let key = finish(&open(&path), "order-1", "ch_1");
    // sled's lock keeps everyone else out while a store is open, so the record is damaged
    // between two opens, behind the store's back.
    {
        // sled lets go of its lock a moment after the store is dropped: wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let db = loop {
            match sled::open(&path) {
                Ok(db) => break db,
                Err(e) if std::time::Instant::now() >= deadline => panic!("cannot reopen: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        db.open_tree("idem.records")
            .unwrap()
            .insert(key.as_str(), &b"\x01\xff damaged"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let store = open(&path);
    let local = admin::scan(store.as_ref(), &Filter::default()).unwrap();
    assert_eq!(local.unreadable.len(), 1);

    let mut remote = Remote::connect(&path).unwrap().expect("the store serves its socket");
    let remote = remote.scan(&Filter::default()).unwrap();
    let messages = |errors: &[Error]| errors.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(messages(&remote.unreadable), messages(&local.unreadable));
    assert!(messages(&remote.unreadable)[0].contains(key.as_str()));
    assert_eq!(remote.records, local.records);
}

/// A process that takes connections but never answers (stopped, hung): each operation fails
/// after the client's timeout, with an error that names the socket and says what to do.
#[test]
fn a_process_that_never_answers_fails_the_call_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(socket(dir.path())).unwrap();
    let (taken, connections) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            // Kept open, never read from nor written to.
            if taken.send(stream.unwrap()).is_err() {
                return;
            }
        }
    });

    let mut remote = Remote::connect(dir.path()).unwrap().expect("something listens");
    let _silent = connections.recv().unwrap();
    remote.set_timeout(Duration::from_millis(200));
    let (answered, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let first = remote.stats();
        let second = remote.list(&Filter::default());
        let _ = answered.send((first, second.map(|_| ())));
    });
    // A generous bound: the call must fail, not block for ever.
    let (first, second) = answer
        .recv_timeout(Duration::from_secs(30))
        .expect("the call returned rather than blocking on a silent process");
    let message = first.unwrap_err().to_string();
    assert!(message.contains(&socket(dir.path()).display().to_string()), "{message}");
    assert!(
        message.contains("did not answer") && message.contains("stop that process"),
        "{message}"
    );
    // The connection is not reused: a late answer could be taken for the next call's.
    assert!(second.is_err());
}

/// Clients that hold every seat and only send a cheap request now and then cannot keep an
/// operator out: the one that has waited longest gives its seat up, and is told so.
#[test]
fn idle_clients_give_their_seats_to_an_operator() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = open(&path);
    finish(&store, "order-1", "ch_1");
    let stats = b"{\"v\":1,\"op\":\"stats\"}\n";
    // Each is answered once, so each has a seat and is waiting for its next request.
    let mut idle: Vec<UnixStream> = (0..16)
        .map(|_| {
            let mut stream = UnixStream::connect(socket(&path)).unwrap();
            assert_eq!(exchange(&mut stream, stats)["ok"]["by_status"]["done"], 1);
            stream
        })
        .collect();
    let mut halfway = UnixStream::connect(socket(&path)).unwrap();
    halfway.write_all(b"{\"v\":1,\"op\":").unwrap();

    let mut remote = Remote::connect(&path).unwrap().expect("the store is served");
    remote.set_timeout(Duration::from_secs(30));
    assert_eq!(remote.list(&Filter::default()).unwrap().len(), 1, "the operator is served");

    // The two that waited longest gave their seats up (to `halfway`, then to the operator),
    // and say so at their next request; nothing ran for them.
    for stream in &mut idle[..2] {
        let answer = exchange(stream, stats);
        assert!(refusal(&answer).contains("closed to make room"), "{answer}");
    }
    assert_eq!(exchange(&mut idle[2], stats)["ok"]["by_status"]["done"], 1);
}

/// A process that stopped taking connections lets its socket's queue fill; connecting then
/// fails after the timeout, naming the socket, instead of waiting for ever.
#[test]
fn a_process_that_takes_no_connection_fails_the_connect_after_the_timeout() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(socket(dir.path())).unwrap();
    // The shortest queue: one pending connection fills it, and nobody takes it.
    // SAFETY: the listener's descriptor is open for the whole call.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let _pending = UnixStream::connect(socket(dir.path())).unwrap();

    let (answered, answer) = std::sync::mpsc::channel();
    let store = dir.path().to_owned();
    std::thread::spawn(move || {
        let got = Remote::connect_with_timeout(&store, Duration::from_millis(200));
        let _ = answered.send(got.map(|remote| remote.is_some()));
    });
    // A generous bound: the connect must fail, not block for ever.
    let got = answer
        .recv_timeout(Duration::from_secs(30))
        .expect("the connect returned rather than waiting on a full queue");
    let message = got.unwrap_err().to_string();
    assert!(message.contains(&socket(dir.path()).display().to_string()), "{message}");
    assert!(message.contains("did not take a connection"), "{message}");
    drop(listener);
}
