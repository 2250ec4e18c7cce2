//! Limits of the file-backed store beyond the shared contract (SPEC S1, S11, E1): a batch whose
//! journal record would not fit the record frame is refused at `apply`, before anything is
//! written, instead of being acknowledged and then rejected when the journal is read back; and a
//! journal that has used up its segment numbers refuses appends instead of wrapping them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

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

/// The last segment number the journal may start (a location holds 24 bits of one; the top
/// 65,536 numbers are left for open's fresh segments).
const LAST_APPEND_SEGMENT: u32 = (1 << 24) - 1 - (1 << 16);

/// A version 2 segment header: preamble (magic, version, its checksum), number, salt, checksum.
fn segment_header(number: u32, salt: u64) -> Vec<u8> {
    let mut h = b"PCLSSEG\x01".to_vec();
    h.extend_from_slice(&2u32.to_le_bytes());
    let preamble = crc32c::crc32c(&h);
    h.extend_from_slice(&preamble.to_le_bytes());
    h.extend_from_slice(&number.to_le_bytes());
    h.extend_from_slice(&salt.to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// Every value the model holds, read back from `store`.
fn check_all(store: &FileStore, model: &BTreeMap<(String, String), Vec<u8>>) {
    for ((p, k), v) in model {
        let p = Partition::new(p).unwrap();
        assert_eq!(
            store.get(&p, k.as_bytes()).unwrap().as_ref(),
            Some(v),
            "{p:?} {k}"
        );
    }
}

/// Segment numbers are never reused, and a location holds 24 bits of one: a journal that would
/// start a segment past the last number it may use refuses the append with `Exhausted` (code
/// 16, a message that says what to do) instead of wrapping every location into it. Nothing is
/// damaged: what was committed reads back, after a close and after a kill, and the refusal
/// stands after the reopen. Run from a tail two segments before the last number appends may
/// start, and from one whose next number is the last a location can hold (a journal that
/// started its segments there, as one numbered before this limit existed could have).
#[test]
fn a_journal_out_of_segment_numbers_refuses_appends_and_keeps_everything() {
    for first in [LAST_APPEND_SEGMENT - 1, (1 << 24) - 2] {
        out_of_segment_numbers(first);
    }
}

fn out_of_segment_numbers(first: u32) {
    use portcullis::store::{FaultFs, Vfs};
    let fs = FaultFs::new();
    let journal = Path::new("/db/journal");
    fs.create_dir_all(journal).unwrap();
    for d in ["/", "/db", "/db/journal"] {
        fs.sync_dir(Path::new(d)).unwrap();
    }
    fs.write_file(
        &journal.join(format!("{first:010}.seg")),
        segment_header(first, 0x5eed_0001),
    )
    .unwrap();
    let open = |fs: &FaultFs| {
        FileStore::builder("/db")
            .vfs(Arc::new(fs.clone()))
            .segment_bytes(4096)
            .base_every_records(1 << 20)
            .auto_compact(false)
            .open()
            .unwrap()
    };
    let store = open(&fs);
    let mut model = BTreeMap::new();
    let refused = (0..64)
        .find_map(|i| {
            let (p, k, v) = (format!("p{}", i % 3), format!("k{i}"), vec![i as u8; 900]);
            let batch = Batch::new().put(k.clone(), v.clone());
            match store.apply(&Partition::new(&p).unwrap(), &batch) {
                Ok(outcome) => {
                    assert!(outcome.is_committed());
                    model.insert((p, k), v);
                    None
                }
                Err(e) => Some(e),
            }
        })
        .expect("appends are refused once the last segment is full");
    assert_eq!(refused.code(), 16, "{first}: {refused}");
    assert!(matches!(refused, Error::Exhausted { .. }), "{refused:?}");
    let message = refused.to_string();
    for says in [
        "journal segment numbers",
        "copy every partition into a new store",
    ] {
        assert!(message.contains(says), "{message}");
    }
    // Every segment it may use was filled (four records each), and none after was started.
    let last = first.max(LAST_APPEND_SEGMENT);
    assert_eq!(model.len() as u32, 4 * (last - first + 1), "{first}");
    let names = fs.list(journal).unwrap();
    let last_name = format!("{last:010}.seg");
    assert!(names.contains(&last_name), "{names:?}");
    assert!(!names.iter().any(|n| n > &last_name), "{names:?}");
    // Refused every time, and nothing was changed: reads and the next open serve everything.
    let again = store.apply(
        &Partition::new("p0").unwrap(),
        &Batch::new().put("x", vec![0; 900]),
    );
    assert_eq!(again.unwrap_err().code(), 16);
    check_all(&store, &model);
    // Compaction appends its copies to the journal too: it is refused the same way (or has
    // nothing to copy), and loses nothing.
    match store.compact() {
        Ok(_) => {}
        Err(e) => assert_eq!(e.code(), 16, "{e}"),
    }
    check_all(&store, &model);
    let killed = fs.crash_process();
    store.close().unwrap();
    for image in [fs.clone(), killed] {
        let reopened = open(&image);
        assert!(reopened.open_report().damaged.is_empty());
        check_all(&reopened, &model);
        let after = reopened.apply(
            &Partition::new("p1").unwrap(),
            &Batch::new().put("y", vec![1; 900]),
        );
        assert_eq!(after.unwrap_err().code(), 16);
        check_all(&reopened, &model);
        reopened.close().unwrap();
    }
}
