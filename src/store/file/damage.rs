//! What damage the store refuses (SPEC S4), and how recovery decides it for a damaged range
//! of the journal.
//!
//! A damaged range starts right after the last valid record before it. A range that provably
//! held exactly one record of a known partition refuses that partition. Any other range is
//! unattributed: a partition is cleared of it only by its first record after the range, when
//! that record is a base (a whole index) or its chain link points before the range; every
//! other partition that existed, and every partition the store does not know, is refused.
//! Refusals are persisted with every heads snapshot and manifest and lifted only by an
//! operator call.

use crate::sync::HashMap;
use crate::sync::atomic::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::format::{Loc, RecordKind, loc_offset, loc_segment, partition_hash};
use super::partition::Load;
use super::{FileStore, Inner};
use crate::error::{Error, Result};
use crate::store::Partition;

/// Why a partition is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The partition's name, when known (damage may name only its hash).
    pub name: Option<Vec<u8>>,
    /// What was found.
    pub reason: String,
}

/// What the store refuses because of damage (SPEC S4). Persisted with every heads snapshot and
/// manifest; only an operator call lifts an entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    /// Refused partitions by partition hash.
    pub refused: BTreeMap<u64, Refusal>,
    /// Damaged ranges no partition could be named for. While any stands, a partition the store
    /// does not know is refused too: it may have lived only in such a range.
    pub unattributed: Vec<String>,
    /// Segments compaction deleted (inclusive ranges of numbers), recorded before deleting
    /// them: a full-scan rebuild accepts these gaps, and only these (any other is a loss).
    pub retired: Vec<(u32, u32)>,
}

impl Damage {
    /// Whether nothing is refused.
    pub fn is_empty(&self) -> bool {
        self.refused.is_empty() && self.unattributed.is_empty()
    }

    /// Records segments compaction is about to delete.
    pub fn retire(&mut self, numbers: impl IntoIterator<Item = u32>) {
        self.retire_ranges(numbers.into_iter().map(|n| (n, n)));
    }

    fn retire_ranges(&mut self, ranges: impl IntoIterator<Item = (u32, u32)>) {
        self.retired.extend(ranges);
        self.retired.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.retired.len());
        for &(a, b) in &self.retired {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.retired = merged;
    }

    /// Whether compaction deleted every segment in `from..=to`.
    pub fn all_retired(&self, from: u32, to: u32) -> bool {
        self.retired.iter().any(|&(a, b)| a <= from && to <= b)
    }

    pub fn refuse(&mut self, hash: u64, name: Option<&[u8]>, reason: String) {
        let entry = self
            .refused
            .entry(hash)
            .or_insert(Refusal { name: None, reason });
        if entry.name.is_none() {
            entry.name = name.map(<[u8]>::to_vec);
        }
    }

    /// Adds everything `other` refuses.
    pub fn merge(&mut self, other: Damage) {
        for (hash, r) in other.refused {
            self.refuse(hash, r.name.as_deref(), r.reason);
        }
        for u in other.unattributed {
            if !self.unattributed.contains(&u) {
                self.unattributed.push(u);
            }
        }
        self.retire_ranges(other.retired);
    }
}

pub fn shown(name: &[u8]) -> String {
    name.escape_ascii().to_string()
}

pub fn at_str(l: Loc) -> String {
    format!("segment {} offset {}", loc_segment(l), loc_offset(l))
}

/// A damaged range being scanned past: it starts right after the last valid record.
pub struct OpenRange {
    from: Loc,
    /// The first missing LSN, if known.
    first_lsn: Option<u64>,
    /// The partition of a damaged record that starts the range, and where that record claims
    /// to end.
    pub candidate: Option<(u64, Option<Vec<u8>>, Loc)>,
    cause: String,
}

/// The bookkeeping that decides which partitions a damaged range refuses.
#[derive(Default)]
pub struct Ranges {
    /// Start of every unattributed range so far, in journal order.
    pub starts: Vec<Loc>,
    /// For a partition seen since the first range: how many ranges it has been judged against.
    pub judged: HashMap<Box<[u8]>, usize>,
    pub open: Option<OpenRange>,
    pub damage: Damage,
}

