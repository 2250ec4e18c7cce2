//! The deterministic simulator (SPEC E9, docs/SIMULATION.md): one `u64` seed chooses the
//! workload, the faults, the clock's jumps and the schedule, and shuttle runs the real engine,
//! fence and stores under that schedule, every thread of the library a task it schedules,
//! every timed wait fired by the simulated clock.
//!
//! Shared by `tests/simulator.rs` (the short lane, the long lane and the teeth) and
//! `examples/simulate.rs` (replaying or sweeping seeds by hand).

#![allow(dead_code)]

pub mod bit_rot;
pub mod disk;
pub mod engine_checks;
pub mod engine_load;
pub mod hooks;
pub mod impostor;
// The documented on-disk layout, as the crash and corruption tests read it.
#[path = "../common/layout.rs"]
#[allow(dead_code)]
pub mod layout;
pub mod net;
pub mod owners;
pub mod store_load;
pub mod take_back;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use portcullis::clock::{CLOCK_TASK, QuietTime, SimClock};
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, FailurePersistence, MaxSteps, Runner};

/// A defect fixed earlier, put back behind its test-only switch (the teeth, docs/SIMULATION.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Compaction takes segments the group-commit leader has not sealed
    /// (`SkipSync::SealedVictims`).
    SealedVictims,
    /// A batch with guards and no operations is answered at once, on state not yet durable
    /// (`SkipSync::GuardOnlyWait`).
    GuardOnlyWait,
    /// The engine commits its entity batches without the fence (`set_bypass_fence_for_test`).
    BypassFence,
    /// Registry slots leave whenever asked, even in use (`set_retire_unguarded_for_test`).
    RetireUnguarded,
    /// A bystander's first use takes a namespace from an owner whose row is at an older epoch,
    /// with no proof of completion, in the middle of another owner's take-over
    /// (`OwnerSwitches::first_use_takes_over`).
    FirstUseTakesOver,
    /// A write whose answer was lost is settled as not committed on an unchanged head alone,
    /// without sealing the log, so a delayed copy can still commit
    /// (`OwnerSwitches::unsealed_settlement`).
    UnsealedSettlement,
    /// Values cut out of a merged read skip their checksums (`skip_value_checks`), so a
    /// damaged value can be served.
    ValueChecks,
    /// The `deferred` metrics hook runs while its deferral still counts in the entity's gate,
    /// so a hook that reads that entity waits for itself
    /// (`OwnerSwitches::deferred_hook_under_gate`).
    DeferredHookUnderGate,
    /// Close does not stop the engine's background thread, which keeps the owners, the
    /// sweeper and the store (`OwnerSwitches::close_leaves_background`).
    CloseLeavesBackground,
    /// Passivation drops entities in any phase, in the middle of a restore or contained
    /// (`Engine::set_passivate_unguarded_for_test`).
    PassivateUnguarded,
    /// A restore unit that spans a re-adoption of its namespace installs the state it restored
    /// under the old holding (`OwnerSwitches::stale_holding_served`).
    StaleHoldingServed,
    /// An engine opens with the owner id of a live incarnation, taking it for crashed
    /// (`OwnerSwitches::ignore_live_incarnation`).
    IgnoreLiveIncarnation,
    /// An engine keeps serving after its owner lease lapsed, without renewing first
    /// (`OwnerSwitches::ignore_lease_expiry`).
    IgnoreLeaseExpiry,
    /// A renewal writes the owner lease without checking the incarnation row is still this
    /// engine's (`OwnerSwitches::unguarded_renewal`).
    UnguardedRenewal,
    /// Close waits for the warm, the drivers, the background thread and calls in flight
    /// without its deadline (`OwnerSwitches::close_waits_unbounded`); not a defect fixed
    /// earlier but the negative control of the bounded-wait check.
    CloseUnbounded,
}

