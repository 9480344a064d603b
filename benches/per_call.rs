//! The cost of one call in system calls (issue 28): runs fresh sled `Fsync` calls, and raw sled
//! durable points for comparison, in a child process under `strace -f -k`, and counts the
//! calls made between two markers, per call, by kind (futex, directory, sync) and by where they
//! come from: code of the `sled` crate on the stack, or not (idem, std, the caller).
//!
//! `cargo bench -p idem-benches --bench per_call` (needs `strace` built with stack traces).
//! `-- [calls|raw] N` prints the table for N calls (default 300, after 50 not counted); `--
//! child calls|raw N` is the traced child; `-- time N` times N untraced fresh calls. With
//! `IDEM_PER_CALL_CHILD=PATH` the traced child is another build's `per_call` binary (an A/B in
//! one run). `-- none N` times N fresh `Durability::None` calls (no sync: idem's and sled's own
//! work), for a profiler: `valgrind --tool=callgrind <per_call> none 3000` counts their
//! instructions, which no other load on the machine changes.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use idem::{Durability, Store};

use self::common::{fresh_call, temp_store};

// Only the store and the fresh call of what the plain binaries share are used here.
#[allow(dead_code)]
#[path = "common.rs"]
mod common;

/// Calls made before counting starts: sled's IO threads are started and the caches warm.
const WARM_UP: usize = 50;
const BEGIN: &str = "/idem-per-call-begin";
const END: &str = "/idem-per-call-end";

/// The system calls counted, by the kind they are reported under.
const KINDS: &[(&str, &[&str])] = &[
    ("futex", &["futex"]),
    // `read`: of the inotify instance that tells whether a directory changed (issue 28).
    (
        "directory (getdents64, openat, statx, fstat, close, read)",
        &["getdents64", "openat", "statx", "newfstatat", "fstat", "close", "read"],
    ),
    ("sync (fsync, fdatasync, sync_file_range)", &["fsync", "fdatasync", "sync_file_range"]),
    ("write (pwrite64, write)", &["pwrite64", "write"]),
];

fn marker(path: &str) {
    // A failing stat of a path nothing else names: the marker strace sees.
    let _ = std::fs::metadata(path);
}

/// The traced child: `n` fresh calls (`calls`) or raw sled durable points (`raw`) between the
/// markers.
fn child(what: &str, n: usize) {
    match what {
        "raw" => {
            let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().expect("temp dir");
            let db = sled::Config::new()
                .path(dir.path().join("raw.sled"))
                .cache_capacity(64 * 1024 * 1024)
                .flush_every_ms(None)
                .open()
                .expect("a raw sled store");
            let tree = db.open_tree("idem.records").expect("a tree");
            let data = std::fs::File::open(dir.path().join("raw.sled").join("db")).expect("db");
            let value = vec![b'x'; 330];
            let point = |i: usize| {
                let key = format!("{i:032x}");
                tree.compare_and_swap(key.as_bytes(), None as Option<&[u8]>, Some(&value[..]))
                    .expect("a swap")
                    .expect("a new key");
                db.flush().expect("a flush");
                data.sync_data().expect("fdatasync");
            };
            (0..WARM_UP).for_each(point);
            marker(BEGIN);
            (WARM_UP..WARM_UP + n).for_each(point);
            marker(END);
            write_thread_names();
        }
        _ => {
            let (_dir, store): (_, Arc<dyn Store>) = temp_store(Durability::Fsync);
            (0..WARM_UP).for_each(|_| fresh_call(&store));
            marker(BEGIN);
            (0..n).for_each(|_| fresh_call(&store));
            marker(END);
            write_thread_names();
        }
    }
}

/// Counts of one traced run: per system call, how many came from sled's code and how many not;
/// and per thread name, the futex calls.
#[derive(Default)]
struct Counts {
    by_call: BTreeMap<String, (u64, u64)>,
    futex_by_thread: BTreeMap<String, u64>,
}