impl Ranges {
    pub fn open(&mut self, from: Loc, first_lsn: Option<u64>, cause: String) -> bool {
        if self.open.is_some() {
            return false;
        }
        self.open = Some(OpenRange {
            from,
            first_lsn,
            candidate: None,
            cause,
        });
        true
    }

    /// Closes the open range at a valid record `to` with LSN `lsn` (None: the journal ended).
    /// `exact_end` says whether a record ending at `end` would end exactly where `to` begins.
    pub fn close(&mut self, to: Option<(Loc, u64)>, exact_end: impl Fn(Loc) -> bool) {
        let Some(range) = self.open.take() else {
            return;
        };
        let lost = match (to, range.first_lsn) {
            (Some((_, lsn)), Some(first)) => Some(lsn.saturating_sub(first)),
            _ => None,
        };
        let single = match (&range.candidate, lost, to) {
            (Some((_, _, end)), Some(1), Some(_)) | (Some((_, _, end)), None, None) => {
                exact_end(*end)
            }
            _ => false,
        };
        let to_str = match to {
            Some((l, _)) => at_str(l),
            None => "the end of the journal".to_owned(),
        };
        let what = format!(
            "journal {} to {} ({}{})",
            at_str(range.from),
            to_str,
            range.cause,
            lost.map(|n| format!("; {n} records lost"))
                .unwrap_or_default()
        );
        if let Some((hash, name, _)) = &range.candidate {
            self.damage.refuse(
                *hash,
                name.as_deref(),
                format!("its record in {what} is damaged"),
            );
        }
        if !single {
            log::error!(
                "unattributed damage in {what}: every partition that may have had a record there is refused"
            );
            self.starts.push(range.from);
            self.damage.unattributed.push(what);
        }
    }

    /// Judges a valid record of `name` against the unattributed ranges before it: a record
    /// proves its partition lost nothing in a range when it is a base (a whole index) or its
    /// chain link points before the range.
    pub fn judge(&mut self, name: &[u8], hash: u64, kind: RecordKind, prev: Loc) {
        if self.starts.is_empty() {
            return;
        }
        let judged = self.judged.get(name).copied().unwrap_or(0);
        if judged < self.starts.len() {
            let from = self.starts[judged];
            if !kind.is_base() && prev >= from {
                self.damage.refuse(
                    hash,
                    Some(name),
                    format!(
                        "its record at {} lies in a damaged range of the journal",
                        at_str(prev)
                    ),
                );
            }
            self.judged.insert(name.into(), self.starts.len());
        }
    }
}

/// A partition the store refuses, as [`FileStore::damage`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RefusedPartition {
    /// The partition, when its name is known (damage may name only its hash).
    pub partition: Option<Partition>,
    /// The partition's hash as record frames carry it.
    pub hash: u64,
    /// What was found.
    pub reason: String,
}

/// What a file-backed store refuses because of damage (SPEC S4). Survives close and reopen
/// until an operator accepts it with [`FileStore::accept_damage`] or
/// [`FileStore::accept_unattributed_damage`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreDamage {
    /// Partitions refused with `Error::Corrupt`.
    pub partitions: Vec<RefusedPartition>,
    /// Damaged ranges of the journal no partition could be named for. While any is listed,
    /// every partition the store does not know is refused too.
    pub unattributed: Vec<String>,
}

impl StoreDamage {
    /// Whether the store refuses nothing.
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty() && self.unattributed.is_empty()
    }
}

pub fn describe(damage: &Damage) -> StoreDamage {
    StoreDamage {
        partitions: damage
            .refused
            .iter()
            .map(|(&hash, r)| RefusedPartition {
                partition: r.name.as_deref().and_then(|n| Partition::new(n).ok()),
                hash,
                reason: r.reason.clone(),
            })
            .collect(),
        unattributed: damage.unattributed.clone(),
    }
}

