//! Portcullis: the file-backed store, every commit synced (group commit shares the syncs).
//! Entity logs are written with `portcullis::log` into the engine's entity partitions, each
//! entity registered with `Engine::register` first, so the engine restores the same data set
//! the log reads (see `engine_restore`).

use std::path::Path;
use std::sync::Arc;

use portcullis::EntityId;
use portcullis::engine::Engine;
use portcullis::log;
use portcullis::store::{Batch, FileStore, Outcome, Partition, Store, SyncPolicy};

use crate::common::{
    Bench, DataSet, Order, PointWriter, R, Reader, RestoreRun, System, Worker, value,
};

pub struct Portcullis;

/// The namespace of the per-entity logs.
pub const LOG_NAMESPACE: &str = "logs";

/// Entity `entity` of the data sets: `logs/00000042`, partition `e/logs/00000042`.
pub fn entity_id(entity: u64) -> R<EntityId> {
    Ok(EntityId::new(LOG_NAMESPACE, format!("{entity:08}"))?)
}

fn entity_partition(entity: u64) -> R<Partition> {
    Ok(entity_id(entity)?.partition())
}

/// Appends `records` to `entity`'s log.
fn append(store: &FileStore, entity: u64, records: &[Vec<u8>]) -> R<()> {
    let p = entity_partition(entity)?;
    match log::append(store, &p, records, Batch::new())?.committed() {
        Some(_) => Ok(()),
        None => Err("append refused".into()),
    }
}

struct Commits {
    store: Arc<FileStore>,
}

/// Closes the store when the workload is done with it: a compaction it started by itself would
/// otherwise go on after the drop (its task holds the store) beside the next measurement.
impl Drop for Commits {
    fn drop(&mut self) {
        let _ = self.store.close();
    }
}

impl Bench for Commits {
    fn worker(&self, thread: usize) -> R<Worker<'_>> {
        // One partition per thread: each thread is an entity appending to its own log.
        let p = Partition::new(format!("commits/{thread}"))?;
        let store = self.store.clone();
        Ok(Box::new(move |i: u64| {
            let b = Batch::new().put(
                i.to_be_bytes().to_vec(),
                value(thread as u64, i, crate::COMMIT_VALUE_LEN),
            );
            Ok(store.apply(&p, &b)?.is_committed())
        }))
    }

    fn counters(&self) -> Option<(u64, u64)> {
        let s = self.store.stats();
        Some((s.batches, s.syncs))
    }
}

struct Cas {
    store: Arc<FileStore>,
    p: Partition,
}

impl Drop for Cas {
    fn drop(&mut self) {
        let _ = self.store.close();
    }
}

impl Bench for Cas {
    fn worker(&self, _thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |_| {
            // `get_for_update`: the value the next batch's guard will see, without waiting
            // for the previous winner's sync (the store's read meant for compare-and-set).
            let old = self
                .store
                .get_for_update(&self.p, b"counter")?
                .ok_or("counter row missing")?;
            let n = u64::from_be_bytes(old.as_slice().try_into()?);
            let b = Batch::new()
                .equals(b"counter".to_vec(), old)
                .put(b"counter".to_vec(), (n + 1).to_be_bytes().to_vec());
            Ok(self.store.apply(&self.p, &b)? == Outcome::Committed)
        }))
    }

    fn counters(&self) -> Option<(u64, u64)> {
        let s = self.store.stats();
        Some((s.batches, s.syncs))
    }
}

struct LogReader {
    store: FileStore,
}

impl Reader for LogReader {
    fn read_entity(&self, entity: u64) -> R<(usize, usize)> {
        let p = entity_partition(entity)?;
        let (mut n, mut bytes) = (0, 0);
        let mut from = Some(1);
        // Each payload is lent, not copied out, as SQLite's and redb's readers borrow each blob.
        while let Some(seq) = from {
            from = log::visit_log(&self.store, &p, seq, 1024, |r| {
                // The log numbers records from 1.
                if r.seq != n as u64 + 1 {
                    return Err("records out of order".into());
                }
                n += 1;
                bytes += r.payload.len();
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            })?;
        }
        Ok((n, bytes))
    }

