//! Where a store's journal bytes go (SPEC S13), for the tests that bound space amplification
//! and the analysis behind them (feature `test-hooks`).
//!
//! Owns [`Footprint`]: every record of every live segment classified as frames, body heads,
//! operation framing, values (live: some index points at them; dead otherwise), base entries
//! (live: the partition's newest base; dead otherwise), and records outside every chain. It
//! loads every partition and reads every segment, so it is for tests, never for a hot path.
//!
//! May call: the journal's reads, the partition table and the chain format.

use crate::sync::HashSet;
use std::collections::BTreeMap;

use super::Inner;
use super::format::{
    self, FRAME_LEN, Item, JournalOp, RecordKind, SEGMENT_HEADER_LEN, decode_body_head, loc,
};
use super::partition;
use crate::error::Result;

/// Bytes of the journal by what they hold. See [`super::FileStore::footprint`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of every live segment file, headers included.
    pub segment_bytes: u64,
    /// Live segments.
    pub segments: u64,
    /// Records, by kind: batches (commits and compaction's copies), bases, base parts.
    pub records: u64,
    /// 37-byte frames.
    pub frames: u64,
    /// Body heads: name, chain link, counts.
    pub body_heads: u64,
    /// Operation framing in batch records: op tag, key length, key, value length.
    pub op_framing: u64,
    /// Value bytes some partition's index points at.
    pub live_values: u64,
    /// Value bytes nothing points at (overwritten, deleted, or copied elsewhere).
    pub dead_values: u64,
    /// Entry bytes of each partition's newest base.
    pub live_bases: u64,
    /// Entry bytes of older bases.
    pub dead_bases: u64,
    /// Frames, heads and framing of records in a partition's chain since its newest base.
    pub chain_overhead: u64,
    /// Frames, heads and framing of records in no chain (their values counted above).
    pub dead_overhead: u64,
    /// Segment headers and bytes after the last record (preallocated space).
    pub other: u64,
    /// Per segment: (number, file bytes, bytes that are dead: dead values, dead bases and
    /// records in no chain).
    pub per_segment: Vec<(u32, u64, u64)>,
    /// Bytes of the store's other files (snapshots, manifest).
    pub other_files: u64,
}

impl Footprint {
    /// Dead bytes: what a compaction of every segment would reclaim, before its own writes.
    pub fn dead(&self) -> u64 {
        self.dead_values + self.dead_bases + self.dead_overhead
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "{} segments, {:.1} MiB; {} records; other files {:.1} MiB",
            self.segments,
            mib(self.segment_bytes),
            self.records,
            mib(self.other_files)
        )?;
        for (what, b) in [
            ("frames", self.frames),
            ("body heads", self.body_heads),
            ("op framing", self.op_framing),
            ("live values", self.live_values),
            ("dead values", self.dead_values),
            ("live bases", self.live_bases),
            ("dead bases", self.dead_bases),
            ("chain overhead", self.chain_overhead),
            ("dead overhead", self.dead_overhead),
            ("other", self.other),
        ] {
            writeln!(f, "  {what:<15} {:>9.1} MiB", mib(b))?;
        }
        let mut hist = [0u64; 10];
        for &(_, size, dead) in &self.per_segment {
            hist[((dead * 10) / size.max(1)).min(9) as usize] += 1;
        }
        write!(f, "  segments by dead tenth: {hist:?}")
    }
}

