//! Memory (SPEC S8): heap bytes per untouched partition after open (goal <= 64) and per loaded
//! key (goal <= 48 plus the key's length).
//!
//! A counting global allocator (`stats_alloc`) records the bytes the program asks for; the
//! figures are net bytes still held (allocated minus freed) across one step. They count the
//! sizes requested, not the allocator's own per-block overhead (glibc adds about 8 bytes per
//! block and rounds up to 16). Fixed costs (journal, file handles) are removed by measuring two
//! sizes and taking the difference per item, reported beside the plain average.
//!
//! Run: `cargo bench --bench memory` (prints a table; not a criterion benchmark).

mod common;

use std::alloc::System;
use std::path::Path;

use common::{full_run, open_for_loading, partitions, scratch, seq_key};
use portcullis::store::{Batch, FileStore, Partition, Store};
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

fn main() {
    let full = full_run();
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
