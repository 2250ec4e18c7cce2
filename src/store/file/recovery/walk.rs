//! The steps of the scan, on the state it carries from record to record and segment to segment:
//! the segments before the scan's start, a gap in segment numbers, a damaged header, the
//! records of one segment (a valid record, the zeros that end a segment, a torn tail, a
//! damaged record), the end of the journal, the partitions unattributed damage refuses, and
//! where appends go next. [`super::scan`] runs them in that order.

use crate::sync::HashMap;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use super::super::damage::{Damage, Ranges, at_str, shown};
use super::super::format::{
    self, FRAME_LEN, Loc, SEGMENT_HEADER_LEN, loc, loc_offset, loc_segment, partition_hash,
};
use super::super::heads::Pages;
use super::super::journal::{JournalTail, Segment, create_segment, new_salt};
use super::super::vfs::Vfs;
use super::super::window::Window;
use super::probe::{
    Probe, attribute, find_valid, probe, proves_durable, written_end, zeros_to_end,
};
use super::segment_files::DamagedSegment;
use super::{DamagedRecord, ScanOutcome, TornTail, UNPROVEN_MARKS};
use crate::error::{Error, Result};

/// What the scan of one segment leaves the scan to do.
pub(super) enum Next {
    /// Go on with the next segment.
    Segment,
    /// Stop: a torn tail was truncated, nothing after it counts.
    Stop,
}

/// A valid record as the probe read it: frame, partition name, previous-record location and
/// total length.
type Valid = (format::Frame, Vec<u8>, Loc, u64);

/// The state of a scan.
pub(super) struct Walk {
    /// Every segment number, live, damaged or unchecked, in order.
    pub(super) numbers: Vec<u32>,
    start_segment: u32,
    start_offset: u64,
    /// Whether the scan starts at a heads snapshot's position.
    from_snapshot: bool,
    zero_end_check: bool,
    proof_slack: u64,
    /// Each live segment's length when its header was read.
    lens: HashMap<u32, u64>,
    pub(super) heads: HashMap<Box<[u8]>, Loc>,
    ranges: Ranges,
    records: Vec<DamagedRecord>,
    torn_tail: Option<TornTail>,
    /// The LSN the next record must have (None: accept the first valid record's).
    expected: Option<u64>,
    bytes_scanned: u64,
    records_scanned: u64,
    end_of_tail: u64,
    /// The newest LSN any scanned frame says was durable when it was framed: a process frames
    /// that only after a sync through it succeeded, so those records are on disk.
    claimed: u64,
    /// Records of the segment being scanned that no frame proved durable when they were read,
    /// as (LSN, offset): every one while there are fewer than `UNPROVEN_MARKS` (more only
    /// under the weaker sync policies, which sync seldom), then only one after a proven mark.
    /// The front is always at or before the first record not proven yet.
    unproven: VecDeque<(u64, u64)>,
    thinned: bool,
    /// How far the segment last scanned is known to hold its records or zeros (checked).
    checked_end: Option<(u32, u64)>,
    /// Where the last valid record ended: a damaged range starts there.
    last_end: Loc,
    /// The segment scanned before the one being scanned.
    previous: u32,
    /// Where each segment's written data ends: its length, or where the zeros of its
    /// preallocated, never written end begin.
    data_ends: HashMap<u32, u64>,
}

/// A record ending at `end` ends exactly where `to` begins, or at the end of the journal.
fn ends_at(data_ends: &HashMap<u32, u64>, numbers: &[u32], end: Loc, to: Option<Loc>) -> bool {
    let seg = loc_segment(end);
    let at_data_end = data_ends.get(&seg) == Some(&loc_offset(end));
    match to {
        Some(to) => end == to || (at_data_end && to == loc(seg + 1, SEGMENT_HEADER_LEN)),
        None => at_data_end && numbers.last() == Some(&seg),
    }
}

