"""Portcullis from Python: a ctypes package over the C ABI (`ffi/include/portcullis.h`).

No build step: it loads the shared library `portcullis-ffi` builds (`cargo build --release -p
portcullis-ffi`), found through `PORTCULLIS_LIB` or in the workspace's `target/release` or
`target/debug`. `Store` is the store on its own; `Engine` runs durable entities over a
`StateMachine` written in Python. Both are context managers. Every failure raises a subclass
of `PortcullisError`, one per stable code, with the library's message.
"""

from .engine import Deferred, Engine, RevokeProgress, Stats, Warm, WarmProgress, Written
from .errors import (
    RAISED_CODE,
    CallbackError,
    Closed,
    Contained,
    Corrupt,
    Fenced,
    InvalidArgument,
    Io,
    Locked,
    NotServed,
    OutcomeUnknown,
    Panic,
    PortcullisError,
    Refused,
    SyncFailed,
    TooLarge,
    Unavailable,
    UnknownEntity,
    UnsupportedVersion,
    WouldDeadlock,
)
from .machine import ApplyContext, Entity, StateMachine
from .store import Batch, ManualClock, Outcome, ScanPage, Store

__all__ = [
    "ApplyContext",
    "Batch",
    "CallbackError",
    "Closed",
    "Contained",
    "Corrupt",
    "Deferred",
    "Engine",
    "Entity",
    "Fenced",
    "InvalidArgument",
    "Io",
    "Locked",
    "ManualClock",
    "NotServed",
    "Outcome",
    "OutcomeUnknown",
    "Panic",
    "PortcullisError",
    "RAISED_CODE",
    "Refused",
    "RevokeProgress",
    "ScanPage",
    "Stats",
    "Store",
    "StateMachine",
    "SyncFailed",
    "TooLarge",
    "Unavailable",
    "UnknownEntity",
    "UnsupportedVersion",
    "Warm",
    "WarmProgress",
    "WouldDeadlock",
    "Written",
]
