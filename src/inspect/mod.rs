//! Inspecting and verifying a file store directory without changing it (SPEC E5); the library
//! side of the `portcullis-inspect` tool.
//!
//! Owns: [`Inspector`], which opens a directory through a file layer that keeps every change in
//! memory (so recovery runs as it would, but nothing reaches the disk), the [`Summary`] of what
//! the store holds (files, what open read, partitions and entities with their sizes, epochs and
//! leases of each namespace, repair state), and [`Verification`], which reads every record of
//! every journal segment with its checksums, every row of every partition, every entity's
//! digest chain and every checkpoint's digest (SPEC L4). It reads rows through the log, restore
//! and fence row layouts and the store; it runs no state machine and writes nothing in the
//! store's directory. [`backup`] copies a store no process has open into a new directory
//! (SPEC S12), through the same file layer, so the store is left as it was.
//!
//! The store lock (SPEC S6) means one owner: a store that another process has open is refused
//! with [`Error::Locked`], because its files are changing under the reader. While an
//! [`Inspector`] is open it holds the lock, so no process takes the store over mid-check.
//! Containment is per process (SPEC R4) and is not stored; what the tool reports as refused is
//! what any process would refuse: partitions the store cannot prove intact, and entities whose
//! history or checkpoint fails verification.
//!
//! ```
//! use portcullis::inspect::Inspector;
//! use portcullis::store::{Batch, FileStore, Partition, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let store = FileStore::open(dir.path())?;
//! let p = Partition::new("accounts/alice")?;
//! store.apply(&p, &Batch::new().put(b"balance".to_vec(), b"10".to_vec()))?;
//! store.close()?;
//!
//! let inspector = Inspector::open(dir.path())?;
//! let summary = inspector.summary()?;
//! assert_eq!(summary.partitions[0].rows, 1);
//! assert!(inspector.verify()?.is_clean());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod report;

use std::path::Path;

use crate::entity::{EntityId, Namespace, RESERVED_KEY_PREFIX};
use crate::error::{Error, Result};
use crate::fence::FenceKind;
use crate::fence::rows::{self as fence, Keys};
use crate::log;
use crate::restore::keys as restore_keys;
use crate::store::{
    BackupReport, Entries, FileCheck, FileState, FileStore, KeyRange, OpenReport, Partition, Store,
    StoreDamage,
};

/// A store directory opened for inspection: nothing it does changes the directory.
///
/// Holds the directory's lock until dropped.
#[derive(Debug)]
pub struct Inspector {
    store: FileStore,
}

/// What a store holds (see [`Inspector::summary`]).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Summary {
    /// The directory.
    pub directory: String,
    /// Every file of the directory and its journal, with its size in bytes.
    pub files: Vec<(String, u64)>,
    /// What opening the store read: the snapshot, the journal after it, a torn tail, damage.
    pub open: OpenReport,
    /// The engines' incarnations per owner id, if an engine has used the store.
    pub incarnation: Option<String>,
    /// Every partition, in name order.
    pub partitions: Vec<PartitionSummary>,
    /// Every entity partition, in name order.
    pub entities: Vec<EntitySummary>,
    /// Every namespace with a coordinator partition, in name order.
    pub namespaces: Vec<NamespaceSummary>,
    /// What the store refuses because of damage (SPEC S4), as [`FileStore::damage`] reports it
    /// after the summary read every partition: refusals found by earlier opens and persisted
    /// until an operator accepts them, and those found now.
    pub damage: StoreDamage,
}

/// One partition's size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionSummary {
    /// The partition's name (bytes outside printable ASCII escaped).
    pub name: String,
    /// Live rows.
    pub rows: u64,
    /// Bytes of live keys and values.
    pub bytes: u64,
    /// Why the partition cannot be read, if it cannot (SPEC S4).
    pub refused: Option<String>,
}

