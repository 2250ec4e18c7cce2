//! Memory (SPEC S8): heap bytes per untouched partition after open (goal <= 64) and per loaded
//! key (goal <= 48 plus the key's length).
//!
//! A counting global allocator (`stats_alloc`) records the bytes the program asks for; the
//! figures are net bytes still held (allocated minus freed) across one step. They count the
//! sizes requested, not the allocator's own per-block overhead (glibc adds about 8 bytes per
//! block and rounds up to 16). Fixed costs (journal, file handles) are removed by measuring two
//! sizes and taking the difference per item, reported beside the plain average.
//!
//! The second table (SPEC R10) is the engine's: heap held after touching many entities once
//! (a read of each, on a fresh open), with no budget and with `max_resident_entities` plus
//! `max_loaded_partitions`, and how much it grew per entity over the second half of the reads
//! (near zero when memory is bounded by the budget rather than by the entities touched).
//! `PORTCULLIS_MEMORY_ENTITIES` sets the count (default 200,000).
//!
//! The third table (SPEC S8, R10) writes: many partitions written once each (one 16-byte row),
//! by the store under `max_loaded_partitions` and by the engine under both budgets, and the
//! heap held after every twentieth of them (relative to just after open), so it shows whether
//! memory stays flat whatever the number of partitions written since open.
//! `PORTCULLIS_MEMORY_WRITES` sets the count (default 1,000,000).
//!
//! Run: `cargo bench --bench memory` (prints a table; not a criterion benchmark).

mod common;

use std::alloc::System;
use std::path::Path;

use common::{full_run, open_for_loading, partitions, scratch, seq_key};
use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};
use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, StateMachine};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Net heap bytes and blocks still held after `f` ran, and what `f` returned.
fn held_by<T>(f: impl FnOnce() -> T) -> ((i64, i64), T) {
    let region = Region::new(GLOBAL);
    let out = f();
    let s = region.change();
    // stats_alloc already adds a realloc's growth to `bytes_allocated` (and a shrink to
    // `bytes_deallocated`); `bytes_reallocated` only repeats that, so it is not added again.
    let net = s.bytes_allocated as i64 - s.bytes_deallocated as i64;
    let blocks = s.allocations as i64 - s.deallocations as i64;
    ((net, blocks), out)
}

/// A store with `n` partitions of one 16-byte row each, closed.
fn build_partitions(dir: &Path, n: u64) {
    let store = open_for_loading(dir);
    for p in partitions(n) {
        let outcome = store
            .apply(&p, &Batch::new().put(seq_key(0), vec![1u8; 16]))
            .expect("apply");
        assert!(outcome.is_committed());
    }
    store.close().expect("close");
}

/// A 16-byte key: `key-` and twelve digits.
fn key16(i: u64) -> Vec<u8> {
    format!("key-{i:012}").into_bytes()
}

const KEY_LEN: usize = 16;

/// A store with one partition of `n` rows (16-byte keys, 16-byte values, one row per append),
/// closed.
fn build_keys(dir: &Path, p: &Partition, n: u64) {
    let store = open_for_loading(dir);
    for i in 0..n {
        let outcome = store
            .apply(p, &Batch::new().put(key16(i), vec![2u8; 16]))
            .expect("apply");
        assert!(outcome.is_committed());
    }
    store.close().expect("close");
}

struct Line {
    what: String,
    items: u64,
    net: i64,
    blocks: i64,
}

/// Each entity's state: its records, concatenated.
struct Bytes;

impl StateMachine for Bytes {
    type State = Vec<u8>;
    fn fresh(&self, _: &EntityId) -> Vec<u8> {
        Vec::new()
    }
    fn apply(&self, s: &mut Vec<u8>, _: &ApplyContext<'_>, r: &[u8]) -> Result<(), Rejection> {
        s.extend_from_slice(r);
        Ok(())
    }
    fn encode_checkpoint(&self, s: &Vec<u8>) -> Result<Vec<u8>, Rejection> {
        Ok(s.clone())
    }
    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<Vec<u8>, Rejection> {
        Ok(b.to_vec())
    }
}

/// Bytes of each entity's one record (so of its state).
const RECORD_LEN: usize = 200;

fn engine_entity(i: u64) -> EntityId {
    EntityId::new("memory", format!("entity-{i:07}")).expect("valid id")
}

