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
//!
//! Checking stored history: FNV-1a is one serial xor-multiply chain per byte, so a single hash
//! runs at the multiply's latency. Each stored record carries its digest, so record `i` can be
//! checked on its own as `chain_digest(stored[i - 1], seq[i], payload[i]) == stored[i]`, the
//! first one against the already verified running digest; by induction every stored digest
//! then equals the recomputed chain. [`check_run`] hashes several such records in interleaved
//! lanes so the CPU overlaps their multiplies. The digest values are the same either way.

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

/// The parts of a stored record that the chain check reads.
pub(crate) trait Chained {
    /// The record's sequence number.
    fn seq(&self) -> u64;
    /// The digest stored with the record.
    fn stored_digest(&self) -> u64;
    /// The application's bytes.
    fn payload(&self) -> &[u8];
}

impl Chained for super::read::LogRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn stored_digest(&self) -> u64 {
        self.digest
    }
    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// The outcome of [`check_run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunCheck {
    /// The index of the first record whose stored digest does not follow from its
    /// predecessor's, if any.
    pub(crate) first_bad: Option<usize>,
    /// The digest after the last verified record: after the whole run when nothing is bad,
    /// else after the record just before `first_bad` (or the starting digest).
    pub(crate) digest: u64,
}

impl RunCheck {
    /// The chain's digest for record `index` of the checked run, given the chain's digest
    /// before it (`previous`). Records before the first bad one were verified to carry exactly
    /// that value, so their stored digest is returned without hashing again.
    pub(crate) fn chained<R: Chained>(&self, index: usize, previous: u64, record: &R) -> u64 {
        match self.first_bad {
            Some(bad) if index >= bad => chain_digest(previous, record.seq(), record.payload()),
            _ => record.stored_digest(),
        }
    }
}

/// How many records [`check_run`] hashes at once. A byte costs one xor and one multiply
/// (about four cycles of latency, one multiply issued per cycle), so four lanes already keep the
/// multiplier busy; eight measured no faster.
const LANES: usize = 4;

