//! The channels of [`crate::sync`] under the feature `simulation`: crossbeam's API (the part the
//! library uses: bounded channels, `send`, `try_send`, `try_recv`, and a receive with a
//! deadline through the clock) over [`super::Mutex`] and [`super::Condvar`], so inside a
//! simulation a blocked receiver is a task shuttle knows is waiting.
//!
//! A channel of capacity 0 holds one message here (crossbeam's hands it over only to a waiting
//! receiver); the library uses such a channel only to signal by dropping its sender.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::{Condvar, Mutex};

pub use crossbeam::channel::{RecvTimeoutError, TryRecvError, TrySendError};

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    cap: usize,
}

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiver: bool,
}

/// The sending half of a channel.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half of a channel.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A channel holding at most `cap` messages (at least one).
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            senders: 1,
            receiver: true,
        }),
        changed: Condvar::new(),
        cap: cap.max(1),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

/// Sending failed: the receiver is gone. Holds the message.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> Sender<T> {
    /// Sends `value`, waiting for room.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        let mut state = self.shared.state.lock();
        loop {
            if !state.receiver {
                return Err(SendError(value));
            }
            if state.queue.len() < self.shared.cap {
                state.queue.push_back(value);
                self.shared.changed.notify_all();
                return Ok(());
            }
            self.shared.changed.wait(&mut state);
        }
    }

    /// Sends `value` if there is room.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let mut state = self.shared.state.lock();
        if !state.receiver {
            return Err(TrySendError::Disconnected(value));
        }
        if state.queue.len() >= self.shared.cap {
            return Err(TrySendError::Full(value));
        }
        state.queue.push_back(value);
        self.shared.changed.notify_all();
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.state.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.state.lock().senders -= 1;
        self.shared.changed.notify_all();
    }
}

impl<T> Receiver<T> {
    /// A message if one is waiting.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut state = self.shared.state.lock();
        match state.queue.pop_front() {
            Some(v) => {
                self.shared.changed.notify_all();
                Ok(v)
            }
            None if state.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Waits for a message until `deadline` on `clock` (see [`crate::clock::recv_timeout`]).
    pub(crate) fn recv_deadline(
        &self,
        clock: &dyn crate::clock::Clock,
        deadline: Instant,
    ) -> Result<T, RecvTimeoutError> {
        let mut state = self.shared.state.lock();
        loop {
            if let Some(v) = state.queue.pop_front() {
                self.shared.changed.notify_all();
                return Ok(v);
            }
            if state.senders == 0 {
                return Err(RecvTimeoutError::Disconnected);
            }
            if crate::clock::wait_until(clock, &self.shared.changed, &mut state, deadline) {
                return match state.queue.pop_front() {
                    Some(v) => Ok(v),
                    None => Err(RecvTimeoutError::Timeout),
                };
            }
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.state.lock().receiver = false;
        self.shared.changed.notify_all();
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sender { .. }")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receiver { .. }")
    }
}
