//! The process default store (opened at `$IDEM_STORE` on first use, and never dropped) removes
//! its admin socket when the process exits cleanly, as a store that closes does.

#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Stdio};

use idem_runtime::{Call, Error};

const CHILD: &str = "IDEM_DEFAULT_STORE_CHILD";

/// Child mode: one call on the default store, then a clean exit.
#[test]
fn default_store_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let ran = Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .run(|| Ok::<_, Error>("sent".to_owned()))
        .unwrap();
    let socket = idem_runtime::default_store_path().join("admin.sock");
    println!("OUTCOME {ran} socket={}", socket.exists());
}

fn run_child(store: &Path) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "default_store_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("IDEM_STORE", store)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "the child failed: {output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    // libtest prints the test's name on the same line, before it.
    let outcome = stdout.lines().find_map(|line| line.split_once("OUTCOME ").map(|(_, o)| o));
    outcome.unwrap_or_default().to_owned()
}

#[test]
fn the_default_stores_socket_is_removed_at_a_clean_exit() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("idem.sled");
    assert_eq!(run_child(&store), "sent socket=true", "the child served no socket");
    assert!(!store.join("admin.sock").exists(), "the socket was left behind");
    // The store itself was left whole: the next process replays the call.
    assert_eq!(run_child(&store), "sent socket=true");
    assert!(!store.join("admin.sock").exists(), "the socket was left behind");
}
