//! Reopen after SIGKILL mid-write. Per system: bulk-load a store of about 512 MiB (not
//! compared); then, per run, start a writer child process (this binary, re-executed with a
//! hidden sub-command) that makes durable single-row writes in a loop and prints a line after
//! each acknowledged one; once it has acknowledged some, kill it with SIGKILL (it does nothing
//! but write and print, so it is almost always inside its next write, most of which is the
//! sync; the kill's moment is not checked); then time, in a fresh child process, opening the store and
//! one point read of the last write the killed writer acknowledged, and check its value. The
//! page cache is dropped before the fresh process starts for the cold rows.
//!
//! Each run kills a new writer (writing a new entity), so every timed open follows a SIGKILL;
//! the timing child closes the store normally after it has printed its figures. The writer
//! starts on a store the previous run's timing child closed, so its open is not measured.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{DataSet, R, System, Workload, value};
use crate::report::Row;

/// Bytes of each record the writer writes (as the durable single-row commits).
pub const WRITE_LEN: usize = 100;

/// The hidden sub-commands.
pub const WRITER: &str = "__crash-writer";
pub const REOPEN: &str = "__crash-reopen";

/// Runs a hidden sub-command in this (child) process: `args` is everything after the
/// program name. `systems` are the systems by their command-line key.
pub fn child(args: &[String], systems: &[Box<dyn System>]) -> R<()> {
    let find = |key: &str| {
        systems
            .iter()
            .find(|s| crate::key(s.as_ref()) == key)
            .ok_or_else(|| format!("no system {key}"))
    };
    let num = |i: usize| -> R<u64> { Ok(args.get(i).ok_or("missing argument")?.parse::<u64>()?) };
    match (args.first().map(String::as_str), args.get(1), args.get(2)) {
        (Some(WRITER), Some(sys), Some(dir)) => {
            let entity = num(3)?;
            let mut write = find(sys)?.crash_writer(Path::new(dir))?;
            let mut out = std::io::stdout().lock();
            for seq in 0.. {
                write(entity, seq, &value(entity, seq, WRITE_LEN))?;
                // A failed write to the pipe means the parent is gone: stop.
                if writeln!(out, "acked {seq}")
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    break;
                }
            }
            Ok(())
        }
        (Some(REOPEN), Some(sys), Some(dir)) => {
            let (entity, seq) = (num(3)?, num(4)?);
            let sys = find(sys)?;
            let started = Instant::now();
            let reader = sys.open(Path::new(dir))?;
            let opened = started.elapsed();
            let got = reader.get(entity, seq)?;
            let took = started.elapsed();
            if got.as_deref() != Some(value(entity, seq, WRITE_LEN).as_slice()) {
                return Err(format!(
                    "{}: record {seq} of entity {entity} was acknowledged before the kill but \
                     reads back as {:?}",
                    sys.name(),
                    got.map(|v| v.len())
                )
                .into());
            }
            println!("reopened {} {}", opened.as_nanos(), took.as_nanos());
            reader.close()
        }
        _ => Err(format!("bad sub-command {args:?}").into()),
    }
}

/// One measured reopen.
pub struct Reopen {
    pub open: Duration,
    pub open_and_read: Duration,
}

/// Kills a writer on the store in `dir` after `acks` acknowledged writes to `entity`, then
/// times a fresh process's open and point read; drops the page cache in between if `cold`.
pub fn kill_then_reopen(
    sys: &dyn System,
    dir: &Path,
    entity: u64,
    acks: u64,
    cold: bool,
) -> R<Reopen> {
    let exe = std::env::current_exe()?;
    let key = crate::key(sys);
    let mut writer = Command::new(&exe)
        .args([WRITER, &key, path_str(dir)?, &entity.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    // The pipe stays open until the writer is dead, so it never sees its output fail.
    let mut lines = BufReader::new(writer.stdout.take().ok_or("no pipe")?).lines();
    let mut last = None;
    for line in lines.by_ref() {
        let seq: u64 = line?
            .strip_prefix("acked ")
            .ok_or("unexpected line from the writer")?
            .parse()?;
        last = Some(seq);
        if seq + 1 >= acks {
            break;
        }
    }
    // `Child::kill` sends SIGKILL on Unix; the writer is (almost always) inside its next write.
    writer.kill()?;
    let status = writer.wait()?;
    drop(lines);
    let last = last.ok_or_else(|| format!("{}: the writer exited ({status})", sys.name()))?;
    if cold && !crate::drop_caches() {
        return Err("dropping the page cache stopped working".into());
    }
    let out = Command::new(&exe)
        .args([
            REOPEN,
            &key,
            path_str(dir)?,
            &entity.to_string(),
            &last.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{}: the reopening process failed ({})",
            sys.name(),
            out.status
        )
        .into());
    }
    let text = String::from_utf8(out.stdout)?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("reopened "))
        .ok_or("no timing from the reopening process")?;
    let mut f = line.split(' ').map(str::parse::<u64>);
    let (open, total) = match (f.next(), f.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b),
        _ => return Err(format!("bad timing line {line:?}").into()),
    };
    Ok(Reopen {
        open: Duration::from_nanos(open),
        open_and_read: Duration::from_nanos(total),
    })
}

fn path_str(p: &Path) -> R<&str> {
    Ok(p.to_str()
        .ok_or("the temporary directory's path is not UTF-8")?)
}

