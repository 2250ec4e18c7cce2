//! Runs the deterministic simulator (docs/SIMULATION.md) by hand: one seed, or a range.
//!
//! ```text
//! cargo run --release --example simulate -- --seed 42
//! cargo run --release --example simulate -- --seed 42 --control sealed-victims
//! cargo run --release --example simulate -- --from 0 --seeds 1000
//! ```
//!
//! Each seed runs twice and the two traces must match; a failing seed prints the command that
//! replays it. Exits 1 on a failure.

#[path = "../tests/sim/mod.rs"]
mod sim;

use sim::{Control, Plan};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut from, mut seeds, mut control) = (0u64, 1u64, None);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the flag");
        match arg.as_str() {
            "--seed" | "--from" => from = value().parse().expect("a number"),
            "--seeds" => seeds = value().parse().expect("a number"),
            "--control" => {
                let name = value();
                control = Some(Control::parse(&name).unwrap_or_else(|| {
                    panic!("unknown control {name}; one of: sealed-victims, guard-only-wait, bypass-fence, retire-unguarded, first-use-takes-over, unsealed-settlement, value-checks, deferred-hook-under-gate, close-leaves-background, passivate-unguarded, stale-holding-served, ignore-live-incarnation, ignore-lease-expiry, unguarded-renewal, close-unbounded")
                }))
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let started = std::time::Instant::now();
    for seed in from..from + seeds {
        match sim::check(Plan { seed, control }) {
            Ok(report) => {
                if seeds == 1 {
                    println!(
                        "seed {seed}: ok, {} events, trace {:016x}",
                        report.events, report.hash
                    );
                }
            }
            Err(failure) => {
                eprintln!("{failure}");
                std::process::exit(1);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds ok in {secs:.1} s ({:.1} seeds per second, each run twice)",
        seeds as f64 / secs
    );
}
