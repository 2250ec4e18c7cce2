//! Opening a store: the directory and its lock, the manifest and heads snapshot, the journal
//! scan, and the [`Inner`] they build; also the [`OpenReport`] that says what open read.
//!
//! May call: the recovery, heads, container, damage, segments, table, durability and journal
//! modules; writes its first snapshot through [`Inner::write_snapshot`]. What open knows before
//! its scan (the manifest, classified, and what a rebuild takes from the files left) is in
//! [`prior`].

mod prior;

use crate::sync::HashMap;
use crate::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use crate::sync::{Mutex, RwLock};

#[cfg(feature = "fault-injection")]
use super::SkipSync;
#[cfg(feature = "fault-injection")]
use super::fault;
use super::journal::Journal;
use super::recovery::Damage;
use super::{
    DamagedRecord, FileStore, FileStoreBuilder, Inner, JOURNAL_DIR, LOCK_FILE, MANIFEST, PathKind,
    SnapshotState, StoreDamage, SyncPolicy, TornTail, compaction, damage, durability, heads,
    recovery, scatter, segments, space, table, unload, values,
};
use crate::clock;
use crate::error::{Error, Result};
use prior::ManifestRead;

/// What opening the store read, and how long it took (SPEC S5).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenReport {
    /// Wall time of the whole open.
    pub elapsed: Duration,
    /// Whether the directory held no store and one was created.
    pub created: bool,
    /// Bytes of the heads snapshot's header and meta read.
    pub snapshot_bytes: u64,
    /// Bytes of the heads snapshot's index read with its meta: its one index page when it has
    /// only one (up to a page, whatever the number of partitions), so a first touch reads
    /// only a data page.
    pub snapshot_index_bytes: u64,
    /// Whether the store had to be rebuilt by scanning the whole journal (the snapshot or the
    /// manifest was missing or damaged; an error reading either fails open with `Io`).
    pub rebuilt_by_full_scan: bool,
    /// Why it was rebuilt: which file was missing or damaged, and how.
    pub rebuild_reason: Option<String>,
    /// Bytes of journal scanned (only what was written after the snapshot).
    pub journal_bytes_scanned: u64,
    /// Records scanned in that journal.
    pub records_scanned: u64,
    /// Partitions known after open.
    pub partitions: u64,
    /// The torn tail that was truncated, if any.
    pub torn_tail: Option<TornTail>,
    /// Damaged records and ranges this open found in the journal it scanned (SPEC S4). Open
    /// does not read older, sealed segments: damage there is found, refused and recorded by
    /// the first load that needs it (see [`FileStore::damage`]).
    pub damaged: Vec<DamagedRecord>,
    /// Everything the store refuses after open: what this open found plus what earlier opens
    /// found and no operator has accepted (see [`FileStore::damage`]).
    pub refused: StoreDamage,
}

