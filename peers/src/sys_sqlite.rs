//! SQLite (bundled), WAL mode, `synchronous=FULL`: every commit syncs the WAL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::common::{Bench, DataSet, PointWriter, R, Reader, System, Worker, value};

pub struct Sqlite;

const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

fn connect(path: &Path) -> R<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if mode != "wal" {
        return Err(format!("journal_mode is {mode}, not wal").into());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// (entity, seq) packed into the integer primary key (the table's rowid), so a row is found
/// and an entity's rows are read in key order without a second index.
fn log_id(entity: u64, seq: u64) -> i64 {
    ((entity << 24) | seq) as i64
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == ErrorCode::DatabaseBusy || f.code == ErrorCode::DatabaseLocked)
}

struct Db {
    path: PathBuf,
}

struct Commits(Db);

impl Bench for Commits {
    fn worker(&self, thread: usize) -> R<Worker<'_>> {
        // One connection per thread.
        let conn = connect(&self.0.path)?;
        Ok(Box::new(move |i: u64| {
            let k = ((thread as i64) << 32) | i as i64;
            let mut st = conn.prepare_cached("INSERT INTO kv (k, v) VALUES (?1, ?2)")?;
            match st.execute(params![k, value(thread as u64, i, crate::COMMIT_VALUE_LEN)]) {
                Ok(_) => Ok(true),
                Err(e) if is_busy(&e) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }))
    }
}

struct Cas(Db);

impl Bench for Cas {
    fn worker(&self, _thread: usize) -> R<Worker<'_>> {
        let mut conn = connect(&self.0.path)?;
        Ok(Box::new(move |_| {
            let old: i64 = conn
                .prepare_cached("SELECT v FROM kv WHERE k = 0")?
                .query_row([], |r| r.get(0))?;
            let mut attempt = || -> rusqlite::Result<bool> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let changed = tx
                    .prepare_cached("UPDATE kv SET v = ?1 WHERE k = 0 AND v = ?2")?
                    .execute(params![old + 1, old])?;
                tx.commit()?;
                Ok(changed == 1)
            };
            match attempt() {
                Ok(won) => Ok(won),
                Err(e) if is_busy(&e) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }))
    }
}

struct LogReader {
    conn: Connection,
}

impl Reader for LogReader {
    fn read_entity(&self, entity: u64) -> R<(usize, usize)> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, v FROM log WHERE id BETWEEN ?1 AND ?2 ORDER BY id")?;
        let mut rows = st.query(params![log_id(entity, 0), log_id(entity, (1 << 24) - 1)])?;
        let (mut n, mut bytes) = (0usize, 0usize);
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            if id != log_id(entity, n as u64) {
                return Err("records out of order".into());
            }
            let v = row.get_ref(1)?.as_blob()?;
            n += 1;
            bytes += v.len();
        }
        Ok((n, bytes))
    }

    fn get(&self, entity: u64, seq: u64) -> R<Option<Vec<u8>>> {
        Ok(self
            .conn
            .prepare_cached("SELECT v FROM log WHERE id = ?1")?
            .query_row(params![log_id(entity, seq)], |r| r.get(0))
            .optional()?)
    }

    fn close(self: Box<Self>) -> R<()> {
        self.conn.close().map_err(|(_, e)| e)?;
        Ok(())
    }
}

impl System for Sqlite {
    fn name(&self) -> &'static str {
        "SQLite"
    }

    fn config(&self) -> String {
        format!(
            "SQLite {} (rusqlite, bundled), journal_mode=WAL, synchronous=FULL (the WAL is \
             synced at every commit), busy_timeout {} s, one connection per thread, \
             autocommit INSERT per row; tables keyed by INTEGER PRIMARY KEY (logs: \
             entity << 24 | seq), other settings default",
            rusqlite::version(),
            BUSY_TIMEOUT.as_secs()
        )
    }

    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let path = dir.join("db.sqlite");
        connect(&path)?
            .execute_batch("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")?;
        Ok(Box::new(Commits(Db { path })))
    }

    fn cas(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let path = dir.join("db.sqlite");
        connect(&path)?.execute_batch(
            "CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);
             INSERT INTO kv (k, v) VALUES (0, 0);",
        )?;
        Ok(Box::new(Cas(Db { path })))
    }

    fn load(&self, dir: &Path, data: &DataSet) -> R<()> {
        // Bulk load: many rows per transaction, each transaction synced.
        let mut conn = connect(&dir.join("db.sqlite"))?;
        conn.execute_batch("CREATE TABLE log (id INTEGER PRIMARY KEY, v BLOB NOT NULL)")?;
        let mut rows = data.rows().peekable();
        while rows.peek().is_some() {
            let tx = conn.transaction()?;
            {
                let mut st = tx.prepare_cached("INSERT INTO log (id, v) VALUES (?1, ?2)")?;
                for (e, s) in rows.by_ref().take(data.rows_per_txn) {
                    st.execute(params![log_id(e, s), value(e, s, data.value_len)])?;
                }
            }
            tx.commit()?;
        }
        conn.close().map_err(|(_, e)| e)?;
        Ok(())
    }

    fn open(&self, dir: &Path) -> R<Box<dyn Reader>> {
        let conn = connect(&dir.join("db.sqlite"))?;
        // Open is lazy in SQLite: make sure the schema is read as part of opening.
        let _: Option<i64> = conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .optional()?;
        Ok(Box::new(LogReader { conn }))
    }

    fn crash_writer(&self, dir: &Path) -> R<PointWriter> {
        let conn = connect(&dir.join("db.sqlite"))?;
        Ok(Box::new(move |entity, seq, record: &[u8]| {
            conn.prepare_cached("INSERT INTO log (id, v) VALUES (?1, ?2)")?
                .execute(params![log_id(entity, seq), record])?;
            Ok(())
        }))
    }
}
