"""The store on its own (SPEC S): a file or memory store of partitions, point reads, paged
scans and guarded batches, and the manual clock tests share with stores and engines.

Owns: `Store`, `Batch` (built in Python, turned into a `pc_batch` when applied, so a batch is
a plain value any thread may build), `Outcome`, `ScanPage` and `ManualClock`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from ctypes import byref, c_bool, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any

from . import _lib, observe
from ._handle import Handle
from .errors import Closed, check

lib = _lib.lib

SYNC_POLICIES = {
    "every_commit": _lib.SYNC_EVERY_COMMIT,
    "periodic": _lib.SYNC_PERIODIC_MAY_LOSE_RECENT,
    "never": _lib.SYNC_NEVER_MAY_LOSE_RECENT,
}


def sync_policy(name: str) -> int:
    try:
        return SYNC_POLICIES[name]
    except KeyError:
        raise ValueError(f"sync must be one of {sorted(SYNC_POLICIES)}, not {name!r}") from None


class ManualClock:
    """A clock that moves only when told (SPEC E4), so time rules are tested without sleeping.
    Stores and engines keep their own reference: closing it here is always safe."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        out = c_void_p()
        check(lib.pc_clock_new_manual(now_ms, byref(out)))
        self._handle = Handle(out.value, lib.pc_clock_free, "clock")

    def advance(self, ms: int) -> None:
        with self._handle.use() as ptr:
            check(lib.pc_clock_advance(ptr, ms))

    def close(self) -> None:
        self._handle.free()

    def __enter__(self) -> ManualClock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        _quietly(self, "_handle")


@dataclass(frozen=True)
class Outcome:
    """What became of a batch: `committed`, or the index of the failed precondition, or the
    store's clock when a passed deadline refused it."""

    kind: str  # "committed", "precondition_failed" or "deadline_passed"
    index: int = 0
    now_ms: int = 0

    @property
    def committed(self) -> bool:
        return self.kind == "committed"


_KINDS = {
    _lib.OUTCOME_COMMITTED: "committed",
    _lib.OUTCOME_PRECONDITION_FAILED: "precondition_failed",
    _lib.OUTCOME_DEADLINE_PASSED: "deadline_passed",
}