impl FileStore {
    #[cfg_attr(not(feature = "fault-injection"), allow(unused_mut))]
    pub(super) fn open_with(mut config: FileStoreBuilder) -> Result<FileStore> {
        let started = config.clock.instant();
        let _span = crate::observe::span!("portcullis.store.open", dir = config.dir.display());
        #[cfg(feature = "fault-injection")]
        {
            config.vfs =
                fault::skip::SkippingVfs::wrap(config.vfs.clone(), &config.dir, &config.skip_syncs);
        }
        let vfs = config.vfs.clone();
        let dir = config.dir.clone();
        let io = |what: &str, e| Error::io(format!("{what} {}", dir.display()), e);
        match vfs.kind(&dir).map_err(|e| io("inspecting", e))? {
            Some(PathKind::File) => {
                return Err(Error::invalid(format!(
                    "{} is a file; a store needs a directory",
                    dir.display()
                )));
            }
            Some(PathKind::Dir) => {}
            None => durability::create_dir_durably(&*vfs, &dir)?,
        }
        let lock = match vfs.try_lock(&dir.join(LOCK_FILE)) {
            Ok(lock) => lock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Locked {
                    path: dir.display().to_string(),
                });
            }
            Err(e) => return Err(io("locking", e)),
        };
        let journal_dir = dir.join(JOURNAL_DIR);
        if vfs.kind(&journal_dir).map_err(|e| io("inspecting", e))? != Some(PathKind::Dir) {
            durability::create_dir_durably(&*vfs, &journal_dir)?;
        }

        let mut report = OpenReport::default();
        let mut damage = Damage::default();
        let rebuild = |report: &mut OpenReport, why: String| {
            log::warn!("{why}; rebuilding by a full scan");
            report.rebuilt_by_full_scan = true;
            report.rebuild_reason.get_or_insert(why);
        };
        let (manifest, set_aside) = match prior::read_manifest(&*vfs, &dir)? {
            ManifestRead::Read(m) => (Some(m), false),
            ManifestRead::Absent => (None, false),
            ManifestRead::Damaged(e) => {
                rebuild(&mut report, format!("the manifest is damaged ({e})"));
                (None, true)
            }
        };
        let numbers = recovery::list_segments(&*vfs, &journal_dir)?;
        if manifest.is_none() && (set_aside || !numbers.is_empty()) {
            // A rebuild no manifest guides: the files left still know what the store refuses
            // and which gaps compaction left on purpose (SPEC S4).
            damage.merge(prior::known_without_manifest(&*vfs, &dir)?);
        }
        let created = manifest.is_none() && numbers.is_empty() && !report.rebuilt_by_full_scan;
        report.created = created;

        let mut snapshot_name = None;
        let mut start = None;
        let mut heads = HashMap::default();
        let mut base = None;
        // A snapshot of an older format is read whole and rewritten in the current one.
        let mut convert = false;
        // Scattered and dead bytes per segment. Those counted after the snapshot (at most
        // `snapshot_every_bytes` of journal, unless the process crashed) and before a
        // full-scan rebuild are not known.
        let mut counts = Vec::new();
        if let Some(m) = &manifest {
            damage.merge(m.damage.clone());
        }
        match manifest.as_ref().and_then(|m| m.snapshot.clone()) {
            Some(name) => match heads::open(&*vfs, &dir, &name) {
                Ok(Some(snap)) => {
                    report.snapshot_bytes = snap.bytes;
                    report.snapshot_index_bytes = snap.index_bytes;
                    let mut position = snap.position;
                    start = Some((position.segment, position.offset, position.next_lsn));
                    counts = std::mem::take(&mut position.segments);
                    match snap.heads {
                        heads::Heads::Paged(pages) => base = Some(Arc::new(pages)),
                        heads::Heads::Listed(listed) => {
                            log::info!("converting heads snapshot {name} to the paged format");
                            convert = true;
                            heads = listed
                                .into_iter()
                                .map(|(k, v)| (k.into_boxed_slice(), v))
                                .collect();
                        }
                    }
                    damage.merge(position.damage);
                    snapshot_name = Some(name);
                }
                Ok(None) => rebuild(&mut report, format!("heads snapshot {name} is missing")),
                // Damage: the manifest still says what the store refuses and deleted.
                Err(e @ Error::Corrupt { .. }) => rebuild(
                    &mut report,
                    format!("heads snapshot {name} is damaged ({e})"),
                ),
                // An I/O error says nothing about the file; a newer format is refused.
                Err(e) => return Err(e),
            },
            None if !numbers.is_empty() && !report.rebuilt_by_full_scan => rebuild(
                &mut report,
                "no manifest or snapshot beside the journal".to_owned(),
            ),
            None => {}
        }

        let files =
            segments::SegmentFiles::new(journal_dir.clone(), vfs.clone(), config.max_open_segments);
        // Only the segments the scan reads are opened here (from the snapshot's on; all of them
        // for a rebuild); older ones are checked on first use. Every read goes through the
        // bounded table, so no number of segments exhausts the file descriptors.
        #[allow(unused_mut)]
        let mut segments = recovery::open_segments_with(
            &*vfs,
            &journal_dir,
            &numbers,
            start.map_or(0, |(s, _, _)| s),
            // The handle that read the header joins the table: the scan reads through it.
            |number, file| {
                files.adopt(number, file);
                files.file(number)
            },
        )?;
        #[cfg(feature = "fault-injection")]
        if config.skip_syncs.contains(&SkipSync::ZeroEndCheck) {
            segments.zero_end_check = false;
        }
        #[cfg(feature = "fault-injection")]
        if config.skip_syncs.contains(&SkipSync::ProofBound) {
            segments.proof_slack = 1;
        }
        let mut outcome = recovery::scan(
            &*vfs,
            &journal_dir,
            segments,
            start.map(|(s, o, _)| (s, o)),
            start.map(|(_, _, l)| l),
            recovery::Known {
                heads,
                pages: base.as_deref(),
            },
            &damage,
        )?;
        #[cfg(feature = "fault-injection")]
        let (skip_tail, trust_anything, any_tail) = (
            config.skip_syncs.contains(&SkipSync::ScannedTail),
            config.skip_syncs.contains(&SkipSync::FoundNothingCheck),
            config.skip_syncs.contains(&SkipSync::EmptyTailCheck),
        );
        #[cfg(not(feature = "fault-injection"))]
        let (skip_tail, trust_anything, any_tail) = (false, false, false);
        let scan_start = start.map(|(s, o, _)| (s, o));
        // After a clean close there is nothing to make durable: no write, no sync.
        if !(trust_anything || durability::found_nothing(&outcome, scan_start)) {
            let needs = durability::Needs::of(&outcome.tail, scan_start, any_tail);
            durability::sync_what_open_found(
                &*vfs,
                &dir,
                &journal_dir,
                &mut outcome.tail,
                skip_tail,
                needs,
            )?;
        } else {
            // Zeros a killed process left after the snapshot may not be durable.
            outcome.tail.prepared_end = 0;
        }
        report.journal_bytes_scanned = outcome.bytes_scanned;
        report.records_scanned = outcome.records_scanned;
        report.torn_tail = outcome.torn_tail.clone();
        report.damaged = outcome.records.clone();
        let overlay = table::overlay_of(base.as_deref(), outcome.heads, convert);
        report.partitions = base.as_ref().map_or(0, |b| b.partitions())
            + overlay.values().filter(|k| !k.in_base).count() as u64;
        let found_damage = !outcome.damage.is_empty();
        let persisted = damage.clone();
        damage.merge(outcome.damage);
        report.refused = damage::describe(&damage);
        if set_aside {
            // Kept as evidence. Only now, just before the fresh manifest is written: an open
            // that failed or was killed before this point leaves the manifest as it found it.
            let aside = dir.join(prior::SET_ASIDE);
            vfs.rename(&dir.join(MANIFEST), &aside)
                .map_err(|e| io("setting the damaged manifest aside in", e))?;
        }

        let journal = Journal::new(
            journal_dir,
            vfs.clone(),
            config.clock.clone(),
            config.sync_policy,
            config.segment_bytes,
            outcome.tail,
            files,
        );
        #[cfg(feature = "fault-injection")]
        let journal = journal
            .with_pin_switch(config.reader_pin.clone())
            .with_sparse_steps(config.skip_syncs.contains(&SkipSync::ZeroFill));
        let journal = Arc::new(journal.with_events(config.events.clone(), config.stall_threshold));
        let table = table::Table {
            base,
            overlay,
            touched: HashMap::default(),
            ..Default::default()
        };
        // New damage is persisted at once: the next open may not scan where it was found.
        let needs_snapshot =
            report.rebuilt_by_full_scan || manifest.is_none() || found_damage || convert;
        // The snapshot on disk describes the journal exactly when open found nothing after it.
        let snapshot_current = snapshot_name.is_some()
            && report.journal_bytes_scanned == 0
            && report.torn_tail.is_none()
            && report.damaged.is_empty();
        #[cfg(feature = "fault-injection")]
        let scatter_off = config.skip_scatter_trigger;
        #[cfg(not(feature = "fault-injection"))]
        let scatter_off = false;
        let scatter = scatter::Scatter::new(config.segment_bytes, scatter_off);
        // The counts the snapshot kept, for the segments still there.
        let space = space::Space::new(config.segment_bytes);
        #[cfg(feature = "fault-injection")]
        space.set_for_test(config.skip_reclaim_trigger, config.version_2_records);
        let live: crate::sync::HashSet<u32> = journal.live_segments().into_iter().collect();
        for (n, apart, dead) in counts.into_iter().filter(|(n, ..)| live.contains(n)) {
            scatter.restore(n, apart);
            space.add(n, dead);
        }
        let inner = Arc::new(Inner {
            config,
            journal,
            table: RwLock::new(table),
            refuses_unknown: AtomicBool::new(!damage.unattributed.is_empty()),
            damage: Mutex::new(damage),
            closed: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
            report: OpenReport::default(),
            snapshot: Mutex::new(SnapshotState {
                newest: snapshot_name,
                finished: false,
                current_at: (snapshot_current && !convert).then_some(0),
                damage_on_disk: persisted,
                abandoned: false,
            }),
            snapshot_running: AtomicBool::new(false),
            bytes_at_last_snapshot: AtomicU64::new(0),
            compaction_running: AtomicBool::new(false),
            compaction_lock: Mutex::new(()),
            batches: AtomicU64::new(0),
            loaded: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            scatter,
            space,
            background: compaction::Background::default(),
            index_budget: unload::IndexBudget::default(),
            folds: Default::default(),
            recent: values::RecentRecords::default(),
            pages: Default::default(),
            syncer: Mutex::new(None),
            handle: super::ops::handle_number(),
            watch: Default::default(),
        });
        if needs_snapshot {
            // A new store gets its manifest at once; a rebuilt one gets a snapshot, so the
            // next open is fast again.
            inner.write_snapshot()?;
        }
        report.elapsed = inner
            .config
            .clock
            .instant()
            .saturating_duration_since(started);
        log::info!(
            "opened store {}: {} partitions, {} snapshot bytes, {} journal bytes scanned in {:?}",
            inner.config.dir.display(),
            report.partitions,
            report.snapshot_bytes,
            report.journal_bytes_scanned,
            report.elapsed
        );
        let mut inner = inner;
        Arc::get_mut(&mut inner)
            .expect("no other handle exists yet")
            .report = report;
        // Started once the store is whole (it holds the store weakly).
        if let SyncPolicy::PeriodicMayLoseRecent { interval_ms } = inner.config.sync_policy {
            *inner.syncer.lock() = Some(spawn_periodic_syncer(&inner, interval_ms)?);
        }
        // Segments the snapshot found due (a load cut short by a close, or garbage left when
        // the process stopped) are compacted now, in the background, rather than after the
        // next commit: a store left alone settles by itself (SPEC S13).
        let sealed = inner.journal.sealed_through();
        if inner.config.auto_compact && compaction::maybe_due(&inner, sealed + 1) {
            compaction::spawn(&inner);
        }
        // What open found, told now that the store is whole (SPEC E8).
        super::watch::open_findings(&inner.config.events, &inner.report);
        inner.deliver_in_background();
        Ok(FileStore { inner })
    }
}

