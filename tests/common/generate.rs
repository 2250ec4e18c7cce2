//! The step generator of the engine property test: from a seed, the next step of a case (see
//! `world` for what each does), mostly on an owner that serves the entity's namespace, with
//! interleavings that pause one owner at a fence hook point while others act (bystanders
//! among them touch, warm and fold in the middle of take-overs, SPEC F12).

use portcullis::fence::HookPoint;

use super::rng::Rng;
use super::world::{Step, World, namespace};

/// Per-owner skew stays within half the margin, so any two clocks differ by less than the
/// margin (the assumption SPEC F states).
pub const MAX_SKEW_MS: i64 = 2_499;

/// The points an interleaving may pause an owner at.
const POINTS: [HookPoint; 8] = [
    HookPoint::WriteBeforeApply,
    HookPoint::RenewalBeforeRow,
    HookPoint::RenewalAfterRow,
    HookPoint::PushBeforeLeaseRead,
    HookPoint::PushBeforeLeaseWrite,
    HookPoint::PushBeforeAck,
    HookPoint::SliceBeforeCheckpoint,
    HookPoint::SweepBeforeDelete,
];

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

/// An owner for a step on entity `e`: mostly one that serves its namespace.
fn owner_for(world: &World, rng: &mut Rng, e: usize) -> usize {
    let ns = namespace(e % world.shape.namespaces);
    let serving: Vec<usize> = (0..world.shape.owners)
        .filter(|&o| world.owner(o).engine.grant(&ns).is_some())
        .collect();
    if !serving.is_empty() && rng.below(4) != 0 {
        return pick(rng, &serving);
    }
    rng.below(world.shape.owners as u64) as usize
}

fn advance(rng: &mut Rng) -> Step {
    let ms = match rng.below(10) {
        0..=5 => rng.below(3_000),
        6..=8 => 3_000 + rng.below(12_000),
        _ => 35_001, // past a whole lease and its margin
    };
    Step::Advance { ms }
}

/// A step of one owner on one entity (what an interleaving pauses).
fn entity_step(world: &World, rng: &mut Rng, e: usize) -> Step {
    let o = owner_for(world, rng, e);
    match rng.below(7) {
        0 | 1 => Step::Write { o, e },
        2 => Step::Defer { o, e },
        3 => Step::Checkpoint { o, e },
        4 => Step::Renew { o, e },
        5 => Step::AuthWrite {
            o,
            e,
            refresh: rng.below(2) == 0,
        },
        _ => Step::Touch { o, e },
    }
}

pub fn step(world: &World, rng: &mut Rng, nested_for: Option<usize>) -> Step {
    let e = rng.below(world.shape.entities as u64) as usize;
    let ns = e % world.shape.namespaces;
    let mut o = rng.below(world.shape.owners as u64) as usize;
    if let Some(busy) = nested_for
        && o == busy
    {
        o = (o + 1) % world.shape.owners;
    }
    let pages = 1 + rng.below(3) as usize;
    let pushes = 1 + rng.below(2) as usize;
    let roll = rng.below(100);
    if nested_for.is_some() {
        // Other owners' steps, run while the paused owner waits: bystanders among them touch,
        // warm and fold in the middle of a take-over (SPEC F12).
        return match roll {
            0..=19 => Step::Revoke {
                o,
                ns,
                pages,
                pushes,
            },
            20..=34 => Step::TakeOver { o, ns },
            35..=44 => Step::Bump { o, ns },
            45..=54 => advance(rng),
            55..=64 => Step::Write { o, e },
            65..=74 => Step::FenceWrite { o, e },
            75..=79 => Step::Sweep { o, ns },
            80..=84 => Step::AuthRevoke { o, ns },
            85..=88 => Step::AuthBump { o, ns },
            89..=91 => Step::MarkRecovered { o, ns },
            92 => Step::Deliver { o },
            93 => Step::Touch { o, e },
            94..=95 => Step::Read { o, e },
            96 => Step::Warm { o },
            97 => Step::FoldAll { o },
            _ => Step::TakeOverCall {
                o,
                ns,
                force: rng.below(2) == 0,
            },
        };
    }
    match roll {
        0..=5 => Step::Touch {
            o: owner_for(world, rng, e),
            e,
        },
        6..=11 => Step::Read {
            o: owner_for(world, rng, e),
            e,
        },
        12..=25 => Step::Write {
            o: owner_for(world, rng, e),
            e,
        },
        26..=33 => Step::Defer {
            o: owner_for(world, rng, e),
            e,
        },
        34..=36 => Step::Checkpoint {
            o: owner_for(world, rng, e),
            e,
        },
        37..=39 => Step::Bump { o, ns },
        40..=47 => Step::Revoke {
            o,
            ns,
            pages,
            pushes,
        },
        48..=50 => Step::Renew {
            o: owner_for(world, rng, e),
            e,
        },
        51 => Step::FenceWrite { o, e },
        52..=53 => Step::Sweep { o, ns },
        54..=61 => advance(rng),
        62..=63 => Step::Skew {
            o,
            ms: rng.below(2 * MAX_SKEW_MS as u64 + 1) as i64 - MAX_SKEW_MS,
        },
        64 => Step::MarkRecovered { o, ns },
        65 => Step::AuthBump { o, ns },
        66..=67 => Step::AuthRevoke { o, ns },
        68..=70 => Step::AuthWrite {
            o: owner_for(world, rng, e),
            e,
            refresh: rng.below(3) == 0,
        },
        71 => Step::Crash { o },
        72 => Step::Release { o, ns },
        73..=75 => Step::Own { o, ns },
        76..=79 => Step::TakeOver { o, ns },
        80 => Step::LoseRows { o, ns },
        81 => Step::Warm { o },
        82 => Step::FoldAll { o },
        83..=84 => Step::TakeOverCall {
            o,
            ns,
            force: rng.below(2) == 0,
        },
        85..=86 => Step::LoseAnswer {
            o,
            commit: rng.below(2) == 0,
        },
        87 => Step::Deliver { o },
        _ => {
            let then = match rng.below(8) {
                0 | 1 => Step::Revoke {
                    o,
                    ns,
                    pages,
                    pushes,
                },
                // Bystanders act at the fence's hook points of a take-over in one call.
                2 => Step::TakeOverCall { o, ns, force: true },
                _ => entity_step(world, rng, e),
            };
            let o = match then {
                Step::Write { o, .. }
                | Step::Defer { o, .. }
                | Step::Checkpoint { o, .. }
                | Step::Renew { o, .. }
                | Step::AuthWrite { o, .. }
                | Step::Touch { o, .. }
                | Step::Revoke { o, .. }
                | Step::TakeOverCall { o, .. } => o,
                _ => unreachable!("entity steps only"),
            };
            let actions = (0..1 + rng.below(3))
                .map(|_| step(world, rng, Some(o)))
                .collect();
            Step::Interleave {
                o,
                point: pick(rng, &POINTS),
                actions,
                then: Box::new(then),
            }
        }
    }
}
