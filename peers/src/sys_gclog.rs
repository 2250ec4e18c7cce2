//! The group-commit log: a yardstick for durable commits, not a store. One file; each commit
//! is a length-prefixed record appended at the end; leader/follower group commit: the first
//! committer to find no leader becomes the leader, takes every record queued so far, writes
//! them with one `write_all_at`, `fdatasync`s, and wakes the followers it covered. Nothing
//! else: no index, no checksums, no reads, no recovery. It takes part in the durable
//! single-row commits only; every other workload reports n/a for it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::{Condvar, Mutex};

use crate::common::{Bench, DataSet, R, Reader, System, Worker, Workload, value};

pub struct GcLog;

struct Queue {
    /// Records queued and not yet taken by a leader, each `len: u32 LE` then its bytes.
    pending: Vec<u8>,
    /// Tickets handed out: the n-th queued record has ticket n (from 1).
    queued: u64,
    /// Every ticket up to this one is written and synced.
    durable: u64,
    /// A leader is writing and syncing.
    leading: bool,
    /// Where the next write goes.
    end: u64,
    /// A leader's write or sync failed: the log is unusable (no recovery, it is a yardstick).
    failed: bool,
    /// Counters: records committed, syncs made.
    commits: u64,
    syncs: u64,
}

struct Log {
    file: File,
    queue: Mutex<Queue>,
    done: Condvar,
}

impl Log {
    /// Appends `record` and returns once it is synced.
    fn commit(&self, record: &[u8]) -> R<()> {
        let mut q = self.queue.lock();
        q.pending
            .extend_from_slice(&u32::try_from(record.len())?.to_le_bytes());
        q.pending.extend_from_slice(record);
        q.queued += 1;
        let ticket = q.queued;
        loop {
            if q.failed {
                return Err("the group-commit log failed to write or sync".into());
            }
            if q.durable >= ticket {
                return Ok(());
            }
            if q.leading {
                self.done.wait(&mut q);
                continue;
            }
            // Lead: take everything queued (this record included), write and sync it outside
            // the lock, then publish and wake the followers covered.
            q.leading = true;
            let batch = std::mem::take(&mut q.pending);
            let covers = q.queued;
            let at = q.end;
            drop(q);
            let written = self
                .file
                .write_all_at(&batch, at)
                .and_then(|()| self.file.sync_data());
            q = self.queue.lock();
            q.leading = false;
            match written {
                Ok(()) => {
                    q.end = at + batch.len() as u64;
                    q.commits += covers - q.durable;
                    q.durable = covers;
                    q.syncs += 1;
                }
                Err(_) => q.failed = true,
            }
            self.done.notify_all();
        }
    }
}

struct Commits {
    log: Log,
}

impl Bench for Commits {
    fn worker(&self, thread: usize) -> R<Worker<'_>> {
        Ok(Box::new(move |i: u64| {
            // The same row the other systems commit: an 8-byte key and a 100-byte value.
            let mut record = Vec::with_capacity(116);
            record.extend_from_slice(&(thread as u64).to_be_bytes());
            record.extend_from_slice(&i.to_be_bytes());
            record.extend_from_slice(&value(thread as u64, i, crate::COMMIT_VALUE_LEN));
            self.log.commit(&record)?;
            Ok(true)
        }))
    }

    fn counters(&self) -> Option<(u64, u64)> {
        let q = self.log.queue.lock();
        Some((q.commits, q.syncs))
    }
}

fn unsupported<T>() -> R<T> {
    Err("the group-commit log takes part in the durable commits only".into())
}

impl System for GcLog {
    fn name(&self) -> &'static str {
        "group-commit log"
    }

    fn config(&self) -> String {
        "a baseline, not a store: one file, each commit a length-prefixed record (thread, key, \
         100-byte value) appended with one `write_all_at` per group, leader/follower group \
         commit (the first waiter leads, takes every queued record, writes, `fdatasync`s, wakes \
         the followers it covered), no preallocation, no index, no checksums, no recovery; \
         durable single-row commits only"
            .into()
    }

    fn supports(&self, workload: Workload) -> bool {
        workload == Workload::Commits
    }

    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>> {
        let file = File::options()
            .create_new(true)
            .read(true)
            .write(true)
            .open(dir.join("group-commit.log"))?;
        File::open(dir)?.sync_all()?;
        Ok(Box::new(Commits {
            log: Log {
                file,
                queue: Mutex::new(Queue {
                    pending: Vec::new(),
                    queued: 0,
                    durable: 0,
                    leading: false,
                    end: 0,
                    failed: false,
                    commits: 0,
                    syncs: 0,
                }),
                done: Condvar::new(),
            },
        }))
    }

    fn cas(&self, _: &Path) -> R<Box<dyn Bench>> {
        unsupported()
    }

    fn load(&self, _: &Path, _: &DataSet) -> R<()> {
        unsupported()
    }

    fn open(&self, _: &Path) -> R<Box<dyn Reader>> {
        unsupported()
    }

    fn crash_writer(&self, _: &Path) -> R<crate::common::PointWriter> {
        unsupported()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed record is in the file, in one piece, once; syncs never exceed commits.
    #[test]
    fn concurrent_commits_all_land_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let bench = GcLog.commits(dir.path()).unwrap();
        let (threads, per_thread) = (8usize, 200u64);
        std::thread::scope(|s| {
            for t in 0..threads {
                let bench = &bench;
                s.spawn(move || {
                    let mut w = bench.worker(t).unwrap();
                    for i in 0..per_thread {
                        assert!(w(i).unwrap());
                    }
                });
            }
        });
        let (commits, syncs) = bench.counters().unwrap();
        assert_eq!(commits, threads as u64 * per_thread);
        assert!(syncs >= 1 && syncs <= commits);
        drop(bench);
        let bytes = std::fs::read(dir.path().join("group-commit.log")).unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let r = &bytes[at + 4..at + 4 + len];
            let t = u64::from_be_bytes(r[..8].try_into().unwrap());
            let i = u64::from_be_bytes(r[8..16].try_into().unwrap());
            assert_eq!(&r[16..], value(t, i, 100).as_slice());
            assert!(seen.insert((t, i)), "record ({t}, {i}) written twice");
            at += 4 + len;
        }
        assert_eq!(seen.len(), threads * per_thread as usize);
    }
}