/// Checks that each record of `records` carries the digest the chain gives it, starting from
/// `previous` (the verified digest before `records[0]`), hashing [`LANES`] records at once.
///
/// Equivalent to recomputing the chain record by record and comparing (SPEC L4): a record is
/// checked against its predecessor's stored digest, and all records before the first mismatch
/// matched, so those stored digests are the chain's.
#[expect(
    clippy::needless_range_loop,
    reason = "the lanes' byte loops step one position across all lanes, so they index"
)]
pub(crate) fn check_run<R: Chained>(previous: u64, records: &[R]) -> RunCheck {
    // Lane state: the record it hashes, its running hash, and the payload bytes still to hash.
    let mut index = [usize::MAX; LANES];
    let mut hash = [0u64; LANES];
    let mut rest: [&[u8]; LANES] = [&[]; LANES];
    let mut next = 0;
    let mut first_bad: Option<usize> = None;
    loop {
        // Start a record in every idle lane, hashing the 16 prefix bytes of the fresh lanes
        // together.
        let mut prefix = [[0u8; 16]; LANES];
        let mut fresh = [false; LANES];
        for lane in 0..LANES {
            if index[lane] == usize::MAX && next < records.len() {
                let record = &records[next];
                let before = match next {
                    0 => previous,
                    n => records[n - 1].stored_digest(),
                };
                prefix[lane][..8].copy_from_slice(&before.to_le_bytes());
                prefix[lane][8..].copy_from_slice(&record.seq().to_le_bytes());
                index[lane] = next;
                hash[lane] = FNV_OFFSET;
                rest[lane] = record.payload();
                fresh[lane] = true;
                next += 1;
            }
        }
        for j in 0..16 {
            for lane in 0..LANES {
                if fresh[lane] {
                    hash[lane] = (hash[lane] ^ u64::from(prefix[lane][j])).wrapping_mul(FNV_PRIME);
                }
            }
        }
        let busy = index.iter().filter(|&&i| i != usize::MAX).count();
        if busy == 0 {
            break;
        }
        if busy == LANES {
            // Every lane hashes the bytes all of them still have, interleaved.
            let common = rest.iter().map(|r| r.len()).min().unwrap_or(0);
            let chunks: [&[u8]; LANES] = std::array::from_fn(|lane| &rest[lane][..common]);
            for j in 0..common {
                for lane in 0..LANES {
                    hash[lane] = (hash[lane] ^ u64::from(chunks[lane][j])).wrapping_mul(FNV_PRIME);
                }
            }
            for r in &mut rest {
                *r = &r[common..];
            }
        } else {
            // The run's last few records: nothing left to interleave with.
            for lane in 0..LANES {
                if index[lane] != usize::MAX {
                    hash[lane] = fnv1a(hash[lane], rest[lane]);
                    rest[lane] = &[];
                }
            }
        }
        for lane in 0..LANES {
            let i = index[lane];
            if i != usize::MAX && rest[lane].is_empty() {
                if hash[lane] != records[i].stored_digest() && first_bad.is_none_or(|b| i < b) {
                    first_bad = Some(i);
                }
                index[lane] = usize::MAX;
            }
        }
    }
    let verified = first_bad.unwrap_or(records.len());
    let digest = match verified {
        0 => previous,
        n => records[n - 1].stored_digest(),
    };
    RunCheck { first_bad, digest }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Row {
        seq: u64,
        digest: u64,
        payload: Vec<u8>,
    }

    impl Chained for Row {
        fn seq(&self) -> u64 {
            self.seq
        }
        fn stored_digest(&self) -> u64 {
            self.digest
        }
        fn payload(&self) -> &[u8] {
            &self.payload
        }
    }

    /// A small deterministic generator (xorshift64*), so failures replay.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A correctly chained run of `len` records after `(first_seq - 1, previous)`.
    fn chained_run(rng: &mut Rng, previous: u64, first_seq: u64, len: usize, max: u64) -> Vec<Row> {
        let mut digest = previous;
        (0..len as u64)
            .map(|k| {
                let size = rng.below(max + 1) as usize;
                let payload: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                digest = chain_digest(digest, first_seq + k, &payload);
                Row {
                    seq: first_seq + k,
                    digest,
                    payload,
                }
            })
            .collect()
    }

    /// The record-by-record check `walk` did before [`check_run`].
    fn sequential(previous: u64, records: &[Row]) -> RunCheck {
        let mut digest = previous;
        for (i, r) in records.iter().enumerate() {
            let next = chain_digest(digest, r.seq, &r.payload);
            if next != r.digest {
                return RunCheck {
                    first_bad: Some(i),
                    digest,
                };
            }
            digest = next;
        }
        RunCheck {
            first_bad: None,
            digest,
        }
    }

    #[test]
    fn matches_the_sequential_chain() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for len in (0..=9).chain([15, 16, 17, 64, 255, 256]) {
            for max in [0, 1, 7, 200, 1000] {
                let previous = rng.next();
                let first = 1 + rng.below(1000);
                let run = chained_run(&mut rng, previous, first, len, max);
                let check = check_run(previous, &run);
                assert_eq!(check, sequential(previous, &run), "len {len} max {max}");
                assert_eq!(check.first_bad, None);
                let end = run.last().map_or(previous, |r| r.digest);
                assert_eq!(check.digest, end);
            }
        }
    }

    #[test]
    fn finds_the_first_mismatch_in_every_position() {
        let mut rng = Rng(7);
        for len in 1..=17 {
            let previous = rng.next();
            let clean = chained_run(&mut rng, previous, 1, len, 300);
            for bad in 0..len {
                // Each way a record can go wrong: its digest, its payload, its sequence number,
                // and the digest it starts from.
                for damage in 0..4 {
                    let mut run: Vec<Row> = clean
                        .iter()
                        .map(|r| Row {
                            seq: r.seq,
                            digest: r.digest,
                            payload: r.payload.clone(),
                        })
                        .collect();
                    let start = match damage {
                        0 => {
                            run[bad].digest ^= 1 << (rng.below(64));
                            previous
                        }
                        1 => {
                            run[bad].payload.push(0);
                            previous
                        }
                        2 => {
                            run[bad].seq += 1;
                            previous
                        }
                        _ if bad == 0 => previous ^ 1,
                        _ => {
                            // The predecessor's stored digest is wrong: the predecessor is the
                            // first bad record.
                            run[bad - 1].digest ^= 1;
                            previous
                        }
                    };
                    let want = sequential(start, &run);
                    let expected_bad = if damage == 3 && bad > 0 { bad - 1 } else { bad };
                    assert_eq!(want.first_bad, Some(expected_bad));
                    // Later records may be damaged too; only the first one counts.
                    if bad + 2 < len {
                        run[len - 1].digest ^= 2;
                    }
                    let got = check_run(start, &run);
                    assert_eq!(got, want, "len {len} bad {bad} damage {damage}");
                }
            }
        }
    }

    #[test]
    fn chained_recomputes_from_the_first_bad_record() {
        let mut rng = Rng(11);
        let mut run = chained_run(&mut rng, GENESIS_DIGEST, 1, 6, 50);
        run[3].digest ^= 4;
        let check = check_run(GENESIS_DIGEST, &run);
        assert_eq!(check.first_bad, Some(3));
        assert_eq!(check.digest, run[2].digest);
        let mut digest = GENESIS_DIGEST;
        for (i, r) in run.iter().enumerate().take(4) {
            let truth = chain_digest(digest, r.seq, &r.payload);
            assert_eq!(check.chained(i, digest, r), truth);
            digest = truth;
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_sequential_on_any_run(
            previous: u64,
            payloads in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..20),
            flip in proptest::option::of((0usize..20, 0u32..64)),
        ) {
            let mut digest = previous;
            let mut run: Vec<Row> = payloads
                .into_iter()
                .enumerate()
                .map(|(k, payload)| {
                    digest = chain_digest(digest, k as u64 + 1, &payload);
                    Row { seq: k as u64 + 1, digest, payload }
                })
                .collect();
            if let Some((at, bit)) = flip && at < run.len() {
                run[at].digest ^= 1 << bit;
            }
            proptest::prop_assert_eq!(check_run(previous, &run), sequential(previous, &run));
        }
    }

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
