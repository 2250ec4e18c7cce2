//! Captures what the library logs, so tests can check that it says what it must (a truncated
//! torn tail, a rebuild) rather than only that it behaved.

use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};
use parking_lot::Mutex;

struct Capture {
    lines: Mutex<Vec<(Level, String)>>,
}

impl Log for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= Level::Info
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            self.lines
                .lock()
                .push((record.level(), record.args().to_string()));
        }
    }

    fn flush(&self) {}
}

static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();

fn capture() -> &'static Capture {
    CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::new(Capture {
            lines: Mutex::new(Vec::new()),
        }));
        // Only this module installs a logger in these test binaries.
        log::set_logger(capture).expect("no other logger is installed");
        log::set_max_level(LevelFilter::Info);
        capture
    })
}

/// Starts capturing (idempotent). Call before the code whose logs a test checks.
pub fn start() {
    capture();
}

/// Whether any warning or error logged so far contains every one of `words` (tests run in
/// parallel, so a test looks for words naming its own situation).
pub fn warned(words: &[&str]) -> bool {
    capture()
        .lines
        .lock()
        .iter()
        .any(|(level, line)| *level <= Level::Warn && words.iter().all(|w| line.contains(w)))
}
