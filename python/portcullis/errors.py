"""The exceptions of the Python package, one per stable code of `portcullis::Error`.

Owns: `PortcullisError` (the base class: `code`, `name`, `message`), one subclass per code
(`WriteRefused` is the one a write's decision may raise too), `Refused` (what a state machine
callback raises to refuse with a code of its choosing), and
`check`, which turns a code a C function returned into the right exception with the calling
thread's last error (`pc_error_last` reads it per thread, and a ctypes call runs on the calling
thread, so the error read right after the call is that call's): its message, retry hint and
the code of the callback that refused.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from . import _lib


class PortcullisError(Exception):
    """A call into Portcullis failed. `code` is the stable numeric code (SPEC E1), `name` its
    C name (`PC_FENCED`, ...) and `message` what the library said to do about it.
    `retry_after_ms` is the hint of `Unavailable` (0 otherwise), and `callback_code` the code a
    state machine callback refused with during the call (0 if none did)."""

    code: int | None = None

    def __init__(
        self,
        message: str,
        code: int | None = None,
        callback_error: str | None = None,
        retry_after_ms: int = 0,
        callback_code: int = 0,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message
        #: For a refusal caused by a Python callback that raised: what it raised, as text.
        self.callback_error = callback_error
        self.retry_after_ms = retry_after_ms
        self.callback_code = callback_code
        text = message
        if callback_error:
            text = f"{message} (the Python callback raised: {callback_error})"
        super().__init__(text)

    @property
    def name(self) -> str:
        return str(_lib.lib.pc_error_name(self.code).decode("ascii"))


class InvalidArgument(PortcullisError):
    """An argument was malformed; nothing was changed."""

    code = 1


class TooLarge(PortcullisError):
    """A key, value, batch or record exceeds a documented limit; nothing was changed."""

    code = 2


class Locked(PortcullisError):
    """Another open store holds the directory."""

    code = 3


class UnsupportedVersion(PortcullisError):
    """A file has a format version this build does not read."""

    code = 4


class Corrupt(PortcullisError):
    """Stored data failed verification."""

    code = 5


class SyncFailed(PortcullisError):
    """An earlier sync failed; writes are refused until the store is reopened."""

    code = 6


class Io(PortcullisError):
    """An operating-system I/O error."""

    code = 7


class Closed(PortcullisError):
    """The handle was closed."""

    code = 8


class Fenced(PortcullisError):
    """The write was planned under an older epoch: stop serving the namespace."""

    code = 9


class Unavailable(PortcullisError):
    """Not possible now; retry later."""

    code = 10


class Contained(PortcullisError):
    """The entity could not be restored and is contained; release it after fixing the cause."""

    code = 11


class UnknownEntity(PortcullisError):
    """The entity is not registered."""

    code = 12


class WouldDeadlock(PortcullisError):
    """The call would deadlock (a callback touching its own entity); nothing changed."""

    code = 13


class OutcomeUnknown(PortcullisError):
    """A remote batch's outcome is unknown; it committed at most once."""

    code = 14


class NotServed(PortcullisError):
    """This engine does not serve the entity's namespace."""

    code = 15


class Exhausted(PortcullisError):
    """The store used up numbers its format bounds (journal segment numbers); copy its
    partitions into a new store. Nothing changed; reads still work."""

    code = 16


class WriteRefused(PortcullisError):
    """The write was refused (SPEC R12): nothing was written and the entity keeps serving.
    `message` carries the reason. A write's decision raises it to refuse the command
    (`raise WriteRefused("not enough money")`); the call then raises it with the library's
    message. (`PC_REFUSED`; named so because `Refused` is what a callback raises.)"""

    code = 17


class OwnerLive(PortcullisError):
    """Another incarnation of the owner is live (it renews its lease): do not take it for a
    crash."""

    code = 18


class Panic(PortcullisError):
    """An internal panic was caught at the boundary; close the handle and report it."""

    code = 100


class Refused(Exception):
    """Raised by a state machine callback (`fresh`, `apply`, `encode`, `decode`, `validate`,
    `check`, `repair`) or a write's decision to refuse with `code` (non-zero) and the message
    as its reason. Any other exception refuses with `RAISED_CODE`."""

    def __init__(self, message: str = "refused", code: int = 1) -> None:
        if not isinstance(code, int) or not 0 < code < 2**32:
            raise ValueError("a refusal code is an integer from 1 to 2**32 - 1")
        super().__init__(message)
        self.code = code


#: The refusal code a callback answers when it raised something other than `Refused`.
RAISED_CODE = 0x5059

BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        TooLarge,
        Locked,
        UnsupportedVersion,
        Corrupt,
        SyncFailed,
        Io,
        Closed,
        Fenced,
        Unavailable,
        Contained,
        UnknownEntity,
        WouldDeadlock,
        OutcomeUnknown,
        NotServed,
        Exhausted,
        WriteRefused,
        OwnerLive,
        Panic,
    )
}


class _ThreadError(threading.local):
    """This thread's error object (a `pc_error`), made on first use, freed with the thread."""

    ptr: int | None = None

    def get(self) -> int:
        if self.ptr is None:
            out = ctypes.c_void_p()
            if _lib.lib.pc_error_new(ctypes.byref(out)) != 0:
                raise MemoryError("pc_error_new failed")
            if out.value is None:
                raise MemoryError("pc_error_new returned no object")
            self.ptr = out.value
        return self.ptr

    def __del__(self) -> None:
        if self.ptr is not None and _lib is not None:
            _lib.lib.pc_error_free(self.ptr)


_thread_error = _ThreadError()


def last_error() -> tuple[int, str, int, int]:
    """The calling thread's last error: code, message, retry hint, refusing callback's code."""
    err = _thread_error.get()
    _lib.lib.pc_error_last(err)
    message = (_lib.lib.pc_error_message(err) or b"").decode("utf-8", errors="replace")
    return (
        _lib.lib.pc_error_code(err),
        message,
        _lib.lib.pc_error_retry_after_ms(err),
        _lib.lib.pc_error_callback_code(err),
    )


def last_error_message() -> str:
    """The calling thread's last error message."""
    return last_error()[1]


def error_for(code: int, callback_error: str | None = None) -> PortcullisError:
    """The exception for a non-zero `code`, carrying this thread's last error."""
    cls = BY_CODE.get(code, PortcullisError)
    _, message, retry, callback_code = last_error()
    return cls(
        message,
        code=code,
        callback_error=callback_error,
        retry_after_ms=retry,
        callback_code=callback_code,
    )


def check(code: int, callback_error: Any = None) -> None:
    """Raises the exception for `code` unless it is `PC_OK`."""
    if code != 0:
        raise error_for(code, callback_error() if callback_error else None)