/// Whether a stack frame line of `strace -k` is in sled or the locks and epochs it brings
/// (idem's own locks are std's). The stacks are cut short where functions were inlined, so a
/// call is also sled's when its thread is one of sled's IO threads.
fn sled_frame(frame: &str) -> bool {
    ["(sled::", "(<sled::", "parking_lot", "crossbeam"].iter().any(|name| frame.contains(name))
}

/// The name a thread is reported under: sled's IO threads together, the process's first
/// thread as the caller.
fn thread(names: &BTreeMap<u32, String>, tid: u32) -> String {
    match names.get(&tid) {
        Some(name) if name.starts_with("sled-io") => "sled-io-*".to_owned(),
        Some(name) if name == "per_call" => "the caller".to_owned(),
        Some(name) => name.clone(),
        None => "(exited)".to_owned(),
    }
}

/// Parses `strace -f -k -o FILE` output between the markers. Each system call line starts with
/// the thread id; its stack frames follow on lines starting with ` > `.
fn parse(trace: &str, names: &BTreeMap<u32, String>) -> Counts {
    let mut counts = Counts::default();
    let mut counting = false;
    // The call being read: its name, its thread, and whether a sled frame was seen.
    let mut current: Option<(String, u32, bool)> = None;
    let finish = |current: Option<(String, u32, bool)>, counts: &mut Counts| {
        if let Some((call, tid, in_sled)) = current {
            let entry = counts.by_call.entry(call.clone()).or_default();
            if in_sled {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
            if call == "futex" {
                *counts.futex_by_thread.entry(thread(names, tid)).or_default() += 1;
            }
        }
    };
    for line in trace.lines() {
        if let Some(frame) = line.strip_prefix(" > ") {
            if let Some((_, _, in_sled)) = &mut current {
                *in_sled |= sled_frame(frame);
            }
            continue;
        }
        let held = current.take();
        if counting {
            finish(held, &mut counts);
        }
        if line.contains(BEGIN) {
            counting = true;
            continue;
        }
        if line.contains(END) {
            break;
        }
        // `TID call(args…` or `TID <... call resumed>`: only the start of a call counts.
        let mut parts = line.splitn(2, ' ');
        let (Some(tid), Some(rest)) = (parts.next(), parts.next()) else { continue };
        let Ok(tid) = tid.trim().parse::<u32>() else { continue };
        let rest = rest.trim_start();
        if rest.starts_with("<...") || rest.starts_with("+++") || rest.starts_with("---") {
            continue;
        }
        let Some(call) = rest.split('(').next() else { continue };
        let in_sled = thread(names, tid) == "sled-io-*";
        current = Some((call.to_owned(), tid, in_sled));
    }
    counts
}

/// Runs the child under strace and returns its counts.
fn traced(what: &str, n: usize) -> Counts {
    // Another build's binary, for a comparison in one run.
    let exe = match std::env::var_os("IDEM_PER_CALL_CHILD") {
        Some(exe) => exe.into(),
        None => std::env::current_exe().expect("the bench binary"),
    };
    let out = tempfile::Builder::new().prefix("idem-bench-strace").tempdir().expect("temp dir");
    let trace = out.path().join("trace");
    let names = out.path().join("threads");
    let status = Command::new("strace")
        .args(["-f", "-k", "-qq", "-o"])
        .arg(&trace)
        .arg(&exe)
        .args(["child", what, &n.to_string()])
        .env("IDEM_PER_CALL_THREADS", &names)
        .status()
        .expect("strace runs (apt-get install strace)");
    assert!(status.success(), "the traced child failed: {status}");
    let names: BTreeMap<u32, String> = std::fs::read_to_string(&names)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (tid, name) = l.split_once(' ')?;
            Some((tid.parse().ok()?, name.to_owned()))
        })
        .collect();
    parse(&std::fs::read_to_string(&trace).expect("the trace"), &names)
}

/// Writes the names of the process's threads (`TID NAME` lines) where the parent asked.
fn write_thread_names() {
    let Ok(path) = std::env::var("IDEM_PER_CALL_THREADS") else { return };
    let mut lines = String::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        lines.push_str(&format!("{} {}\n", task.file_name().to_string_lossy(), comm.trim()));
    }
    let _ = std::fs::write(path, lines);
}

