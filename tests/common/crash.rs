//! Power-cut checks shared by the crash sweeps: what a workload acknowledged, and when, in
//! operations of its [`FaultFs`]; and the check every crash image must pass (SPEC S3, S4).

use std::sync::Arc;

use portcullis::ManualClock;
use portcullis::store::{FaultFs, FileStore, FileStoreBuilder, Outcome, SkipSync, Store};

use super::check::{Model, check_store};
use super::workload::{batch, partition_of};

/// The store directory on every [`FaultFs`] of the sweeps.
pub const DIR: &str = "/db";

/// A store on `fs` with small segments and every background job off, so that segment rotation,
/// base records, the heads snapshot and compaction all happen in a short workload, at points
/// the workload chooses. `skip` turns a sync off (negative controls only).
pub fn builder(fs: &FaultFs, skip: Option<SkipSync>) -> FileStoreBuilder {
    let b = FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(1_000)))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .base_every_records(4)
        .auto_compact(false);
    match skip {
        Some(s) => b.skip_sync(s),
        None => b,
    }
}

/// When each batch of a workload was handed to `apply` and when it was acknowledged, counted
/// in operations of the disk ([`FaultFs::ops`]). A batch counts as acknowledged at a crash point
/// only if the operation count read after `apply` returned is below the point's: the read
/// happens after the return, so this never counts a batch acknowledged after the crash (with
/// threads it may count one too few, which only weakens the check a little).
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    started: Vec<(u64, u64)>,
    acked: Vec<(u64, u64)>,
    /// `Committed` does not mean durable (a weaker sync policy): only [`Timeline::flushed`]
    /// acknowledges.
    weak: bool,
}

impl Timeline {
    /// Batch `n` is about to be handed to `apply`.
    pub fn start(&mut self, n: u64, fs: &FaultFs) {
        self.started.push((n, fs.ops()));
    }

    /// A timeline for a sync policy under which `Committed` is not a promise of durability.
    pub fn weak() -> Self {
        Timeline {
            weak: true,
            ..Timeline::default()
        }
    }

    /// Batch `n` was acknowledged as committed (durable, unless the timeline is weak).
    pub fn ack(&mut self, n: u64, fs: &FaultFs) {
        if !self.weak {
            self.acked.push((n, fs.ops()));
        }
    }

    /// Every batch up to `n` was made durable (a flush, snapshot, compaction or close returned).
    pub fn flushed(&mut self, n: u64, fs: &FaultFs) {
        self.acked.push((n, fs.ops()));
    }

    /// The newest batch acknowledged before operation `op` began (0 if none).
    pub fn acked_before(&self, op: u64) -> u64 {
        let acked = self.acked.iter().filter(|&&(_, at)| at < op);
        acked.map(|&(n, _)| n).max().unwrap_or(0)
    }

    /// The newest batch whose `apply` began before operation `op` (0 if none).
    pub fn attempted_before(&self, op: u64) -> u64 {
        let started = self.started.iter().filter(|&&(_, at)| at < op);
        started.map(|&(n, _)| n).max().unwrap_or(0)
    }
}

/// Applies workload batches `from..=to`, recording them on `timeline`; `after` runs after each.
pub fn write_batches(
    store: &FileStore,
    fs: &FaultFs,
    timeline: &mut Timeline,
    range: std::ops::RangeInclusive<u64>,
    mut after: impl FnMut(u64, &mut Timeline),
) {
    for n in range {
        timeline.start(n, fs);
        let outcome = store.apply(&partition_of(n), &batch(n));
        assert_eq!(outcome.ok(), Some(Outcome::Committed), "batch {n}");
        timeline.ack(n, fs);
        after(n, timeline);
    }
}

/// What recovery made of one crash image.
#[derive(Clone, Copy, Debug)]
pub struct Recovered {
    /// The newest batch the image holds.
    pub newest: u64,
    /// Whether open truncated a torn tail.
    pub torn_tail: bool,
}

/// Checks one crash image left by a power cut, and says what recovery made of it. The
/// store that checks always syncs correctly (a negative control switches syncs off only in the
/// workload that wrote the image):
/// - open succeeds and reports no damage (a power cut alone damages nothing that was synced, so
///   every partition must stay readable: refusing one would be a false alarm);
/// - what it shows is exactly the state after batches `1..=m` for one `m` with
///   `acked <= m <= attempted`: every acknowledged batch, no partial batch, nothing invented;
/// - the store then takes two more batches, closes, and a power cut after that close loses
///   none of them (recovery left a store that works and whose state is durable).
pub fn check_power_cut(
    image: &FaultFs,
    model: &mut Model,
    acked: u64,
    attempted: u64,
    seed: u64,
) -> Result<Recovered, String> {
    let store = builder(image, None)
        .open()
        .map_err(|e| format!("open failed: {e}"))?;
    let report = store.open_report().clone();
    if !report.damaged.is_empty() {
        return Err(format!("a power cut left damage: {:?}", report.damaged));
    }
    let m = check_store(model, &store, acked, attempted)?;
    for n in m + 1..=m + 2 {
        match store.apply(&partition_of(n), &batch(n)) {
            Ok(Outcome::Committed) => {}
            other => return Err(format!("batch {n} after recovery answered {other:?}")),
        }
    }
    check_store(model, &store, m + 2, m + 2).map_err(|e| format!("after recovery: {e}"))?;
    store
        .close()
        .map_err(|e| format!("close after recovery: {e}"))?;
    let again = builder(&image.crash(seed ^ 0xA5A5), None)
        .open()
        .map_err(|e| format!("open after a power cut after recovery: {e}"))?;
    check_store(model, &again, m + 2, m + 2)
        .map_err(|e| format!("power cut after a clean close after recovery: {e}"))?;
    Ok(Recovered {
        newest: m,
        torn_tail: report.torn_tail.is_some(),
    })
}

/// The seed of crash image `s` at operation `op`: distinct per point, fixed by `base`.
pub fn image_seed(base: u64, op: u64, s: u64) -> u64 {
    base ^ op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ s.wrapping_mul(0xD1B5_4A32_D192_ED03)
}
