//! Runs each workload on Portcullis and on its peers (SQLite, redb, fjall), every system
//! configured so that each acknowledged commit is synced, and prints a markdown table of medians
//! with the ratio Portcullis/peer for each cell.
//!
//! `cargo run --release -p portcullis-peers` runs everything; `-- --help` lists the options.

#![forbid(unsafe_code)]

mod common;
mod sys_fjall;
mod sys_portcullis;
mod sys_redb;
mod sys_sqlite;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{DataSet, Order, R, System};

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
                         --only commits,cas,logs,open | --systems portcullis,sqlite,redb,fjall | \
                         --threads 1,4,16,64 | --cas-threads N (default 16) | --no-cold | \
                         --first-only (skip reading every entity after the first answer) | --out FILE (also write \
                         the markdown there)"
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

/// One row of the table: a measured quantity per system.
struct Row {
    what: String,
    unit: &'static str,
    higher_is_better: bool,
    samples: Vec<Vec<f64>>,
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if !n.is_multiple_of(2) {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

fn fmt_num(x: f64, unit: &str) -> String {
    match unit {
        "ms" if x >= 10_000.0 => format!("{:.1} s", x / 1000.0),
        "ms" if x >= 100.0 => format!("{x:.0} ms"),
        "ms" if x >= 1.0 => format!("{x:.1} ms"),
        "ms" => format!("{:.0} µs", x * 1000.0),
        _ if x >= 100.0 => thousands(x.round() as u64),
        _ if x >= 1.0 => format!("{x:.1}"),
        _ => format!("{x:.2}"),
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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

struct ThroughputRun {
    per_second: f64,
    attempts_per_second: f64,
    syncs_per_commit: Option<f64>,
    commits: u64,
    max_latency_ms: f64,
}

/// Runs `threads` workers of `bench` for `seconds`; counts the operations that completed (and
/// succeeded) before the deadline.
fn run_threads(bench: &dyn common::Bench, threads: usize, seconds: f64) -> R<ThroughputRun> {
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let dur = Duration::from_secs_f64(seconds);
    let deadline = Mutex::new(None::<Instant>);
    let (results, before, after) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, stop, deadline) = (&barrier, &stop, &deadline);
                s.spawn(move || -> R<(u64, u64, Duration)> {
                    let worker = bench.worker(t);
                    barrier.wait();
                    let mut worker = worker?;
                    let deadline = deadline.lock().unwrap().ok_or("no deadline")?;
                    let (mut wins, mut attempts, mut worst) = (0u64, 0u64, Duration::ZERO);
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let won = worker(i)?;
                        let done = Instant::now();
                        i += 1;
                        if done <= deadline {
                            attempts += 1;
                            wins += u64::from(won);
                            worst = worst.max(done - started);
                        }
                    }
                    Ok((wins, attempts, worst))
                })
            })
            .collect();
        *deadline.lock().unwrap() = Some(Instant::now() + dur);
        let before = bench.counters();
        barrier.wait();
        std::thread::sleep(dur);
        let after = bench.counters();
        stop.store(true, Ordering::Relaxed);
        let out: Vec<R<(u64, u64, Duration)>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect();
        (out, before, after)
    });
    let (mut wins, mut attempts, mut worst) = (0, 0, Duration::ZERO);
    for r in results {
        let (w, a, l) = r?;
        wins += w;
        attempts += a;
        worst = worst.max(l);
    }
    let syncs_per_commit = match (before, after) {
        (Some((batches0, syncs0)), Some((batches1, syncs1))) if batches1 > batches0 => {
            Some((syncs1 - syncs0) as f64 / (batches1 - batches0) as f64)
        }
        _ => None,
    };
    Ok(ThroughputRun {
        per_second: wins as f64 / seconds,
        attempts_per_second: attempts as f64 / seconds,
        syncs_per_commit,
        commits: wins,
        max_latency_ms: worst.as_secs_f64() * 1000.0,
    })
}

