//! Runs each workload on Portcullis and on its peers (SQLite, redb, fjall), every system
//! configured so that each acknowledged commit is synced, and prints a markdown table of medians
//! with the ratio Portcullis/peer for each cell. A minimal group-commit log takes part in the
//! durable commits as a baseline.
//!
//! `cargo run --release -p portcullis-peers` runs everything; `-- --help` lists the options.
//! This module owns the options and the order of the workloads.

#![forbid(unsafe_code)]

mod common;
mod crash;
mod engine_restore;
mod report;
mod sys_fjall;
mod sys_gclog;
mod sys_portcullis;
mod sys_redb;
mod sys_sqlite;
mod throughput;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::{DataSet, Order, R, System, Workload};
use report::{Row, render, thousands};
use throughput::{bytes_written, run_threads};

struct Options {
    runs: usize,
    big_runs: usize,
    seconds: f64,
    threads: Vec<usize>,
    cas_threads: usize,
    logs: DataSet,
    big: DataSet,
    only: Vec<String>,
    systems: Vec<String>,
    cold: bool,
    read_all: bool,
    out: Option<String>,
    /// The store the crash workload kills a writer on.
    crash: DataSet,
    /// Writes the killed writer has acknowledged before the kill.
    acks: u64,
}

impl Options {
    fn parse() -> R<Options> {
        let mut o = Options {
            runs: 3,
            big_runs: 3,
            seconds: 3.0,
            threads: vec![1, 4, 16, 64],
            cas_threads: 16,
            logs: DataSet {
                entities: 10_000,
                records: 100,
                value_len: 200,
                order: Order::Interleaved,
                rows_per_txn: 10_000,
            },
            big: DataSet {
                entities: 16_384,
                records: 16,
                value_len: 4096,
                order: Order::PerEntity,
                rows_per_txn: 4096,
            },
            only: Vec::new(),
            systems: Vec::new(),
            cold: true,
            read_all: true,
            out: None,
            crash: crash::data_set(false),
            acks: 100,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut next = || args.next().ok_or(format!("{a} needs a value"));
            match a.as_str() {
                "--quick" => {
                    o.runs = 1;
                    o.big_runs = 1;
                    o.seconds = 0.5;
                    o.logs.entities = 200;
                    o.big.entities = 256;
                    o.crash = crash::data_set(true);
                    o.acks = 20;
                }
                "--runs" => o.runs = next()?.parse()?,
                "--big-runs" => o.big_runs = next()?.parse()?,
                "--seconds" => o.seconds = next()?.parse()?,
                "--only" => o.only = next()?.split(',').map(str::to_string).collect(),
                "--systems" => {
                    o.systems = next()?.split(',').map(str::to_lowercase).collect();
                }
                "--threads" => {
                    o.threads = next()?
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<_, _>>()?;
                }
                "--cas-threads" => o.cas_threads = next()?.parse()?,
                "--no-cold" => o.cold = false,
                "--first-only" => o.read_all = false,
                "--out" => o.out = Some(next()?),
                "--help" | "-h" => {
                    println!(
                        "options: --quick | --runs N (default 3) | --big-runs N (default 3) | \
                         --seconds S per throughput run (default 3) | \
                         --only commits,cas,logs,open,crash | \
                         --systems portcullis,sqlite,redb,fjall,group-commit-log | \
                         --threads 1,4,16,64 | --cas-threads N (default 16) | --no-cold | \
                         --first-only (skip reading every entity after the first answer, and \
                         the restore) | --out FILE (also write the markdown there)"
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown option {other}").into()),
            }
        }
        Ok(o)
    }

    fn wants(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == workload)
    }
}

/// A system's name on the command line: lower case, spaces as dashes.
fn key(sys: &dyn System) -> String {
    sys.name().to_lowercase().replace(' ', "-")
}

fn all_systems() -> Vec<Box<dyn System>> {
    vec![
        Box::new(sys_portcullis::Portcullis),
        Box::new(sys_sqlite::Sqlite),
        Box::new(sys_redb::Redb),
        Box::new(sys_fjall::Fjall),
        Box::new(sys_gclog::GcLog),
    ]
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn temp_dir(tag: &str) -> R<tempfile::TempDir> {
    Ok(tempfile::Builder::new()
        .prefix(&format!("portcullis-peers-{tag}-"))
        .tempdir_in(std::env::temp_dir())?)
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a.starts_with("__")) {
        return crash::child(&args, &all_systems());
    }
    let o = Options::parse()?;
    let mut systems = all_systems();
    if !o.systems.is_empty() {
        systems.retain(|s| o.systems.contains(&key(s.as_ref())));
    }
    let n = systems.len();
    let started = Instant::now();
    let cold = o.cold && drop_caches();
    let mut rows: Vec<Row> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let new_row = |what: String, unit, higher_is_better| Row {
        what,
        unit,
        higher_is_better,
        samples: vec![Vec::new(); n],
    };

    if o.wants("commits") {
        for &threads in &o.threads {
            let mut row = new_row(
                format!("durable single-row commits, {threads} threads"),
                "commits/s",
                true,
            );
            let mut syncs = new_row(
                format!(
                    "syncs per commit, {threads} threads (Portcullis and the group-commit log: \
                     their own counters)"
                ),
                "",
                false,
            );
            let mut worst = new_row(
                format!("slowest single commit, {threads} threads"),
                "ms",
                false,
            );
            let mut amplification = new_row(
                format!(
                    "write amplification, {threads} threads: bytes handed to write calls \
                     (`/proc/self/io` wchar, every thread of the process) per byte of payload \
                     (the {COMMIT_VALUE_LEN}-byte values committed)"
                ),
                "x",
                false,
            );
            for run in 0..o.runs {
                for (i, sys) in systems.iter().enumerate() {
                    if !sys.supports(Workload::Commits) {
                        continue;
                    }
                    let dir = temp_dir("commits")?;
                    let bench = sys.commits(dir.path())?;
                    let written = bytes_written();
                    let r = run_threads(bench.as_ref(), threads, o.seconds)?;
                    let written = bytes_written()
                        .zip(written)
                        .map(|(after, before)| after.saturating_sub(before));
                    drop(bench);
                    if let Some(bytes) = written.filter(|_| r.all_commits > 0) {
                        let payload = r.all_commits * COMMIT_VALUE_LEN as u64;
                        amplification.samples[i].push(bytes as f64 / payload as f64);
                    }
                    eprintln!(
                        "[{:>6.1}s] commits t={threads} run {run} {}: {:.0}/s, {} commits (syncs/commit {:?}, worst {:.1} ms)",
                        started.elapsed().as_secs_f64(),
                        sys.name(),
                        r.per_second,
                        r.commits,
                        r.syncs_per_commit,
                        r.max_latency_ms
                    );
                    row.samples[i].push(r.per_second);
                    if let Some(s) = r.syncs_per_commit {
                        syncs.samples[i].push(s);
                    }
                    worst.samples[i].push(r.max_latency_ms);
                }
            }
            rows.extend([row, syncs, worst, amplification]);
        }
    }

    if o.wants("cas") {
        let threads = o.cas_threads;
        let mut row = new_row(
            format!("compare-and-set on one row, {threads} threads: successful updates"),
            "updates/s",
            true,
        );
        let mut tries = new_row(
            format!("compare-and-set, {threads} threads: attempts (won or lost)"),
            "attempts/s",
            true,
        );
        for run in 0..o.runs {
            for (i, sys) in systems.iter().enumerate() {
                if !sys.supports(Workload::Cas) {
                    continue;
                }
                let dir = temp_dir("cas")?;
                let bench = sys.cas(dir.path())?;
                let r = run_threads(bench.as_ref(), threads, o.seconds)?;
                drop(bench);
                eprintln!(
                    "[{:>6.1}s] cas t={threads} run {run} {}: {:.0} won/s of {:.0} tries/s (syncs/commit {:?})",
                    started.elapsed().as_secs_f64(),
                    sys.name(),
                    r.per_second,
                    r.attempts_per_second,
                    r.syncs_per_commit
                );
                row.samples[i].push(r.per_second);
                tries.samples[i].push(r.attempts_per_second);
            }
        }
        rows.extend([row, tries]);
    }

    for (key, data, runs, label) in [
        ("logs", o.logs, o.runs, "per-entity logs"),
        ("open", o.big, o.big_runs, "~1 GiB store"),
    ] {
        if !o.wants(key) {
            continue;
        }
        let shape = format!(
            "{} entities x {} records of {} B",
            thousands(data.entities),
            data.records,
            data.value_len
        );
        let mut open_w = new_row(format!("{label}: open, warm cache"), "ms", false);
        let mut first_w = new_row(
            format!("{label}: time to first answer (open + one entity's history), warm cache"),
            "ms",
            false,
        );
        let mut all_w = new_row(
            format!("{label}: read every entity's history after open, warm cache"),
            "ms",
            false,
        );
        let mut open_c = new_row(format!("{label}: open, cold cache"), "ms", false);
        let mut first_c = new_row(
            format!("{label}: time to first answer (open + one entity's history), cold cache"),
            "ms",
            false,
        );
        let mut all_c = new_row(
            format!("{label}: read every entity's history after open, cold cache"),
            "ms",
            false,
        );
        // Portcullis's engine restoring every entity, next to the peers' reads of every
        // history (their samples are repeated here so the ratios show).
        let restore_what = |cache: &str| {
            format!(
                "{label}: restore every entity after open (Portcullis: `Engine::warm` to \
                 completion; peers: their read of every entity's history after open, as above), \
                 {cache} cache"
            )
        };
        let mut restore_c = new_row(restore_what("cold"), "ms", false);
        let mut restore_w = new_row(restore_what("warm"), "ms", false);
        let mut engine_open_c = new_row(
            format!("{label}: open of the engine before that restore, cold cache"),
            "ms",
            false,
        );
        let mut engine_open_w = new_row(
            format!("{label}: open of the engine before that restore, warm cache"),
            "ms",
            false,
        );
        let (mut on_disk, mut space_amp) = space_rows(label, &new_row);
        for (i, sys) in systems.iter().enumerate() {
            if !sys.supports(Workload::Read) {
                continue;
            }
            let dir = temp_dir(key)?;
            let t = Instant::now();
            sys.load(dir.path(), &data)?;
            let load = t.elapsed();
            let (loaded, settled) = settle(sys.as_ref(), dir.path())?;
            eprintln!(
                "[{:>6.1}s] {key} load {}: {:.1} s, {} MiB on disk, {} MiB settled",
                started.elapsed().as_secs_f64(),
                sys.name(),
                load.as_secs_f64(),
                loaded >> 20,
                settled >> 20
            );
            notes.push(format!(
                "{label} ({shape}): {} bulk load took {:.1} s; {} MiB on disk after it, {} \
                 MiB once settled.",
                sys.name(),
                load.as_secs_f64(),
                loaded >> 20,
                settled >> 20
            ));
            on_disk.samples[i].push(settled as f64 / (1 << 20) as f64);
            space_amp.samples[i].push(settled as f64 / data.payload() as f64);
            let modes: &[bool] = if cold { &[true, false] } else { &[false] };
            for &is_cold in modes {
                for run in 0..runs {
                    if is_cold && !drop_caches() {
                        return Err("dropping the page cache stopped working".into());
                    }
                    let entity = (run as u64 * 7919 + 1234) % data.entities;
                    let t = Instant::now();
                    let reader = sys.open(dir.path())?;
                    let opened = t.elapsed();
                    let (count, bytes) = reader.read_entity(entity)?;
                    let first = t.elapsed();
                    if count as u64 != data.records
                        || bytes != data.records as usize * data.value_len
                    {
                        return Err(format!(
                            "{}: entity {entity} has {count} records, {bytes} bytes",
                            sys.name()
                        )
                        .into());
                    }
                    let t_all = Instant::now();
                    for e in (0..data.entities).filter(|_| o.read_all) {
                        let (count, _) = reader.read_entity(e)?;
                        if count as u64 != data.records {
                            return Err(
                                format!("{}: entity {e} has {count} records", sys.name()).into()
                            );
                        }
                    }
                    let all = t_all.elapsed();
                    reader.close()?;
                    eprintln!(
                        "[{:>6.1}s] {key} {} {} run {run}: open {:.2} ms, first answer {:.2} ms, all {:.0} ms",
                        started.elapsed().as_secs_f64(),
                        sys.name(),
                        if is_cold { "cold" } else { "warm" },
                        opened.as_secs_f64() * 1e3,
                        first.as_secs_f64() * 1e3,
                        all.as_secs_f64() * 1e3
                    );
                    let (ro, rf, ra) = if is_cold {
                        (&mut open_c, &mut first_c, &mut all_c)
                    } else {
                        (&mut open_w, &mut first_w, &mut all_w)
                    };
                    ro.samples[i].push(opened.as_secs_f64() * 1e3);
                    rf.samples[i].push(first.as_secs_f64() * 1e3);
                    ra.samples[i].push(all.as_secs_f64() * 1e3);
                    if o.read_all && key == "logs" {
                        let rr = if is_cold {
                            &mut restore_c
                        } else {
                            &mut restore_w
                        };
                        rr.samples[i].push(all.as_secs_f64() * 1e3);
                    }
                }
            }
            for &is_cold in modes.iter().filter(|_| o.read_all && key == "logs") {
                let mut warms = Vec::new();
                for run in 0..runs {
                    if is_cold && !drop_caches() {
                        return Err("dropping the page cache stopped working".into());
                    }
                    let Some(r) = sys.restore_all(dir.path(), &data)? else {
                        break;
                    };
                    eprintln!(
                        "[{:>6.1}s] {key} {} restore {} run {run}: engine open {:.2} ms, warm {:.0} ms",
                        started.elapsed().as_secs_f64(),
                        sys.name(),
                        if is_cold { "cold" } else { "warm" },
                        r.open.as_secs_f64() * 1e3,
                        r.warm.as_secs_f64() * 1e3
                    );
                    let ro = if is_cold {
                        &mut engine_open_c
                    } else {
                        &mut engine_open_w
                    };
                    ro.samples[i].push(r.open.as_secs_f64() * 1e3);
                    warms.push(r.warm.as_secs_f64() * 1e3);
                }
                // A system with an engine shows its restore, not its reads, in the restore rows.
                if !warms.is_empty() {
                    let rr = if is_cold {
                        &mut restore_c
                    } else {
                        &mut restore_w
                    };
                    rr.samples[i] = warms;
                }
            }
            drop(dir);
        }
        for r in [
            &mut open_w,
            &mut first_w,
            &mut all_w,
            &mut open_c,
            &mut first_c,
            &mut all_c,
            &mut restore_c,
            &mut restore_w,
            &mut engine_open_c,
            &mut engine_open_w,
            &mut on_disk,
            &mut space_amp,
        ] {
            r.what = format!("{} ({shape})", r.what);
        }
        rows.extend([
            first_c, first_w, open_c, open_w, all_c, all_w, on_disk, space_amp,
        ]);
        // Shown only when an engine restored (the rows would only repeat the reads otherwise).
        if engine_open_c
            .samples
            .iter()
            .chain(&engine_open_w.samples)
            .any(|v| !v.is_empty())
        {
            rows.extend([restore_c, restore_w, engine_open_c, engine_open_w]);
        }
    }

    if o.wants("crash") {
        rows.extend(crash::run(
            &systems, &o.crash, o.big_runs, o.acks, cold, started, &mut notes,
        )?);
    }

    let settles: Vec<String> = systems
        .iter()
        .map(|s| format!("{}: {}", s.name(), s.settles()))
        .collect();
    let how = format!(
        "Medians of {} runs per cell ({} s per throughput run); the ~1 GiB store and the crash \
         workload's store are written once per system; the ~1 GiB store is reopened {} times per \
         cache state, and a writer is killed {} times per cache state. Bytes on disk are \
         measured once the load settled: after the load closes the store, it is reopened, the \
         background work the system does by itself is waited for, and it is closed again \
         ({}); then every file under its directory is counted (file lengths). Payload: every \
         record's value.",
        o.runs,
        o.seconds,
        o.big_runs,
        o.big_runs,
        settles.join("; ")
    );
    let md = render(&how, &systems, &rows, &notes, cold, started.elapsed());
    println!("{md}");
    if let Some(path) = &o.out {
        std::fs::write(path, &md)?;
    }
    Ok(())
}

/// Bytes of each single-row commit's value in the commits workload.
pub const COMMIT_VALUE_LEN: usize = 100;

/// The rows of a data set's footprint once the load settled: bytes on disk, and those bytes
/// per byte of payload.
fn space_rows(label: &str, new_row: &dyn Fn(String, &'static str, bool) -> Row) -> (Row, Row) {
    (
        new_row(
            format!("{label}: bytes on disk once the load settled (see the method)"),
            "MiB",
            false,
        ),
        new_row(
            format!(
                "{label}: space amplification once the load settled: bytes on disk per byte \
                 of payload"
            ),
            "x",
            false,
        ),
    )
}

/// Lets the store in `dir` settle (see [`common::System::settle`]); returns its bytes on disk
/// right after the load and once settled.
fn settle(sys: &dyn System, dir: &Path) -> R<(u64, u64)> {
    let loaded = dir_size(dir);
    sys.settle(dir)?;
    Ok((loaded, dir_size(dir)))
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
