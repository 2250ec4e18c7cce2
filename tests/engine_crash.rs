//! Real crashes of the engine (SPEC R3, R8 over S3, S4): a child process (this test binary,
//! re-executed) defers work to pending entities, writes to restored ones and checkpoints, on a
//! file-backed store, reporting every acknowledged record on its stdout; the parent kills it
//! with SIGKILL at a random moment (during writes, deferred work, restores and repairs) and
//! checks, after reopening, that no acknowledged record was lost, none was applied twice, and
//! every unclean incarnation was repaired at most once per entity.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use common::rng::Rng;
use portcullis::engine::{Engine, EngineBuilder};
use portcullis::restore::{ApplyContext, Rejection, StateMachine};
use portcullis::store::{FileStore, Store};
use portcullis::{EntityId, Error};

const CHILD_ENV: &str = "PORTCULLIS_TEST_ENGINE_CHILD";
const CHILD_TEST: &str = "engine_child_process";
const MARK: &str = "@child ";
const ENTITIES: usize = 6;
/// Kill rounds per run: each spawns a child, kills it and checks the reopened engine.
const ROUNDS: u64 = 30;

/// Folds records into a list; repair appends one record naming the unclean incarnation.
struct Journal;

impl StateMachine for Journal {
    type State = Vec<String>;

    fn fresh(&self, _: &EntityId) -> Vec<String> {
        Vec::new()
    }

    fn apply(
        &self,
        s: &mut Vec<String>,
        _: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let text = String::from_utf8(record.to_vec()).map_err(|_| Rejection::new("not utf-8"))?;
        s.push(text);
        Ok(())
    }

    fn encode_checkpoint(&self, s: &Vec<String>) -> Result<Vec<u8>, Rejection> {
        Ok(s.join("\n").into_bytes())
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<Vec<String>, Rejection> {
        let text = std::str::from_utf8(b).map_err(|_| Rejection::new("not utf-8"))?;
        Ok(if text.is_empty() {
            Vec::new()
        } else {
            text.split('\n').map(str::to_owned).collect()
        })
    }

    fn repair(
        &self,
        _: &EntityId,
        _: &Vec<String>,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        Ok(vec![format!("repair:{unclean}").into_bytes()])
    }
}

fn entity(i: usize) -> EntityId {
    EntityId::new("crash", format!("e{i}")).unwrap()
}

fn builder(dir: &Path) -> EngineBuilder<Journal> {
    builder_over(dir).0
}

/// A builder, and a handle on its store so the caller can close the store itself.
fn builder_over(dir: &Path) -> (EngineBuilder<Journal>, Arc<FileStore>) {
    let store = Arc::new(FileStore::open(dir).expect("open the store"));
    let builder = Engine::builder(Journal)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .pool_threads(1)
        .checkpoint_tail_bound(4);
    (builder, store)
}

/// Child mode; a no-op as an ordinary test. Reports `open <incarnation>` then one
/// `ack <entity> <record>` per acknowledged record, forever.
#[test]
fn engine_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let engine = builder(Path::new(&dir)).open().expect("the child opens");
    let inc = engine.incarnation();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}open {inc}").unwrap();
    out.flush().unwrap();
    for i in 0..ENTITIES {
        engine.register(&entity(i)).unwrap();
    }
    // Every entity is pending now: defer to each, then write, which restores them one by one
    // (replay, deferred work, repair, owed checkpoint), then keep writing and checkpointing.
    let mut n = 0u64;
    loop {
        let i = (n as usize) % ENTITIES;
        let record = format!("{}:{inc}:{n}", if n < 12 { "d" } else { "w" });
        let result = if n < 12 {
            engine
                .defer(&entity(i), record.clone().into_bytes())
                .map(|_| ())
        } else {
            engine
                .append(&entity(i), vec![record.clone().into_bytes()])
                .map(|_| ())
        };
        match result {
            Ok(()) => writeln!(out, "{MARK}ack {i} {record}").unwrap(),
            Err(e) => writeln!(out, "{MARK}refused {e}").unwrap(),
        }
        out.flush().unwrap();
        if n % 7 == 6 {
            engine.checkpoint(&entity(i)).unwrap();
        }
        n += 1;
    }
}

fn spawn_child(dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.display().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-executing the test binary")
}

fn report(line: &str) -> Option<&str> {
    Some(&line[line.find(MARK)? + MARK.len()..])
}

