//! What checking before writing costs (SPEC R12): an engine write runs the state machine's
//! `check` on each record, under the entity's lock, before the commit. Measured on a lone
//! commit (one thread appending one record at a time to its own entity) and on 16 threads
//! (each appending to its own entity, so their commits share syncs), on `FileStore` (default
//! sync policy: every commit synced) and on `MemoryStore` (no I/O: the CPU cost alone).
//!
//! Six machines, on raw bytes and on typed records: with `check` skipped entirely (the engine's
//! test-only switch: the write path as it was before `check` existed), with the default `check`
//! (accepts everything; `Typed` still decodes the record to hand it over), and with a `check`
//! that does a little work (reads the record and compares it with the state). Every case has its
//! own engine and store; the cases run interleaved, round after round, so a load that drifts
//! during the run (the machine is shared) weighs on all alike. Prints medians per write and the
//! ratio of each case to its skipped baseline. Also times the restore of an entity with
//! deferred records: the unit checks each against the state it meets, so it commits a batch
//! per record accepted.
//!
//! Run: `cargo bench --bench check`. `cargo test --benches` runs it with tiny sizes.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{full_run, median, scratch, value};
use portcullis::restore::{ApplyContext, Rejection, StateMachine};
use portcullis::store::{MemoryStore, Store};
use portcullis::{Engine, EntityId, Typed, TypedMachine};
use serde::{Deserialize, Serialize};

const THREADS: usize = 16;
const RECORD_BYTES: usize = 100;

/// Folds records into a count and a mix of their first bytes; `CHECKS` adds a check that reads
/// the record and compares it with the state.
struct Mix<const CHECKS: bool>;

fn word(record: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = record.len().min(8);
    w[..n].copy_from_slice(&record[..n]);
    u64::from_le_bytes(w)
}

impl<const CHECKS: bool> StateMachine for Mix<CHECKS> {
    type State = [u64; 2];

    fn fresh(&self, _: &EntityId) -> [u64; 2] {
        [0, 0]
    }

    fn check(&self, s: &[u64; 2], ctx: &ApplyContext<'_>, record: &[u8]) -> Result<(), Rejection> {
        if CHECKS && (record.len() > 1024 || word(record).rotate_left(7) ^ s[1] == ctx.seq) {
            return Err(Rejection::new("a record that collides with the state"));
        }
        Ok(())
    }

    fn apply(
        &self,
        s: &mut [u64; 2],
        _: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        s[0] += 1;
        s[1] = s[1].rotate_left(5) ^ word(record) ^ record.len() as u64;
        Ok(())
    }

    fn encode_checkpoint(&self, s: &[u64; 2]) -> Result<Vec<u8>, Rejection> {
        Ok([s[0].to_le_bytes(), s[1].to_le_bytes()].concat())
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<[u64; 2], Rejection> {
        if b.len() != 16 {
            return Err(Rejection::new("a checkpoint is 16 bytes"));
        }
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok([w(0), w(8)])
    }
}

/// A chat message (about 100 bytes encoded).
#[derive(Serialize, Deserialize)]
struct Post {
    author: String,
    text: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Room {
    messages: u64,
    bytes: u64,
}

/// A room; `CHECKS` refuses an empty or overlong message in `check`.
struct Chat<const CHECKS: bool>;

impl<const CHECKS: bool> TypedMachine for Chat<CHECKS> {
    type Record = Post;
    type State = Room;

    fn fresh(&self, _: &EntityId) -> Room {
        Room::default()
    }

    fn check(&self, room: &Room, _: &ApplyContext<'_>, post: &Post) -> Result<(), Rejection> {
        if CHECKS && (post.text.is_empty() || post.author.len() > 64 || room.messages == u64::MAX) {
            return Err(Rejection::new("an empty or overlong message"));
        }
        Ok(())
    }