impl Walk {
    pub(super) fn new(
        numbers: Vec<u32>,
        start: Option<(u32, u64)>,
        start_lsn: Option<u64>,
        heads: HashMap<Box<[u8]>, Loc>,
        lens: HashMap<u32, u64>,
        zero_end_check: bool,
        proof_slack: u64,
    ) -> Walk {
        let first = numbers.first().copied().unwrap_or(1);
        let (start_segment, start_offset) = start.unwrap_or((first, SEGMENT_HEADER_LEN));
        Walk {
            numbers,
            start_segment,
            start_offset,
            from_snapshot: start.is_some(),
            zero_end_check,
            proof_slack,
            data_ends: lens.clone(),
            lens,
            heads,
            ranges: Ranges::default(),
            records: Vec::new(),
            torn_tail: None,
            expected: start_lsn,
            bytes_scanned: 0,
            records_scanned: 0,
            end_of_tail: SEGMENT_HEADER_LEN,
            claimed: 0,
            unproven: VecDeque::new(),
            thinned: false,
            checked_end: None,
            last_end: loc(start_segment, start_offset),
            previous: start_segment.saturating_sub(1),
        }
    }

    /// Where the scan starts in segment `number`.
    fn base(&self, number: u32) -> u64 {
        if number == self.start_segment {
            self.start_offset
        } else {
            SEGMENT_HEADER_LEN
        }
    }

    /// Whether segment `number` is older than the scan's start: snapshotted history, not
    /// opened at all (its headers are checked on first use). Loads and reads that need a
    /// damaged one refuse; nothing else does.
    pub(super) fn before_start(&mut self, number: u32, damaged: Option<&DamagedSegment>) -> bool {
        if number >= self.start_segment {
            return false;
        }
        if let Some(d) = damaged {
            self.records.push(DamagedRecord {
                segment: number,
                offset: 0,
                partition: None,
                detail: format!("segment {number} has a damaged header: {}", d.reason),
            });
        }
        true
    }

    /// Checks the segment numbers between the one scanned before and `number`: a gap is a
    /// loss unless compaction recorded deleting every segment in it. Returns whether LSNs may
    /// skip at the start of `number` (the deleted segments took theirs).
    pub(super) fn gap_before(&mut self, number: u32, known: &Damage) -> bool {
        let previous = self.previous;
        self.previous = number;
        if number <= previous + 1 {
            return false;
        }
        if known.all_retired(previous + 1, number - 1) {
            return true;
        }
        let cause = if previous + 1 == number - 1 {
            format!("segment {} is missing", previous + 1)
        } else {
            format!("segments {} to {} are missing", previous + 1, number - 1)
        };
        log::error!("journal: {cause}");
        self.records.push(DamagedRecord {
            segment: previous + 1,
            offset: 0,
            partition: None,
            detail: cause.clone(),
        });
        self.ranges.open(self.last_end, self.expected, cause);
        false
    }

    /// A segment whose header is damaged: kept, never read; a damaged range runs through it.
    pub(super) fn damaged_header(&mut self, number: u32, reason: &str) {
        let cause = format!("segment {number} has a damaged header: {reason}");
        self.records.push(DamagedRecord {
            segment: number,
            offset: 0,
            partition: None,
            detail: cause.clone(),
        });
        self.ranges.open(self.last_end, self.expected, cause);
    }

