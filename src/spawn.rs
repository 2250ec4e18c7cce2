//! The one place library code starts background work (SPEC E9): the warm, background
//! revocation (fence drivers), heads snapshots and compaction run as tasks on a pool; the
//! engine's background thread, a fence's own sweeper thread and the periodic syncer run on
//! threads of their own. Both go through a
//! [`Spawner`], held by the engine's and the store's configuration. A test (`tests/seams.rs`)
//! fails naming any other `rayon::spawn`, `thread::spawn` or `std::thread::Builder` in library
//! code.
//!
//! In production a spawner is rayon (the global pool, or a pool of its own, as the engine
//! makes) and std threads. With the feature `simulation`, a spawner made inside a simulation
//! runs both as tasks of the simulation, which it schedules.
//!
//! A task must catch its own panics: a panic that unwinds out of a rayon task aborts the
//! process.

use std::fmt;
use std::io;
use std::sync::Arc;

/// Starts background tasks and threads (see the module documentation). Clones share the pool.
#[derive(Clone)]
pub struct Spawner {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    /// rayon's global pool and std threads.
    Global,
    /// A rayon pool of its own and std threads.
    Pool(Arc<rayon::ThreadPool>),
    /// Tasks and threads of a simulation.
    #[cfg(feature = "simulation")]
    Simulated,
}

impl Spawner {
    /// rayon's global pool and std threads.
    pub fn global() -> Self {
        Spawner { kind: Kind::Global }
    }

    /// A rayon pool of its own of `threads` threads named `name-0`, `name-1` ... (each with a
    /// stack of `stack_size` bytes if given) for tasks, and std threads.
    pub fn new_pool(
        threads: usize,
        stack_size: Option<usize>,
        name: &'static str,
    ) -> io::Result<Self> {
        let mut pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("{name}-{i}"));
        if let Some(bytes) = stack_size {
            pool = pool.stack_size(bytes);
        }
        let pool = pool.build().map_err(io::Error::other)?;
        Ok(Spawner::pool(Arc::new(pool)))
    }

    /// `pool` for tasks and std threads.
    pub fn pool(pool: Arc<rayon::ThreadPool>) -> Self {
        Spawner {
            kind: Kind::Pool(pool),
        }
    }

    /// Tasks and threads of the simulation under way (feature `simulation`): every task is a
    /// task of the simulation, which it schedules. Make it inside the simulation.
    #[cfg(feature = "simulation")]
    pub fn simulated() -> Self {
        Spawner {
            kind: Kind::Simulated,
        }
    }

    /// Whether this spawner runs its tasks inside a simulation.
    pub fn is_simulated(&self) -> bool {
        #[cfg(feature = "simulation")]
        if let Kind::Simulated = self.kind {
            return true;
        }
        false
    }

    /// Runs `task` in the background, on the pool.
    pub fn spawn(&self, task: impl FnOnce() + Send + 'static) {
        match &self.kind {
            Kind::Global => rayon::spawn(task),
            Kind::Pool(pool) => pool.spawn(task),
            #[cfg(feature = "simulation")]
            Kind::Simulated => {
                shuttle::thread::Builder::new()
                    .name("pool task".into())
                    .spawn(task)
                    .expect("a simulation starts its tasks");
            }
        }
    }

    /// Starts a thread of its own named `name` that runs `task`; the answer joins it.
    pub fn thread(&self, name: &str, task: impl FnOnce() + Send + 'static) -> io::Result<Joiner> {
        match &self.kind {
            Kind::Global | Kind::Pool(_) => std::thread::Builder::new()
                .name(name.into())
                .spawn(task)
                .map(Joiner::Std),
            #[cfg(feature = "simulation")]
            Kind::Simulated => shuttle::thread::Builder::new()
                .name(name.into())
                .spawn(task)
                .map(Joiner::Simulated),
        }
    }
}

/// A thread started by [`Spawner::thread`]: joins it.
#[derive(Debug)]
pub enum Joiner {
    /// A std thread.
    Std(std::thread::JoinHandle<()>),
    /// A task of a simulation.
    #[cfg(feature = "simulation")]
    Simulated(shuttle::thread::JoinHandle<()>),
}

impl Joiner {
    /// Whether the calling thread (or task) is this one.
    pub fn is_current(&self) -> bool {
        match self {
            Joiner::Std(t) => t.thread().id() == std::thread::current().id(),
            #[cfg(feature = "simulation")]
            Joiner::Simulated(t) => t.thread().id() == shuttle::thread::current().id(),
        }
    }

    /// Waits for the thread to end; `Err` carries its panic.
    pub fn join(self) -> std::thread::Result<()> {
        match self {
            Joiner::Std(t) => t.join(),
            #[cfg(feature = "simulation")]
            Joiner::Simulated(t) => t.join(),
        }
    }
}

impl Default for Spawner {
    /// rayon's global pool and std threads; with the feature `simulation`, inside a
    /// simulation, `Spawner::simulated`.
    fn default() -> Self {
        #[cfg(feature = "simulation")]
        if crate::sync::simulating() {
            return Spawner::simulated();
        }
        Spawner::global()
    }
}

impl fmt::Debug for Spawner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Global => f.write_str("Spawner::Global"),
            Kind::Pool(pool) => write!(f, "Spawner::Pool({} threads)", pool.current_num_threads()),
            #[cfg(feature = "simulation")]
            Kind::Simulated => f.write_str("Spawner::Simulated"),
        }
    }
}
