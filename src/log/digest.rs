//! The running digest of an entity log (SPEC L4).
//!
//! Choice: FNV-1a, 64 bits, chained. Record `n`'s digest is FNV-1a-64 over the previous
//! record's digest (8 bytes, little-endian), `n` (8 bytes, little-endian) and the payload. So
//! each digest covers every record before it, a checkpoint that names `(seq, digest)` pins the
//! whole history it folds, and a record moved to another sequence number no longer matches.
//!
//! It detects accidental mismatch (a bit flip, a lost or reordered record, a checkpoint taken
//! from another history); it is not cryptographic and does not resist a deliberate forger.
//! FNV was chosen over two crc32c halves because it is a few lines with no table, is stable
//! across platforms and versions by construction, and 64 bits keeps accidental collisions
//! negligible at any realistic history length.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The digest "before record 1": the value the chain starts from.
pub const GENESIS_DIGEST: u64 = 0;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The digest of record `seq` with `payload`, given the digest of record `seq - 1`.
///
/// ```
/// use portcullis::log::{GENESIS_DIGEST, chain_digest};
/// let d1 = chain_digest(GENESIS_DIGEST, 1, b"a");
/// let d2 = chain_digest(d1, 2, b"b");
/// assert_ne!(d2, chain_digest(chain_digest(GENESIS_DIGEST, 1, b"b"), 2, b"a"));
/// ```
pub fn chain_digest(previous: u64, seq: u64, payload: &[u8]) -> u64 {
    let hash = fnv1a(FNV_OFFSET, &previous.to_le_bytes());
    let hash = fnv1a(hash, &seq.to_le_bytes());
    fnv1a(hash, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_known_vector() {
        // Published FNV-1a-64 test vector: "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn digest_depends_on_every_input() {
        let base = chain_digest(1, 2, b"x");
        assert_ne!(base, chain_digest(0, 2, b"x"));
        assert_ne!(base, chain_digest(1, 3, b"x"));
        assert_ne!(base, chain_digest(1, 2, b"y"));
    }
}