    /// Scans the records of live segment `number` from the scan's start in it, through a
    /// bounded window.
    pub(super) fn segment(
        &mut self,
        number: u32,
        segment: &Segment,
        lsn_may_skip: bool,
    ) -> Result<Next> {
        let base = self.base(number);
        if self.ranges.open.is_none() {
            self.last_end = loc(number, base);
        }
        let len = match self.lens.get(&number) {
            Some(&len) => len,
            None => segment
                .file
                .len()
                .map_err(|e| Error::io(format!("sizing segment {number}"), e))?,
        };
        if number == self.start_segment && len < self.start_offset {
            let cause = format!(
                "segment {number} is shorter than the heads snapshot's position {}",
                self.start_offset
            );
            log::error!("journal: {cause}");
            self.records.push(DamagedRecord {
                segment: number,
                offset: self.start_offset,
                partition: None,
                detail: cause,
            });
        }
        let read = |e| Error::io(format!("reading segment {number}"), e);
        let mut w = Window::new(&*segment.file, len);
        let mut at = base;
        // A later segment exists only once everything before it was synced.
        self.unproven.clear();
        self.thinned = false;
        // Every segment but the newest was synced before the next one was created.
        let is_last = Some(number) == self.numbers.last().copied();
        while at < len {
            let expected = self.expected;
            let valid = match probe(&mut w, at, segment.seed).map_err(read)? {
                Probe::Valid(frame, name, prev, record_len)
                    if expected.is_none_or(|e| frame.lsn >= e && frame.lsn - e < (1 << 32)) =>
                {
                    Some((frame, name, prev, record_len))
                }
                _ => None,
            };
            if let Some(valid) = valid {
                // LSNs may skip only at the start of a segment after deleted ones.
                let may_skip =
                    lsn_may_skip && at == SEGMENT_HEADER_LEN && base == SEGMENT_HEADER_LEN;
                at = self.valid(number, at, valid, may_skip);
                continue;
            }
            if self.zeros_end(&mut w, number, at, len).map_err(read)? {
                break;
            }
            let after = expected.map(|e| e.saturating_sub(1));
            let next = find_valid(&mut w, at + 1, segment.seed, after).map_err(read)?;
            // In the last segment, damage is a torn write unless a later record was framed
            // after the damaged one had become durable (not only the next one: that may have
            // been written in the same group commit as the damaged record).
            let durable_damage = match expected {
                Some(lsn) => {
                    proves_durable(&mut w, next, segment.seed, after, lsn).map_err(read)?
                }
                None => next.is_some(),
            };
            if is_last && !durable_damage {
                self.torn_tail(&mut w, segment, number, at)?;
                return Ok(Next::Stop);
            }
            self.damaged_record(&mut w, segment.seed, number, at)
                .map_err(read)?;
            match next {
                Some((next_at, _)) => at = next_at,
                // Nothing valid follows in this sealed segment: the range goes on into the
                // next one.
                None => return Ok(Next::Segment),
            }
        }
        self.end_of_tail = at;
        if at == len {
            self.checked_end = Some((number, len));
        }
        Ok(Next::Segment)
    }

    /// Takes the valid record at `at` of segment `number`: closes a damaged range before it,
    /// judges its partition against the unattributed ranges, counts what it proves durable
    /// and updates its partition's head. Returns where the next record starts.
    fn valid(&mut self, number: u32, at: u64, valid: Valid, may_skip: bool) -> u64 {
        let (frame, name, prev, record_len) = valid;
        let here = loc(number, at);
        if let Some(e) = self.expected
            && frame.lsn > e
            && !may_skip
        {
            let cause = format!("records {e} to {} are missing", frame.lsn - 1);
            if self
                .ranges
                .open(self.last_end, self.expected, cause.clone())
            {
                log::error!("journal {}: {cause}", at_str(here));
                self.records.push(DamagedRecord {
                    segment: number,
                    offset: at,
                    partition: None,
                    detail: cause,
                });
            }
        }
        let (data_ends, numbers) = (&self.data_ends, &self.numbers);
        self.ranges.close(Some((here, frame.lsn)), |end| {
            ends_at(data_ends, numbers, end, Some(here))
        });
        self.ranges
            .judge(&name, frame.partition_hash, frame.kind, prev);
        self.claimed = self
            .claimed
            .max(frame.synced_lsn.saturating_add(self.proof_slack));
        let claimed = self.claimed;
        if frame.lsn > claimed {
            if self.unproven.len() < UNPROVEN_MARKS
                || self.unproven.back().is_some_and(|&(l, _)| l <= claimed)
            {
                self.unproven.push_back((frame.lsn, at));
            } else {
                self.thinned = true;
            }
        }
        while self.unproven.get(1).is_some_and(|&(l, _)| l <= claimed + 1) {
            self.unproven.pop_front();
        }
        self.heads.insert(name.into_boxed_slice(), here);
        self.expected = Some(frame.lsn + 1);
        let at = at + record_len;
        self.last_end = loc(number, at);
        self.bytes_scanned += record_len;
        self.records_scanned += 1;
        at
    }