    fn get(&self, entity: u64, seq: u64) -> R<Option<Vec<u8>>> {
        let page = log::read_log(&self.store, &entity_partition(entity)?, seq + 1, 1)?;
        Ok(page
            .records
            .into_iter()
            .find(|r| r.seq == seq + 1)
            .map(|r| r.payload))
    }

    fn close(self: Box<Self>) -> R<()> {
        Ok(self.store.close()?)
    }
}

impl System for Portcullis {
    fn name(&self) -> &'static str {
        "Portcullis"
    }

    fn config(&self) -> String {
        "FileStore, SyncPolicy::SyncEveryCommit (default: `apply` returns once the batch is \
         fdatasync'd; concurrent commits share a sync), other options default; single-row \
         commits: one partition per thread; logs: one partition per entity (the engine's \
         entity partition, registered with `Engine::register`) written and read with \
         `portcullis::log` (`append`: one guarded batch per append, guarded on the log's head \
         row; `visit_log` pages of 1,024, each record's payload lent, not copied; the point \
         read after a kill: `read_log` of one record); compare-and-set: `get_for_update`, then \
         a batch guarded with `equals`; "
            .to_string()
            + crate::engine_restore::CONFIG
    }

    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        Ok(Box::new(Commits {
            store: Arc::new(store),
        }))
    }

    fn cas(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        let p = Partition::new("cas")?;
        let seeded = store.apply(
            &p,
            &Batch::new().put(b"counter".to_vec(), 0u64.to_be_bytes().to_vec()),
        )?;
        if !seeded.is_committed() {
            return Err("seeding the counter failed".into());
        }
        Ok(Box::new(Cas {
            store: Arc::new(store),
            p,
        }))
    }

    fn load(&self, dir: &Path, data: &DataSet) -> R<()> {
        // Bulk load: commits are written but not synced one by one; `close` syncs everything
        // and writes a heads snapshot, so the data set is durable when `load` returns.
        let store = Arc::new(
            FileStore::builder(dir)
                .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
                .open()?,
        );
        // Register every entity as an application would (this writes the marker row the
        // engine lists entities by), then append through the log.
        let engine = Engine::builder(crate::engine_restore::Histories)
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .open()?;
        for e in 0..data.entities {
            engine.register(&entity_id(e)?)?;
        }
        engine.close()?;
        match data.order {
            Order::Interleaved => {
                for (e, s) in data.rows() {
                    append(&store, e, &[value(e, s, data.value_len)])?;
                }
            }
            Order::PerEntity => {
                for e in 0..data.entities {
                    let records: Vec<Vec<u8>> = (0..data.records)
                        .map(|s| value(e, s, data.value_len))
                        .collect();
                    append(&store, e, &records)?;
                }
            }
        }
        store.close()?;
        Ok(())
    }

    fn open(&self, dir: &Path) -> R<Box<dyn Reader>> {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        Ok(Box::new(LogReader { store }))
    }

    fn settle(&self, dir: &Path) -> R<()> {
        // A load its close cut short leaves segments due; the reopen compacts them.
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        store.wait_for_background_compactions();
        Ok(store.close()?)
    }

    fn settles(&self) -> &'static str {
        "reopened, `FileStore::wait_for_background_compactions` (the compactions it starts by \
         itself, and those it starts after them while segments are due, finished), closed"
    }

    fn crash_writer(&self, dir: &Path) -> R<PointWriter> {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        Ok(Box::new(move |entity, seq, record: &[u8]| {
            let _ = seq; // the log numbers records itself: record `seq` is log seq `seq + 1`
            append(&store, entity, &[record.to_vec()])
        }))
    }

    fn restore_all(&self, dir: &Path, data: &DataSet) -> R<Option<RestoreRun>> {
        crate::engine_restore::restore_all(dir, data).map(Some)
    }
}
