//! fjall: one keyspace shared by all threads, every write batch persisted with `SyncData`.

use std::path::Path;

use fjall::{
    Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode, TxKeyspace,
    TxPartitionHandle,
};

use crate::common::{Bench, DataSet, PointWriter, R, Reader, System, Worker, log_key, value};

pub struct Fjall;

/// The same sync call Portcullis and redb make (`fdatasync`); fjall also offers `SyncAll`
/// (`fsync`).
const MODE: PersistMode = PersistMode::SyncData;

struct Commits {
    ks: Keyspace,
    part: PartitionHandle,
}

impl Bench for Commits {
    fn worker(&self, thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |i: u64| {
            let mut b = self.ks.batch().durability(Some(MODE));
            b.insert(
                &self.part,
                log_key(thread as u64, i),
                value(thread as u64, i, crate::COMMIT_VALUE_LEN),
            );
            b.commit()?;
            Ok(true)
        }))
    }
}

struct Cas {
    ks: TxKeyspace,
    part: TxPartitionHandle,
}

impl Bench for Cas {
    fn worker(&self, _thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |_| {
            // A write transaction (fjall's default single-writer transactions: serialised),
            // read then write inside it, committed with a sync.
            let mut tx = self.ks.write_tx().durability(Some(MODE));
            let old = tx
                .get(&self.part, b"counter")?
                .ok_or("counter row missing")?;
            let n = u64::from_be_bytes(old.as_ref().try_into()?);
            tx.insert(&self.part, b"counter", (n + 1).to_be_bytes());
            tx.commit()?;
            Ok(true)
        }))
    }
}

struct LogReader {
    _ks: Keyspace,
    part: PartitionHandle,
}

impl Reader for LogReader {
    fn read_entity(&self, entity: u64) -> R<(usize, usize)> {
        let (mut n, mut bytes) = (0usize, 0usize);
        for row in self.part.prefix(entity.to_be_bytes()) {
            let (k, v) = row?;
            if *k != log_key(entity, n as u64) {
                return Err("records out of order".into());
            }
            n += 1;
            bytes += v.len();
        }
        Ok((n, bytes))
    }

    fn get(&self, entity: u64, seq: u64) -> R<Option<Vec<u8>>> {
        Ok(self.part.get(log_key(entity, seq))?.map(|v| v.to_vec()))
    }

    fn close(self: Box<Self>) -> R<()> {
        drop(self);
        Ok(())
    }
}

impl System for Fjall {
    fn name(&self) -> &'static str {
        "fjall"
    }

    fn config(&self) -> String {
        "fjall 2.11 (crate default features: lz4, single-writer transactions), one keyspace \
         shared by all threads, each commit a write batch with durability \
         Some(PersistMode::SyncData) (the journal is fdatasync'd before commit returns); \
         compare-and-set in a write transaction with the same durability; keys 16 bytes \
         (entity, seq big-endian), other settings default"
            .into()
    }

    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let ks = Config::new(dir).open()?;
        let part = ks.open_partition("kv", PartitionCreateOptions::default())?;
        Ok(Box::new(Commits { ks, part }))
    }

    fn cas(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let ks = Config::new(dir).open_transactional()?;
        let part = ks.open_partition("kv", PartitionCreateOptions::default())?;
        let mut tx = ks.write_tx().durability(Some(MODE));
        tx.insert(&part, b"counter", 0u64.to_be_bytes());
        tx.commit()?;
        Ok(Box::new(Cas { ks, part }))
    }

    fn load(&self, dir: &Path, data: &DataSet) -> R<()> {
        // Bulk load: many rows per write batch, each batch synced.
        let ks = Config::new(dir).open()?;
        let part = ks.open_partition("log", PartitionCreateOptions::default())?;
        let mut rows = data.rows().peekable();
        while rows.peek().is_some() {
            let mut b = ks.batch().durability(Some(MODE));
            for (e, s) in rows.by_ref().take(data.rows_per_txn) {
                b.insert(&part, log_key(e, s), value(e, s, data.value_len));
            }
            b.commit()?;
        }
        ks.persist(PersistMode::SyncAll)?;
        drop(part);
        drop(ks);
        Ok(())
    }

    fn open(&self, dir: &Path) -> R<Box<dyn Reader>> {
        let ks = Config::new(dir).open()?;
        let part = ks.open_partition("log", PartitionCreateOptions::default())?;
        Ok(Box::new(LogReader { _ks: ks, part }))
    }

    fn settle(&self, dir: &Path) -> R<()> {
        let ks = Config::new(dir).open()?;
        let part = ks.open_partition("log", PartitionCreateOptions::default())?;
        // fjall has no call that waits for its compactions: poll until none is running and
        // the disk space stays put (bounded: a minute).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut last = u64::MAX;
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let space = ks.disk_space();
            if ks.active_compactions() == 0 && space == last {
                break;
            }
            last = space;
        }
        ks.persist(PersistMode::SyncAll)?;
        drop(part);
        drop(ks);
        Ok(())
    }

    fn settles(&self) -> &'static str {
        "reopened, polled every 200 ms until no compaction runs and `disk_space` stays put \
         (fjall has no call that waits for them), persisted, dropped"
    }

    fn crash_writer(&self, dir: &Path) -> R<PointWriter> {
        let ks = Config::new(dir).open()?;
        let part = ks.open_partition("log", PartitionCreateOptions::default())?;
        Ok(Box::new(move |entity, seq, record: &[u8]| {
            let mut b = ks.batch().durability(Some(MODE));
            b.insert(&part, log_key(entity, seq), record);
            b.commit()?;
            Ok(())
        }))
    }
}
