"""An owned C handle that Python threads share: calls in flight are counted, so the handle is
freed only once no call uses it (the ABI forbids a `pc_*_free` racing another call).

Owns: `Handle`. Its lock guards only the count and the freed flag and is never held while C
runs, so a callback on another thread never waits for it while a caller waits in C.
"""

import threading

from .errors import Closed

# Test-only switches: a hook called when `free` starts waiting for calls in flight, and a
# negative control that frees at once without waiting.
_TEST_ON_WAIT = None
_TEST_FREE_WITHOUT_WAITING = False


class Handle:
    def __init__(self, ptr, free, what):
        self._ptr = ptr
        self._free = free
        self._what = what
        self._users = 0
        self._freed = False
        self._idle = threading.Condition(threading.Lock())

    def use(self):
        """Context manager lending the pointer for one call; raises `Closed` once freed."""
        return _Use(self)

    def free(self):
        """Stops new calls, waits for those in flight, then frees the handle (once)."""
        with self._idle:
            if self._freed:
                return False
            self._freed = True
            while self._users and not _TEST_FREE_WITHOUT_WAITING:
                if _TEST_ON_WAIT is not None:
                    _TEST_ON_WAIT()
                self._idle.wait()
            ptr, self._ptr = self._ptr, None
        self._free(ptr)
        return True

    @property
    def freed(self):
        return self._freed


class _Use:
    __slots__ = ("_h",)

    def __init__(self, handle):
        self._h = handle

    def __enter__(self):
        h = self._h
        with h._idle:
            if h._freed:
                raise Closed(f"the {h._what} was closed", code=Closed.code)
            h._users += 1
            return h._ptr

    def __exit__(self, *exc):
        h = self._h
        with h._idle:
            h._users -= 1
            if h._users == 0:
                h._idle.notify_all()
        return False
