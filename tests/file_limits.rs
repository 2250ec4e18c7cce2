//! Limits of the file-backed store beyond the shared contract (SPEC S1, S11, E1): a batch whose
//! journal record would not fit the record frame is refused at `apply`, before anything is
//! written, instead of being acknowledged and then rejected when the journal is read back.

use portcullis::Error;
use portcullis::store::{Batch, FileStore, MAX_BATCH_BYTES, MAX_VALUE_BYTES, Partition, Store};

/// Keys and values exactly at `MAX_BATCH_BYTES`, but so many tiny operations that the framing
/// of each (kind, key length, value length) pushes the record past the 80 MiB frame limit.
fn batch_whose_record_is_too_large() -> Batch {
    // Each tiny put counts 1 byte (its key) and takes 8 bytes in the record: 2.5 million of
    // them add about 17.5 MiB of framing to four large values that fill the rest of the batch.
    const TINY: usize = 2_500_000;
    let value_len = (MAX_BATCH_BYTES - TINY - 4 * 2) / 4;
    assert!(value_len <= MAX_VALUE_BYTES);
    let value = vec![5u8; value_len];
    let mut batch = Batch::new();
    let mut counted = 0usize;
    for k in 0..4u8 {
        batch = batch.put(vec![b'v', k], value.clone());
        counted += 2 + value.len();
    }
    for _ in 0..TINY {
        batch = batch.put(vec![b't'], Vec::new());
        counted += 1;
    }
    assert!(
        counted <= MAX_BATCH_BYTES,
        "the batch is within the contract"
    );
    assert!(counted + 7 * TINY > (80 << 20), "its record is not");
    batch
}

/// Fails on the code before this check: the batch was acknowledged, and the store then could not
/// read its own record back (the partition, or the whole reopen, failed).
#[test]
fn a_batch_whose_record_exceeds_the_frame_limit_is_refused_at_apply() {
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("p").unwrap();
    {
        let store = FileStore::open(dir.path()).unwrap();
        assert!(
            store
                .apply(&p, &Batch::new().put(b"before".to_vec(), b"1".to_vec()))
                .unwrap()
                .is_committed()
        );
        let batch = batch_whose_record_is_too_large();
        let result = store.apply(&p, &batch);
        drop(batch);
        match result {
            Err(e @ Error::TooLarge { .. }) => {
                assert_eq!(e.code(), 2);
                let message = e.to_string();
                assert!(message.contains("record"), "{message}");
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // Nothing was written: the store keeps working and holds only the earlier batch.
        assert_eq!(store.get(&p, b"t").unwrap(), None);
        assert!(
            store
                .apply(&p, &Batch::new().put(b"after".to_vec(), b"2".to_vec()))
                .unwrap()
                .is_committed()
        );
        store.close().unwrap();
    }
    let store = FileStore::open(dir.path()).unwrap();
    assert!(store.open_report().damaged.is_empty());
    assert_eq!(store.get(&p, b"before").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(&p, b"after").unwrap(), Some(b"2".to_vec()));
    assert_eq!(store.get(&p, b"t").unwrap(), None);
}
