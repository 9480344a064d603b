//! Chaos on one SQLite store shared by several processes, for about half a minute: long-lived
//! workers (each with the store opened twice) call keys that the others call too, while the
//! test kills some with SIGKILL (and starts others in their place), stops some with SIGSTOP for
//! a while, and runs short-lived processes that open the store, read it and close it. What a
//! user relies on is then checked: no effect ran twice, no key was stuck under a live owner
//! (no caller waited out its wait), every effect that ran is either recorded with its result or
//! in doubt (never absent, which would let it run again), and every key in doubt belonged to a
//! killed process.
//!
//! The actions come from a seeded generator; the seed is printed, and `IDEM_CHAOS_SEED` runs
//! one again.

mod children;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::block_on;
use idem_runtime::store::{assess, Assessment};
use idem_runtime::{Call, Error, InDoubtPolicy, SqliteStore, Status, Store};

/// The keys of one round; the workers go through the rounds, meeting on every key.
const KEYS: usize = 12;
/// How many workers run at once.
const WORKERS: usize = 4;
/// How long the test makes trouble.
const CHAOS: Duration = Duration::from_secs(25);
/// How long a caller waits for another owner: far longer than a worker is ever stopped, so a
/// caller that waits it out found a key stuck under a live owner.
const WAIT: Duration = Duration::from_secs(20);
/// How long a stopped worker stays stopped.
const STOPPED: Duration = Duration::from_millis(1500);
/// The longest the test waits for a child's line.
const DEADLINE: Duration = Duration::from_secs(120);

fn path(dir: &Path) -> std::path::PathBuf {
    dir.join("idem.sqlite")
}

/// The effect: one line in the ledger (`O_APPEND`, one write), made durable.
fn charge(dir: &Path, scope: &str) -> String {
    let id = format!("{scope}:{}:{}", std::process::id(), idem_runtime::fencing_token());
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("ledger")).unwrap();
    file.write_all(format!("{id}\n").as_bytes()).unwrap();
    file.sync_all().unwrap();
    id
}

/// What a child says to the test begins after this mark: the test harness may have begun the
/// line (`test name ... `) before the child spoke.
const SAYS: &str = "@@ ";

/// Says `line` to the test, at once.
fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "\n{SAYS}{line}");
    let _ = stdout.flush();
}

/// Child mode `worker`: opens the store twice and calls key after key, round after round (from
/// an offset of its own), until its stdin says `stop` or closes; prints each outcome, then
/// `DONE` once both handles are closed.
fn worker(dir: &Path) {
    let stores: [Arc<dyn Store>; 2] = [
        Arc::new(SqliteStore::open(path(dir)).expect("the store opens")),
        Arc::new(SqliteStore::open(path(dir)).expect("the store opens a second time")),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        stopping.store(true, Ordering::SeqCst);
    });
    let offset: usize = std::env::var("IDEM_OFFSET").unwrap().parse().unwrap();
    say("READY");
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let (round, key) = ((n + offset) / KEYS, (n + offset) % KEYS);
        let scope = format!("round-{round}-order-{key}");
        let outcome = Call::new("charge_card", &scope, &serde_json::json!({ "key": key }))
            .unwrap()
            .store(Arc::clone(&stores[n % 2]))
            .in_doubt(InDoubtPolicy::Fail)
            .wait(WAIT)
            .run(|| {
                let id = charge(dir, &scope);
                // A window between the effect and its record, for a SIGKILL to land in.
                std::thread::sleep(Duration::from_millis(15));
                Ok::<_, Error>(id)
            });
        match outcome {
            Ok(id) => say(&format!("RESULT {scope} {id}")),
            Err(Error::InDoubt { .. }) => say(&format!("INDOUBT {scope}")),
            Err(Error::InFlight { .. }) => say(&format!("INFLIGHT {scope}")),
            Err(e) => say(&format!("ERROR {scope} {}", e.to_string().replace('\n', " "))),
        }
        n += 1;
    }
    drop(stores);
    say("DONE");
}

/// Child mode `peek`: opens the store, reads every record, and closes it.
fn peek(dir: &Path) {
    let store = SqliteStore::open(path(dir)).expect("the store opens");
    let page = block_on(store.scan_page(None, usize::MAX)).expect("the store reads");
    println!("RECORDS {}", page.into_records().count());
}

