//! The log lines of restore (SPEC R9): one `info` line per restored entity, one `warn` per
//! refusal, one summary per warm. A capturing logger records every line of this test binary;
//! the test looks only at lines naming its own namespace.

mod common;

use std::sync::{Arc, OnceLock};

use common::engine::{TestMachine, TestStore, builder};
use parking_lot::Mutex;
use portcullis::EntityId;

/// Every line logged in this process, with its level.
struct Capture(Mutex<Vec<(log::Level, String)>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0
            .lock()
            .push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(capture).expect("the only logger of this test binary");
        log::set_max_level(log::LevelFilter::Trace);
        capture
    })
}

fn lines(level: log::Level, containing: &str) -> Vec<String> {
    capture()
        .0
        .lock()
        .iter()
        .filter(|(l, line)| *l == level && line.contains(containing))
        .map(|(_, line)| line.clone())
        .collect()
}

fn entity(i: usize) -> EntityId {
    EntityId::new("telemetry", format!("t{i}")).unwrap()
}

#[test]
fn r9_one_info_line_per_restored_entity_one_warn_per_refusal_and_one_warm_summary() {
    capture();
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    {
        let engine = builder(&machine, &store).open().unwrap();
        for i in 0..5 {
            engine.register(&entity(i)).unwrap();
            engine
                .append(&entity(i), vec![b"one".to_vec(), b"two".to_vec()])
                .unwrap();
        }
        // A record that `apply` refuses is durable; every restore of t3 will meet it.
        let _ = engine.append(&entity(3), vec![b"!refuse".to_vec()]);
        engine.close().unwrap();
    }
    let before = capture().0.lock().len();
    let engine = builder(&machine, &store).open().unwrap();
    let progress = engine.warm().unwrap().wait().unwrap();
    assert_eq!((progress.done, progress.total, progress.refused), (5, 5, 1));
    // Only lines logged since the reopen count.
    let since: Vec<(log::Level, String)> = capture().0.lock()[before..].to_vec();
    let count = |level: log::Level, needle: &str| {
        since
            .iter()
            .filter(|(l, line)| *l == level && line.contains(needle))
            .count()
    };
    for i in [0, 1, 2, 4] {
        let name = format!("restored {}:", entity(i));
        assert_eq!(
            count(log::Level::Info, &name),
            1,
            "one info line for {name}\n{since:#?}"
        );
        let line = lines(log::Level::Info, &name).pop().unwrap();
        assert!(
            line.contains("2 records replayed"),
            "records replayed: {line}"
        );
        assert!(line.contains(" in "), "elapsed: {line}");
    }
    let refused = format!("contained {}", entity(3));
    assert_eq!(
        count(log::Level::Warn, &refused),
        1,
        "one warn per refusal\n{since:#?}"
    );
    assert_eq!(
        count(log::Level::Info, &format!("restored {}:", entity(3))),
        0
    );
    assert_eq!(
        count(
            log::Level::Info,
            "warm finished: 5 of 5 entities done, 1 refused (telemetry/t3)"
        ),
        1,
        "one summary per warm\n{since:#?}"
    );
    // Touching the contained entity again logs no second warn: the refusal is answered from
    // memory.
    assert!(engine.read(&entity(3), |_| ()).is_err());
    let after: Vec<(log::Level, String)> = capture().0.lock()[before..].to_vec();
    let warns = after
        .iter()
        .filter(|(l, line)| *l == log::Level::Warn && line.contains(&refused))
        .count();
    assert_eq!(warns, 1);
}

/// Refuses empty messages in `check` (SPEC R12).
struct NoEmpty;

impl portcullis::TypedMachine for NoEmpty {
    type Record = String;
    type State = u64;
    fn fresh(&self, _: &EntityId) -> u64 {
        0
    }
    fn check(
        &self,
        _: &u64,
        _: &portcullis::ApplyContext<'_>,
        text: &String,
    ) -> Result<(), portcullis::Rejection> {
        if text.is_empty() {
            return Err(portcullis::Rejection::new("an empty message"));
        }
        Ok(())
    }
    fn apply(
        &self,
        n: &mut u64,
        _: &portcullis::ApplyContext<'_>,
        _: String,
    ) -> Result<(), portcullis::Rejection> {
        *n += 1;
        Ok(())
    }
}

#[test]
fn r9_r12_a_deferred_record_set_aside_is_one_warn_line_and_counted_in_the_info_line() {
    capture();
    let store: Arc<dyn portcullis::store::Store> = TestStore::new();
    // The background warm is off: both records must still be deferred when the read restores
    // the room (with it on, the second one could meet the restored room and be refused).
    let open = || {
        portcullis::Engine::builder(portcullis::Typed(NoEmpty))
            .store(Arc::clone(&store))
            .background_warm(false)
            .open()
            .unwrap()
    };
    let e = EntityId::new("telemetry-refused", "room").unwrap();
    let engine = open();
    engine.register(&e).unwrap();
    engine.close().unwrap();
    let engine = open();
    engine.defer_typed(&e, &"hello".to_string()).unwrap();
    engine.defer_typed(&e, &String::new()).unwrap();
    assert_eq!(engine.read(&e, |n| *n).unwrap(), 1);
    let warned = lines(log::Level::Warn, "telemetry-refused/room");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(
        warned[0].contains("refused by the state and set aside, not appended")
            && warned[0].contains("an empty message"),
        "{}",
        warned[0]
    );
    let info = lines(log::Level::Info, "restored telemetry-refused/room");
    assert!(
        info.len() == 1 && info[0].contains("1 deferred, 1 deferred refused"),
        "{info:#?}"
    );
}
