//! What open makes durable after a killed process, and what it may leave (SPEC S4): a record a
//! failed sync left readable in the page cache but not on disk (fsyncgate), once a reopen in
//! the same boot has served it, survives a power cut after that reopen. Open rewrites and syncs
//! every record of the tail that no later frame proves durable (a frame's `synced_lsn` is
//! written only after a sync through it succeeded), and nothing else.
//!
//! Negative controls: `SkipSync::ScannedTail` (no rewrite, no sync at open) and
//! `SkipSync::ProofBound` (one record more taken as proven than the frames prove) both lose
//! the served record in some power cut.

mod common;

use common::disk::builder;
use portcullis::store::{Batch, FaultFs, Partition, SkipSync, Store};

/// Fault seeds tried (each makes the failed sync keep a different part of its write).
const SEEDS: u64 = 24;
/// Power cuts tried after each reopen.
const CUTS: u64 = 8;

/// Commits five batches, fails the sync of a sixth, kills the process, reopens in the same
/// boot (with `skip`), reads the sixth, and power-cuts. Returns every cut that lost what the
/// reopen served, and how many reopens served the sixth batch.
fn served_then_lost(skip: Option<SkipSync>) -> (Vec<String>, usize) {
    let mut lost = Vec::new();
    let mut served = 0;
    let p = Partition::new("p").unwrap();
    for seed in 0..SEEDS {
        let fs = FaultFs::new();
        fs.set_fault_seed(seed);
        let store = builder(&fs).open().unwrap();
        for n in 0..5 {
            let put = Batch::new().put(format!("k{n}").into_bytes(), b"value".to_vec());
            assert!(store.apply(&p, &put).unwrap().is_committed());
        }
        fs.fail_syncs();
        let put = Batch::new().put(b"k5".to_vec(), b"failed sync".to_vec());
        assert!(store.apply(&p, &put).is_err(), "its sync failed");
        fs.clear_faults();
        let image = fs.crash_process();
        drop(store);

        let mut b = builder(&image);
        if let Some(skip) = skip {
            b = b.skip_sync(skip);
        }
        let reopened = b.open().unwrap();
        let seen = reopened.get(&p, b"k5").unwrap();
        if seen.is_none() {
            continue;
        }
        served += 1;
        for cut in 0..CUTS {
            let after = builder(&image.crash(seed * CUTS + cut)).open().unwrap();
            let found = after.get(&p, b"k5").unwrap();
            if found != seen {
                lost.push(format!("fault seed {seed}, cut {cut}: {found:?}"));
            }
        }
        drop(reopened);
    }
    (lost, served)
}

#[test]
fn a_record_a_failed_sync_left_in_the_page_cache_is_made_durable_by_the_reopen_serving_it() {
    let (lost, served) = served_then_lost(None);
    assert!(served > 0, "no reopen served the record");
    assert!(lost.is_empty(), "lost after being served: {lost:#?}");
}

#[test]
fn control_without_the_rewrite_at_open_the_served_record_is_lost() {
    let (lost, served) = served_then_lost(Some(SkipSync::ScannedTail));
    assert!(served > 0, "no reopen served the record");
    assert!(!lost.is_empty(), "nothing lost without the rewrite");
}

#[test]
fn control_taking_one_record_too_many_as_proven_loses_it() {
    let (lost, served) = served_then_lost(Some(SkipSync::ProofBound));
    assert!(served > 0, "no reopen served the record");
    assert!(
        !lost.is_empty(),
        "nothing lost with one record too many proven"
    );
}