/// One entity's log, checkpoint, deferred work, lease and repair state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntitySummary {
    /// The entity.
    pub entity: EntityId,
    /// The incarnation that registered it.
    pub registered_by: Option<u64>,
    /// The oldest retained record (equal to `next_seq` when none is).
    pub first_seq: u64,
    /// The sequence number the next record gets.
    pub next_seq: u64,
    /// The newest checkpoint's sequence number.
    pub checkpoint: Option<u64>,
    /// Deferred records waiting for the entity's restore (SPEC R8).
    pub deferred: u64,
    /// Deferred records its state refused when they were drained, set aside (SPEC R12).
    pub refused_deferred: u64,
    /// The last namespace term it was repaired for (SPEC R3, F11).
    pub repaired_for: Option<u64>,
    /// Its epoch lease: `(epoch, expires_at_ms)` (SPEC F2).
    pub lease: Option<(u64, u64)>,
    /// Rows of the application's own (keys not reserved by Portcullis).
    pub application_rows: u64,
    /// Why its rows cannot be read, if they cannot.
    pub refused: Option<String>,
}

/// One namespace's fences (SPEC F1-F10).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamespaceSummary {
    /// The namespace.
    pub namespace: Namespace,
    /// The epoch fence, then the authority generation (SPEC F10).
    pub fences: Vec<FenceSummary>,
    /// Why the coordinator's rows cannot be read, if they cannot.
    pub refused: Option<String>,
}

/// One fence of a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceSummary {
    /// Which fence.
    pub kind: FenceKind,
    /// The current epoch (or generation); 0 before the first bump.
    pub current: u64,
    /// The leased-shard rows (SPEC F2, F4).
    pub leased: Vec<LeasedShard>,
    /// When the lease table was declared recovered (SPEC F6).
    pub recovered_at_ms: Option<u64>,
    /// The revocation checkpoint (SPEC F4): the epoch revoked towards, and where it resumes.
    pub revocation: Option<String>,
}

/// One leased-shard row of a namespace's coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeasedShard {
    /// The entity that may hold a lease.
    pub entity: EntityId,
    /// The epoch the row was granted or renewed under.
    pub epoch: u64,
    /// When the lease ends, in milliseconds on the writer's clock.
    pub expires_at_ms: u64,
    /// The epoch the entity's lease is known to carry (by a committed push).
    pub acked_epoch: u64,
}

/// One problem [`Inspector::verify`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// What is affected: a file, a segment, a partition, an entity.
    pub subject: String,
    /// What is wrong and what it means.
    pub problem: String,
}

/// What [`Inspector::verify`] read and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verification {
    /// Journal records read, with their checksums.
    pub records: u64,
    /// Journal bytes read.
    pub bytes: u64,
    /// Partitions whose every row was read.
    pub partitions: u64,
    /// Entities whose digest chain was recomputed (SPEC L4).
    pub entities: u64,
    /// Checkpoints verified against the history they fold (SPEC L4).
    pub checkpoints: u64,
    /// Every problem found; empty for a healthy store.
    pub findings: Vec<Finding>,
}

impl Verification {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    fn find(&mut self, subject: impl Into<String>, problem: impl Into<String>) {
        self.findings.push(Finding {
            subject: subject.into(),
            problem: problem.into(),
        });
    }
}

/// Verifies the store in `dir` without changing it (see [`Inspector::verify`]). A store that
/// does not open at all (for example a damaged segment header that its snapshot points past)
/// is still walked file by file, and the refusal is the first finding.
///
/// # Errors
/// [`Error::Locked`] if another process has the store open; [`Error::UnsupportedVersion`] for
/// a store written by a newer Portcullis; [`Error::InvalidArgument`] if `dir` is not a
/// directory.
///
/// ```
/// use portcullis::store::{FileStore, Store};
/// let dir = tempfile::tempdir()?;
/// FileStore::open(dir.path())?.close()?;
/// let verification = portcullis::inspect::verify(dir.path())?;
/// assert!(verification.is_clean(), "{verification}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn verify(dir: impl AsRef<Path>) -> Result<Verification> {
    let dir = dir.as_ref();
    match Inspector::open(dir) {
        Ok(inspector) => inspector.verify(),
        Err(e @ (Error::Corrupt { .. } | Error::Io { .. })) => {
            let mut v = Verification::default();
            let check = crate::store::check_unopened(dir)?;
            v.find("store", format!("does not open: {e}"));
            files_findings(&check, &mut v);
            damage_findings(&check.persisted, &mut v);
            Ok(v)
        }
        Err(e) => Err(e),
    }
}