/// Runs a child until it acknowledged `kill_after` records, kills it, and adds every
/// acknowledgement (including those printed after the decision) to `acked`.
fn round(dir: &Path, kill_after: u64, acked: &mut HashMap<usize, Vec<String>>) -> u64 {
    let mut child = spawn_child(dir);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut incarnation = 0;
    let mut seen = 0;
    let mut take = |line: &str, acked: &mut HashMap<usize, Vec<String>>| -> bool {
        let Some(r) = report(line) else { return false };
        if let Some(inc) = r.strip_prefix("open ") {
            incarnation = inc.trim().parse().unwrap();
            return false;
        }
        assert!(!r.starts_with("refused"), "the child reported {r}");
        let (i, record) = r.strip_prefix("ack ").unwrap().split_once(' ').unwrap();
        acked
            .entry(i.parse().unwrap())
            .or_default()
            .push(record.trim().to_owned());
        true
    };
    while seen < kill_after {
        let line = match lines.next() {
            Some(line) => line.unwrap(),
            None => panic!("the child exited early: {:?}", child.wait()),
        };
        if take(&line, acked) {
            seen += 1;
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    for line in lines {
        take(&line.unwrap(), acked);
    }
    incarnation
}

/// Checks the reopened engine against every acknowledgement so far. Returns the engine's
/// incarnation; the engine ends without a clean close (it crashes, its owner lease lapsing as
/// if its time had passed, and is forgotten, since dropping it would close it cleanly; its
/// store is closed directly), so the next child repairs too.
fn check(dir: &Path, acked: &HashMap<usize, Vec<String>>, what: &str) -> u64 {
    let (builder, store) = builder_over(dir);
    let engine = builder
        .open()
        .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let incarnation = check_engine(&engine, acked, what);
    engine.crash_for_test();
    std::mem::forget(engine);
    store.close().unwrap();
    incarnation
}

fn check_engine(engine: &Engine<Journal>, acked: &HashMap<usize, Vec<String>>, what: &str) -> u64 {
    for i in 0..ENTITIES {
        let state = match engine.read(&entity(i), Clone::clone) {
            Ok(state) => state,
            Err(Error::UnknownEntity(_)) => continue, // killed before registering it
            Err(e) => panic!("{what}: entity {i}: {e}"),
        };
        let mut seen = HashMap::new();
        for record in &state {
            *seen.entry(record.as_str()).or_insert(0) += 1;
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "{what}: entity {i} applied twice: {twice:?}"
        );
        // Every acknowledged record is there, in the order it was acknowledged.
        let expected = acked.get(&i).cloned().unwrap_or_default();
        let found: Vec<&String> = state.iter().filter(|r| expected.contains(r)).collect();
        assert_eq!(
            found,
            expected.iter().collect::<Vec<_>>(),
            "{what}: entity {i} lost or reordered acknowledged records"
        );
        // This open took over from a killed holder of the namespace: the repair for the last
        // term that ended without releasing it ran here, once (SPEC R3, F11).
        assert!(engine.unclean_previous().is_some(), "the child was killed");
        let owed = engine.owed_repairs(entity(i).namespace()).unwrap();
        let unclean = *owed.last().expect("a killed holder leaves a repair owed");
        assert!(
            state.contains(&format!("repair:{unclean}")),
            "{what}: entity {i} was not repaired for term {unclean}"
        );
    }
    engine.incarnation()
}

#[test]
fn killed_engines_lose_no_acknowledged_work_and_repair_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(0xE61E_0001);
    let mut acked: HashMap<usize, Vec<String>> = HashMap::new();
    for r in 0..ROUNDS {
        // Sometimes kill during open, restore and repair; mostly after some work.
        let kill_after = match rng.below(4) {
            0 => rng.below(3),
            _ => 3 + rng.below(40),
        };
        let what = format!("round {r} (kill after {kill_after} acks)");
        let child_incarnation = round(dir.path(), kill_after, &mut acked);
        let checked = check(dir.path(), &acked, &what);
        assert!(
            checked > child_incarnation,
            "{what}: incarnations must grow"
        );
    }
    // Negative control: the checker must catch a record applied twice.
    let store = FileStore::open(dir.path()).unwrap();
    let (i, records) = acked.iter().find(|(_, r)| !r.is_empty()).unwrap();
    let dup = records[0].clone().into_bytes();
    portcullis::log::append(
        &store,
        &entity(*i).partition(),
        &[dup],
        portcullis::store::Batch::new(),
    )
    .unwrap()
    .committed()
    .unwrap();
    store.close().unwrap();
    drop(store);
    let caught = std::panic::catch_unwind(|| check(dir.path(), &acked, "negative control"));
    assert!(caught.is_err(), "the checker missed a duplicated record");
    let total: usize = acked.values().map(Vec::len).sum();
    eprintln!("{ROUNDS} engine kill rounds: {total} acknowledged records checked");
    assert!(total > 0);
}
