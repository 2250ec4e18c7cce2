//! The partition table: every partition the store knows and where its newest record is.
//!
//! Owns three sources, newest first:
//! - `touched`: the state of every partition touched since open (or since its index was
//!   dropped), with its live head;
//! - `overlay`: heads newer than the snapshot's pages, found by open's journal scan after the
//!   snapshot or kept when an idle index was dropped;
//! - `base`: the pages of the newest heads snapshot ([`heads::Pages`](super::heads::Pages)):
//!   the one open read, then each one the store writes (see [`fold`](super::fold), which
//!   folds the heads a snapshot wrote out of the overlay), looked up on a partition's first
//!   touch with one page read, never held in memory (SPEC S5, S8).
//!
//! A lookup asks them in that order; listing merges them in name order. Page reads happen with
//! the table's lock released (a snapshot's pages never change), and the result is re-checked
//! under the write lock before a state is created, so a partition is never created twice: if
//! the table changed pages meanwhile (`generation`), the lookup starts again.

use crate::sync::HashMap;
use crate::sync::atomic::Ordering;
use std::collections::BTreeSet;
use std::sync::Arc;

use super::format::Loc;
use super::heads::Pages;
use super::partition::{self, PartState};
use super::{FileStore, Inner};
use crate::error::{Error, Result};
use crate::store::Partition;

/// A partition known outside its state: its head, and whether the snapshot's pages hold it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Known {
    pub head: Loc,
    pub in_base: bool,
}

#[derive(Default)]
pub(super) struct Table {
    pub base: Option<Arc<Pages>>,
    pub overlay: HashMap<Box<[u8]>, Known>,
    pub touched: HashMap<Box<[u8]>, Arc<PartState>>,
    /// Bumped each time `base` changes, so a lookup that read pages with the lock released
    /// knows whether what it read is still the table's.
    pub generation: u64,
}

impl Table {
    /// Partitions with a committed record.
    pub fn partitions(&self) -> u64 {
        let base = self.base.as_ref().map_or(0, |b| b.partitions());
        let overlay = self.overlay.values().filter(|k| !k.in_base).count();
        let touched = self
            .touched
            .values()
            .filter(|s| !s.in_base.load(Ordering::Relaxed) && partition::head_of(s) != 0)
            .count();
        base + (overlay + touched) as u64
    }

    /// Every head the base's pages do not hold as it is, sorted by name (the next snapshot
    /// merges these into the pages).
    pub fn changed(&self) -> Vec<(Box<[u8]>, Loc)> {
        let mut changed: Vec<(Box<[u8]>, Loc)> = self
            .overlay
            .iter()
            .filter(|(name, _)| !self.touched.contains_key(*name))
            .map(|(name, k)| (name.clone(), k.head))
            .chain(
                self.touched
                    .iter()
                    .map(|(name, s)| (name.clone(), partition::head_of(s)))
                    .filter(|&(_, head)| head != 0),
            )
            .collect();
        changed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        changed
    }

    /// Names starting with `prefix` known outside the base.
    fn changed_names(&self, prefix: &[u8]) -> BTreeSet<Box<[u8]>> {
        let overlay = self.overlay.keys().filter(|n| n.starts_with(prefix));
        let touched = self
            .touched
            .iter()
            .filter(|(n, s)| n.starts_with(prefix) && partition::head_of(s) != 0)
            .map(|(n, _)| n);
        overlay.chain(touched).cloned().collect()
    }
}

/// The overlay open starts with: the heads its journal scan found (or every head, read from a
/// snapshot of an older format), each marked with whether the pages hold it (for counting),
/// reading each page at most once.
pub(super) fn overlay_of(
    base: Option<&Pages>,
    found: HashMap<Box<[u8]>, Loc>,
    listed: bool,
) -> HashMap<Box<[u8]>, Known> {
    let Some(base) = base.filter(|_| !listed) else {
        return found
            .into_iter()
            .map(|(name, head)| {
                (
                    name,
                    Known {
                        head,
                        in_base: false,
                    },
                )
            })
            .collect();
    };
    let mut names: Vec<&[u8]> = found.keys().map(|n| &**n).collect();
    names.sort_unstable();
    let in_base: HashMap<&[u8], bool> = names
        .iter()
        .copied()
        .zip(base.contains_sorted(&names))
        .collect();
    let in_base: Vec<(Box<[u8]>, bool)> =
        found.keys().map(|n| (n.clone(), in_base[&**n])).collect();
    in_base
        .into_iter()
        .map(|(name, in_base)| {
            let head = found[&name];
            (name, Known { head, in_base })
        })
        .collect()
}

