//! The `idem` binary against a store that a running process holds: the process (this test
//! binary run again as a child) keeps the store open and makes calls while the operator's
//! command reaches it through its admin socket.
#![cfg(unix)]

mod common;

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;

use idem_runtime::{may_have_landed, Call, Error, SledStore, Store};
use serde_json::{json, Value};

use self::common::Lines;

const AGENT: &str = "IDEM_TEST_AGENT_STORE";

/// Child mode: an agent that holds the store and runs one command per line of stdin, answering
/// one line on stdout for each:
/// - `call SCOPE RESULT`: a charge whose body returns RESULT: `ran R` or `replayed R`;
/// - `doubt SCOPE`: a charge whose request may have landed before it failed: `in-doubt KEY`;
/// - `hold SCOPE RESULT`: a charge whose body waits for `finish`: `holding KEY` once it runs;
/// - `finish`: lets the held body return: `ran R`, or how the call ended.
#[test]
fn agent_child() {
    let Ok(path) = std::env::var(AGENT) else { return };
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).expect("the agent opens"));
    let charge = |scope: &str| {
        Call::new("charge_card", scope, &json!({"amount": 4200})).unwrap().store(Arc::clone(&store))
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    let mut held: Option<(mpsc::Sender<()>, std::thread::JoinHandle<String>)> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split(' ').collect();
        let answer = match words[..] {
            ["call", scope, result] => {
                let mut ran = false;
                let got: Result<String, Error> = charge(scope).run(|| {
                    ran = true;
                    Ok(result.to_owned())
                });
                outcome(got, ran)
            }
            ["doubt", scope] => {
                let call = charge(scope);
                let key = call.key().to_string();
                let got: Result<String, Error> = call.run(|| {
                    may_have_landed();
                    Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
                });
                assert!(got.is_err());
                format!("in-doubt {key}")
            }
            ["hold", scope, result] => {
                let call = charge(scope);
                let key = call.key().to_string();
                let (started, running) = mpsc::channel();
                let (finish, finished) = mpsc::channel::<()>();
                let result = result.to_owned();
                let thread = std::thread::spawn(move || {
                    let mut ran = false;
                    let got: Result<String, Error> = call.run(|| {
                        ran = true;
                        started.send(()).unwrap();
                        finished.recv().unwrap();
                        Ok(result)
                    });
                    outcome(got, ran)
                });
                running.recv().expect("the held body runs");
                held = Some((finish, thread));
                format!("holding {key}")
            }
            ["finish"] => {
                let (finish, thread) = held.take().expect("a call is held");
                finish.send(()).unwrap();
                thread.join().unwrap()
            }
            _ => panic!("unknown agent command {line:?}"),
        };
        writeln!(out, "{answer}").unwrap();
        out.flush().unwrap();
    }
}

fn outcome(got: Result<String, Error>, ran: bool) -> String {
    match got {
        Ok(result) if ran => format!("ran {result}"),
        Ok(result) => format!("replayed {result}"),
        Err(e) => format!("error {e}"),
    }
}

/// The agent, running as a child process.
struct Agent {
    child: Child,
    input: ChildStdin,
    output: Lines,
}

impl Agent {
    fn start(store: &Path) -> Agent {
        Agent::start_with(store, &[])
    }

    /// The agent, with `envs` added to its environment.
    fn start_with(store: &Path, envs: &[(&str, &str)]) -> Agent {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "agent_child", "--nocapture", "--test-threads=1", "-q"])
            .env(AGENT, store)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the agent starts");
        let input = child.stdin.take().unwrap();
        let mut output = Lines::read(child.stdout.take().unwrap());
        // The harness may print its own lines first; the agent's begin at `ready`, which it
        // prints once the store (and so its socket) is open.
        while output.next("`ready`") != "ready" {}
        Agent { child, input, output }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").unwrap();
        self.input.flush().unwrap();
        self.output.next(&format!("an answer to `{command}`"))
    }

    /// The key the agent printed after `prefix`.
    fn key(&mut self, command: &str, prefix: &str) -> String {
        let answer = self.ask(command);
        answer.strip_prefix(prefix).unwrap_or_else(|| panic!("{command}: {answer}")).to_owned()
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn stop(mut self) {
        drop(self.input);
        self.output.end();
        assert!(self.child.wait().unwrap().success(), "the agent failed");
    }
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "idem failed: {self:?}");
        assert!(self.stderr.is_empty(), "{self:?}");
        &self.stdout
    }

    fn fails(&self) -> &str {
        assert_eq!(self.code, 1, "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:?}");
        &self.stderr
    }
}