class Batch:
    """Preconditions and operations on one partition, applied atomically (SPEC S2). Every
    method returns the batch, so calls chain: `Batch().absent(k).put(k, v)`."""

    def __init__(self) -> None:
        self._steps: list[tuple[Any, ...]] = []

    def _add(self, *step: Any) -> Batch:
        self._steps.append(step)
        return self

    def equals(self, key: bytes | str, value: bytes | str) -> Batch:
        return self._add("equals", _lib.as_bytes(key, "key"), _lib.as_bytes(value, "value"))

    def absent(self, key: bytes | str) -> Batch:
        return self._add("absent", _lib.as_bytes(key, "key"))

    def present(self, key: bytes | str) -> Batch:
        return self._add("present", _lib.as_bytes(key, "key"))

    def not_after(self, deadline_ms: int) -> Batch:
        return self._add("not_after", int(deadline_ms))

    def put(self, key: bytes | str, value: bytes | str) -> Batch:
        return self._add("put", _lib.as_bytes(key, "key"), _lib.as_bytes(value, "value"))

    def delete(self, key: bytes | str) -> Batch:
        return self._add("delete", _lib.as_bytes(key, "key"))

    def delete_range(self, start: bytes | str, end: bytes | str) -> Batch:
        return self._add("delete_range", _lib.as_bytes(start, "start"), _lib.as_bytes(end, "end"))

    def _build(self) -> int | None:
        out = c_void_p()
        check(lib.pc_batch_new(byref(out)))
        batch = out.value
        try:
            for op, *args in self._steps:
                if op == "not_after":
                    check(lib.pc_batch_not_after(batch, args[0]))
                    continue
                flat = []
                for a in args:
                    flat += [a, len(a)]
                check(getattr(lib, f"pc_batch_{op}")(batch, *flat))
        except BaseException:
            lib.pc_batch_free(batch)
            raise
        return batch


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: `(key, value)` pairs in key order, and the cursor of the next page
    (None at the end of the range)."""

    entries: list[tuple[bytes, bytes]]
    cursor: bytes | None


def _opt(value: Any, what: str) -> tuple[bytes | None, int]:
    if value is None:
        return None, 0
    b = _lib.as_bytes(value, what)
    return b, len(b)


class Store:
    """An open store (a context manager: closed on exit). Any number of threads may share it."""

    def __init__(self, ptr: int | None, listener: Any = None) -> None:
        self._handle = Handle(ptr, lib.pc_store_free, "store")
        # The C callback the library may call until the store is freed.
        self._listener = listener

    @classmethod
    def open(
        cls,
        directory: str | bytes | Any,
        sync: str = "every_commit",
        sync_interval_ms: int = 0,
        clock: ManualClock | None = None,
        listener: Callable[[observe.Event], Any] | None = None,
    ) -> Store:
        """Opens (creating if missing) the file store in `directory`. `sync` is
        "every_commit" (the default: durable on return), "periodic" or "never". `listener`
        is called with each `observe.Event` of the store (SPEC E8): commit stalls, failed
        syncs, compactions, what open recovered, failed snapshots, threads that ended."""
        out = c_void_p()
        path = _lib.as_name(directory, "directory")
        policy = sync_policy(sync)
        callback = None if listener is None else observe.c_listener(listener)

        def open_with(c: Any) -> None:
            if callback is None:
                check(lib.pc_store_open_file(path, policy, sync_interval_ms, c, byref(out)))
            else:
                check(
                    lib.pc_store_open_file_listened(
                        path, policy, sync_interval_ms, c, callback, None, byref(out)
                    )
                )

        if clock is None:
            open_with(None)
        else:
            with clock._handle.use() as c:
                open_with(c)
        return cls(out.value, callback)

    @classmethod
    def memory(cls, clock: ManualClock | None = None) -> Store:
        """An empty in-memory store (for tests)."""
        out = c_void_p()
        if clock is None:
            check(lib.pc_store_open_memory(None, byref(out)))
        else:
            with clock._handle.use() as c:
                check(lib.pc_store_open_memory(c, byref(out)))
        return cls(out.value)

    def get(self, partition: bytes | str, key: bytes | str) -> bytes | None:
        """The value at `key` of `partition`, or None."""
        p, k = _lib.as_bytes(partition, "partition"), _lib.as_bytes(key, "key")
        value, found = _lib.Bytes(), c_bool()
        with self._handle.use() as s:
            check(lib.pc_store_get(s, p, len(p), k, len(k), byref(value), byref(found)))
        data = _lib.take_bytes(value)
        return data if found.value else None

    def scan(
        self,
        partition: bytes | str,
        start: bytes | str | None = None,
        end: bytes | str | None = None,
        limit: int = 100,
        cursor: bytes | None = None,
    ) -> ScanPage:
        """One page of at most `limit` entries with `start <= key < end` (None: unbounded),
        resuming after `cursor` (a previous page's)."""
        p = _lib.as_bytes(partition, "partition")
        (s, sl), (e, el), (c, cl) = _opt(start, "start"), _opt(end, "end"), _opt(cursor, "cursor")
        out = c_void_p()
        with self._handle.use() as st:
            check(lib.pc_store_scan(st, p, len(p), s, sl, e, el, c, cl, limit, byref(out)))
        page = out.value
        try:
            entries = []
            for i in range(lib.pc_scan_page_len(page)):
                kp, kl = ctypes.POINTER(ctypes.c_uint8)(), c_size_t()
                vp, vl = ctypes.POINTER(ctypes.c_uint8)(), c_size_t()
                check(lib.pc_scan_page_entry(page, i, byref(kp), byref(kl), byref(vp), byref(vl)))
                entries.append((ctypes.string_at(kp, kl.value), ctypes.string_at(vp, vl.value)))
            more, cp, cn = c_bool(), ctypes.POINTER(ctypes.c_uint8)(), c_size_t()
            check(lib.pc_scan_page_next(page, byref(more), byref(cp), byref(cn)))
            nxt = ctypes.string_at(cp, cn.value) if more.value else None
        finally:
            lib.pc_scan_page_free(page)
        return ScanPage(entries, nxt)

    def scan_all(
        self,
        partition: bytes | str,
        start: bytes | str | None = None,
        end: bytes | str | None = None,
        page_size: int = 100,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Every `(key, value)` in the range, fetched a page at a time."""
        cursor = None
        while True:
            page = self.scan(partition, start, end, page_size, cursor)
            yield from page.entries
            if page.cursor is None:
                return
            cursor = page.cursor

    def apply(self, partition: bytes | str, batch: Batch) -> Outcome:
        """Applies `batch` to `partition` atomically; durable on return under the default sync
        policy. Returns the `Outcome`."""
        p = _lib.as_bytes(partition, "partition")
        b = batch._build()
        out = _lib.Outcome()
        try:
            with self._handle.use() as s:
                check(lib.pc_store_apply(s, p, len(p), b, byref(out)))
        finally:
            lib.pc_batch_free(b)
        return Outcome(_KINDS[out.kind], out.index, out.now_ms)

    def stats(self) -> observe.StoreStats:
        """The store's counters (SPEC E8): batches, syncs and their times, compactions,
        stalls, and `degraded` (a `PC_DEGRADED_*` cause, 0 when healthy)."""
        out = _lib.sized(_lib.StoreStats)
        with self._handle.use() as s:
            check(lib.pc_store_get_stats(s, byref(out)))
        return observe.StoreStats(*(getattr(out, name) for name in _lib.STORE_STAT_NAMES))

    def degraded(self) -> observe.Degraded | None:
        """Why the store is degraded (a latched sync failure, a failed background snapshot
        ...), or None when it is healthy (SPEC E8)."""
        with self._handle.use() as s:
            return observe.degraded(lib.pc_store_degraded, s)

    def close(self) -> None:
        """Makes everything committed durable and unlocks the directory. Closing twice is
        harmless; engines opened over this store stop working (close them first)."""
        try:
            with self._handle.use() as s:
                check(lib.pc_store_close(s))
        except Closed:
            pass  # closed by another thread meanwhile
        finally:
            self._handle.free()

    @property
    def closed(self) -> bool:
        return self._handle.freed

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        _quietly(self, "_handle")


def _quietly(obj: Any, attr: str) -> None:
    """Frees a handle an object still owns when it is collected (best effort)."""
    handle = getattr(obj, attr, None)
    if handle is not None:
        try:
            handle.free()
        except Exception:
            pass