const OPERATOR_HINT: &str =
    "an operator lifts this with FileStore::accept_damage once the loss is understood";

impl Inner {
    /// Why partition `hash` is refused, if it is.
    pub(super) fn refusal(&self, hash: u64) -> Option<String> {
        let damage = self.damage.lock();
        damage
            .refused
            .get(&hash)
            .map(|r| format!("{}; {OPERATOR_HINT}", r.reason))
    }

    /// For a partition the store does not know: refused if its hash is, or while unattributed
    /// damage stands (it may have lived only in a damaged range).
    pub(super) fn check_absent(&self, p: &Partition) -> Result<()> {
        let what = || format!("partition {p}");
        if let Some(detail) = self.refusal(partition_hash(p.as_bytes())) {
            return Err(Error::corrupt(what(), detail));
        }
        if self.refuses_unknown.load(Ordering::Acquire) {
            let ranges = self.damage.lock().unattributed.join("; ");
            return Err(Error::corrupt(
                what(),
                format!(
                    "the journal lost records no partition could be named for ({ranges}), and this partition cannot be proven absent from them; an operator lifts this with FileStore::accept_unattributed_damage"
                ),
            ));
        }
        Ok(())
    }
}

impl FileStore {
    /// What the store refuses because of damage (SPEC S4): partitions answered with
    /// `Error::Corrupt`, and damage no partition could be named for. It survives close and
    /// reopen until an operator accepts it.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// let damage = store.damage();
    /// assert!(damage.is_empty()); // a healthy store refuses nothing
    /// for refused in &damage.partitions {
    ///     println!("refused {:?}: {}", refused.partition, refused.reason);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn damage(&self) -> StoreDamage {
        let mut damage = describe(&self.inner.damage.lock());
        // Damaged pages of the heads snapshot refuse the names they could hold until reopen.
        if let Some(base) = self.inner.table.read().base.clone() {
            damage.unattributed.extend(base.describe_damage());
        }
        damage
    }

    /// Operator call: accepts the damage of partition `p` and lifts its refusal, durably. The
    /// partition then serves what its intact history holds, which may be older than what was
    /// acknowledged (that is what the operator accepts). If its history cannot be read at
    /// all, its next load refuses it again. Returns whether `p` was refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// // An operator who has looked at a refused partition accepts what is left of it.
    /// for refused in store.damage().partitions {
    ///     if let Some(p) = refused.partition {
    ///         store.accept_damage(&p)?;
    ///     }
    /// }
    /// assert!(!store.accept_damage(&Partition::new("accounts")?)?); // it was not refused
    /// # Ok(())
    /// # }
    /// ```
    pub fn accept_damage(&self, p: &Partition) -> Result<bool> {
        let inner = &self.inner;
        inner.check_open()?;
        let hash = partition_hash(p.as_bytes());
        let was = inner.damage.lock().refused.remove(&hash).is_some();
        if let Some(state) = inner.table.read().touched.get(p.as_bytes()).cloned() {
            let mut commit = state.commit.lock();
            if matches!(commit.load, Load::Corrupt(_)) {
                commit.load = Load::NotLoaded;
            }
        }
        log::warn!("operator accepted the damage of partition {p}");
        inner.write_snapshot()?;
        Ok(was)
    }

    /// Operator call: accepts the damaged ranges no partition could be named for, durably, so
    /// partitions the store does not know are served (as absent) again. Partitions refused by
    /// name stay refused until [`FileStore::accept_damage`].
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// if !store.damage().unattributed.is_empty() {
    ///     store.accept_unattributed_damage()?; // serve unknown partitions as absent again
    /// }
    /// assert!(store.damage().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn accept_unattributed_damage(&self) -> Result<()> {
        let inner = &self.inner;
        inner.check_open()?;
        inner.damage.lock().unattributed.clear();
        inner.refuses_unknown.store(false, Ordering::Release);
        log::warn!("operator accepted the unattributed damage of the journal");
        inner.write_snapshot()
    }
}