/// Backs up the store in `src`, which no process may have open, to the new directory `dest`,
/// changing nothing in `src` (SPEC S12, E5): the copy holds what opening `src` would recover,
/// opens as an ordinary store and verifies as `src` does. Sealed journal segments and the heads
/// snapshot are shared by hard links where the file system allows; the rest is copied (see
/// [`FileStore::backup`], which backs up a store while it runs).
///
/// # Errors
/// [`Error::Locked`] if another process has the store open (back it up from there with
/// [`FileStore::backup`] or `Engine::backup`); [`Error::InvalidArgument`] if `src` holds no
/// store or `dest` exists; [`Error::UnsupportedVersion`] for a store written by a newer
/// Portcullis; [`Error::Io`] if `dest` cannot be written.
///
/// ```
/// use portcullis::store::{Batch, FileStore, Partition, Store};
/// let dir = tempfile::tempdir()?;
/// let store = FileStore::open(dir.path().join("live"))?;
/// store.apply(&Partition::new("accounts")?, &Batch::new().put("alice", "10"))?;
/// store.close()?;
///
/// let report = portcullis::inspect::backup(dir.path().join("live"), dir.path().join("copy"))?;
/// println!("{} bytes linked, {} copied", report.bytes_linked, report.bytes_copied);
/// assert!(portcullis::inspect::verify(dir.path().join("copy"))?.is_clean());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn backup(src: impl AsRef<Path>, dest: impl AsRef<Path>) -> Result<BackupReport> {
    crate::store::backup_unopened(src.as_ref(), dest.as_ref())
}

const KINDS: [FenceKind; 2] = [FenceKind::Epoch, FenceKind::Authority];

fn be_u64(raw: Option<Vec<u8>>) -> Option<u64> {
    raw.and_then(|v| v.try_into().ok().map(u64::from_be_bytes))
}

impl Inspector {
    /// Opens the store in `dir` for inspection. Recovery runs as a normal open would, but what
    /// it would write (a torn tail cut off, a snapshot rebuilt) stays in memory.
    ///
    /// # Errors
    /// [`Error::Locked`] if another process has the store open; [`Error::UnsupportedVersion`]
    /// for a store written by a newer Portcullis; [`Error::InvalidArgument`] if `dir` is not a
    /// directory; [`Error::Corrupt`] or [`Error::Io`] if the store cannot be opened at all.
    pub fn open(dir: impl AsRef<Path>) -> Result<Inspector> {
        let store = FileStore::open_unchanged(dir.as_ref())?;
        Ok(Inspector { store })
    }

    /// The store, opened without changing anything, for reads the summary does not cover.
    /// A batch applied to it is kept in memory only and lost when the inspector is dropped.
    pub fn store(&self) -> &FileStore {
        &self.store
    }

    /// What the store holds. Reads every row of every partition to size it.
    pub fn summary(&self) -> Result<Summary> {
        let store = &self.store;
        let mut summary = Summary {
            directory: store.path().display().to_string(),
            files: store.check_files()?.files,
            open: store.open_report().clone(),
            incarnation: crate::engine::describe_incarnation(store)
                .unwrap_or_else(|e| Some(format!("unreadable: {e}"))),
            ..Summary::default()
        };
        for p in store.list_partitions(b"")? {
            summary.partitions.push(self.partition(&p));
            if let Some(entity) = EntityId::from_partition(&p) {
                summary.entities.push(self.entity(entity));
            } else if let Some(ns) = p
                .as_bytes()
                .strip_prefix(b"c/")
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(|n| Namespace::new(n).ok())
            {
                summary.namespaces.push(self.namespace(ns));
            }
        }
        // After every partition was read, so refusals found by loading them are included.
        summary.damage = store.damage();
        Ok(summary)
    }

    fn partition(&self, p: &Partition) -> PartitionSummary {
        let mut summary = PartitionSummary {
            name: p.to_string(),
            ..PartitionSummary::default()
        };
        for entry in Entries::new(&self.store, p.clone(), KeyRange::all()) {
            match entry {
                Ok((k, v)) => {
                    summary.rows += 1;
                    summary.bytes += (k.len() + v.len()) as u64;
                }
                Err(e) => {
                    summary.refused = Some(e.to_string());
                    break;
                }
            }
        }
        summary
    }

    fn entity(&self, entity: EntityId) -> EntitySummary {
        let mut summary = EntitySummary {
            entity,
            registered_by: None,
            first_seq: 1,
            next_seq: 1,
            checkpoint: None,
            deferred: 0,
            refused_deferred: 0,
            repaired_for: None,
            lease: None,
            application_rows: 0,
            refused: None,
        };
        if let Err(e) = self.fill_entity(&mut summary) {
            summary.refused = Some(e.to_string());
        }
        summary
    }

