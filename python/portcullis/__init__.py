"""Portcullis from Python: a ctypes package over the C ABI (`ffi/include/portcullis.h`).

Install it with `pip install ./python` from the repository: that builds the C library
(`portcullis-ffi`, with the Rust toolchain) and installs it inside the package. `Store` is the
store on its own; `Engine` runs durable entities over a `StateMachine` written in Python. Both
are context managers. Every failure raises a subclass of `PortcullisError`, one per stable
code, with the library's message. The library's warnings go to the `logging` logger
"portcullis" (`set_log_level` for more).
"""

from . import _lib, observe
from ._log import set_log_level
from .engine import (
    Deferred,
    Engine,
    Record,
    RevokeProgress,
    Stats,
    Warm,
    WarmProgress,
    Written,
)
from .errors import (
    RAISED_CODE,
    Closed,
    Contained,
    Corrupt,
    Exhausted,
    Fenced,
    InvalidArgument,
    Io,
    Locked,
    NotServed,
    OutcomeUnknown,
    OwnerLive,
    Panic,
    PortcullisError,
    Refused,
    SyncFailed,
    TooLarge,
    Unavailable,
    UnknownEntity,
    UnsupportedVersion,
    WouldDeadlock,
    WriteRefused,
)
from .machine import ApplyContext, Entity, StateMachine
from .observe import Degraded, Event, StoreStats
from .store import Batch, ManualClock, Outcome, ScanPage, Store

__version__ = "0.1.0"


def library_version() -> str:
    """The version of the C library this package loaded."""
    return str(_lib.lib.pc_version().decode("ascii"))


def abi_version() -> int:
    """The ABI version of the C library this package loaded."""
    return int(_lib.lib.pc_abi_version())


__all__ = [
    "ApplyContext",
    "Batch",
    "Closed",
    "Contained",
    "Corrupt",
    "Deferred",
    "Degraded",
    "Engine",
    "Entity",
    "Event",
    "Exhausted",
    "Fenced",
    "InvalidArgument",
    "Io",
    "Locked",
    "ManualClock",
    "NotServed",
    "Outcome",
    "OutcomeUnknown",
    "OwnerLive",
    "Panic",
    "PortcullisError",
    "RAISED_CODE",
    "Record",
    "Refused",
    "RevokeProgress",
    "ScanPage",
    "Stats",
    "Store",
    "StoreStats",
    "StateMachine",
    "SyncFailed",
    "TooLarge",
    "Unavailable",
    "UnknownEntity",
    "UnsupportedVersion",
    "Warm",
    "WarmProgress",
    "WouldDeadlock",
    "WriteRefused",
    "Written",
    "abi_version",
    "library_version",
    "observe",
    "set_log_level",
]
