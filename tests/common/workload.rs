//! The workload: batch number `n` (1, 2, 3 ...) is a pure function of `n`, so a writer that
//! finds batch `m` as the newest on disk resumes with `m + 1`, and a checker can rebuild what
//! any prefix of the workload leaves.
//!
//! Every batch goes to one of a few partitions and, in that partition, sets the generation key
//! `g` to `n` and writes or deletes several other keys whose values carry `n` too; it is guarded
//! on the partition's previous generation, so a lost or duplicated batch also shows as a
//! refused guard. Value sizes vary so records straddle small segments.

use std::ops::Bound;

use portcullis::store::{Batch, KeyRange, Partition};

/// The partitions the workload writes to.
pub const PARTITIONS: [&str; 3] = ["alpha", "beta", "gamma"];

/// The generation key of every partition.
pub const GEN_KEY: &[u8] = b"g";

/// Which partition batch `n` writes to (an uneven pattern, so partitions interleave unevenly).
pub fn partition_index(n: u64) -> usize {
    ((n * n + n / 2) % PARTITIONS.len() as u64) as usize
}

/// The partition batch `n` writes to.
pub fn partition_of(n: u64) -> Partition {
    Partition::new(PARTITIONS[partition_index(n)]).unwrap()
}

/// The newest batch before `n` that wrote to the same partition, if any.
pub fn previous_on_same_partition(n: u64) -> Option<u64> {
    let p = partition_index(n);
    (1..n).rev().find(|&m| partition_index(m) == p)
}

/// How a generation is stored.
pub fn encode_gen(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Reads a stored generation back.
pub fn decode_gen(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn value(n: u64, slot: u64) -> Vec<u8> {
    let mut v = format!("batch {n} slot {slot};").into_bytes();
    // 0..700 bytes of padding that also names the batch.
    v.resize(
        v.len() + ((n * 53 + slot * 11) % 700) as usize,
        b'a' + (n % 26) as u8,
    );
    v
}

fn key(i: u64) -> Vec<u8> {
    format!("k{}", i % 6).into_bytes()
}

/// Batch number `n` (from 1), for the partition [`partition_of`] names.
pub fn batch(n: u64) -> Batch {
    assert!(n >= 1, "batches are numbered from 1");
    let mut b = match previous_on_same_partition(n) {
        Some(prev) => Batch::new().equals(GEN_KEY.to_vec(), encode_gen(prev)),
        None => Batch::new().absent(GEN_KEY.to_vec()),
    };
    // Every guard kind appears somewhere in the workload.
    if n.is_multiple_of(4) {
        b = b.not_after(u64::MAX);
    }
    if n.is_multiple_of(5) && previous_on_same_partition(n).is_some() {
        b = b.present(GEN_KEY.to_vec());
    }
    b = b
        .put(GEN_KEY.to_vec(), encode_gen(n))
        .put(key(n), value(n, 1))
        .put(key(n + 3), value(n, 2));
    if n.is_multiple_of(3) {
        b = b.delete(key(n + 1));
    }
    if n.is_multiple_of(7) {
        // Deletes k2..k4 (those just written too), then writes one back.
        b = b
            .delete_range(KeyRange {
                start: Bound::Included(b"k2".to_vec()),
                end: Bound::Excluded(b"k5".to_vec()),
            })
            .put(key(3), value(n, 3));
    }
    b
}

/// The partition writer thread `t` of a group-commit workload owns.
pub fn writer_partition(t: usize) -> Partition {
    Partition::new(format!("writer-{t}")).unwrap()
}

/// Batch `i` (from 1) of one writer thread: guarded on its previous generation, it sets the
/// generation and rows tagged with it.
pub fn writer_batch(i: u64) -> Batch {
    let guard = if i == 1 {
        Batch::new().absent(GEN_KEY.to_vec())
    } else {
        Batch::new().equals(GEN_KEY.to_vec(), encode_gen(i - 1))
    };
    writer_ops(i)
        .into_iter()
        .fold(guard, |b, (k, v)| b.put(k, v))
}

fn writer_ops(i: u64) -> [(Vec<u8>, Vec<u8>); 3] {
    [
        (GEN_KEY.to_vec(), encode_gen(i)),
        (
            b"a".to_vec(),
            format!("{i};").repeat(1 + (i % 50) as usize).into_bytes(),
        ),
        (format!("b{}", i % 3).into_bytes(), encode_gen(i)),
    ]
}

/// The rows of a writer's partition after its batches `1..=g`.
pub fn writer_rows(g: u64) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    (1..=g).flat_map(writer_ops).collect()
}
