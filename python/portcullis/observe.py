"""Observability (SPEC E8): the events an engine or a store tells its listener, why one is
degraded, and a store's stats.

Owns: `Event`, `Degraded`, `StoreStats`, and turning a Python callable into the C library's
`pc_event_fn`. A listener is called with no lock of the library held, on the thread that did
the work (a committer, a background compaction, the engine's pool) or at the end of the call
that caused the event; it may call the engine or store back, except to close it. An exception
it raises is logged (logger "portcullis") and dropped: it never reaches the library.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any, Callable

from . import _lib

_log = logging.getLogger("portcullis")


@dataclass(frozen=True)
class Event:
    """One event: `kind` (a `PC_EVENT_*` number), its `name` ("commit_stall", "contained"
    ...), what it is about (`subject`: an entity, a namespace, a segment or a thread, or ""),
    one line for a log (`message`), and for stalls and compactions how long they took
    (`elapsed_us`), for revocations, take-overs and depositions the epoch."""

    kind: int
    name: str
    subject: str
    message: str
    elapsed_us: int
    epoch: int


@dataclass(frozen=True)
class Degraded:
    """Why an engine or a store is degraded: the cause (`PC_DEGRADED_*`) and the reason."""

    cause: int
    reason: str


@dataclass(frozen=True)
class StoreStats:
    batches: int
    syncs: int
    bytes_written: int
    partitions: int
    partitions_loaded: int
    max_loaded_partitions: int
    segments: int
    compactions: int
    compactions_failed: int
    garbage_bytes: int
    stalls: int
    sync_count: int
    sync_total_us: int
    sync_max_us: int
    degraded: int


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""


def c_listener(listener: Callable[[Event], Any]) -> Any:
    """The `pc_event_fn` calling `listener`; keep it alive as long as the library may call it
    (until the engine or store is freed)."""
    if not callable(listener):
        raise TypeError("the listener must be callable with one Event")

    def on_event(_: Any, event: Any) -> None:
        try:
            e = event.contents
            listener(
                Event(
                    e.kind,
                    _text(e.name),
                    _text(e.subject),
                    _text(e.message),
                    e.elapsed_us,
                    e.epoch,
                )
            )
        except BaseException:  # never into C
            _log.exception("the event listener raised")

    return _lib.EVENT(on_event)


def degraded(fn: Any, handle: Any) -> Degraded | None:
    """Calls `pc_engine_degraded` or `pc_store_degraded` on a live handle."""
    from .errors import check

    cause, reason = ctypes.c_uint32(), _lib.Bytes()
    check(fn(handle, ctypes.byref(cause), ctypes.byref(reason)))
    text = _lib.take_bytes(reason).decode("utf-8", "replace")
    return Degraded(cause.value, text) if cause.value else None