impl Inner {
    /// Classifies every byte of every live segment (see [`Footprint`]).
    pub(super) fn footprint(&self) -> Result<Footprint> {
        let mut live_values: BTreeMap<u64, u32> = BTreeMap::new();
        let mut chains: HashSet<u64> = HashSet::default();
        let mut newest_bases: HashSet<u64> = HashSet::default();
        for p in self.list_partitions(b"")? {
            let Some(state) = self.readable(&p)? else {
                continue;
            };
            live_values.extend(state.view.read().index.values().map(|v| (v.at, v.len)));
            let mut at = partition::head_of(&state);
            while at != 0 {
                let (frame, body) = self.journal.read_record(at)?;
                let (_, prev) = decode_body_head(&body).unwrap_or((&[], 0));
                chains.insert(at);
                if frame.kind.is_base() {
                    newest_bases.insert(at);
                    break;
                }
                if frame.kind.is_base_part() {
                    newest_bases.insert(at);
                    if format::decode_base_part_head(&body).is_some_and(|(part, _)| part == 0) {
                        break;
                    }
                }
                at = prev;
            }
        }
        let mut f = Footprint::default();
        let mut per: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for number in self.journal.live_segments() {
            let segment = self.journal.segment(number)?;
            let len = segment.file.len().unwrap_or(0);
            f.segments += 1;
            f.segment_bytes += len;
            let mut dead_here = 0u64;
            let mut offset = SEGMENT_HEADER_LEN;
            f.other += SEGMENT_HEADER_LEN.min(len);
            while offset + (FRAME_LEN as u64) < len {
                let at = loc(number, offset);
                let Ok((frame, body)) = self.journal.read_record(at) else {
                    break;
                };
                f.records += 1;
                f.frames += FRAME_LEN as u64;
                let in_chain = chains.contains(&at);
                // Bytes of the body besides its values and base entries.
                let body_at = at + FRAME_LEN as u64;
                let range = body_at..body_at + body.len() as u64;
                let values_live: u64 = live_values.range(range).map(|(_, &l)| l as u64).sum();
                let (mut framing, mut values) = (0u64, 0u64);
                let (name, _) = decode_body_head(&body).unwrap_or((&[], 0));
                let head_len = (1 + name.len() + 8) as u64;
                format::visit_body(frame.kind, &body, |item| match item {
                    Item::Op(JournalOp::Put(k, _, len)) => {
                        framing += 1 + 2 + k.len() as u64 + 4;
                        values += len as u64;
                    }
                    Item::Op(JournalOp::Delete(k)) => framing += 3 + k.len() as u64,
                    _ => {}
                })?;
                if frame.kind == RecordKind::Values {
                    values = body.len() as u64 - head_len;
                }
                let values_dead = values - values_live;
                let rest = body.len() as u64 - values_live - values_dead - framing;
                let (head, base_entries) = if frame.kind.is_base() || frame.kind.is_base_part() {
                    let head = if frame.kind.is_base_part() {
                        head_len + 8
                    } else {
                        head_len
                    };
                    (head, rest - head)
                } else {
                    (rest, 0)
                };
                f.body_heads += head;
                f.op_framing += framing;
                let overhead = FRAME_LEN as u64 + head + framing;
                f.live_values += values_live;
                f.dead_values += values_dead;
                dead_here += values_dead;
                if frame.kind.is_base() || frame.kind.is_base_part() {
                    if newest_bases.contains(&at) {
                        f.live_bases += base_entries;
                        f.chain_overhead += overhead;
                    } else {
                        f.dead_bases += base_entries;
                        f.dead_overhead += overhead;
                        dead_here += base_entries + overhead;
                    }
                } else if in_chain {
                    f.chain_overhead += overhead;
                } else {
                    f.dead_overhead += overhead;
                    dead_here += overhead;
                }
                offset += FRAME_LEN as u64 + body.len() as u64;
            }
            f.other += len.saturating_sub(offset.max(SEGMENT_HEADER_LEN));
            per.insert(number, (len, dead_here));
        }
        f.per_segment = per.into_iter().map(|(n, (l, d))| (n, l, d)).collect();
        let vfs = &*self.config.vfs;
        for name in vfs.list(&self.config.dir).unwrap_or_default() {
            let path = self.config.dir.join(&name);
            if let Ok(Some(super::vfs::PathKind::File)) = vfs.kind(&path)
                && let Ok(file) = vfs.open(&path, super::vfs::OpenMode::Read)
            {
                f.other_files += file.len().unwrap_or(0);
            }
        }
        Ok(f)
    }
}
