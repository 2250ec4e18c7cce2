"""A handle is freed only when no call is using it: `free` waits for calls in flight, and
calls that start after it raise `Closed`. Negative control: with the wait switched off the
handle is freed while a call still uses it, and the test sees it."""

import threading
import unittest

from support import TIMEOUT

import portcullis
from portcullis import _handle


class HandleTest(unittest.TestCase):
    def free_during_a_call(self):
        """Frees a handle on another thread while this thread is inside `use()`; returns how
        many calls were in flight when the free function ran."""
        in_flight = [0]
        users_at_free = []
        handle = _handle.Handle("ptr", lambda ptr: users_at_free.append(in_flight[0]), "thing")
        waiting = threading.Event()
        _handle._TEST_ON_WAIT = waiting.set
        self.addCleanup(setattr, _handle, "_TEST_ON_WAIT", None)
        freer = threading.Thread(target=handle.free, daemon=True)
        with handle.use() as ptr:
            self.assertEqual(ptr, "ptr")
            in_flight[0] += 1
            freer.start()
            if not _handle._TEST_FREE_WITHOUT_WAITING:
                self.assertTrue(waiting.wait(TIMEOUT), "free did not start waiting")
                self.assertEqual(users_at_free, [], "freed while a call was in flight")
            else:
                freer.join(TIMEOUT)
            in_flight[0] -= 1
        freer.join(TIMEOUT)
        self.assertFalse(freer.is_alive(), "free did not finish")
        with self.assertRaises(portcullis.Closed):
            with handle.use():
                pass
        self.assertFalse(handle.free(), "a second free does nothing")
        return users_at_free

    def test_free_waits_for_the_calls_in_flight(self):
        self.assertEqual(self.free_during_a_call(), [0])

    def test_negative_control_without_the_wait_a_call_in_flight_is_freed_under(self):
        _handle._TEST_FREE_WITHOUT_WAITING = True
        try:
            self.assertEqual(self.free_during_a_call(), [1])
        finally:
            _handle._TEST_FREE_WITHOUT_WAITING = False