#[test]
fn sqlite_chaos_child() {
    let Some((mode, dir)) = children::role() else { return };
    match mode.as_str() {
        "worker" => worker(&dir),
        _ => peek(&dir),
    }
}

/// A small generator of the test's choices (xorshift), so that a seed replays a run.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A worker process, with what it printed so far coming in on the test's channel.
struct Worker {
    id: usize,
    process: Child,
    stopped_until: Option<Instant>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = signal("CONT", &self.process);
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn signal(name: &str, process: &Child) -> bool {
    let sent = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(process.id().to_string())
        .stderr(Stdio::null())
        .status();
    sent.is_ok_and(|status| status.success())
}

/// Starts worker `id`, its lines sent to `lines` as `(id, line)`, and waits for its `READY`.
fn start_worker(
    dir: &Path,
    id: usize,
    lines: &Sender<(usize, String)>,
    said: &Receiver<(usize, String)>,
    log: &mut Vec<(usize, String)>,
) -> Worker {
    let mut process = children::child("sqlite_chaos_child", "worker", dir)
        .env("IDEM_OFFSET", (id * 5).to_string())
        .spawn()
        .expect("a worker starts");
    let stdout = BufReader::new(process.stdout.take().unwrap());
    // Killed and waited for as it drops, should it never say it is ready.
    let worker = Worker { id, process, stopped_until: None };
    let lines = lines.clone();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            let Some(at) = line.find(SAYS) else { continue };
            if lines.send((id, line[at + SAYS.len()..].to_owned())).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (from, line) = said
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("worker {id} did not start within {DEADLINE:?}"));
        let ready = from == id && line.trim_end() == "READY";
        log.push((from, line));
        if ready {
            return worker;
        }
    }
}

