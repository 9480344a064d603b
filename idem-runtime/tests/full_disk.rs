//! A full disk: once the store could not make a write durable, it refuses every later read and
//! write until it is reopened, so no caller is told that a write whose sync failed is durable
//! (a store that remembered only its last 64 failed syncs once replayed such a write as done).
//!
//! The disk is a small tmpfs, which needs root and `mount`; elsewhere the test says so and
//! skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::{Call, Error, SledStore, Store};

/// A tmpfs mounted for the test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .ok()?;
        mounted.status.success().then(|| SmallDisk(at.to_owned()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn call(store: &Arc<dyn Store>, n: usize) -> Call {
    Call::new("export_report", format!("report-{n}"), &serde_json::json!({ "n": n }))
        .unwrap()
        .store(Arc::clone(store))
}

#[test]
fn after_a_failed_sync_every_write_is_refused_until_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("disk"), "3m") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root: this test must run"
        );
        eprintln!("NOTICE: cannot mount a tmpfs (needs root): the full-disk test is SKIPPED");
        return;
    };
    let store: Arc<dyn Store> = Arc::new(SledStore::open(disk.0.join("store")).unwrap());
    let runs = AtomicUsize::new(0);
    let body = |n: usize| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(format!("{n:06}").repeat(20_000))
    };
    let mut failed = None;
    for n in 0..200 {
        if let Err(e) = call(&store, n).run(|| body(n)) {
            failed = Some((n, e));
            break;
        }
    }
    let (failed, error) = failed.expect("a 3 MiB disk fills up within 200 results of 120 KB");
    // The reservation failed, or the result after the body ran, which the call then says.
    assert!(matches!(error, Error::Store { .. } | Error::Unrecorded { .. }), "{error:?}");
    let ran = runs.load(Ordering::SeqCst);
    // Well past the 64 failures the old code remembered.
    for n in failed..failed + 100 {
        let Err(error) = call(&store, n).run(|| body(n)) else {
            panic!("call {n} succeeded on a store whose sync failed (call {failed} failed)");
        };
        assert!(error.to_string().contains("until it is reopened"), "call {n}: {error}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), ran, "no body ran once the store was refused");
    let read = idem_runtime::admin::show(&*store, call(&store, failed).key());
    assert!(read.is_err(), "the failed call's record is handed out after its sync failed");
}
