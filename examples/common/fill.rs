//! The data the examples that measure open and reads write: per-entity logs shaped like the
//! peers' data sets (`peers/`, whose `value` is the same, so both fill the same bytes).
//!
//! Included by each example with `#[path = "common/fill.rs"] mod fill;`; a folder under
//! `examples/` without a `main.rs` is not an example target of its own.

use portcullis::log;
use portcullis::store::{Batch, FileStore, Partition};

/// Any error, carried up to `main`.
pub type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The partition holding entity `entity`'s log.
pub fn partition(entity: u64) -> R<Partition> {
    Ok(Partition::new(format!("e/logs/{entity:08}"))?)
}

/// Pseudo-random bytes, so nothing compresses.
pub fn value(entity: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut x = entity
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seq.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Appends `records` to entity `entity`'s log; a refused append is an error.
pub fn append(store: &FileStore, entity: u64, records: &[Vec<u8>]) -> R<()> {
    match log::append(store, &partition(entity)?, records, Batch::new())?.committed() {
        Some(_) => Ok(()),
        None => Err("append refused".into()),
    }
}

/// Record 0 of every entity, then record 1 of every entity, ...: one record per append,
/// round-robin over the entities, as a live system writes them.
pub fn interleaved(store: &FileStore, entities: u64, records: u64, len: usize) -> R<()> {
    for s in 0..records {
        for e in 0..entities {
            append(store, e, &[value(e, s, len)])?;
        }
    }
    Ok(())
}

/// Entity by entity: each entity's whole history in one append.
pub fn entity_by_entity(store: &FileStore, entities: u64, records: u64, len: usize) -> R<()> {
    for e in 0..entities {
        let rs: Vec<Vec<u8>> = (0..records).map(|s| value(e, s, len)).collect();
        append(store, e, &rs)?;
    }
    Ok(())
}
