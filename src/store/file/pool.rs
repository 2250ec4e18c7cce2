//! A small, bounded pool of read buffers, so a read takes buffers an earlier read already
//! allocated and zeroed instead of allocating and zero-filling its own (SPEC S8).
//!
//! Owns only the keeping: a reader takes a buffer with [`Pool::take`] (a fresh, empty one when
//! none is kept) and gives it back with [`Pool::put`] when done; what the buffer holds and how
//! it is emptied is the buffer's own ([`Reusable`]). Calls nothing else.
//!
//! Bounded: at most [`POOL_KEPT`] buffers are kept, and a buffer holding more than
//! [`POOL_BUFFER_MAX`] bytes is dropped instead of kept, so the pool holds at most
//! `POOL_KEPT * POOL_BUFFER_MAX` bytes (1 MiB) whatever the reads were. The lock is held only
//! to take or put a buffer: never while a buffer is emptied or dropped, nor while user code
//! runs.

use crate::sync::Mutex;

/// Most buffers kept: one per reader running at once on a small machine, a few more for
/// bursts; a reader that finds none allocates one.
pub const POOL_KEPT: usize = 4;
/// Most bytes a kept buffer may hold (all of its capacities): a scan page of a few hundred
/// values of a few hundred bytes fits; a larger one is dropped after its read.
pub const POOL_BUFFER_MAX: usize = 256 << 10;

/// A buffer a [`Pool`] can keep.
pub trait Reusable: Default {
    /// Empties it for the next reader, keeping its allocations.
    fn clear(&mut self);
    /// Bytes of memory it holds (its buffers' capacities).
    fn held(&self) -> usize;
}

/// Buffers kept for reuse (see the module docs).
pub struct Pool<T> {
    kept: Mutex<Vec<T>>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool {
            kept: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Reusable> Pool<T> {
    /// A kept buffer (empty), or a new one when none is kept.
    pub fn take(&self) -> T {
        self.kept.lock().pop().unwrap_or_default()
    }

    /// Keeps `buffer` for a later [`Pool::take`] if it is small enough and the pool is not full;
    /// otherwise drops it.
    pub fn put(&self, mut buffer: T) {
        buffer.clear();
        if buffer.held() > POOL_BUFFER_MAX {
            return;
        }
        let mut kept = self.kept.lock();
        if kept.len() < POOL_KEPT {
            if kept.capacity() == 0 {
                kept.reserve_exact(POOL_KEPT);
            }
            kept.push(buffer);
            return;
        }
        drop(kept);
        // Dropped here, outside the lock.
        drop(buffer);
    }

    /// Bytes the kept buffers hold.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.kept.lock().iter().map(T::held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Reusable for Vec<u8> {
        fn clear(&mut self) {
            Vec::clear(self)
        }
        fn held(&self) -> usize {
            self.capacity()
        }
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound_and_hands_back_kept_buffers() {
        let pool = Pool::<Vec<u8>>::default();
        // Too large to keep.
        pool.put(vec![1u8; POOL_BUFFER_MAX + 1]);
        assert_eq!(pool.held(), 0);
        for _ in 0..3 * POOL_KEPT {
            pool.put(vec![1u8; POOL_BUFFER_MAX]);
            assert!(pool.held() <= POOL_KEPT * POOL_BUFFER_MAX);
        }
        assert_eq!(pool.held(), POOL_KEPT * POOL_BUFFER_MAX);
        // Handed back emptied, with its allocation.
        let reused = pool.take();
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), POOL_BUFFER_MAX);
        for _ in 0..POOL_KEPT {
            pool.take();
        }
        assert_eq!(pool.held(), 0);
        assert_eq!(pool.take().capacity(), 0);
    }
}