impl Inner {
    /// The state of partition `p`; `None` if it has never been written and `create` is false.
    /// A damaged snapshot page that could hold `p` refuses it.
    pub(super) fn part(&self, p: &Partition, create: bool) -> Result<Option<Arc<PartState>>> {
        let name = p.as_bytes();
        loop {
            let (base, generation) = {
                let table = self.table.read();
                if let Some(state) = table.touched.get(name) {
                    self.touched(state);
                    return Ok(Some(state.clone()));
                }
                let base = match table.overlay.contains_key(name) {
                    true => None,
                    false => table.base.clone(),
                };
                (base, table.generation)
            };
            // One page read, with no lock held.
            let in_base = match &base {
                Some(base) => self.in_base(base, name)?,
                None => None,
            };
            #[cfg(feature = "test-hooks")]
            self.folds.between_lookups(name);
            let mut table = self.table.write();
            if let Some(state) = table.touched.get(name) {
                return Ok(Some(state.clone()));
            }
            // The pages changed meanwhile, and with them the overlay (a snapshot folded heads
            // out of it): what was read above may be stale, so look again.
            if table.generation != generation && self.folds.recheck() {
                continue;
            }
            let (head, in_base, base_head) = match (table.overlay.remove(name), in_base) {
                (Some(known), _) => (known.head, known.in_base, 0),
                (None, Some(head)) => (head, true, head),
                (None, None) if create => (0, false, 0),
                (None, None) => return Ok(None),
            };
            let state = Arc::new(PartState::new(p.clone(), head, in_base, base_head));
            self.touched(&state);
            table.touched.insert(Box::from(name), state.clone());
            return Ok(Some(state));
        }
    }

    /// Looks `name` up in the snapshot's pages. A damaged page is refused, and the first time
    /// one is found the store stops pointing its manifest at the snapshot (see
    /// [`Inner::write_snapshot`]), so the next open rebuilds the heads from the journal.
    fn in_base(&self, base: &Pages, name: &[u8]) -> Result<Option<Loc>> {
        base.lookup(name).map_err(|e| self.base_failed(base, e))
    }

    fn base_failed(&self, base: &Pages, e: Error) -> Error {
        if matches!(e, Error::Corrupt { .. })
            && base.any_damaged()
            && let Err(w) = self.write_snapshot()
        {
            log::warn!("could not record the damaged heads snapshot in the manifest: {w}");
        }
        e
    }

    /// Every partition whose name starts with `prefix`, in name order.
    pub(super) fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        let (mut names, base) = {
            let table = self.table.read();
            (table.changed_names(prefix), table.base.clone())
        };
        if let Some(base) = base {
            base.for_each_prefixed(prefix, |name, _| {
                if !names.contains(name) {
                    names.insert(Box::from(name));
                }
            })
            .map_err(|e| self.base_failed(&base, e))?;
        }
        names.into_iter().map(|n| Partition::new(&n[..])).collect()
    }

    /// Whether partition `p` has a committed record.
    pub(super) fn contains(&self, p: &Partition) -> Result<bool> {
        let name = p.as_bytes();
        let base = {
            let table = self.table.read();
            if let Some(state) = table.touched.get(name) {
                return Ok(partition::head_of(state) != 0);
            }
            if table.overlay.contains_key(name) {
                return Ok(true);
            }
            table.base.clone()
        };
        match base {
            Some(base) => Ok(self.in_base(&base, name)?.is_some()),
            None => Ok(false),
        }
    }
}

impl FileStore {
    /// Test-only negative control: the heads snapshot's pages are used without checking their
    /// checksums, so tests can show they catch what a damaged page then serves.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_snapshot_page_checks_off_for_test(&self, off: bool) {
        if let Some(base) = &self.inner.table.read().base {
            base.unchecked.store(off, Ordering::Relaxed);
        }
    }

    /// Test only: writes a heads snapshot in the whole-file format of version 2 and points the
    /// manifest at it, as a store written before the paged format would have left it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn write_version_2_heads_snapshot_for_test(&self) -> Result<()> {
        let inner = &self.inner;
        let mut state = inner.snapshot.lock();
        let bytes_before = inner
            .journal
            .counters
            .bytes_appended
            .load(Ordering::Relaxed);
        let (segment, offset, next_lsn, (changed, base)) =
            inner.journal.with_appends_paused(|| {
                let table = inner.table.read();
                (table.changed(), table.base.clone())
            });
        inner.journal.sync_all()?;
        let mut all = std::collections::BTreeMap::new();
        if let Some(base) = base {
            base.for_each_prefixed(b"", |name, head| {
                all.insert(name.to_vec(), head);
            })?;
        }
        for (name, head) in changed {
            all.insert(name.into_vec(), head);
        }
        let damage = inner.damage.lock().clone();
        let position = super::heads::Position {
            segment,
            offset,
            next_lsn,
            damage: damage.clone(),
            garbage_bytes: inner.space.total(),
            segments: Vec::new(),
        };
        let name = format!("heads-{next_lsn:020}.snap");
        let (vfs, dir) = (&*inner.config.vfs, &inner.config.dir);
        super::heads::write_version_2(vfs, dir, &name, &position, all.into_iter().collect())?;
        super::container::write_atomic(
            vfs,
            dir,
            super::MANIFEST,
            super::MANIFEST_MAGIC,
            &super::Manifest {
                snapshot: Some(name.clone()),
                damage: damage.clone(),
            },
        )?;
        state.newest = Some(name);
        state.current_at = Some(bytes_before);
        state.damage_on_disk = damage;
        Ok(())
    }
}