/// The name of the periodic sync thread.
const SYNC_THREAD: &str = "portcullis-sync";

fn spawn_periodic_syncer(
    inner: &Arc<Inner>,
    interval_ms: u64,
) -> Result<crate::sync::channel::Sender<()>> {
    let (stop, stopped) = crate::sync::channel::bounded::<()>(0);
    let interval = Duration::from_millis(interval_ms.max(1));
    let journal = inner.journal.clone();
    let clock = inner.config.clock.clone();
    // Weak: the thread must not keep the store open; dropping it closes the store and so
    // drops the sender, which stops the thread.
    let store = Arc::downgrade(inner);
    inner
        .config
        .spawner
        .thread(SYNC_THREAD, move || {
            // A thread that unwinds says so: the store is degraded from then on (SPEC E8).
            let _watch = EndWatch(store.clone());
            // Runs until the store drops its sender.
            while let Err(crate::sync::channel::RecvTimeoutError::Timeout) =
                clock::recv_timeout(&*clock, &stopped, interval)
            {
                #[cfg(feature = "test-hooks")]
                if store.upgrade().is_some_and(|s| {
                    s.watch
                        .kill_syncer
                        .load(crate::sync::atomic::Ordering::Relaxed)
                }) {
                    panic!("the periodic sync thread was made to panic (a test)");
                }
                let synced = journal.sync_all();
                if let Some(store) = store.upgrade() {
                    store.deliver_in_background();
                }
                if let Err(e) = synced {
                    // Latched: the store says it is degraded, and commits are refused.
                    log::warn!("periodic sync failed: {e}");
                    return;
                }
            }
        })
        .map_err(|e| Error::io("starting the periodic sync thread", e))
        .map(drop)?;
    Ok(stop)
}

/// Records, when the periodic sync thread unwinds, that it ended.
struct EndWatch(std::sync::Weak<Inner>);

impl Drop for EndWatch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(store) = self.0.upgrade()
        {
            log::error!(
                "the periodic sync thread panicked; commits are no longer synced on a timer"
            );
            store.thread_ended(
                SYNC_THREAD,
                "it panicked; commits are no longer synced on a timer (flush, or reopen the store)"
                    .to_owned(),
            );
            store.deliver_in_background();
        }
    }
}
