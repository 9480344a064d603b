//! The examples are the README's demonstration: run each one as a user would and check that it
//! succeeds and says what it should.
//!
//! Each runs through `cargo run --example`, with the cargo that runs these tests: that builds
//! the example when `cargo test` did not (`cargo test --test examples`), and never runs a stale
//! one.

use std::process::Command;

/// Runs `cargo run --example NAME` and returns its standard output; fails the test on a non-zero
/// exit status.
fn run_example(name: &str) -> String {
    run_example_with(name, &[])
}

/// [`run_example`] with `envs` set.
fn run_example_with(name: &str, envs: &[(&str, &std::ffi::OsStr)]) -> String {
    let output = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--example", name])
        .envs(envs.iter().copied())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "example {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    stdout
}

/// The table row whose label starts with `label`, split into words.
fn row<'a>(stdout: &'a str, label: &str) -> Vec<&'a str> {
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no table row {label:?} in:\n{stdout}"));
    line.split_whitespace().collect()
}

#[test]
fn agent_loop_charges_once_only_when_the_key_reaches_the_vendor() {
    let stdout = run_example("agent_loop");
    // Each row: label words, then attempts, charges, and the agent's answer.
    let unprotected = row(&stdout, "1  none");
    assert_eq!(unprotected[2..5], ["3", "3", "charged:"], "{stdout}");
    let local = row(&stdout, "2  #[idempotent], key kept local");
    assert_eq!(local[6], "1", "one charge, in doubt:\n{stdout}");
    assert!(local.ends_with(&["in", "doubt"]), "{stdout}");
    let released = row(&stdout, "2b ");
    assert!(released.ends_with(&["3", "3", "charged:", "ch_3"]), "{stdout}");
    let said = row(&stdout, "2c ");
    assert!(
        said.ends_with(&[
            "1", "could", "not", "confirm", "the", "charge:", "it", "is", "in", "doubt"
        ]),
        "{stdout}"
    );
    let pushed = row(&stdout, "3  #[idempotent], idem-reqwest sends the key");
    assert!(pushed.ends_with(&["1", "charged:", "ch_1"]), "one charge, replayed:\n{stdout}");
    // Two lost responses make three attempts; on a loaded machine a replayed answer can also
    // come after the deadline, and one more attempt replays it again: still one charge.
    let attempts: u32 = pushed[pushed.len() - 4].parse().unwrap();
    assert!(attempts >= 3, "{stdout}");
    assert!(stdout.contains("ok: every row is as expected"), "{stdout}");
}

#[test]
fn crash_recovery_settles_the_key_in_doubt_and_replays_it() {
    let stdout = run_example("crash_recovery");
    assert!(stdout.contains("[crash] effect landed: ch_1"), "{stdout}");
    assert!(stdout.contains("[retry] in doubt: "), "{stdout}");
    assert!(
        stdout.contains(" resolve ") && stdout.contains(r#"--done '{"amount":4200,"id":"ch_1"}'"#),
        "{stdout}"
    );
    assert!(stdout.contains("[replay] replayed: ch_1"), "{stdout}");
    assert!(stdout.contains("ok: charged once"), "{stdout}");
}

#[test]
fn crash_reconcile_settles_both_keys_from_the_vendor_without_an_operator() {
    let stdout = run_example("crash_reconcile");
    assert!(stdout.contains("[crash] effect landed: ch_1"), "{stdout}");
    assert!(stdout.contains("killed (signal: 9 (SIGKILL))"), "{stdout}");
    assert!(stdout.contains("[restart] reconciler: the vendor has ch_1 under key "), "{stdout}");
    assert!(stdout.contains("[restart] o-17: ch_1 (4200 cents)"), "{stdout}");
    assert!(!stdout.contains("[restart] effect landed"), "the body did not run again: {stdout}");
    assert!(stdout.contains("[sweep] sweep: 1 settled, 0 still in doubt"), "{stdout}");
    assert!(stdout.contains("[sweep] o-18: ch_2 (1500 cents)"), "{stdout}");
    assert!(stdout.contains("ok: one charge per order"), "{stdout}");
}

/// The `idem` command, built by this workspace's `cargo test --workspace`; built here when this
/// test runs alone.
fn idem_command() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/debug/deps/…");
    let idem = dir.join(format!("idem{}", std::env::consts::EXE_SUFFIX));
    if !idem.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "idem-agent-cli"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p idem-agent-cli failed");
    }
    idem
}

#[test]
fn refund_approval_runs_the_refund_once_after_idem_approve_and_denies_the_changed_one() {
    let idem = idem_command();
    let stdout = run_example_with("refund_approval", &[("IDEM_BIN", idem.as_os_str())]);
    assert!(stdout.contains("idem ls --status awaiting-approval"), "{stdout}");
    // The idem command's own words: it reached the running example through its socket.
    assert!(stdout.contains("approved ") && stdout.contains("runs it once"), "{stdout}");
    assert!(stdout.contains("denied ") && stdout.contains("only 500.00 was agreed"), "{stdout}");
    assert!(stdout.contains("ok: the refund over the threshold ran once"), "{stdout}");
}
