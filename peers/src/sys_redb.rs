//! redb: one `Database`, durable commits (`Durability::Immediate`, the default).

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::common::{Bench, DataSet, PointWriter, R, Reader, System, Worker, value};

pub struct Redb;

const KV: TableDefinition<u64, &[u8]> = TableDefinition::new("kv");
const COUNTER: TableDefinition<u64, u64> = TableDefinition::new("counter");
const LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("log");

struct Commits {
    db: Arc<Database>,
}

impl Bench for Commits {
    fn worker(&self, thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |i: u64| {
            let txn = self.db.begin_write()?;
            {
                let mut t = txn.open_table(KV)?;
                t.insert(
                    ((thread as u64) << 32) | i,
                    value(thread as u64, i, crate::COMMIT_VALUE_LEN).as_slice(),
                )?;
            }
            txn.commit()?;
            Ok(true)
        }))
    }
}

struct Cas {
    db: Arc<Database>,
}

impl Bench for Cas {
    fn worker(&self, _thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |_| {
            // Read and conditional write inside one write transaction; redb serialises write
            // transactions, so the condition always holds.
            let txn = self.db.begin_write()?;
            let won = {
                let mut t = txn.open_table(COUNTER)?;
                let old = t.get(0)?.ok_or("counter row missing")?.value();
                t.insert(0, old + 1)?;
                true
            };
            txn.commit()?;
            Ok(won)
        }))
    }
}

struct LogReader {
    db: Database,
}

impl Reader for LogReader {
    fn read_entity(&self, entity: u64) -> R<(usize, usize)> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(LOG)?;
        let (mut n, mut bytes) = (0usize, 0usize);
        for row in t.range((entity, 0)..=(entity, u64::MAX))? {
            let (k, v) = row?;
            if k.value() != (entity, n as u64) {
                return Err("records out of order".into());
            }
            n += 1;
            bytes += v.value().len();
        }
        Ok((n, bytes))
    }

    fn get(&self, entity: u64, seq: u64) -> R<Option<Vec<u8>>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(LOG)?;
        Ok(t.get((entity, seq))?.map(|v| v.value().to_vec()))
    }

    fn close(self: Box<Self>) -> R<()> {
        drop(self.db);
        Ok(())
    }
}

impl System for Redb {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn config(&self) -> String {
        "redb 4.1 (crate default features), one Database shared by all threads, every write \
         transaction committed with the default Durability::Immediate (synced before commit \
         returns), tables keyed by u64 / (entity: u64, seq: u64), cache size default"
            .into()
    }

    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let db = Database::create(dir.join("db.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(KV)?;
        txn.commit()?;
        Ok(Box::new(Commits { db: Arc::new(db) }))
    }

    fn cas(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let db = Database::create(dir.join("db.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(COUNTER)?.insert(0, 0)?;
        txn.commit()?;
        Ok(Box::new(Cas { db: Arc::new(db) }))
    }

    fn load(&self, dir: &Path, data: &DataSet) -> R<()> {
        // Bulk load: many rows per durable write transaction.
        let db = Database::create(dir.join("db.redb"))?;
        let mut rows = data.rows().peekable();
        while rows.peek().is_some() {
            let txn = db.begin_write()?;
            {
                let mut t = txn.open_table(LOG)?;
                for (e, s) in rows.by_ref().take(data.rows_per_txn) {
                    t.insert((e, s), value(e, s, data.value_len).as_slice())?;
                }
            }
            txn.commit()?;
        }
        drop(db);
        Ok(())
    }

    fn open(&self, dir: &Path) -> R<Box<dyn Reader>> {
        let db = Database::create(dir.join("db.redb"))?;
        Ok(Box::new(LogReader { db }))
    }

    fn crash_writer(&self, dir: &Path) -> R<PointWriter> {
        let db = Database::create(dir.join("db.redb"))?;
        Ok(Box::new(move |entity, seq, record: &[u8]| {
            let txn = db.begin_write()?;
            txn.open_table(LOG)?.insert((entity, seq), record)?;
            txn.commit()?;
            Ok(())
        }))
    }
}