fn open_engine(dir: &Path, budget: Option<usize>) -> Engine<Bytes> {
    let mut builder = Engine::builder(Bytes)
        .directory(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .own_unfenced(Namespace::new("memory").expect("valid namespace"))
        .register_on_first_write(true);
    if let Some(n) = budget {
        builder = builder.max_resident_entities(n).max_loaded_partitions(n);
    }
    builder.open().expect("open the engine")
}

/// Heap held after reading entities once on a fresh open.
struct Touched {
    /// Net bytes held after reading the first half of the entities.
    half: i64,
    /// Net bytes held after reading all of them.
    net: i64,
    /// Resident entities, registry slots and loaded partitions at the end.
    resident: u64,
    slots: u64,
    loaded: u64,
}

/// Heap held after reading each of `n` entities once on a fresh open (and after the first
/// half), and the engine's counts then.
fn touch_entities(dir: &Path, n: u64, budget: Option<usize>) -> Touched {
    let engine = open_engine(dir, budget);
    let read = |range: std::ops::Range<u64>| {
        for i in range {
            let len = engine.read(&engine_entity(i), Vec::len).expect("read");
            assert_eq!(len, RECORD_LEN);
        }
    };
    let region = Region::new(GLOBAL);
    read(0..n / 2);
    let half = region.change();
    read(n / 2..n);
    let full = region.change();
    let net = |s: stats_alloc::Stats| s.bytes_allocated as i64 - s.bytes_deallocated as i64;
    let stats = engine.stats();
    engine.close().expect("close");
    Touched {
        half: net(half),
        net: net(full),
        resident: stats.passivation.resident,
        slots: stats.passivation.slots,
        loaded: stats.store.partitions_loaded,
    }
}

fn engine_table(n: u64, full: bool) {
    let dir = scratch("memory-engine");
    let started = std::time::Instant::now();
    {
        let engine = open_engine(dir.path(), None);
        for i in 0..n {
            engine
                .append(&engine_entity(i), vec![vec![7u8; RECORD_LEN]])
                .expect("append");
        }
        engine.close().expect("close");
    }
    let built = started.elapsed();
    println!();
    println!(
        "## memory: engine, {n} entities touched once (a read each after open){}",
        if full { "" } else { " (smoke run)" }
    );
    println!("built in {built:?}; each entity has one {RECORD_LEN}-byte record");
    println!(
        "| budget | net bytes | per entity | growth per entity over the second half | resident entities | registry slots | loaded partitions |"
    );
    println!("|---|---|---|---|---|---|---|");
    let budget = (n / 200).max(10) as usize;
    for b in [None, Some(budget)] {
        let started = std::time::Instant::now();
        let t = touch_entities(dir.path(), n, b);
        println!(
            "| {} | {} | {:.1} | {:.1} | {} | {} | {} | ({:?})",
            b.map_or("none".to_string(), |b| b.to_string()),
            t.net,
            t.net as f64 / n as f64,
            (t.net - t.half) as f64 / (n - n / 2) as f64,
            t.resident,
            t.slots,
            t.loaded,
            started.elapsed()
        );
    }
}

/// Heap held (net bytes since the start) at each of 20 checkpoints while `n` items are written
/// by `write(i)`, and how long it took.
fn held_while_writing(
    n: u64,
    mut write: impl FnMut(u64),
) -> (Vec<(u64, i64)>, std::time::Duration) {
    let started = std::time::Instant::now();
    let region = Region::new(GLOBAL);
    let step = (n / 20).max(1);
    let mut points = Vec::new();
    for i in 0..n {
        write(i);
        if (i + 1) % step == 0 || i + 1 == n {
            let s = region.change();
            points.push((i + 1, s.bytes_allocated as i64 - s.bytes_deallocated as i64));
        }
    }
    (points, started.elapsed())
}

fn write_row(what: &str, budget: usize, points: &[(u64, i64)], took: std::time::Duration) {
    let at = |frac: u64| {
        let n = points.last().map_or(0, |p| p.0);
        points
            .iter()
            .find(|p| p.0 >= n * frac / 20)
            .copied()
            .unwrap_or((0, 0))
    };
    let (half, end) = (at(10), at(20));
    let second: Vec<i64> = points
        .iter()
        .filter(|p| p.0 > half.0)
        .map(|p| p.1)
        .collect();
    let (least, most) = (
        second.iter().min().copied().unwrap_or(0),
        second.iter().max().copied().unwrap_or(0),
    );
    println!(
        "| {what} | {budget} | {} | {} | {} | {} | {least} to {most} | {:.1} | {:.2} | ({took:?})",
        end.0,
        at(2).1,
        half.1,
        end.1,
        end.1 as f64 / end.0 as f64,
        (end.1 - half.1) as f64 / (end.0 - half.0).max(1) as f64,
    );
}

/// Partitions written once each under a budget, by the store and by the engine.
fn write_table(n: u64, full: bool) {
    let budget = (n / 200).max(10) as usize;
    println!();
    println!(
        "## memory: {n} partitions written once each under a budget{}",
        if full { "" } else { " (smoke run)" }
    );
    println!(
        "net heap bytes held since open, after a tenth, half and all of the writes, and the least and most at the 10 checkpoints of the second half; bytes per partition at the end; growth per partition over the second half (about 0 when flat)"
    );
    println!(
        "| writer | budget | partitions | after a tenth | after half | after all | second half, least to most | per partition | growth per partition, second half |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    {
        let dir = scratch("memory-writes");
        let store = FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .auto_compact(false)
            .max_loaded_partitions(budget)
            .open()
            .expect("open");
        let row = vec![1u8; 16];
        let (points, took) = held_while_writing(n, |i| {
            let p = Partition::new(common::part_name(i)).expect("valid name");
            let outcome = store
                .apply(&p, &Batch::new().put(seq_key(0), row.clone()))
                .expect("apply");
            assert!(outcome.is_committed());
        });
        let stats = store.stats();
        assert_eq!(stats.partitions, n);
        assert!(stats.partitions_loaded <= budget as u64);
        write_row("store, `max_loaded_partitions`", budget, &points, took);
        store.close().expect("close");
    }
    {
        let dir = scratch("memory-engine-writes");
        let engine = open_engine(dir.path(), Some(budget));
        let (points, took) = held_while_writing(n, |i| {
            engine
                .append(&engine_entity(i), vec![vec![7u8; 16]])
                .expect("append");
        });
        write_row(
            "engine, `max_resident_entities` and `max_loaded_partitions`",
            budget,
            &points,
            took,
        );
        engine.close().expect("close");
    }
}

fn main() {
    let full = full_run();
    let writes = if full {
        common::env_u64("PORTCULLIS_MEMORY_WRITES", 1_000_000)
    } else {
        400
    };
    write_table(writes, full);
    let entities = if full {
        common::env_u64("PORTCULLIS_MEMORY_ENTITIES", 200_000)
    } else {
        200
    };
    engine_table(entities, full);
    let (small, large) = if full {
        (10_000, 100_000)
    } else {
        (100, 1_000)
    };
    let name_len = common::part_name(0).len() as f64;

    // Untouched partitions after open.
    let mut opens = Vec::new();
    for n in [small, large] {
        let dir = scratch("memory-parts");
        build_partitions(dir.path(), n);
        let ((net, blocks), store) = held_by(|| FileStore::open(dir.path()).expect("open"));
        assert_eq!(store.stats().partitions, n);
        assert_eq!(store.stats().partitions_loaded, 0);
        opens.push(Line {
            what: format!("open, {n} untouched partitions"),
            items: n,
            net,
            blocks,
        });
        // Touch every partition once (a one-row index each).
        let parts = partitions(n);
        let ((net, blocks), ()) = held_by(|| {
            for p in &parts {
                assert!(store.get(p, &seq_key(0)).expect("get").is_some());
            }
        });
        opens.push(Line {
            what: format!("first get of each of {n} one-row partitions"),
            items: n,
            net,
            blocks,
        });
        store.close().expect("close");
    }

    // Loaded keys.
    let mut keys = Vec::new();
    let p = Partition::new("memory/keys").expect("valid name");
    for n in [small, large] {
        let dir = scratch("memory-keys");
        build_keys(dir.path(), &p, n);
        let store = FileStore::open(dir.path()).expect("open");
        let ((net, blocks), ()) = held_by(|| {
            assert!(store.get(&p, &key16(0)).expect("get").is_some());
        });
        assert_eq!(store.stats().partitions_loaded, 1);
        keys.push(Line {
            what: format!("load a partition of {n} keys (first get)"),
            items: n,
            net,
            blocks,
        });
        store.close().expect("close");
    }
    // Keys added by appends in this process (the index grows by inserts, not by a load).
    for n in [small, large] {
        let dir = scratch("memory-appends");
        let store = open_for_loading(dir.path());
        let ((net, blocks), ()) = held_by(|| {
            for i in 0..n {
                let outcome = store
                    .apply(&p, &Batch::new().put(key16(i), vec![2u8; 16]))
                    .expect("apply");
                assert!(outcome.is_committed());
            }
            store.flush().expect("flush");
        });
        keys.push(Line {
            what: format!("append {n} keys to a new partition"),
            items: n,
            net,
            blocks,
        });
        store.close().expect("close");
    }

    println!();
    println!(
        "## memory: net heap bytes requested (stats_alloc){}",
        if full { "" } else { " (smoke run)" }
    );
    println!("partition names are {name_len} bytes; keys are {KEY_LEN} bytes");
    println!(
        "| step | items | net bytes | net blocks | per item | per item without the name/key bytes |"
    );
    println!("|---|---|---|---|---|---|");
    let per = |l: &Line| l.net as f64 / l.items as f64;
    for l in &opens {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} |",
            l.what,
            l.items,
            l.net,
            l.blocks,
            per(l),
            per(l) - name_len
        );
    }
    for l in &keys {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} |",
            l.what,
            l.items,
            l.net,
            l.blocks,
            per(l),
            per(l) - KEY_LEN as f64
        );
    }
    let slope = |a: &Line, b: &Line| (b.net - a.net) as f64 / (b.items - a.items) as f64;
    println!(
        "difference between sizes (fixed costs removed): untouched partition {:.1} B ({:.1} without its name; goal <= 64); \
         loaded key {:.1} B ({:.1} without the key; goal <= 48 + key length); appended key {:.1} B ({:.1} without the key)",
        slope(&opens[0], &opens[2]),
        slope(&opens[0], &opens[2]) - name_len,
        slope(&keys[0], &keys[1]),
        slope(&keys[0], &keys[1]) - KEY_LEN as f64,
        slope(&keys[2], &keys[3]),
        slope(&keys[2], &keys[3]) - KEY_LEN as f64,
    );
}
