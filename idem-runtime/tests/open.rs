//! Opening stores that cannot be used: held by another process, damaged, missing, or holding a
//! damaged record. Each is a clear error, never a panic, and loses nothing that was stored.

mod children;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{admin, Call, Error, SledStore, Store};

use self::children::start;

const HOLDER: &str = "IDEM_OPEN_HOLDER";

/// Child mode: hold the store open until stdin closes.
#[test]
fn holder_child() {
    let Ok(path) = std::env::var(HOLDER) else { return };
    let _store = SledStore::open(&path).unwrap();
    println!("HOLDING");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn charge(store: &Arc<dyn Store>, order: &str) -> Result<String, Error> {
    Call::new("charge_card", order, &serde_json::json!({ "amount": 4200 }))?
        .store(Arc::clone(store))
        .run(|| Ok(format!("ch_{order}")))
}

#[test]
fn store_held_by_another_process_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).unwrap());
        charge(&store, "order-1").unwrap();
    }
    let mut holder = start(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "holder_child", "--nocapture", "--test-threads=1"])
            .env(HOLDER, &path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    holder.until_line("HOLDING");
    let refused = SledStore::open(&path).map(|_| ()).unwrap_err();
    let text = refused.to_string();
    assert!(matches!(refused, Error::Store { .. }), "{refused:?}");
    assert!(text.contains("another process"), "says why: {text}");
    assert!(text.contains(&path.display().to_string()), "names the store: {text}");
    drop(holder.process.stdin.take());
    holder.finish();

    let store: Arc<dyn Store> =
        Arc::new(SledStore::builder(&path).lock_wait(Duration::from_secs(5)).open().unwrap());
    assert_eq!(charge(&store, "order-1").unwrap(), "ch_order-1", "the record survived");
}

#[test]
fn damaged_store_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    drop(SledStore::open(&path).unwrap());
    for file in ["conf", "db"] {
        std::fs::write(path.join(file), b"\x00\x01 this is not a sled file \xff\xfe".repeat(64))
            .unwrap();
    }
    let opened = std::panic::catch_unwind(|| SledStore::open(&path).map(|_| ()));
    let error = opened.expect("opening never panics").expect_err("a damaged store does not open");
    let text = error.to_string();
    assert!(text.contains(&path.display().to_string()), "names the store: {text}");
}

#[test]
fn a_file_where_the_store_should_be_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    std::fs::write(&path, b"notes").unwrap();
    let text = SledStore::open(&path).map(|_| ()).unwrap_err().to_string();
    assert!(text.contains("not a store directory"), "{text}");
    assert_eq!(std::fs::read(&path).unwrap(), b"notes", "the file is untouched");
}

/// A new sled store's directory is its user's alone (0700), whatever the umask, and so are
/// the parents idem creates for it, opened by path or by name: sled makes its own files with
/// the umask's mode and lets no one choose another, so the directory is what keeps other
/// users out. Before, it was 0755 under the usual umask, and every file in it 0644.
#[cfg(unix)]
#[test]
fn a_new_store_directory_is_its_user_s_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |at: &std::path::Path| {
        format!("{:o}", std::fs::metadata(at).unwrap().permissions().mode() & 0o777)
    };
    let dir = tempfile::tempdir().unwrap();
    let direct = dir.path().join("idem.sled");
    drop(SledStore::open(&direct).unwrap());
    assert_eq!(mode(&direct), "700", "opened by path");
    let named = dir.path().join("data/agents/idem.sled");
    drop(idem_runtime::open_store(named.to_str().unwrap()).unwrap());
    for at in [dir.path().join("data"), dir.path().join("data/agents"), named] {
        assert_eq!(mode(&at), "700", "{}", at.display());
    }
    let sqlite = dir.path().join("db/idem.sqlite");
    drop(idem_runtime::open_store(&format!("sqlite:{}", sqlite.display())).unwrap());
    assert_eq!(mode(&dir.path().join("db")), "700", "a SQLite store's new parent");
    let shared = dir.path().join("shared.sled");
    drop(SledStore::builder(&shared).group_access(true).open().unwrap());
    assert_eq!(mode(&shared), "770", "group_access(true), whatever the umask");
}

#[test]
fn missing_store_is_not_created_when_asked_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.sled");
    let text = SledStore::builder(&path).create(false).open().map(|_| ()).unwrap_err().to_string();
    assert!(text.contains("no idem store"), "{text}");
    assert!(!path.exists(), "no empty store was created");
}

#[test]
fn damaged_record_names_its_key_and_leaves_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let (good, bad) = {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).unwrap());
        charge(&store, "order-1").unwrap();
        let good =
            Call::new("charge_card", "order-1", &serde_json::json!({ "amount": 4200 })).unwrap();
        let bad =
            Call::new("charge_card", "order-2", &serde_json::json!({ "amount": 4200 })).unwrap();
        (good.key().clone(), bad.key().clone())
    };
    {
        // Damage one record behind the store's back, once sled lets go of its lock (a moment
        // after the store closes).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let db = loop {
            match sled::open(&path) {
                Ok(db) => break db,
                Err(e)
                    if std::time::Instant::now() < deadline && e.to_string().contains("lock") =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        };
        db.open_tree("idem.records").unwrap().insert(bad.as_str(), &b"{not json"[..]).unwrap();
        db.flush().unwrap();
    }
    let store: Arc<dyn Store> =
        Arc::new(SledStore::builder(&path).lock_wait(Duration::from_secs(5)).open().unwrap());
    let error = charge(&store, "order-2").unwrap_err();
    assert!(error.to_string().contains(bad.as_str()), "names the damaged key: {error}");
    assert_eq!(charge(&store, "order-1").unwrap(), "ch_order-1", "other records still replay");
    assert_eq!(admin::show(store.as_ref(), &good).unwrap().key, good.as_str());
}

#[test]
fn a_damaged_record_is_reported_and_the_listing_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let bad = {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).unwrap());
        charge(&store, "order-1").unwrap();
        charge(&store, "order-3").unwrap();
        Call::new("charge_card", "order-2", &serde_json::json!({ "amount": 4200 })).unwrap()
    };
    {
        let db = sled::open(&path).unwrap();
        db.open_tree("idem.records")
            .unwrap()
            .insert(bad.key().as_str(), &b"{not json"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let store: Arc<dyn Store> =
        Arc::new(SledStore::builder(&path).lock_wait(Duration::from_secs(5)).open().unwrap());
    let listing = admin::scan(store.as_ref(), &admin::Filter::default()).unwrap();
    assert_eq!(listing.records.len(), 2, "the readable records are listed");
    assert_eq!(listing.unreadable.len(), 1, "the damaged one is reported");
    let reported = listing.unreadable[0].to_string();
    assert!(reported.contains(bad.key().as_str()), "names the damaged key: {reported}");
    assert_eq!(admin::list(store.as_ref(), &admin::Filter::default()).unwrap().len(), 2);
    let stats = admin::stats(store.as_ref()).unwrap();
    assert_eq!((stats.by_status.get("done"), stats.unreadable), (Some(&2), 1));
    assert_eq!(
        admin::purge(store.as_ref(), admin::Purge::OlderThan(Duration::ZERO), "ann@ops")
            .unwrap()
            .records,
        2
    );
    let kept = admin::show(store.as_ref(), bad.key()).unwrap_err();
    assert!(kept.to_string().contains("damaged"), "kept for inspection, not purged: {kept}");
}