/// The store the crash workload fills: about 512 MiB (16 records of 4 KiB per entity).
pub fn data_set(quick: bool) -> DataSet {
    DataSet {
        entities: if quick { 128 } else { 8192 },
        records: 16,
        value_len: 4096,
        order: crate::common::Order::PerEntity,
        rows_per_txn: 4096,
    }
}

/// The crash workload on every system that takes part: its rows (open + point read, and
/// open alone, cold then warm) and one note per system on the bulk load.
pub fn run(
    systems: &[Box<dyn System>],
    data: &DataSet,
    runs: usize,
    acks: u64,
    cold: bool,
    started: Instant,
    notes: &mut Vec<String>,
) -> R<Vec<Row>> {
    let label = format!(
        "~{} MiB store, reopen after SIGKILL mid-write",
        (data.entities * data.records * data.value_len as u64) >> 20
    );
    let shape = format!(
        "{} entities x {} records of {} B, then a writer of {WRITE_LEN}-byte durable single-row \
         writes killed after {acks} acknowledged",
        crate::thousands(data.entities),
        data.records,
        data.value_len
    );
    let row = |what: &str, cache: &str| Row {
        what: format!("{label}: {what} in a fresh process, {cache} cache ({shape})"),
        unit: "ms",
        higher_is_better: false,
        samples: vec![Vec::new(); systems.len()],
    };
    let (mut first_c, mut first_w) = (
        row(
            "open + one point read of the last acknowledged write",
            "cold",
        ),
        row(
            "open + one point read of the last acknowledged write",
            "warm",
        ),
    );
    let (mut open_c, mut open_w) = (row("open", "cold"), row("open", "warm"));
    let new_row = |what: String, unit, higher_is_better| Row {
        what: format!("{what} ({shape})"),
        unit,
        higher_is_better,
        samples: vec![Vec::new(); systems.len()],
    };
    let (mut on_disk, mut space_amp) = crate::space_rows(&label, &new_row);
    for (i, sys) in systems.iter().enumerate() {
        if !sys.supports(Workload::Crash) {
            continue;
        }
        let dir = crate::temp_dir("crash")?;
        let t = Instant::now();
        sys.load(dir.path(), data)?;
        let load = t.elapsed();
        let (loaded, settled) = crate::settle(sys.as_ref(), dir.path())?;
        eprintln!(
            "[{:>6.1}s] crash load {}: {:.1} s, {} MiB on disk, {} MiB settled",
            started.elapsed().as_secs_f64(),
            sys.name(),
            load.as_secs_f64(),
            loaded >> 20,
            settled >> 20
        );
        notes.push(format!(
            "{label} ({} entities x {} records of {} B): {} bulk load took {:.1} s; {} MiB on \
             disk after it, {} MiB once settled.",
            crate::thousands(data.entities),
            data.records,
            data.value_len,
            sys.name(),
            load.as_secs_f64(),
            loaded >> 20,
            settled >> 20
        ));
        on_disk.samples[i].push(settled as f64 / (1 << 20) as f64);
        space_amp.samples[i].push(settled as f64 / data.payload() as f64);
        let modes: &[bool] = if cold { &[true, false] } else { &[false] };
        // Each run's writer writes a new entity after the loaded ones.
        let mut entity = data.entities;
        for &is_cold in modes {
            for run in 0..runs {
                let r = kill_then_reopen(sys.as_ref(), dir.path(), entity, acks, is_cold)?;
                entity += 1;
                eprintln!(
                    "[{:>6.1}s] crash {} {} run {run}: open {:.2} ms, open + point read {:.2} ms",
                    started.elapsed().as_secs_f64(),
                    sys.name(),
                    if is_cold { "cold" } else { "warm" },
                    r.open.as_secs_f64() * 1e3,
                    r.open_and_read.as_secs_f64() * 1e3
                );
                let (rf, ro) = if is_cold {
                    (&mut first_c, &mut open_c)
                } else {
                    (&mut first_w, &mut open_w)
                };
                rf.samples[i].push(r.open_and_read.as_secs_f64() * 1e3);
                ro.samples[i].push(r.open.as_secs_f64() * 1e3);
            }
        }
    }
    Ok(vec![first_c, first_w, open_c, open_w, on_disk, space_amp])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::Order;

    /// The reopening process's check: an acknowledged write reads back, and a record that was
    /// never written is reported (the negative control of that check), on every system.
    #[test]
    fn the_reopen_check_finds_acknowledged_writes_and_only_those() {
        let systems = crate::all_systems();
        let data = DataSet {
            entities: 3,
            records: 2,
            value_len: 64,
            order: Order::PerEntity,
            rows_per_txn: 4,
        };
        for sys in systems.iter().filter(|s| s.supports(Workload::Crash)) {
            let dir = tempfile::tempdir().unwrap();
            sys.load(dir.path(), &data).unwrap();
            {
                let mut write = sys.crash_writer(dir.path()).unwrap();
                for seq in 0..3 {
                    write(7, seq, &value(7, seq, WRITE_LEN)).unwrap();
                }
            }
            let args = |seq: u64| -> Vec<String> {
                let d = dir.path().to_str().unwrap().to_string();
                vec![
                    REOPEN.into(),
                    crate::key(sys.as_ref()),
                    d,
                    "7".into(),
                    seq.to_string(),
                ]
            };
            child(&args(2), &systems).unwrap();
            assert!(child(&args(3), &systems).is_err(), "{}", sys.name());
        }
    }
}