impl Control {
    pub const ALL: [Control; 15] = [
        Control::SealedVictims,
        Control::GuardOnlyWait,
        Control::BypassFence,
        Control::RetireUnguarded,
        Control::FirstUseTakesOver,
        Control::UnsealedSettlement,
        Control::ValueChecks,
        Control::DeferredHookUnderGate,
        Control::CloseLeavesBackground,
        Control::PassivateUnguarded,
        Control::StaleHoldingServed,
        Control::IgnoreLiveIncarnation,
        Control::IgnoreLeaseExpiry,
        Control::UnguardedRenewal,
        Control::CloseUnbounded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Control::SealedVictims => "sealed-victims",
            Control::GuardOnlyWait => "guard-only-wait",
            Control::BypassFence => "bypass-fence",
            Control::RetireUnguarded => "retire-unguarded",
            Control::FirstUseTakesOver => "first-use-takes-over",
            Control::UnsealedSettlement => "unsealed-settlement",
            Control::ValueChecks => "value-checks",
            Control::DeferredHookUnderGate => "deferred-hook-under-gate",
            Control::CloseLeavesBackground => "close-leaves-background",
            Control::PassivateUnguarded => "passivate-unguarded",
            Control::StaleHoldingServed => "stale-holding-served",
            Control::IgnoreLiveIncarnation => "ignore-live-incarnation",
            Control::IgnoreLeaseExpiry => "ignore-lease-expiry",
            Control::UnguardedRenewal => "unguarded-renewal",
            Control::CloseUnbounded => "close-unbounded",
        }
    }

    pub fn parse(name: &str) -> Option<Control> {
        Control::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether a seed's workload can meet this defect (the workload the seed picks must run
    /// the code the switch changes).
    pub fn store_side(self) -> bool {
        matches!(
            self,
            Control::SealedVictims | Control::GuardOnlyWait | Control::ValueChecks
        )
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5eed_5eed_5eed_5eed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The events of one run, in the order the schedule made them: hashed, so two runs of a seed
/// can be compared.
#[derive(Clone, Debug, Default)]
pub struct Trace(Arc<StdMutex<Vec<String>>>);

impl Trace {
    pub fn push(&self, event: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for e in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            e.hash(&mut h);
        }
        h.finish()
    }

    pub fn tail(&self, n: usize) -> Vec<String> {
        let events = self.0.lock().unwrap_or_else(|p| p.into_inner());
        events[events.len().saturating_sub(n)..].to_vec()
    }
}

/// What a seed asks the simulation to do.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub seed: u64,
    pub control: Option<Control>,
}

impl Plan {
    /// Whether this seed runs the store workload (the file store on the fault-injecting disk)
    /// or the engine workload (owners over one store).
    pub fn store_workload(&self) -> bool {
        match self.control {
            Some(c) => c.store_side(),
            None => self.seed.is_multiple_of(2),
        }
    }

    /// PCT (bug depth 3) for one seed in three, the random scheduler for the others.
    pub fn pct(&self) -> bool {
        (self.seed / 2).is_multiple_of(3)
    }

    /// Quiet time (time moves only while every other task waits, `QuietTime`) for one seed in
    /// two, so waits are held to their bounds there; the others let timeouts fire at any point.
    pub fn quiet_time(&self) -> bool {
        self.control == Some(Control::CloseUnbounded) || (self.seed / 6).is_multiple_of(2)
    }
}

/// The one command that replays `plan` exactly.
pub fn replay_command(plan: &Plan) -> String {
    let control = plan
        .control
        .map(|c| format!(" --control {}", c.name()))
        .unwrap_or_default();
    format!(
        "cargo run --release --example simulate -- --seed {}{control}",
        plan.seed
    )
}

/// The outcome of one run of a seed.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub hash: u64,
    pub events: usize,
    /// The events, in order.
    pub trace: Vec<String>,
    /// What went wrong: an invariant, a deadlock (with the waiting tasks named) or a panic.
    pub failure: Option<String>,
}

thread_local! {
    /// The first panic on this thread (a simulation's tasks all run on its thread).
    static FIRST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Installs (once) a panic hook that keeps the first panic of each thread, then calls the
/// hook that was there before.
fn record_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = FIRST_PANIC.try_with(|p| {
                if let Ok(mut p) = p.try_borrow_mut()
                    && p.is_none()
                {
                    *p = Some(info.to_string());
                }
            });
            previous(info);
        }));
    });
}

