//! Fork safety: a process never uses, closes or writes for a store or engine its parent opened.
//!
//! A forked child holds copies of its parent's handles, but not the threads behind them, and
//! any lock a parent thread held at the fork stays locked. Closing an inherited store would
//! write a snapshot and trim the journal to the child's stale view, destroying writes the
//! parent acknowledged since. So each store, engine and warm handle records the process
//! generation it was made in; a `pthread_atfork` handler moves the generation on in every
//! child, and each entry point that takes such a handle refuses a handle from an older
//! generation with `PC_CLOSED` before it touches anything. Freeing one in a child only
//! forgets it. Plain memory (options, batches, scan pages, buffers, clocks, error objects)
//! stays usable.
//!
//! Owns: the generation counter and the atfork registration.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::boundary::Fail;

/// The process generation: moved on in every forked child.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

#[cfg(test)]
thread_local! {
    /// Test-only negative control: the check lets every handle through.
    pub(crate) static UNCHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(unix)]
unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> i32;
}

#[cfg(unix)]
unsafe extern "C" fn in_child() {
    // Async-signal-safe: one atomic add, no allocation, no lock.
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// The current generation, registering the fork handler the first time.
pub(crate) fn generation() -> u64 {
    REGISTER.call_once(|| {
        #[cfg(unix)]
        // SAFETY: registers a handler that only bumps an atomic; `pthread_atfork` has no other
        // precondition.
        unsafe {
            if pthread_atfork(None, None, Some(in_child)) != 0 {
                log::warn!("pthread_atfork failed: a forked child cannot be told from its parent");
            }
        }
    });
    GENERATION.load(Ordering::Acquire)
}

/// Whether a handle made in generation `made` belongs to this process.
pub(crate) fn ours(made: u64) -> bool {
    #[cfg(test)]
    if UNCHECKED.with(std::cell::Cell::get) {
        return true;
    }
    made == GENERATION.load(Ordering::Acquire)
}

/// Refuses a `what` handle made before a fork, in the parent process.
pub(crate) fn check(made: u64, what: &str) -> Result<(), Fail> {
    if ours(made) {
        return Ok(());
    }
    Err(Fail {
        code: crate::PC_CLOSED,
        message: format!(
            "this {what} was opened by the parent process before a fork: a forked child never \
             uses, closes or writes for it (freeing it only forgets it); open a new one in the \
             child"
        ),
        retry_after_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle from another generation (what every handle becomes in a forked child, once
    /// the atfork handler moved the generation on) is refused; the negative control lets it
    /// through. (The handler itself is not called here: it would move the generation on under
    /// the other tests of this binary.)
    #[test]
    fn a_handle_from_an_older_generation_is_refused() {
        let now = generation();
        assert!(check(now, "engine").is_ok());
        let made = now.wrapping_sub(1);
        let refused = check(made, "engine").unwrap_err();
        assert_eq!(refused.code, crate::PC_CLOSED);
        assert!(refused.message.contains("fork"));
        UNCHECKED.with(|u| u.set(true));
        assert!(
            check(made, "engine").is_ok(),
            "the negative control lets it through"
        );
        UNCHECKED.with(|u| u.set(false));
    }
}