fn main() -> R<()> {
    let o = Options::parse()?;
    let mut systems: Vec<Box<dyn System>> = vec![
        Box::new(sys_portcullis::Portcullis),
        Box::new(sys_sqlite::Sqlite),
        Box::new(sys_redb::Redb),
        Box::new(sys_fjall::Fjall),
    ];
    if !o.systems.is_empty() {
        systems.retain(|s| o.systems.contains(&s.name().to_lowercase()));
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
                format!("syncs per commit, {threads} threads (Portcullis: its own counter)"),
                "",
                false,
            );
            let mut worst = new_row(
                format!("slowest single commit, {threads} threads"),
                "ms",
                false,
            );
            for run in 0..o.runs {
                for (i, sys) in systems.iter().enumerate() {
                    let dir = temp_dir("commits")?;
                    let bench = sys.commits(dir.path())?;
                    let r = run_threads(bench.as_ref(), threads, o.seconds)?;
                    drop(bench);
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
            rows.extend([row, syncs, worst]);
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
        for (i, sys) in systems.iter().enumerate() {
            let dir = temp_dir(key)?;
            let t = Instant::now();
            sys.load(dir.path(), &data)?;
            let load = t.elapsed();
            let size = dir_size(dir.path());
            eprintln!(
                "[{:>6.1}s] {key} load {}: {:.1} s, {} MiB on disk",
                started.elapsed().as_secs_f64(),
                sys.name(),
                load.as_secs_f64(),
                size >> 20
            );
            notes.push(format!(
                "{label} ({shape}): {} bulk load took {:.1} s; {} MiB on disk.",
                sys.name(),
                load.as_secs_f64(),
                size >> 20
            ));
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
        ] {
            r.what = format!("{} ({shape})", r.what);
        }
        rows.extend([first_c, first_w, open_c, open_w, all_c, all_w]);
    }

    let md = render(&o, &systems, &rows, &notes, cold, started.elapsed());
    println!("{md}");
    if let Some(path) = &o.out {
        std::fs::write(path, &md)?;
    }
    Ok(())
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

fn machine_facts() -> Vec<String> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or("unknown".to_string(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0)
        });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let fs = Command::new("df")
        .arg("-T")
        .arg(std::env::temp_dir())
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| {
            t.lines().nth(1).map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                format!(
                    "{} on {}",
                    f.get(1).unwrap_or(&"?"),
                    f.first().unwrap_or(&"?")
                )
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    vec![
        format!("{cores} cores ({cpu}), {mem} of memory, Linux {kernel}"),
        format!("temporary directory's file system (`df -T`): {fs}"),
    ]
}

fn render(
    o: &Options,
    systems: &[Box<dyn System>],
    rows: &[Row],
    notes: &[String],
    cold: bool,
    took: Duration,
) -> String {
    let mut s = String::new();
    let names: Vec<&str> = systems.iter().map(|x| x.name()).collect();
    let _ = writeln!(s, "Machine: {}.", machine_facts().join("; "));
    let _ = writeln!(
        s,
        "Medians of {} runs per cell ({} s per throughput run); the ~1 GiB store is written once \
         per system and reopened {} times per cache state. Whole run: {:.0} s.",
        o.runs,
        o.seconds,
        o.big_runs,
        took.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "Cold cache: {}.\n",
        if cold {
            "the page cache was dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before each \
             cold open"
        } else {
            "not measured (the page cache could not be dropped); every figure is warm"
        }
    );
    let _ = write!(s, "| workload | unit |");
    for n in &names {
        let _ = write!(s, " {n} |");
    }
    for n in &names[1..] {
        let _ = write!(s, " {}/{n} |", names[0]);
    }
    let _ = write!(s, "\n| --- | --- |");
    for _ in 0..(names.len() * 2 - 1) {
        let _ = write!(s, " ---: |");
    }
    s.push('\n');
    for r in rows {
        let meds: Vec<Option<f64>> = r.samples.iter().map(|v| median(v)).collect();
        if meds.iter().all(Option::is_none) {
            continue;
        }
        let unit = match (r.unit, r.higher_is_better) {
            ("", _) => String::new(),
            (u, true) => format!("{u} (higher is better)"),
            (u, false) => format!("{u} (lower is better)"),
        };
        let _ = write!(s, "| {} | {unit} |", r.what);
        for m in &meds {
            let _ = write!(
                s,
                " {} |",
                m.map_or("n/a".to_string(), |x| fmt_num(x, r.unit))
            );
        }
        for m in &meds[1..] {
            let cell = match (meds[0], *m) {
                (Some(p), Some(q)) if q > 0.0 && !r.unit.is_empty() => {
                    let ratio = p / q;
                    let ahead = if r.higher_is_better {
                        ratio > 1.0
                    } else {
                        ratio < 1.0
                    };
                    format!("{ratio:.2} ({})", if ahead { "ahead" } else { "behind" })
                }
                (Some(p), Some(q)) if q > 0.0 => format!("{:.2}", p / q),
                _ => "n/a".to_string(),
            };
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "\nConfigurations (every acknowledged commit is synced):\n"
    );
    for sys in systems {
        let _ = writeln!(s, "- **{}**: {}", sys.name(), sys.config());
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "\nData sets (loading is not part of the comparison):\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}