    /// Whether nothing but zeros follows from `at`: preallocated space nothing was written to,
    /// so the segment's records end here. Not a torn tail, not damage (a record lost from the
    /// end of a sealed segment shows as a gap in LSNs at the next one).
    fn zeros_end(
        &mut self,
        w: &mut Window,
        number: u32,
        at: u64,
        len: u64,
    ) -> std::io::Result<bool> {
        let ends_here = if self.zero_end_check {
            zeros_to_end(w, at)?
        } else {
            w.get(at, FRAME_LEN)?.iter().all(|&b| b == 0)
        };
        if ends_here {
            self.data_ends.insert(number, at);
            if self.zero_end_check {
                self.checked_end = Some((number, len));
            }
        }
        Ok(ends_here)
    }

    /// A torn tail at `at` of the newest segment: it and everything after it were never
    /// acknowledged, and are truncated (and the truncation synced).
    fn torn_tail(&mut self, w: &mut Window, segment: &Segment, number: u32, at: u64) -> Result<()> {
        // The preallocated zeros after the written bytes are not counted as dropped.
        let dropped =
            written_end(w, at).map_err(|e| Error::io(format!("reading segment {number}"), e))? - at;
        log::warn!(
            "journal segment {number}: torn tail at offset {at}, truncating {dropped} bytes of unacknowledged writes"
        );
        segment
            .file
            .set_len(at)
            .and_then(|()| segment.file.sync_data())
            .map_err(|e| Error::io(format!("truncating segment {number}"), e))?;
        self.torn_tail = Some(TornTail {
            segment: number,
            offset: at,
            bytes_dropped: dropped,
        });
        self.end_of_tail = at;
        self.checked_end = Some((number, at));
        Ok(())
    }

    /// A damaged record at `at` of segment `number`: recorded, and a damaged range opened (or
    /// continued); the partition it names, when the evidence agrees, is the range's candidate.
    fn damaged_record(
        &mut self,
        w: &mut Window,
        seed: u32,
        number: u32,
        at: u64,
    ) -> std::io::Result<()> {
        let here = loc(number, at);
        let candidate = attribute(w, at, seed)?;
        let partition = candidate
            .as_ref()
            .and_then(|c| c.name.as_deref())
            .map(shown);
        log::error!(
            "journal segment {number} offset {at}: damaged record (partition {})",
            partition.as_deref().unwrap_or("unknown")
        );
        self.records.push(DamagedRecord {
            segment: number,
            offset: at,
            partition,
            detail: "damaged record".into(),
        });
        if self.ranges.open(
            self.last_end,
            self.expected,
            format!("damaged record at {}", at_str(here)),
        ) && here == self.last_end
            && let (Some(c), Some(open)) = (candidate, self.ranges.open.as_mut())
        {
            open.candidate = Some((c.hash, c.name, loc(number, c.end)));
        }
        Ok(())
    }

    /// The end of the journal: a lost segment the snapshot points into, and the range still
    /// open. Returns whether a range was open at the end.
    pub(super) fn end(&mut self) -> bool {
        let (start_segment, start_offset) = (self.start_segment, self.start_offset);
        // The segment the heads snapshot points into, and everything after it, is gone.
        if self.from_snapshot && self.numbers.last().is_none_or(|&n| n < start_segment) {
            let cause = format!(
                "segment {start_segment}, which the heads snapshot points into, is missing"
            );
            log::error!("journal: {cause}");
            self.records.push(DamagedRecord {
                segment: start_segment,
                offset: start_offset,
                partition: None,
                detail: cause.clone(),
            });
            self.ranges.open(self.last_end, self.expected, cause);
        }
        let open_at_end = self.ranges.open.is_some();
        let (data_ends, numbers) = (&self.data_ends, &self.numbers);
        self.ranges
            .close(None, |end| ends_at(data_ends, numbers, end, None));
        open_at_end
    }

