//! Folding the heads a snapshot wrote back out of memory (SPEC S8).
//!
//! Owns: switching the partition table to the pages of each heads snapshot the store writes,
//! dropping from the overlay every head those pages now hold, and starting a snapshot when the
//! overlay grows past its bound under a budget of loaded indexes.
//!
//! Without this, every partition written since open and then unloaded stays an overlay entry
//! (its name and head) until close, so memory grows with the partitions written whatever the
//! budget. With it, the overlay holds only heads that changed since the newest snapshot, and
//! under `max_loaded_partitions` a snapshot falls due once the overlay holds
//! [`Inner::overlay_bound`] heads, so memory stays flat whatever the number of partitions
//! written since open.
//!
//! The rules (each with a test-only switch that breaks it, see `tests/heads_fold.rs`):
//! - a head leaves the overlay only once the snapshot holding it is durable and named by the
//!   manifest: the fold runs after [`heads::write`] (synced, renamed, directory synced) and the
//!   manifest's rewrite, and reads the new pages back from the file;
//! - an overlay entry leaves only if its head is still the one the snapshot wrote: a partition
//!   written (and unloaded) while the snapshot was being written keeps its newer head;
//! - the pages, the overlay and each loaded state's notion of the pages (`in_base`,
//!   `base_head`) change together under the table's write lock, and the table's `generation`
//!   moves, so a lookup that read the old pages with the lock released starts again
//!   ([`Inner::part`](super::table)).
//!
//! May call: the heads module (reading the new snapshot back); takes the table's write lock
//! (the caller holds the snapshot mutex and no other lock).

#[cfg(feature = "test-hooks")]
use crate::sync::atomic::AtomicUsize;
use crate::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[cfg(feature = "test-hooks")]
use crate::sync::Mutex;

use super::format::Loc;
use super::heads::{self, Heads, Pages};
use super::{FileStore, Inner};

/// Overlay heads at which a snapshot falls due under a budget, unless the budget is larger.
pub(super) const OVERLAY_BOUND: usize = 1 << 16;

#[cfg(feature = "test-hooks")]
type Hook = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// When the next fold is due, and the test-only switches.
#[derive(Default)]
pub(super) struct Folds {
    /// Set when the overlay holds [`Inner::overlay_bound`] heads or more: the next commit
    /// starts a heads snapshot.
    pub(super) due: AtomicBool,
    /// Test-only negative control: snapshots fold nothing back.
    #[cfg(feature = "test-hooks")]
    off: AtomicBool,
    /// Test-only negative control: an overlay entry leaves even if its head changed since the
    /// snapshot took it.
    #[cfg(feature = "test-hooks")]
    unchecked: AtomicBool,
    /// Test-only negative control: a lookup does not start again when the pages changed.
    #[cfg(feature = "test-hooks")]
    no_recheck: AtomicBool,
    /// Test only: the overlay bound (0: the default).
    #[cfg(feature = "test-hooks")]
    bound: AtomicUsize,
    /// Test only: runs after a snapshot is written, before its heads are folded back.
    #[cfg(feature = "test-hooks")]
    before_fold: Mutex<Option<Hook>>,
    /// Test only: runs in a lookup between its page read and the table's write lock.
    #[cfg(feature = "test-hooks")]
    between: Mutex<Option<Hook>>,
    /// Test only: signalled when a background snapshot finishes.
    #[cfg(feature = "test-hooks")]
    finished: (Mutex<()>, crate::sync::Condvar),
}

impl Folds {
    /// Whether a lookup checks that the pages did not change under it (always, but under a
    /// test-only switch).
    pub(super) fn recheck(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.no_recheck.load(Ordering::Relaxed) {
            return false;
        }
        true
    }

    /// A background snapshot finished (its `snapshot_running` is cleared).
    #[cfg(feature = "test-hooks")]
    pub(super) fn background_done(&self) {
        let _held = self.finished.0.lock();
        self.finished.1.notify_all();
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn between_lookups(&self, name: &[u8]) {
        let hook = self.between.lock().clone();
        if let Some(hook) = hook {
            hook(name);
        }
    }
}

impl Inner {
    /// Overlay heads at which a snapshot falls due under a budget of `n` loaded indexes:
    /// `max(n, 65,536)`, a few MiB of names and locations.
    pub(super) fn overlay_bound(&self) -> usize {
        #[cfg(feature = "test-hooks")]
        if let n @ 1.. = self.folds.bound.load(Ordering::Relaxed) {
            return n;
        }
        self.config
            .max_loaded_partitions
            .map_or(OVERLAY_BOUND, |n| n.max(OVERLAY_BOUND))
    }

    /// Notes the overlay's size after unloading: a snapshot falls due at the bound.
    pub(super) fn note_overlay(&self, len: usize) {
        if len >= self.overlay_bound() {
            self.folds.due.store(true, Ordering::Relaxed);
        }
    }