#[test]
fn chaos_on_one_sqlite_file_runs_no_effect_twice_and_strands_no_key() {
    let seed: u64 = match std::env::var("IDEM_CHAOS_SEED") {
        Ok(seed) => seed.parse().expect("IDEM_CHAOS_SEED is a number"),
        Err(_) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            u64::from(now.subsec_nanos()) | 1
        }
    };
    eprintln!("chaos seed {seed} (IDEM_CHAOS_SEED={seed} runs it again)");
    let mut choices = Choices(seed);
    let dir = tempfile::tempdir().unwrap();
    // Created before the workers race to, so that each starts on a store.
    drop(SqliteStore::open(path(dir.path())).unwrap());
    let (lines, said) = mpsc::channel();
    let mut log: Vec<(usize, String)> = Vec::new();
    let mut next_id = 0;
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| {
            next_id += 1;
            start_worker(dir.path(), next_id, &lines, &said, &mut log)
        })
        .collect();
    let mut killed: BTreeSet<u32> = BTreeSet::new();
    let (mut stops, mut peeks) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < CHAOS {
        std::thread::sleep(Duration::from_millis(200 + choices.below(400)));
        for worker in &mut workers {
            if worker.stopped_until.is_some_and(|until| Instant::now() >= until) {
                assert!(signal("CONT", &worker.process), "worker {} continues", worker.id);
                worker.stopped_until = None;
            }
        }
        let which = choices.below(workers.len() as u64) as usize;
        match choices.below(10) {
            0..=2 => {
                let mut worker = workers.swap_remove(which);
                worker.process.kill().unwrap();
                worker.process.wait().unwrap();
                killed.insert(worker.process.id());
                next_id += 1;
                workers.push(start_worker(dir.path(), next_id, &lines, &said, &mut log));
            }
            3..=4 if workers[which].stopped_until.is_none() => {
                assert!(signal("STOP", &workers[which].process), "worker stops");
                workers[which].stopped_until = Some(Instant::now() + STOPPED);
                stops += 1;
            }
            5..=7 => {
                let output = children::child("sqlite_chaos_child", "peek", dir.path())
                    .stdin(Stdio::null())
                    .output()
                    .expect("a short-lived process runs");
                assert!(output.status.success(), "a short-lived process failed: {output:?}");
                peeks += 1;
            }
            _ => {}
        }
        log.extend(said.try_iter());
    }
    // The end: every worker continues, finishes its call, closes the store and says so.
    for worker in &mut workers {
        if worker.stopped_until.take().is_some() {
            assert!(signal("CONT", &worker.process), "worker {} continues", worker.id);
        }
        writeln!(worker.process.stdin.as_mut().unwrap(), "stop").unwrap();
    }
    let mut done: BTreeSet<usize> = BTreeSet::new();
    let deadline = Instant::now() + DEADLINE;
    while done.len() < workers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (from, line) = said.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "workers {:?} did not finish within {DEADLINE:?}",
                workers.iter().map(|w| w.id).collect::<Vec<_>>()
            )
        });
        if line.trim_end() == "DONE" {
            done.insert(from);
        }
        log.push((from, line));
    }
    for worker in &mut workers {
        assert!(worker.process.wait().unwrap().success(), "worker {} ended cleanly", worker.id);
    }

    // No effect ran twice.
    let ledger = std::fs::read_to_string(dir.path().join("ledger")).unwrap_or_default();
    let mut effects: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in ledger.lines() {
        let scope = line.split(':').next().unwrap();
        effects.entry(scope).or_default().push(line);
    }
    let twice: Vec<_> = effects.iter().filter(|(_, runs)| runs.len() > 1).collect();
    assert!(twice.is_empty(), "effects that ran twice (seed {seed}): {twice:?}");

    // No caller waited out its wait, and none failed but by finding a key in doubt.
    let outcomes = log.iter().filter(|(_, line)| {
        line.starts_with("RESULT ")
            || line.starts_with("INDOUBT ")
            || line.starts_with("INFLIGHT ")
            || line.starts_with("ERROR ")
    });
    let (mut results, mut in_doubt) = (0, 0);
    for (from, line) in outcomes {
        assert!(
            !line.starts_with("INFLIGHT "),
            "worker {from} waited out a live owner (seed {seed}): {line}"
        );
        assert!(!line.starts_with("ERROR "), "worker {from} failed (seed {seed}): {line}");
        if let Some(result) = line.strip_prefix("RESULT ") {
            let (scope, id) = result.split_once(' ').unwrap();
            assert_eq!(
                effects.get(scope).map(|runs| runs[0]),
                Some(id),
                "worker {from} got the one effect of {scope}"
            );
            results += 1;
        } else {
            in_doubt += 1;
        }
    }

    // Every effect is recorded with its result or in doubt, and in doubt only where its owner
    // was killed.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path(dir.path())).unwrap());
    let page = block_on(store.scan_page(None, usize::MAX)).unwrap();
    let mut by_scope = BTreeMap::new();
    for record in page.into_records() {
        let record = record.unwrap();
        by_scope.insert(record.scope.clone(), record);
    }
    for (scope, runs) in &effects {
        let record = by_scope.get(*scope).unwrap_or_else(|| {
            panic!("{scope} ran ({runs:?}) but has no record: it could run again (seed {seed})")
        });
        match assess(Some(record), store.clock(), store.instance().id()) {
            Assessment::Replay => {
                let recorded = serde_json::to_string(runs[0]).unwrap();
                assert_eq!(record.result.as_deref(), Some(recorded.as_str()), "{scope}");
            }
            Assessment::InDoubt => {
                let pid: u32 = runs[0].split(':').nth(1).unwrap().parse().unwrap();
                assert!(
                    killed.contains(&pid),
                    "{scope} is in doubt, but its process {pid} was not killed (seed {seed})"
                );
            }
            other => {
                panic!("{scope} is {other:?} after every worker ended: {record:?} (seed {seed})")
            }
        }
    }
    for (scope, record) in &by_scope {
        assert!(
            effects.contains_key(scope.as_str()) || record.status != Status::Done,
            "{scope} is done with no effect"
        );
    }
    eprintln!(
        "chaos: {} workers killed, {stops} stopped, {peeks} short-lived opens; {} effects, {results} results, {in_doubt} refusals of keys in doubt",
        killed.len(),
        effects.len()
    );
    assert!(results > 0 && !killed.is_empty(), "the chaos did something (seed {seed})");
}