    /// Every partition not judged against every unattributed range may have lost records
    /// there: refused. Those of the snapshot's pages are listed from them; an error reading a
    /// page is returned (it says nothing about the page's names).
    pub(super) fn refuse_unjudged(&mut self, pages: Option<&Pages>) -> Result<()> {
        let Some(&from) = self.ranges.starts.first() else {
            return Ok(());
        };
        let ranges = &mut self.ranges;
        let mut judge = |name: &[u8]| {
            let judged = ranges.judged.get(name).copied().unwrap_or(0);
            if judged < ranges.starts.len() {
                let from = ranges.starts.get(judged).copied().unwrap_or(from);
                ranges.damage.refuse(
                    partition_hash(name),
                    Some(name),
                    format!(
                        "it may have had records in the damaged journal from {}",
                        at_str(from)
                    ),
                );
            }
        };
        for name in self.heads.keys() {
            judge(name);
        }
        if let Some(pages) = pages {
            let heads = &self.heads;
            pages.for_each_readable(|name| {
                if !heads.contains_key(name) {
                    judge(name);
                }
            })?;
        }
        Ok(())
    }

    /// Where appends go next, and the outcome. Appends go to a fresh segment after a damaged
    /// newest one, and skip past any LSN the damage may have held, so no new record can be
    /// mistaken for a lost one.
    pub(super) fn outcome(
        self,
        vfs: &dyn Vfs,
        journal_dir: &Path,
        mut segments: BTreeMap<u32, Segment>,
        unchecked: Vec<u32>,
        damaged: BTreeMap<u32, DamagedSegment>,
        open_at_end: bool,
    ) -> Result<ScanOutcome> {
        let newest = self.numbers.last().copied();
        let last_live = segments.keys().next_back().copied();
        let mut next_lsn = self.expected.unwrap_or(1);
        if open_at_end || newest != last_live {
            next_lsn += 1 << 20;
        }
        let (mut unproven_from, mut prepared_end) = (None, 0);
        let (tail_segment, tail_seed, tail_offset) = match (newest, segments.iter().next_back()) {
            (Some(n), Some((&l, s))) if n == l => {
                // A lone proven mark: every record after it was proven or marked, so none is
                // left to prove.
                let proven = |&(l, _): &(u64, u64)| l <= self.claimed;
                if !(self.unproven.len() == 1
                    && !self.thinned
                    && self.unproven.front().is_some_and(proven))
                {
                    unproven_from = self.unproven.front().map(|&(_, at)| at);
                }
                if let Some((checked, end)) = self.checked_end
                    && checked == l
                {
                    prepared_end = end;
                }
                (l, s.seed, self.end_of_tail.max(SEGMENT_HEADER_LEN))
            }
            // Never a sealed segment older than the scan's start (when the segment the
            // snapshot points into is lost, the newest file left is one of those), and never
            // the number of a lost segment the snapshot's heads may point into.
            _ => {
                let number = match self.from_snapshot {
                    true => newest.map_or(1, |n| n + 1).max(self.start_segment + 1),
                    false => newest.map_or(1, |n| n + 1),
                };
                // Sized by the journal's first write into it.
                let s = create_segment(vfs, journal_dir, number, new_salt(), 0)?;
                let seed = s.seed;
                segments.insert(number, s);
                (number, seed, SEGMENT_HEADER_LEN)
            }
        };
        Ok(ScanOutcome {
            tail: JournalTail {
                segments,
                unchecked,
                damaged: damaged.into_iter().map(|(n, d)| (n, d.reason)).collect(),
                tail_segment,
                tail_seed,
                tail_offset,
                next_lsn,
                unproven_from,
                prepared_end,
            },
            heads: self.heads,
            damage: self.ranges.damage,
            records: self.records,
            torn_tail: self.torn_tail,
            bytes_scanned: self.bytes_scanned,
            records_scanned: self.records_scanned,
        })
    }
}
