//! Models of the syncer under loom, which runs them over every interleaving of the threads
//! (`cargo test -p idem-agent-runtime --features loom --lib loom_`).

use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::*;

/// The store's memory and its disk. A write bumps `written`; a sync reads `written` as it
/// begins and makes that much durable, or, when it fails, loses it for good (the kernel may
/// drop the pages it could not write, and a later sync does not bring them back).
#[derive(Default)]
struct Disk {
    written: AtomicUsize,
    durable: AtomicUsize,
    /// Writes `1..=lost` may never reach the disk.
    lost: AtomicUsize,
}

fn syncer(disk: &Arc<Disk>, failing_syncs: usize) -> Syncer {
    let disk = Arc::clone(disk);
    let mut syncs = 0;
    let sync = Box::new(move || {
        let seen = disk.written.load(SeqCst);
        syncs += 1;
        if syncs <= failing_syncs {
            disk.lost.fetch_max(seen, SeqCst);
            return Err("EIO".to_owned());
        }
        disk.durable.fetch_max(seen, SeqCst);
        Ok(())
    });
    Syncer::start("model-sync", Gather::Off, sync).unwrap()
}

/// One write through the syncer: refused, or its ticket's answer. A ticket that says
/// durable must be right.
fn write(syncer: &Syncer, disk: &Disk) -> Option<Result<(), StoreError>> {
    syncer.begin_write().ok()?;
    let mine = disk.written.fetch_add(1, SeqCst) + 1;
    let outcome = match syncer.end_write(true) {
        Some(ticket) => block_on(ticket),
        None => panic!("a write that changed the store gets a ticket"),
    };
    if outcome.is_ok() {
        assert!(disk.durable.load(SeqCst) >= mine, "told durable before a sync covered it");
        assert!(disk.lost.load(SeqCst) < mine, "told durable after its sync failed");
    }
    Some(outcome)
}

/// A reader: what it read is handed out only once it is durable and none of it was lost.
fn read(syncer: &Syncer, disk: &Disk) -> Result<(), StoreError> {
    let seen = disk.written.load(SeqCst);
    if let Some(ticket) = syncer.barrier() {
        block_on(ticket)?;
    }
    assert!(disk.durable.load(SeqCst) >= seen, "a reader was handed a write not yet durable");
    assert!(seen == 0 || disk.lost.load(SeqCst) == 0, "a reader was handed a lost write");
    Ok(())
}

/// A writer thread and a reader race the syncer thread; then the reader writes.
fn check(failing_syncs: usize) {
    crate::loom::model(move || {
        let disk = Arc::new(Disk::default());
        let syncer = Arc::new(syncer(&disk, failing_syncs));
        let writer = {
            let (syncer, disk) = (Arc::clone(&syncer), Arc::clone(&disk));
            thread::spawn(move || write(&syncer, &disk))
        };
        let read = read(&syncer, &disk);
        let first = writer.join().unwrap();
        let second = write(&syncer, &disk);
        if failing_syncs == 0 {
            assert!(read.is_ok());
            assert!(matches!(first, Some(Ok(()))), "{first:?}");
            assert!(matches!(second, Some(Ok(()))), "{second:?}");
        } else {
            // The first sync fails, whichever call it answers: from then on no write is
            // accepted and none is told it is durable.
            assert!(syncer.begin_write().is_err(), "a write accepted after a failed sync");
            assert!(!matches!(second, Some(Ok(()))), "{second:?}");
        }
    });
}

#[test]
fn loom_a_ticket_or_a_read_is_durable_only_after_a_sync_begun_after_the_write() {
    check(0);
}

#[test]
fn loom_after_a_failed_sync_nothing_is_reported_durable() {
    check(1);
}