fn run(mut command: Command, store: &Path, args: &[&str]) -> Run {
    let output = command
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("IDEM_STORE")
        .output()
        .expect("idem runs");
    Run {
        code: output.status.code().expect("idem exited"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn idem(store: &Path, args: &[&str]) -> Run {
    run(Command::new(env!("CARGO_BIN_EXE_idem")), store, args)
}

fn place() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    (dir, path)
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[test]
fn ls_and_resolve_reach_a_running_agent_and_print_what_they_print_on_a_closed_store() {
    let (_dir, path) = place();
    let mut agent = Agent::start(&path);
    assert_eq!(agent.ask("call order-1 ch_1"), "ran ch_1");
    assert_eq!(agent.ask("call order-1 ch_again"), "replayed ch_1");
    let gone = agent.key("doubt order-0", "in-doubt ");
    idem(&path, &["resolve", &gone, "--release"]).ok();
    // Removed through the socket: the agent, which holds its recent records in memory too,
    // must not replay it from there. The released key's history goes too, counted apart.
    let out = idem(&path, &["purge", "--older-than", "0ms"]).ok().to_owned();
    assert_eq!(
        out,
        "removed 1 done record (finished more than 0s ago)\n\
         removed 1 history of released keys (last changed more than 0s ago)\n"
    );
    let out = idem(&path, &["show", &gone]).fails().to_owned();
    assert!(out.contains("no record"), "neither record nor history is left: {out}");
    assert_eq!(agent.ask("call order-1 ch_again"), "ran ch_again", "a purged record replayed");
    let released = agent.key("doubt order-2", "in-doubt ");
    let settled = agent.key("doubt order-3", "in-doubt ");
    let finished = agent.key("doubt order-4", "in-doubt ");

    let table = idem(&path, &["ls"]).ok().to_owned();
    assert_eq!(table.lines().count(), 5, "a header and four records: {table}");
    assert!(table.lines().any(|l| l.starts_with(&released) && l.contains("in-doubt")), "{table}");
    let in_doubt = idem(&path, &["ls", "--status", "in-doubt", "--json"]).ok().to_owned();
    assert_eq!(json_lines(&in_doubt).len(), 3);

    // Settled by the operator while the agent runs; the agent then behaves as after a restart.
    let out =
        idem(&path, &["resolve", &released, "--release", "--note", "no charge at the vendor"])
            .ok()
            .to_owned();
    assert_eq!(out, format!("released {released}: the next call runs the body\n"));
    assert_eq!(agent.ask("call order-2 ch_2"), "ran ch_2", "a released key runs again");
    let out = idem(&path, &["resolve", &settled, "--done", "\"ch_3\""]).ok().to_owned();
    assert_eq!(out, format!("settled {settled} as done: later calls replay \"ch_3\"\n"));
    assert_eq!(agent.ask("call order-3 ch_other"), "replayed ch_3", "a settled key replays");
    // Keys in order: whether serde_json keeps an object's order depends on the features the
    // build unifies, which is not what this test is about.
    let out = idem(&path, &["resolve", &finished, "--done", "{\"a\":2,\"b\":1}"]).ok().to_owned();
    assert!(out.ends_with("later calls replay {\"a\":2,\"b\":1}\n"), "{out}");
    let refused = idem(&path, &["resolve", &settled, "--release"]).fails().to_owned();
    assert!(refused.contains("is done and cannot be resolved"), "{refused}");

    // Every subcommand prints the same through the socket as on the store opened directly.
    let commands: [&[&str]; 8] = [
        &["ls", "--json"],
        &["show", &settled],
        &["show", &finished, "--json"],
        &["show", &settled, "--json"],
        &["show", &released],
        &["show", &released, "--json"],
        &["resolve", &settled, "--release"],
        &["show", "0123456789abcdef0123456789abcdef"],
    ];
    let live: Vec<Run> = commands.iter().map(|args| idem(&path, args)).collect();
    // The socket carried the operator's note into the history.
    let released_history = json_lines(&live[5].stdout)[0]["history"].clone();
    assert_eq!(released_history[2]["event"], "resolved", "{released_history}");
    assert_eq!(released_history[2]["note"], "no charge at the vendor");
    assert_eq!(released_history[3]["event"], "reserved", "the next call continues the history");
    let live_stats = json_lines(idem(&path, &["stats", "--json"]).ok())[0].clone();
    agent.stop();
    for (args, live) in commands.iter().zip(&live) {
        let closed = idem(&path, args);
        assert_eq!((live.code, &live.stderr), (closed.code, &closed.stderr), "{args:?}");
        // `show` prints ages, which may tick over between the two runs.
        let strip = |text: &str| {
            text.lines().map(|l| l.split(" (").next().unwrap().to_owned()).collect::<Vec<_>>()
        };
        assert_eq!(strip(&live.stdout), strip(&closed.stdout), "{args:?}");
    }
    let closed_stats = json_lines(idem(&path, &["stats", "--json"]).ok())[0].clone();
    assert_eq!(live_stats["by_status"], closed_stats["by_status"]);
    assert_eq!(live_stats["by_tool"], closed_stats["by_tool"]);
    assert_eq!(live_stats["total"], 4);
}

#[test]
fn stats_shows_the_retention_of_the_agent_that_holds_the_store() {
    let (_dir, path) = place();
    let mut agent = Agent::start_with(&path, &[("IDEM_RETAIN", "30d")]);
    assert_eq!(agent.ask("call order-1 ch_1"), "ran ch_1");
    let text = idem(&path, &["stats"]).ok().to_owned();
    let policy = "retention: finished records and released keys' histories older than 30d are \
                  removed, 100 at a time, a pass every 1h";
    assert!(text.contains(policy), "{text}");
    let stats = json_lines(idem(&path, &["stats", "--json"]).ok())[0].clone();
    assert_eq!(stats["retention"]["keep_ms"], json!(30u64 * 86_400_000), "{stats}");
    agent.stop();
    // Closed, the store is opened by the command itself, which runs no retention.
    let text = idem(&path, &["stats"]).ok().to_owned();
    assert!(text.contains("retention: none here"), "{text}");
    assert_eq!(json_lines(idem(&path, &["stats", "--json"]).ok())[0]["retention"], Value::Null);
}

#[test]
fn a_resolve_racing_the_keys_own_owner_is_refused() {
    let (_dir, path) = place();
    let mut agent = Agent::start(&path);
    let key = agent.key("hold order-9 ch_9", "holding ");
    for resolution in [&["--release"][..], &["--done", "\"ch_operator\""]] {
        let mut args = vec!["resolve", key.as_str()];
        args.extend_from_slice(resolution);
        let line = idem(&path, &args).fails().to_owned();
        assert!(line.contains("is in-flight and cannot be resolved"), "{line}");
    }
    assert_eq!(agent.ask("finish"), "ran ch_9", "the owner's result stands");
    let record = json_lines(idem(&path, &["show", &key, "--json"]).ok())[0].clone();
    assert_eq!((record["status"].as_str(), &record["result"]), (Some("done"), &json!("ch_9")));
    assert_eq!(agent.ask("call order-9 ch_again"), "replayed ch_9");
    agent.stop();
}

#[test]
fn a_killed_agents_socket_is_left_behind_and_replaced_by_the_next_agent() {
    let (_dir, path) = place();
    let mut agent = Agent::start(&path);
    let key = agent.key("hold order-5 ch_5", "holding ");
    agent.kill();
    assert!(path.join("admin.sock").exists(), "SIGKILL leaves the socket file");

    // No one serves the stale socket, so the command opens the store itself: the killed
    // agent's call is in doubt.
    let ls = idem(&path, &["ls", "--json"]).ok().to_owned();
    assert_eq!(json_lines(&ls)[0]["status"], "in-doubt", "{ls}");

    let mut agent = Agent::start(&path);
    let out = idem(&path, &["resolve", &key, "--done", "\"ch_5\""]).ok().to_owned();
    assert!(out.contains("settled"), "{out}");
    assert_eq!(agent.ask("call order-5 ch_new"), "replayed ch_5");
    agent.stop();
}

#[test]
fn another_user_is_refused_by_the_socket() {
    use std::os::unix::fs::MetadataExt;
    let (dir, path) = place();
    // A directory this process just made belongs to its effective user.
    if std::fs::metadata(dir.path()).unwrap().uid() != 0 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root: this test must run"
        );
        eprintln!("NOTICE: another_user_is_refused_by_the_socket skipped: it runs as root only, to run idem as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let mut agent = Agent::start(&path);
    let key = agent.key("doubt order-7", "in-doubt ");
    // The other user must be able to run the binary and reach the directory, so that what
    // refuses it is the socket, not the path.
    let binary = dir.path().join("idem");
    // Copied by a child process: a copy written here would hold the file open for writing while
    // another test's thread forks, and the fork's inherited handle makes running it fail with
    // "text file busy" until that fork execs.
    let copied = Command::new("cp").arg(env!("CARGO_BIN_EXE_idem")).arg(&binary).status();
    assert!(copied.expect("cp runs").success(), "the binary could not be copied");
    set_mode(dir.path(), 0o755);
    set_mode(&path, 0o755);
    let as_nobody = || {
        let mut command = Command::new(&binary);
        command.uid(NOBODY).gid(NOBODY);
        command
    };

    // The socket's mode keeps the other user out.
    let line = run(as_nobody(), &path, &["resolve", &key, "--release"]).fails().to_owned();
    assert!(line.contains("permission denied") && line.contains("run idem as the user"), "{line}");

    // With the mode loosened by hand, the process still checks who connected.
    set_mode(&path.join("admin.sock"), 0o666);
    let line = run(as_nobody(), &path, &["resolve", &key, "--release"]).fails().to_owned();
    assert!(line.contains("user 65534 may not use"), "{line}");
    let line = run(as_nobody(), &path, &["ls"]).fails().to_owned();
    assert!(line.contains("refused"), "{line}");

    let record = json_lines(idem(&path, &["show", &key, "--json"]).ok())[0].clone();
    assert_eq!(record["status"], "in-doubt", "the other user changed nothing");
    agent.stop();
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
