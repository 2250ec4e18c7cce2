//! Store backends the structure tests run against.

use std::sync::Arc;

use portcullis::store::{FileStore, MemoryStore, Store};

/// A store under test, with whatever keeps it alive (a temporary directory for file stores).
pub struct Backend {
    /// A name for failure messages.
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn Store>,
    _keep: Option<Box<dyn std::any::Any>>,
}

fn memory() -> Backend {
    Backend {
        name: "memory",
        store: Arc::new(MemoryStore::new()),
        _keep: None,
    }
}

fn file() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    Backend {
        name: "file",
        store: Arc::new(store),
        _keep: Some(Box::new(dir)),
    }
}

/// Every backend the structure tests run against; a new backend joins with one line.
const BACKENDS: &[fn() -> Backend] = &[memory, file];

/// Runs `test` once against a fresh store of every backend.
pub fn each_backend(mut test: impl FnMut(&Backend)) {
    for make in BACKENDS {
        let backend = make();
        test(&backend);
    }
}