fn table(what: &str, n: usize) {
    let counts = traced(what, n);
    let per = |v: u64| v as f64 / n as f64;
    println!("{what}: {n} calls counted (after {WARM_UP} not counted), per call:\n");
    println!("| system calls | total | in sled's code | elsewhere (idem, std) |");
    println!("| --- | --- | --- | --- |");
    for (kind, calls) in KINDS {
        let (sled, other) = calls
            .iter()
            .filter_map(|c| counts.by_call.get(*c))
            .fold((0, 0), |(s, o), (cs, co)| (s + cs, o + co));
        println!("| {kind} | {:.2} | {:.2} | {:.2} |", per(sled + other), per(sled), per(other));
    }
    let all: u64 = counts.by_call.values().map(|(s, o)| s + o).sum();
    println!("| all | {:.2} | | |", per(all));
    println!("\nfutex per call, by thread:");
    for (thread, count) in &counts.futex_by_thread {
        println!("- {thread}: {:.2}", per(*count));
    }
    println!("\nevery system call per call (sled / elsewhere):");
    for (call, (sled, other)) in &counts.by_call {
        println!("- {call}: {:.2} / {:.2}", per(*sled), per(*other));
    }
}

/// `n` untraced fresh calls with `durability`: the median call in µs, and the process's CPU time per call in µs.
fn time(n: usize, durability: Durability) -> (f64, f64) {
    let (_dir, store) = temp_store(durability);
    (0..WARM_UP).for_each(|_| fresh_call(&store));
    let cpu = common::process_cpu();
    let mut took: Vec<f64> = (0..n)
        .map(|_| {
            let began = Instant::now();
            fresh_call(&store);
            began.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let cpu = (common::process_cpu() - cpu).as_secs_f64() * 1e6 / n as f64;
    took.sort_by(f64::total_cmp);
    (took[n / 2], cpu)
}

/// The build in `IDEM_PER_CALL_CHILD` (before) against this one (after), alternately, `rounds`
/// times `n` untraced fresh calls each: medians and CPU per call, and their ratios.
fn ab(n: &str, rounds: usize) {
    let before = std::env::var_os("IDEM_PER_CALL_CHILD").expect("IDEM_PER_CALL_CHILD=<before>");
    let after = std::env::current_exe().expect("the bench binary");
    let run = |exe: &std::ffi::OsStr| -> (f64, f64) {
        let out = Command::new(exe).args(["time", n]).output().expect("the timed child");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut figures = text.split_whitespace().map(|f| f.parse::<f64>().expect("a figure"));
        (figures.next().expect("a median"), figures.next().expect("a CPU time"))
    };
    println!("| round | median before | median after | ratio | CPU/call before | CPU/call after | ratio |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for round in 1..=rounds {
        let (m0, c0) = run(&before);
        let (m1, c1) = run(after.as_os_str());
        println!(
            "| {round} | {m0:.0} µs | {m1:.0} µs | {:.2} | {c0:.0} µs | {c1:.0} µs | {:.2} |",
            m1 / m0,
            c1 / c0
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let count = |s: Option<&&str>| s.map_or(300, |s| s.parse().expect("a call count"));
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["child", what, n] => child(what, n.parse().expect("a call count")),
        ["time", n] => {
            let (median, cpu) = time(n.parse().expect("a call count"), Durability::Fsync);
            println!("{median:.1} {cpu:.1}");
        }
        ["none", n] => {
            let (median, cpu) = time(n.parse().expect("a call count"), Durability::None);
            println!("fresh Durability::None call: median {median:.1} µs, {cpu:.1} µs of CPU");
        }
        ["ab", n, rounds] => ab(n, rounds.parse().expect("a round count")),
        [what @ ("calls" | "raw"), rest @ ..] => table(what, count(rest.first())),
        _ => {
            let n = count(args.first().map(String::as_str).as_ref());
            table("calls", n);
            println!();
            table("raw", n);
        }
    }
}
