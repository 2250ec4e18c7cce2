//! A transient failure while open recovers a crashed store (SPEC S4): every operation of an
//! open that scans the journal after the snapshot fails once in turn, on [`FaultFs`]. A failed
//! operation is an I/O error, never damage: open either fails without refusing anything, or
//! opens with nothing damaged and every batch there; and the next open finds nothing wrong.

mod common;

use common::check::{Model, check_store};
use common::disk::{BATCHES, builder, written};
use portcullis::Error;
use portcullis::store::{FailMode, Store};

#[test]
fn every_operation_of_open_failing_once_is_never_taken_for_damage() {
    // A killed process's store: open scans every segment after the creation of the store.
    let image = written(false);
    let ops = {
        let fs = image.crash_process();
        let store = builder(&fs).open().unwrap();
        assert!(store.open_report().journal_bytes_scanned > 0);
        fs.ops()
    };
    assert!(ops > 20, "open ran only {ops} operations");
    let mut model = Model::default();
    let mut failed_opens = 0;
    for k in 1..=ops {
        let fs = image.crash_process();
        fs.fail_at(k, FailMode::Once);
        let what = |fs: &portcullis::store::FaultFs| {
            format!(
                "operation {k} ({}) failing once",
                fs.injected().unwrap_or_default()
            )
        };
        match builder(&fs).open() {
            Ok(store) => {
                let report = store.open_report();
                assert!(
                    report.damaged.is_empty() && report.refused.partitions.is_empty(),
                    "{}: open reported damage: {report:?}",
                    what(&fs)
                );
                assert!(store.damage().is_empty(), "{}", what(&fs));
                store.close().unwrap();
            }
            Err(e) => {
                assert!(
                    !matches!(e, Error::Corrupt { .. }),
                    "{}: open answered {e:?}",
                    what(&fs)
                );
                failed_opens += 1;
            }
        }
        let store = builder(&fs).open().unwrap();
        assert!(
            store.open_report().damaged.is_empty() && store.damage().is_empty(),
            "{}, then reopened: {:?}",
            what(&fs),
            store.open_report()
        );
        assert_eq!(
            check_store(&mut model, &store, BATCHES, BATCHES),
            Ok(BATCHES),
            "{}",
            what(&fs)
        );
    }
    assert!(failed_opens > 0, "no failure reached the caller");
}
