//! The report: rows of per-system samples, their medians, and the markdown table with the
//! ratio Portcullis/peer for each cell.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use crate::common::System;

/// One row of the table: a measured quantity per system.
pub struct Row {
    pub what: String,
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub samples: Vec<Vec<f64>>,
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

pub fn fmt_num(x: f64, unit: &str) -> String {
    match unit {
        "ms" if x >= 10_000.0 => format!("{:.1} s", x / 1000.0),
        "ms" if x >= 100.0 => format!("{x:.0} ms"),
        "ms" if x >= 1.0 => format!("{x:.1} ms"),
        "ms" => format!("{:.0} µs", x * 1000.0),
        "x" => format!("{x:.2}"),
        _ if x >= 100.0 => thousands(x.round() as u64),
        _ if x >= 1.0 => format!("{x:.1}"),
        _ => format!("{x:.2}"),
    }
}

pub fn thousands(n: u64) -> String {
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

/// The markdown report: machine, `how` (runs per cell and the like), the table, each system's
/// configuration and the notes.
pub fn render(
    how: &str,
    systems: &[Box<dyn System>],
    rows: &[Row],
    notes: &[String],
    cold: bool,
    took: Duration,
) -> String {
    let mut s = String::new();
    let names: Vec<&str> = systems.iter().map(|x| x.name()).collect();
    let _ = writeln!(s, "Machine: {}.", machine_facts().join("; "));
    let _ = writeln!(s, "{how} Whole run: {:.0} s.", took.as_secs_f64());
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