    fn apply(&self, room: &mut Room, _: &ApplyContext<'_>, post: Post) -> Result<(), Rejection> {
        room.messages += 1;
        room.bytes += post.text.len() as u64;
        Ok(())
    }
}

type Write = Arc<dyn Fn(usize) + Send + Sync>;

/// One engine (over its own store) and how to write one record to its entity `i`.
struct Case {
    name: &'static str,
    write: Write,
    _dir: Option<tempfile::TempDir>,
}

fn store(file: bool) -> (Arc<dyn Store>, Option<tempfile::TempDir>) {
    if file {
        let dir = scratch("check");
        let store = portcullis::store::FileStore::open(dir.path()).expect("file store");
        (Arc::new(store), Some(dir))
    } else {
        (Arc::new(MemoryStore::new()), None)
    }
}

fn entities() -> Vec<EntityId> {
    (0..THREADS)
        .map(|i| EntityId::new("bench", format!("e{i:02}")).expect("valid"))
        .collect()
}

fn raw_case<const CHECKS: bool>(name: &'static str, file: bool, skip: bool) -> Case {
    let (store, dir) = store(file);
    let engine = Engine::builder(Mix::<CHECKS>)
        .store(store)
        .register_on_first_write(true)
        .sweep_expired_leases(false)
        .open()
        .expect("engine");
    engine.set_skip_checks_for_test(skip);
    let ids = entities();
    let record = value(7, RECORD_BYTES);
    let write: Write = Arc::new(move |i| {
        engine
            .append(&ids[i], vec![record.clone()])
            .expect("append");
    });
    Case {
        name,
        write,
        _dir: dir,
    }
}

fn typed_case<const CHECKS: bool>(name: &'static str, file: bool, skip: bool) -> Case {
    let (store, dir) = store(file);
    let engine = Engine::builder(Typed(Chat::<CHECKS>))
        .store(store)
        .register_on_first_write(true)
        .sweep_expired_leases(false)
        .open()
        .expect("engine");
    engine.set_skip_checks_for_test(skip);
    let ids = entities();
    let write: Write = Arc::new(move |i| {
        let post = Post {
            author: format!("writer-{i:02}"),
            text: "x".repeat(RECORD_BYTES - 12),
        };
        engine.append_typed(&ids[i], &[post]).expect("append");
    });
    Case {
        name,
        write,
        _dir: dir,
    }
}

fn cases(file: bool) -> Vec<Case> {
    vec![
        raw_case::<false>("raw, check skipped", file, true),
        raw_case::<false>("raw, default check", file, false),
        raw_case::<true>("raw, small check", file, false),
        typed_case::<false>("typed, check skipped", file, true),
        typed_case::<false>("typed, default check", file, false),
        typed_case::<true>("typed, small check", file, false),
    ]
}

/// Times `n` writes by one thread to entity 0.
fn lone(case: &Case, n: usize, out: &mut Vec<Duration>) {
    for _ in 0..n {
        let started = Instant::now();
        (case.write)(0);
        out.push(started.elapsed());
    }
}

/// 16 threads, each writing `n` records to its own entity, started together; returns every
/// write's time and the wall time of the whole round.
fn threads(case: &Case, n: usize, out: &mut Vec<Duration>) -> Duration {
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let (write, start) = (Arc::clone(&case.write), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut took = Vec::with_capacity(n);
                start.wait();
                for _ in 0..n {
                    let t = Instant::now();
                    write(i);
                    took.push(t.elapsed());
                }
                took
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    for w in workers {
        out.extend(w.join().expect("a writer"));
    }
    started.elapsed()
}

/// The first read of an entity with `n` deferred records of 100 bytes on `FileStore` (its
/// restore unit drains them: a batch per record `check` accepts), median of `reps` fresh stores.
fn drain(n: usize, reps: usize) -> Duration {
    let e = EntityId::new("bench", "drained").expect("valid");
    let mut took = Vec::with_capacity(reps);
    for _ in 0..reps {
        let dir = scratch("drain");
        let open = || {
            Engine::builder(Mix::<false>)
                .directory(dir.path())
                // The entity stays pending until the timed read: the background warm would
                // restore it as soon as work is deferred to it.
                .background_warm(false)
                .open()
                .expect("engine")
        };
        let engine = open();
        engine.register(&e).expect("register");
        engine.close().expect("close");
        let engine = open();
        for i in 0..n {
            engine
                .defer(&e, value(i as u64, RECORD_BYTES))
                .expect("defer");
        }
        engine.close().expect("close");
        let engine = open();
        let started = Instant::now();
        assert_eq!(engine.read(&e, |s| s[0]).expect("read"), n as u64);
        took.push(started.elapsed());
        engine.close().expect("close");
    }
    median(took)
}

fn main() {
    let full = full_run();
    println!("## restore of an entity with deferred records (FileStore, every commit synced)");
    println!("| deferred records | first read (restore and drain): median |");
    println!("|---|---|");
    for n in [1, 8, 64, 512] {
        let took = drain(n, if full { 15 } else { 1 });
        println!("| {n} | {:.2} ms |", took.as_secs_f64() * 1e3);
    }
    println!();
    let rounds = if full { 7 } else { 1 };
    for (label, file) in [
        ("FileStore, every commit synced", true),
        ("MemoryStore", false),
    ] {
        let (lone_n, threads_n) = match (full, file) {
            (false, _) => (3, 2),
            (true, true) => (300, 60),
            (true, false) => (20_000, 2_000),
        };
        let cases = cases(file);
        for case in &cases {
            lone(case, 2, &mut Vec::new()); // registers and restores the entities
            threads(case, 1, &mut Vec::new());
        }
        let mut lone_took = vec![Vec::new(); cases.len()];
        let mut thread_took = vec![Vec::new(); cases.len()];
        let mut walls = vec![Vec::new(); cases.len()];
        for _ in 0..rounds {
            for (i, case) in cases.iter().enumerate() {
                lone(case, lone_n, &mut lone_took[i]);
                walls[i].push(threads(case, threads_n, &mut thread_took[i]));
            }
        }
        println!("## check before writing, {label} ({rounds} rounds, interleaved)");
        println!(
            "| case | lone commit: median | vs skipped | 16 threads: median write | vs skipped | 16 threads: writes/s (median round) | vs skipped |"
        );
        println!("|---|---|---|---|---|---|---|");
        let per_round = (THREADS * threads_n) as f64;
        for (i, case) in cases.iter().enumerate() {
            let base = i - i % 3;
            let l = median(lone_took[i].clone());
            let lb = median(lone_took[base].clone());
            let t = median(thread_took[i].clone());
            let tb = median(thread_took[base].clone());
            let rate = per_round / median(walls[i].clone()).as_secs_f64();
            let rate_b = per_round / median(walls[base].clone()).as_secs_f64();
            println!(
                "| {} | {:.1} us | {:.3}x | {:.1} us | {:.3}x | {:.0} | {:.3}x |",
                case.name,
                l.as_secs_f64() * 1e6,
                l.as_secs_f64() / lb.as_secs_f64(),
                t.as_secs_f64() * 1e6,
                t.as_secs_f64() / tb.as_secs_f64(),
                rate,
                rate / rate_b,
            );
        }
        println!();
    }
}
