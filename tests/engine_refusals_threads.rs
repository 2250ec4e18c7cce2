//! Refusals under concurrency (SPEC R12): several threads write refused and accepted records
//! to the same entities at once, through every write path (append, a refusing decision, defer
//! to a restored entity). Every accepted record is in the history exactly once, in the order
//! of its sequence number, each was checked against the state it was folded onto (the check
//! runs under the entity's lock), and no refused record is anywhere. A negative control turns
//! `check` off and finds refused records in the history.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

use common::rng::Rng;
use portcullis::engine::Deferred;
use portcullis::store::MemoryStore;
use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
use serde::{Deserialize, Serialize};

const THREADS: u32 = 6;
const ENTITIES: u32 = 3;
const WRITES: u32 = 150;

/// A record: who wrote it, its number in that writer's sequence, the parity of the entity's
/// record count it claims to follow, and whether it is poison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Mark {
    thread: u32,
    i: u32,
    parity: u8,
    poison: bool,
}

/// `check` refuses poison and a mark whose parity is not the parity of the records so far:
/// a rule on the current state, which only holds if the check sees the state the record is
/// then folded onto.
struct Parity;

impl TypedMachine for Parity {
    type Record = Mark;
    type State = Vec<Mark>;

    fn fresh(&self, _: &EntityId) -> Vec<Mark> {
        Vec::new()
    }

    fn check(&self, seen: &Vec<Mark>, _: &ApplyContext<'_>, m: &Mark) -> Result<(), Rejection> {
        if m.poison {
            return Err(Rejection::new("poison"));
        }
        if usize::from(m.parity) != seen.len() % 2 {
            return Err(Rejection::new("wrong parity"));
        }
        Ok(())
    }

    fn apply(&self, seen: &mut Vec<Mark>, _: &ApplyContext<'_>, m: Mark) -> Result<(), Rejection> {
        seen.push(m);
        Ok(())
    }
}

fn entity(i: u32) -> EntityId {
    EntityId::new("parity", format!("e{i}")).unwrap()
}

/// What the writers did: each entity's history, the writes answered `Ok` (keyed by writer and
/// number: the entity and the seq they got), and the marks answered `Refused`.
type Outcome = (Vec<Vec<Mark>>, BTreeMap<(u32, u32), (u32, u64)>, Vec<Mark>);

/// Runs the writers.
fn run(skip_checks: bool) -> Outcome {
    let engine = Engine::builder(Typed(Parity))
        .store(Arc::new(MemoryStore::new()))
        .pool_threads(2)
        .open()
        .unwrap();
    engine.set_skip_checks_for_test(skip_checks);
    for e in 0..ENTITIES {
        engine.register(&entity(e)).unwrap();
        engine.read(&entity(e), Vec::len).unwrap(); // restored: defer appends at once
    }
    let start = Arc::new(Barrier::new(THREADS as usize));
    let writers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (engine, start) = (engine.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut rng = Rng::new(u64::from(thread) + 1);
                let mut accepted = Vec::new();
                let mut refused = Vec::new();
                start.wait();
                for i in 0..WRITES {
                    let e = rng.below(u64::from(ENTITIES)) as u32;
                    let mark = Mark {
                        thread,
                        i,
                        parity: rng.below(2) as u8,
                        poison: rng.below(5) == 0,
                    };
                    let answer = match i % 3 {
                        0 => engine.append_typed(&entity(e), &[mark]).map(|s| *s.start()),
                        1 => engine
                            .try_write_typed(&entity(e), |seen| {
                                if seen.len() > 1000 {
                                    return Err(Rejection::new("full"));
                                }
                                Ok((vec![mark], ()))
                            })
                            .map(|w| *w.seqs.expect("one record").start()),
                        _ => match engine.defer_typed(&entity(e), &mark) {
                            Ok(Deferred::Applied { seq }) => Ok(seq),
                            Ok(other) => panic!("a restored entity appends at once: {other:?}"),
                            Err(e) => Err(e),
                        },
                    };
                    match answer {
                        Ok(seq) => accepted.push((mark, e, seq)),
                        Err(Error::Refused { .. }) => refused.push(mark),
                        Err(other) => panic!("only refusals may fail here: {other}"),
                    }
                }
                (accepted, refused)
            })
        })
        .collect();
    let mut accepted = BTreeMap::new();
    let mut refused = Vec::new();
    for w in writers {
        let (a, r) = w.join().unwrap();
        for (mark, e, seq) in a {
            accepted.insert((mark.thread, mark.i), (e, seq));
        }
        refused.extend(r);
    }
    let histories = (0..ENTITIES)
        .map(|e| {
            let history: Vec<Mark> = engine
                .history_typed(&entity(e), 1)
                .unwrap()
                .map(|r| r.unwrap().1)
                .collect();
            assert_eq!(engine.read(&entity(e), Vec::clone).unwrap(), history);
            history
        })
        .collect();
    (histories, accepted, refused)
}

#[test]
fn r12_many_threads_write_refused_and_accepted_records_to_the_same_entities() {
    let (histories, accepted, refused) = run(false);
    assert!(!refused.is_empty() && !accepted.is_empty());
    let mut in_history = 0;
    for (e, history) in histories.iter().enumerate() {
        let mut last_i: BTreeMap<u32, u32> = BTreeMap::new();
        for (k, m) in history.iter().enumerate() {
            let seq = k as u64 + 1;
            assert!(!m.poison, "a poison record was written: {m:?}");
            assert_eq!(
                usize::from(m.parity),
                k % 2,
                "checked against another state: {m:?}"
            );
            assert_eq!(
                accepted.get(&(m.thread, m.i)),
                Some(&(e as u32, seq)),
                "{m:?} is in the history of e{e} at {seq} but was not answered so"
            );
            let before = last_i.insert(m.thread, m.i);
            assert!(before < Some(m.i), "a writer's records are in its order");
            in_history += 1;
        }
    }
    assert_eq!(in_history, accepted.len(), "every accepted record, once");
    let written: std::collections::HashSet<Mark> = histories.concat().into_iter().collect();
    assert!(
        refused.iter().all(|m| !written.contains(m)),
        "no refused record anywhere"
    );
}

/// Negative control: without the check, poison and wrong-parity records are written.
#[test]
fn r12_negative_control_without_check_refused_records_reach_the_history() {
    let (histories, _, refused) = run(true);
    assert!(refused.is_empty());
    let all = histories.concat();
    assert!(all.iter().any(|m| m.poison));
}