    fn fill_entity(&self, s: &mut EntitySummary) -> Result<()> {
        let store = &self.store;
        let p = s.entity.partition();
        let head = log::read_head(store, &p)?.head;
        s.first_seq = head.first_seq;
        s.next_seq = head.next_seq;
        s.checkpoint = head.checkpoint.map(|c| c.seq);
        s.registered_by = be_u64(store.get(&p, &restore_keys::entity_key())?);
        s.repaired_for = be_u64(store.get(&p, &restore_keys::repair_key())?);
        for row in Entries::new(store, p.clone(), restore_keys::deferred_range()) {
            row?;
            s.deferred += 1;
        }
        for row in Entries::new(store, p.clone(), restore_keys::refused_range()) {
            row?;
            s.refused_deferred += 1;
        }
        s.lease = store
            .get(&p, Keys::new(FenceKind::Epoch).lease())?
            .map(|raw| fence::decode::<fence::LeaseRow>("lease row", &raw))
            .transpose()?
            .map(|l| (l.epoch, l.expires_at_ms));
        let app = KeyRange::from(vec![RESERVED_KEY_PREFIX + 1]);
        for row in Entries::new(store, p, app) {
            row?;
            s.application_rows += 1;
        }
        Ok(())
    }

    fn namespace(&self, namespace: Namespace) -> NamespaceSummary {
        let mut fences = Vec::new();
        let mut refused = None;
        for kind in KINDS {
            match self.fence(&namespace, kind) {
                Ok(f) => fences.push(f),
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        NamespaceSummary {
            namespace,
            fences,
            refused,
        }
    }

    fn fence(&self, ns: &Namespace, kind: FenceKind) -> Result<FenceSummary> {
        let store = &self.store;
        let keys = Keys::new(kind);
        let c = ns.coordinator_partition();
        let current = store
            .get(&c, &keys.current())?
            .map(|raw| fence::decode::<u64>("epoch row", &raw))
            .transpose()?
            .unwrap_or(0);
        let mut leased = Vec::new();
        for row in Entries::new(store, c.clone(), keys.shard_range()) {
            let (key, raw) = row?;
            let shard: fence::ShardRow = fence::decode("leased-shard row", &raw)?;
            leased.push(LeasedShard {
                entity: keys.entity_of_shard(ns, &key)?,
                epoch: shard.epoch,
                expires_at_ms: shard.expires_at_ms,
                acked_epoch: shard.acked_epoch,
            });
        }
        let recovered_at_ms = store
            .get(&c, &keys.recovery())?
            .map(|raw| fence::decode::<fence::RecoveryRow>("recovery row", &raw))
            .transpose()?
            .map(|r| r.resumed_at_ms);
        let revocation = store
            .get(&c, &keys.checkpoint())?
            .map(|raw| fence::decode::<fence::CheckpointRow>("revocation checkpoint", &raw))
            .transpose()?
            .map(|r| format!("towards epoch {} at {:?}", r.epoch, r.cursor));
        Ok(FenceSummary {
            kind,
            current,
            leased,
            recovered_at_ms,
            revocation,
        })
    }

    /// Reads everything and reports every problem, changing nothing: every record of every
    /// journal segment with its checksums (including records open does not read because a
    /// snapshot covers them), the manifest and snapshot, every row of every partition, every
    /// entity's digest chain from its first retained record to its head, and every checkpoint
    /// against the history it folds (SPEC L4), and every fence row of every namespace. Damage
    /// the store refuses (SPEC S4, [`FileStore::damage`]) is a finding too, even when the
    /// records that showed it are gone (an earlier open found it and persisted the refusal).
    pub fn verify(&self) -> Result<Verification> {
        let store = &self.store;
        let mut v = Verification::default();
        files_findings(&store.check_files()?, &mut v);
        for p in store.list_partitions(b"")? {
            let partition = self.partition(&p);
            v.partitions += 1;
            if let Some(why) = partition.refused {
                v.find(format!("partition {p}"), format!("refuses to load: {why}"));
                continue;
            }
            if let Some(entity) = EntityId::from_partition(&p) {
                v.entities += 1;
                if let Err(e) = self.verify_entity(&p, &mut v) {
                    v.find(format!("entity {entity}"), e.to_string());
                }
            } else if let Some(ns) = self.summary_namespace(&p)
                && let Some(why) = ns.refused
            {
                v.find(format!("namespace {}", ns.namespace), why);
            }
        }
        damage_findings(&store.damage(), &mut v);
        Ok(v)
    }

    fn summary_namespace(&self, p: &Partition) -> Option<NamespaceSummary> {
        let name = std::str::from_utf8(p.as_bytes().strip_prefix(b"c/")?).ok()?;
        Some(self.namespace(Namespace::new(name).ok()?))
    }

    fn verify_entity(&self, p: &Partition, v: &mut Verification) -> Result<()> {
        let store = &self.store;
        let (head, checkpoint) = log::load_restore_point(store, p)?;
        let head = head.head;
        // The whole retained chain, ending at the head's digest.
        log::replay::<Error>(
            store,
            p,
            &head,
            head.first_seq - 1,
            head.base_digest,
            |_| Ok(()),
        )?;
        if let Some(mark) = head.checkpoint {
            match &checkpoint {
                Some(c) if c.mark() == mark => {}
                Some(c) => {
                    return Err(Error::corrupt(
                        p.to_string(),
                        format!(
                            "the checkpoint row is at {} but the head names {}",
                            c.seq, mark.seq
                        ),
                    ));
                }
                None => {
                    return Err(Error::corrupt(
                        p.to_string(),
                        format!(
                            "the head names a checkpoint at {} that is missing",
                            mark.seq
                        ),
                    ));
                }
            }
            log::verify_checkpoint_against_history(store, p, &mark)?;
            v.checkpoints += 1;
        }
        Ok(())
    }
}

/// One finding per refusal the store keeps (SPEC S4), saying how an operator lifts it.
fn damage_findings(damage: &StoreDamage, v: &mut Verification) {
    for refused in &damage.partitions {
        let subject = match &refused.partition {
            Some(p) => format!("partition {p}"),
            None => format!("partition with hash {:016x}", refused.hash),
        };
        v.find(
            subject,
            format!(
                "refused by the store until an operator accepts it (FileStore::accept_damage): {}",
                refused.reason
            ),
        );
    }
    for range in &damage.unattributed {
        v.find(
            "store",
            format!(
                "damage no partition could be named for ({range}): every partition the store does not know is refused until an operator accepts it (FileStore::accept_unattributed_damage)"
            ),
        );
    }
}

fn files_findings(check: &FileCheck, v: &mut Verification) {
    v.records = check.records;
    v.bytes = check.bytes;
    match &check.manifest {
        FileState::Intact => {}
        FileState::Missing if check.files.is_empty() => {}
        FileState::Missing => v.find(
            "MANIFEST",
            "missing: open rebuilds it (and a snapshot) by reading the whole journal",
        ),
        FileState::Damaged(why) => v.find(
            "MANIFEST",
            format!("damaged ({why}): open rebuilds it by reading the whole journal"),
        ),
    }
    match &check.snapshot {
        Some((_, FileState::Intact)) | None => {}
        Some((name, FileState::Missing)) => v.find(
            name.clone(),
            "the snapshot the manifest names is missing: open rebuilds it by reading the whole journal",
        ),
        Some((name, FileState::Damaged(why))) => v.find(
            name.clone(),
            format!("damaged ({why}): open rebuilds it by reading the whole journal"),
        ),
    }
    for (segment, why) in &check.bad_headers {
        v.find(
            format!("journal segment {segment}"),
            format!("bad header: {why}"),
        );
    }
    for d in &check.damaged {
        v.find(
            format!("journal segment {} offset {}", d.segment, d.offset),
            format!(
                "a damaged record with valid records after it; partition {} refuses to load",
                d.partition.as_deref().unwrap_or("(unknown)")
            ),
        );
    }
    if let Some(t) = &check.torn_tail {
        v.find(
            format!("journal segment {} offset {}", t.segment, t.offset),
            format!(
                "torn tail of {} bytes: writes a crash cut short, never acknowledged; open truncates them",
                t.bytes_dropped
            ),
        );
    }
    if let Some(why) = &check.unreadable {
        v.find("journal", format!("cannot be read to its end: {why}"));
    }
}