    /// After snapshot `name` (merged from `old` and `changed`, the heads that differed from
    /// it) is durable and named by the manifest: the table reads the new pages, and every
    /// overlay head they hold as it is leaves memory. A failure to read the new file back
    /// only leaves the heads in memory until the next snapshot.
    pub(super) fn fold_back(
        &self,
        name: &str,
        old: Option<&Arc<Pages>>,
        changed: &[(Box<[u8]>, Loc)],
    ) {
        #[cfg(feature = "test-hooks")]
        if self.folds.off.load(Ordering::Relaxed) {
            return;
        }
        if self.closed.load(Ordering::Acquire) {
            // The final snapshot: nothing is looked up after it.
            return;
        }
        let pages = match heads::open(&*self.config.vfs, &self.config.dir, name) {
            Ok(Some(opened)) => match opened.heads {
                Heads::Paged(pages) => Arc::new(pages),
                Heads::Listed(_) => return,
            },
            Ok(None) => return,
            Err(e) => {
                log::warn!(
                    "could not read back heads snapshot {name}; its heads stay in memory until the next one: {e}"
                );
                return;
            }
        };
        #[cfg(feature = "test-hooks")]
        {
            let hook = self.folds.before_fold.lock().clone();
            if let Some(hook) = hook {
                hook(name.as_bytes());
            }
        }
        #[cfg(feature = "test-hooks")]
        let unchecked = self.folds.unchecked.load(Ordering::Relaxed);
        #[cfg(not(feature = "test-hooks"))]
        let unchecked = false;
        let mut table = self.table.write();
        let same = match (&table.base, old) {
            (Some(now), Some(old)) => Arc::ptr_eq(now, old),
            (None, None) => true,
            _ => false,
        };
        // Damage found in the old pages meanwhile stays visible (and abandons the next
        // snapshot) rather than being forgotten with them.
        if !same || table.base.as_ref().is_some_and(|b| b.any_damaged()) {
            return;
        }
        table.base = Some(pages);
        table.generation += 1;
        let mut folded = 0usize;
        for (name, written) in changed {
            if let Some(known) = table.overlay.get_mut(name) {
                if known.head == *written || unchecked {
                    table.overlay.remove(name);
                    folded += 1;
                } else {
                    known.in_base = true;
                }
            } else if let Some(state) = table.touched.get(name) {
                state.in_base.store(true, Ordering::Relaxed);
                state.base_head.store(*written, Ordering::Relaxed);
            }
        }
        let left = table.overlay.len();
        // A map that held many more heads (a long journal scan at open, a burst of writes)
        // gives its room back.
        if table.overlay.capacity() > 4 * (left + 1024) {
            table.overlay.shrink_to(2 * left);
        }
        drop(table);
        self.folds
            .due
            .store(left >= self.overlay_bound(), Ordering::Relaxed);
        log::debug!("folded {folded} heads back into snapshot {name}; {left} stay in memory");
    }
}

impl FileStore {
    /// Test-only negative control: heads snapshots fold nothing back, so the overlay keeps
    /// every head written since open.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_heads_fold_off_for_test(&self, off: bool) {
        self.inner.folds.off.store(off, Ordering::Relaxed);
    }

    /// Test-only negative control: a fold drops an overlay head even if it changed since the
    /// snapshot took it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_heads_fold_unchecked_for_test(&self, unchecked: bool) {
        self.inner
            .folds
            .unchecked
            .store(unchecked, Ordering::Relaxed);
    }

    /// Test-only negative control: a partition's lookup does not start again when the table
    /// changed pages while it read one.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_lookup_recheck_off_for_test(&self, off: bool) {
        self.inner.folds.no_recheck.store(off, Ordering::Relaxed);
    }

    /// Test only: the overlay heads at which a snapshot falls due under a budget (0: the
    /// default).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_overlay_bound_for_test(&self, heads: usize) {
        self.inner.folds.bound.store(heads, Ordering::Relaxed);
    }

    /// Test hook: waits until no heads snapshot started in the background is running.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn wait_for_background_snapshot_for_test(&self) {
        let inner = &self.inner;
        let mut held = inner.folds.finished.0.lock();
        while inner.snapshot_running.load(Ordering::Acquire) {
            inner.folds.finished.1.wait(&mut held);
        }
    }

    /// Test only: heads now in the table's overlay (changed since the newest snapshot and
    /// not loaded).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn overlay_heads_for_test(&self) -> usize {
        self.inner.table.read().overlay.len()
    }

    /// Test only: `hook` runs after each heads snapshot is written and named by the manifest,
    /// before its heads are folded back (with the snapshot's name). The snapshot mutex is
    /// held: the hook may read and write, but not wait for another snapshot.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_before_fold_hook_for_test(&self, hook: Option<Hook>) {
        *self.inner.folds.before_fold.lock() = hook;
    }

    /// Test only: `hook` runs in each partition lookup that creates a state, between its read
    /// of the pages and the table's write lock (with the partition's name). No lock is held.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_lookup_hook_for_test(&self, hook: Option<Hook>) {
        *self.inner.folds.between.lock() = hook;
    }
}
