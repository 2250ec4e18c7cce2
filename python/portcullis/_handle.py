"""An owned C handle that Python threads share: calls in flight are counted, so the handle is
freed only once no call uses it (the ABI forbids a `pc_*_free` racing another call).

Owns: `Handle`, and the process generation that `os.register_at_fork` moves on in a forked
child: a handle made before the fork is refused with `Closed` in the child and freeing it only
forgets it, so a child never closes (or writes for) the stores and engines of its parent. The
C library refuses such handles too; this keeps the child from calling it at all.

The lock guards only the count and the freed flag and is never held while C runs, so a
callback on another thread never waits for it while a caller waits in C.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .errors import Closed

# Test-only switches: a hook called when `free` starts waiting for calls in flight, and a
# negative control that frees at once without waiting.
_TEST_ON_WAIT: Callable[[], None] | None = None
_TEST_FREE_WITHOUT_WAITING = False

#: Moved on in every forked child (see `os.register_at_fork` below).
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Handle:
    def __init__(self, ptr: int | None, free: Callable[[Any], None], what: str) -> None:
        self._ptr: int | None = ptr
        self._free = free
        self._what = what
        self._users = 0
        self._freed = False
        self._generation = _generation
        self._idle = threading.Condition(threading.Lock())

    def use(self) -> _Use:
        """Context manager lending the pointer for one call; raises `Closed` once freed, and in
        a forked child for a handle of its parent."""
        return _Use(self)

    @property
    def inherited(self) -> bool:
        """Whether this process is a child forked after the handle was made."""
        return self._generation != _generation

    def free(self) -> bool:
        """Stops new calls, waits for those in flight, then frees the handle (once). In a forked
        child the handle is only forgotten."""
        if self.inherited:
            # The child's copy of the lock may be held by a parent thread that does not exist
            # here: take nothing, call nothing.
            self._freed = True
            self._ptr = None
            return False
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
    def freed(self) -> bool:
        return self._freed


class _Use:
    __slots__ = ("_h",)

    def __init__(self, handle: Handle) -> None:
        self._h = handle

    def __enter__(self) -> Any:
        h = self._h
        if h.inherited:
            raise Closed(
                f"this {h._what} was opened by the parent process before a fork: a forked "
                "child never uses, closes or writes for it; open a new one in the child",
                code=Closed.code,
            )
        with h._idle:
            if h._freed:
                raise Closed(f"the {h._what} was closed", code=Closed.code)
            h._users += 1
            return h._ptr

    def __exit__(self, *exc: object) -> None:
        h = self._h
        with h._idle:
            h._users -= 1
            if h._users == 0:
                h._idle.notify_all()
