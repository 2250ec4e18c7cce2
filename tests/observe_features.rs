//! SPEC E8's optional integrations (cargo features `metrics` and `tracing`, off by default):
//! the stats through the `metrics` facade, and `tracing` spans around open, restore units,
//! compaction, revocation slices and take-over. Run with
//! `cargo test --features metrics,tracing --test observe_features`; without the features this
//! binary holds no test.
#![cfg(all(feature = "metrics", feature = "tracing"))]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::engine::{TestMachine, TestStore, builder, entity, owner_builder, recs};
use parking_lot::Mutex;
use portcullis::engine::TakeOver;
use portcullis::observe::metrics::{MetricsListener, record_engine, record_store};
use portcullis::store::{Batch, FileStore, Partition, Store};

/// A `metrics` recorder that keeps the last value of every counter and gauge, and how many
/// values each histogram got.
#[derive(Default)]
struct Recorded(Arc<Mutex<BTreeMap<String, f64>>>);

struct Cell(String, Arc<Mutex<BTreeMap<String, f64>>>);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        *self.1.lock().entry(self.0.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.1.lock().insert(self.0.clone(), value as f64);
    }
}

impl metrics::GaugeFn for Cell {
    fn increment(&self, value: f64) {
        *self.1.lock().entry(self.0.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.1.lock().entry(self.0.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.1.lock().insert(self.0.clone(), value);
    }
}

impl metrics::HistogramFn for Cell {
    fn record(&self, _: f64) {
        *self.1.lock().entry(self.0.clone()).or_default() += 1.0;
    }
}

impl Recorded {
    fn cell(&self, key: &metrics::Key) -> Arc<Cell> {
        let mut name = key.name().to_owned();
        for label in key.labels() {
            name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
        }
        Arc::new(Cell(name, Arc::clone(&self.0)))
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.0.lock().get(name).copied()
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.cell(key))
    }
}

/// Held by each test for its whole run. `tracing` caches, per call site, whether any
/// subscriber wants it; a call site first reached by the metrics test (no subscriber on its
/// thread) while the span test installs its subscriber may keep the answer "none", and the span
/// test then misses that span. The two tests run one after the other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn e8_metrics_get_the_stats_the_sync_times_and_the_events() {
    let _one = ONE_AT_A_TIME.lock();
    let recorder = Recorded::default();
    metrics::with_local_recorder(&recorder, || {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::builder(dir.path())
            .segment_bytes(4096)
            .auto_compact(false)
            .listener(Arc::new(MetricsListener))
            .open()
            .unwrap();
        let p = Partition::new("p").unwrap();
        for i in 0..100u32 {
            let outcome = store.apply(&p, &Batch::new().put("k", i.to_be_bytes()));
            assert!(outcome.unwrap().is_committed());
        }
        store.compact().unwrap();
        record_store(&store.stats());
    });
    assert_eq!(recorder.get("portcullis_store_batches"), Some(100.0));
    assert!(recorder.get("portcullis_sync_seconds").unwrap() >= 100.0);
    assert_eq!(recorder.get("portcullis_store_degraded"), Some(0.0));
    assert_eq!(
        recorder.get("portcullis_events_total{event=compaction_finished}"),
        Some(1.0)
    );
    assert_eq!(recorder.get("portcullis_compaction_seconds"), Some(1.0));

    let recorder = Recorded::default();
    metrics::with_local_recorder(&recorder, || {
        let store = TestStore::new();
        let machine = Arc::new(TestMachine::default());
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&entity(1)).unwrap();
        engine.append(&entity(1), recs(&["a"])).unwrap();
        record_engine(&engine.stats());
    });
    assert_eq!(recorder.get("portcullis_engine_entities"), Some(1.0));
    assert_eq!(recorder.get("portcullis_engine_namespaces"), Some(1.0));
    assert_eq!(recorder.get("portcullis_engine_degraded"), Some(0.0));
}

/// A `tracing` subscriber that keeps the name of every span opened.
#[derive(Default)]
struct Spans {
    names: Mutex<Vec<&'static str>>,
    next: AtomicU64,
}

impl tracing::Subscriber for Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.names.lock().push(span.metadata().name());
        tracing::span::Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn e8_tracing_spans_cover_open_restore_compaction_revocation_and_take_over() {
    let _one = ONE_AT_A_TIME.lock();
    let spans = Arc::new(Spans::default());
    tracing::subscriber::with_default(Arc::clone(&spans), || {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::builder(dir.path())
            .segment_bytes(4096)
            .auto_compact(false)
            .open()
            .unwrap();
        let p = Partition::new("p").unwrap();
        for i in 0..100u32 {
            let outcome = store.apply(&p, &Batch::new().put("k", i.to_be_bytes()));
            assert!(outcome.unwrap().is_committed());
        }
        store.compact().unwrap();

        let store = TestStore::new();
        let machine = Arc::new(TestMachine::default());
        let a = owner_builder(&machine, &store, "a").open().unwrap();
        let b = owner_builder(&machine, &store, "b").open().unwrap();
        let ns = entity(1).namespace().clone();
        a.own(&ns).unwrap();
        a.register(&entity(1)).unwrap();
        a.append(&entity(1), recs(&["x"])).unwrap();
        b.take_over(&ns, TakeOver::new().force(true)).unwrap();
        assert_eq!(b.read(&entity(1), |s| s.records.len()).unwrap(), 1); // a restore unit
    });
    let names = spans.names.lock().clone();
    for name in [
        "portcullis.store.open",
        "portcullis.compaction",
        "portcullis.engine.open",
        "portcullis.take_over",
        "portcullis.revoke_slice",
        "portcullis.restore",
    ] {
        assert!(names.contains(&name), "no span {name}: {names:?}");
    }
}