/// Runs `plan` once under shuttle.
pub fn run_once(plan: Plan) -> RunReport {
    let trace = Trace::default();
    let mut config = Config::new();
    config.stack_size = 4 << 20;
    config.silence_warnings = true;
    config.failure_persistence = FailurePersistence::None;
    config.max_steps = MaxSteps::FailAfter(2_000_000);
    // A failed execution's tasks are left where they are: their destructors would wait for
    // one another.
    config
        .ungraceful_shutdown_config
        .immediately_return_on_panic = true;
    let body = {
        let trace = trace.clone();
        move || {
            trace.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
            simulate(plan, &trace);
        }
    };
    // Shuttle reports a failure (an invariant's panic, a deadlock with the waiting tasks
    // named, the step bound) by panicking; the payload says which. Each run has a thread of
    // its own: a failed execution leaves shuttle's per-thread state behind, and the next run
    // on the same thread would fail at once.
    record_panics();
    let (outcome, first_panic) = std::thread::Builder::new()
        .name(format!("simulation of seed {}", plan.seed))
        .spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let quiet = plan.quiet_time();
                if plan.pct() {
                    let pct = PctScheduler::new_from_seed(plan.seed, 3, 1);
                    Runner::new(QuietTime::new(pct, quiet), config).run(body);
                } else {
                    let random = RandomScheduler::new_from_seed(plan.seed, 1);
                    Runner::new(QuietTime::new(random, quiet), config).run(body);
                }
            }));
            (outcome, FIRST_PANIC.with(|p| p.borrow_mut().take()))
        })
        .expect("a thread for the simulation")
        .join()
        .unwrap_or_else(|payload| (Err(payload), None));
    let failure = match outcome {
        Ok(()) => None,
        // The first panic of the run says what failed (shuttle's own payload, with early
        // return on, only says that a task panicked).
        Err(payload) => Some(first_panic.unwrap_or_else(|| {
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into())
        })),
    };
    // Each read of the trace takes its lock on its own (a guard kept for the whole struct
    // expression would be taken again by `tail`).
    let failure = failure.map(|f| format!("{f}\nlast events:\n  {}", trace.tail(12).join("\n  ")));
    let events = trace.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    RunReport {
        hash: trace.hash(),
        events: events.len(),
        trace: events,
        failure,
    }
}

/// Runs `plan` twice; answers the first run's report, or the failure (an invariant, or two
/// runs of the seed that did not make the same trace), with the command that replays it.
pub fn check(plan: Plan) -> Result<RunReport, String> {
    let first = run_once(plan);
    if let Some(f) = &first.failure {
        return Err(format!(
            "seed {} failed: {f}\nreplay: {}",
            plan.seed,
            replay_command(&plan)
        ));
    }
    let second = run_once(plan);
    if let Some(f) = &second.failure {
        return Err(format!(
            "seed {} failed on its second run only (not deterministic): {f}\nreplay: {}",
            plan.seed,
            replay_command(&plan)
        ));
    }
    if (first.hash, first.events) != (second.hash, second.events) {
        let at = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
            .unwrap_or(first.events.min(second.events));
        return Err(format!(
            "seed {}: two runs made different traces ({} events, hash {:016x}; {} events, hash {:016x}): something outside the seed decides; event {at} is\n  {:?}\nthen\n  {:?}\nreplay: {}",
            plan.seed,
            first.events,
            first.hash,
            second.events,
            second.hash,
            first.trace.get(at),
            second.trace.get(at),
            replay_command(&plan)
        ));
    }
    Ok(first)
}

/// The body of one simulation: the clock and its timer task, then the seed's workload.
fn simulate(plan: Plan, trace: &Trace) {
    let clock = SimClock::new(1_700_000_000_000, Duration::from_secs(3_600));
    let timers = {
        let clock = clock.clone();
        shuttle::thread::Builder::new()
            .name(CLOCK_TASK.into())
            .spawn(move || clock.run_timers())
            .unwrap()
    };
    let mut rng = Rng::new(plan.seed);
    if plan.store_workload() {
        store_load::run(plan, &mut rng, &clock, trace);
    } else {
        engine_load::run(plan, &mut rng, &clock, trace);
    }
    trace.push(format!(
        "end: {:?} virtual, {} timers fired, {} context switches",
        clock.elapsed(),
        clock.fired(),
        shuttle::current::context_switches()
    ));
    if plan.quiet_time()
        && let Some((late, task)) = clock.latest_return()
    {
        panic!(
            "no wait longer than its bound: a timed wait of task {task} returned {late:?} after its deadline (its lock was held by a task waiting for time to pass)"
        );
    }
    clock.stop();
    timers.join().unwrap();
}

/// Spawns a named task of the simulation.
pub fn task<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> shuttle::thread::JoinHandle<T> {
    shuttle::thread::Builder::new().name(name).spawn(f).unwrap()
}

/// Lets the other tasks run `n` steps or so.
pub fn pause(n: u64) {
    for _ in 0..n {
        shuttle::thread::yield_now();
    }
}
