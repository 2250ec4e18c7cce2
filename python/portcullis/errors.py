"""The exceptions of the Python package, one per stable code of `portcullis::Error`.

Owns: `PortcullisError` (the base class: `code`, `name`, `message`), one subclass per code,
`Refused` (what a state machine callback raises to refuse with a code of its choosing), and
`check`, which turns a code a C function returned into the right exception with the calling
thread's last error message (`pc_last_error_message` is per thread, and a ctypes call runs on
the calling thread, so the message read right after the call is that call's).
"""

import ctypes

from . import _lib


class PortcullisError(Exception):
    """A call into Portcullis failed. `code` is the stable numeric code (SPEC E1), `name` its
    C name (`PC_FENCED`, ...) and `message` what the library said to do about it."""

    code = None

    def __init__(self, message, code=None, callback_error=None):
        if code is not None:
            self.code = code
        self.message = message
        #: For a refusal caused by a Python callback that raised: what it raised, as text.
        self.callback_error = callback_error
        text = message
        if callback_error:
            text = f"{message} (the Python callback raised: {callback_error})"
        super().__init__(text)

    @property
    def name(self):
        return _lib.lib.pc_error_name(self.code).decode("ascii")


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


class Panic(PortcullisError):
    """An internal panic was caught at the boundary; close the handle and report it."""

    code = 100


class CallbackError(PortcullisError):
    """A Python callback that cannot refuse (`fresh`, `encode`) raised; `callback_error` says
    what. The C ABI has no refusal for these two, so the wrapper reports it here."""

    code = None

    @property
    def name(self):
        return "CALLBACK_ERROR"


class Refused(Exception):
    """Raised by a state machine callback (`apply`, `decode`, `validate`, `repair`, a write's
    decision) to refuse with `code` (non-zero). Any other exception refuses with
    `RAISED_CODE`."""

    def __init__(self, message="refused", code=1):
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
        Panic,
    )
}


def last_error_message():
    """The calling thread's last error message."""
    written = ctypes.c_size_t(0)
    _lib.lib.pc_last_error_message(None, 0, ctypes.byref(written))
    buf = ctypes.create_string_buffer(written.value + 1)
    _lib.lib.pc_last_error_message(buf, len(buf), ctypes.byref(written))
    return buf.value.decode("utf-8", errors="replace")


def error_for(code, callback_error=None):
    """The exception for a non-zero `code`, carrying this thread's last error message."""
    cls = BY_CODE.get(code, PortcullisError)
    return cls(last_error_message(), code=code, callback_error=callback_error)


def check(code, callback_error=None):
    """Raises the exception for `code` unless it is `PC_OK`."""
    if code != 0:
        raise error_for(code, callback_error() if callback_error else None)
