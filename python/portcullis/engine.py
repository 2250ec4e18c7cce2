"""The engine of durable entities over a Python state machine (SPEC R, F, E2).

Owns: `Engine` (open with options, register, read, append, write with a decision, defer,
checkpoint, release, warm, the fencing calls, stats, close; a context manager), `Warm`, and
the result types. Entity ids are bytes (or str, encoded as UTF-8); namespaces are str.

Every call releases the GIL while it runs in C (the library is a `CDLL`), so the pool's
callbacks run while a Python thread waits. The engine keeps its `Bridge` (and with it every
ctypes callback) alive until `destroy` has run and the thread that ran it has returned from
it: normally inside `pc_engine_free` on the closing thread; after a close that timed out, on
the pool thread of the last callback, in which case the bridge is kept for the life of the
process.
"""

from __future__ import annotations

import atexit
import copy
import ctypes
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from ctypes import byref, c_bool, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any

from . import _lib, observe
from ._handle import Handle
from .errors import (
    RAISED_CODE,
    Closed,
    Contained,
    Refused,
    WouldDeadlock,
    WriteRefused,
    check,
    error_for,
)
from .machine import (
    INTERRUPTED,
    Bridge,
    Entity,
    StateMachine,
    entering,
    in_callback,
    take_interruption,
    take_thread_error,
)
from .store import ManualClock, Store, _quietly, sync_policy

lib = _lib.lib


@dataclass(frozen=True)
class Written:
    """What a write did: whether records were appended, their sequence numbers, and the code
    the decision refused with (0 when it did not refuse)."""

    wrote: bool
    first_seq: int
    last_seq: int
    decision: int


@dataclass(frozen=True)
class Deferred:
    """Where deferred work went: "queued" (the entity is pending), "already_accepted" (same
    dedup id before: nothing written) or "applied" at `seq` (the entity was restored)."""

    kind: str
    seq: int = 0


_DEFERRED = {
    _lib.DEFERRED_QUEUED: "queued",
    _lib.DEFERRED_ALREADY_ACCEPTED: "already_accepted",
    _lib.DEFERRED_APPLIED: "applied",
}


@dataclass(frozen=True)
class WarmProgress:
    done: int
    total: int
    refused: int
    elapsed_ms: int
    finished: bool
    stopped: bool


@dataclass(frozen=True)
class RevokeProgress:
    complete: bool
    remaining: int


@dataclass(frozen=True)
class Stats:
    incarnation: int
    unclean_previous: int
    entities: int
    pending: int
    running: int
    restored: int
    contained: int
    units_run: int
    store_batches: int
    store_syncs: int
    store_partitions: int
    resident: int
    passivated: int
    max_resident_entities: int
    namespaces: int
    owner_lease_renewals: int
    owner_lease_failed_renewals: int
    store_stalls: int
    store_sync_count: int
    store_sync_total_us: int
    store_sync_max_us: int
    store_compactions: int
    store_compactions_failed: int
    #: A `PC_DEGRADED_*` cause when the engine or its store is degraded, else 0 (SPEC E8).
    degraded: int


@dataclass(frozen=True)
class Record:
    """One record of an entity's history: its sequence number and bytes."""

    seq: int
    data: bytes


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


class Warm:
    """A background warm restoring every pending entity on the pool (SPEC R6). Closing the
    handle does not stop the warm; `stop` does."""

    def __init__(self, ptr: int | None) -> None:
        self._handle = Handle(ptr, lib.pc_warm_free, "warm handle")

    def wait(self, timeout: float = 60.0) -> bool:
        """Waits at most `timeout` seconds; True if the warm ended. From a callback or a
        write's decision it raises `WouldDeadlock` at once."""
        if in_callback():
            raise WouldDeadlock("waiting for a warm from a state machine callback", code=13)
        finished = c_bool()
        with self._handle.use() as w:
            check(lib.pc_warm_wait(w, _ms(timeout), byref(finished)))
        return finished.value

    def progress(self) -> WarmProgress:
        out = _lib.sized(_lib.WarmProgress)
        with self._handle.use() as w:
            check(lib.pc_warm_get_progress(w, byref(out)))
        return WarmProgress(
            out.done, out.total, out.refused, out.elapsed_ms, out.finished, out.stopped
        )

    def stop(self) -> None:
        with self._handle.use() as w:
            check(lib.pc_warm_stop(w))

    def close(self) -> None:
        self._handle.free()

    def __enter__(self) -> Warm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        _quietly(self, "_handle")


# Every engine not freed yet, with its bridge: the ctypes callbacks must outlive the C engine
# even when the `Engine` object is dropped without `close`, or C would call freed memory.
_open: dict[Handle, Bridge] = {}
# Bridges whose engine was freed but whose `destroy` ran on another thread (after a close that
# timed out) or has not run yet: C may still be in (or call) one of their callbacks, so they
# are kept for the life of the process.
_retired: list[Bridge] = []


def _freed(handle: Handle, bridge: Bridge) -> None:
    """After `pc_engine_free` returned on this thread: drops the bridge if its `destroy` ran
    here (so no callback can run any more), else keeps it for good."""
    _open.pop(handle, None)
    if not (bridge.destroyed.is_set() and bridge.destroyed_by == threading.get_ident()):
        _retired.append(bridge)


@atexit.register
def _close_all() -> None:
    # Callbacks must not arrive while the interpreter shuts down: close what is still open.
    for handle, bridge in list(_open.items()):
        try:
            if handle.free():
                _freed(handle, bridge)
        except Exception:
            pass
        _open.pop(handle, None)


class Engine:
    """An open engine over a Python `StateMachine`. Any number of threads may share it.
    Use it as a context manager (closed on exit) or call `close`."""

    def __init__(self, ptr: int | None, bridge: Bridge) -> None:
        self._bridge = bridge
        self._handle = Handle(ptr, lib.pc_engine_free, "engine")
        _open[self._handle] = bridge

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and not handle.freed:
            # Not closed here: a collection may run on a callback thread. It stays open (and
            # its callbacks alive) until the interpreter exits.
            warnings.warn("an Engine was not closed", ResourceWarning, stacklevel=1)

    @classmethod
    def open(
        cls,
        machine: StateMachine,
        directory: str | bytes | Any | None = None,
        *,
        store: Store | None = None,
        clock: ManualClock | None = None,
        owner: str | None = None,
        own: Sequence[str] = (),
        own_unfenced: Sequence[str] = (),
        adopt_on_first_use: bool | None = None,
        register_on_first_write: bool | None = None,
        truncate_after_checkpoint: bool | None = None,
        warm_on_open: bool | None = None,
        sweep_expired_leases: bool | None = None,
        background_warm: bool | None = None,
        pool_threads: int | None = None,
        pool_stack_size: int | None = None,
        warm_parallelism: int | None = None,
        checkpoint_every: int | None = None,
        checkpoint_tail_bound: int | None = None,
        max_resident_entities: int | None = None,
        close_timeout: float | None = None,
        sweep_interval: float | None = None,
        sync: str | None = None,
        sync_interval_ms: int = 0,
        fence: dict[str, int] | None = None,
        listener: Callable[[observe.Event], Any] | None = None,
    ) -> Engine:
        """Opens an engine over `directory` (a file store, created if missing) or an open
        `store`. Returns at once: entities restore on their first touch. Times are in seconds,
        `pool_stack_size` in bytes. `fence` is a dict of `epoch_lease_ms`, `lease_margin_ms`,
        `min_lease_budget_ms`, `max_apply_window_ms`. `listener` is called with each
        `observe.Event` of the engine and of the store it opens from `directory` (SPEC E8)."""
        bridge = Bridge(machine)
        opts = c_void_p()
        check(lib.pc_engine_options_new(byref(opts)))
        try:
            o = opts.value
            if directory is not None:
                check(lib.pc_engine_options_directory(o, _lib.as_name(directory, "directory")))
            if store is not None:
                with store._handle.use() as s:
                    check(lib.pc_engine_options_store(o, s))
            if clock is not None:
                with clock._handle.use() as c:
                    check(lib.pc_engine_options_clock(o, c))
            if sync is not None:
                check(lib.pc_engine_options_sync_policy(o, sync_policy(sync), sync_interval_ms))
            if owner is not None:
                check(lib.pc_engine_options_owner(o, _lib.as_name(owner, "owner")))
            for ns in own:
                check(lib.pc_engine_options_own(o, _lib.as_name(ns, "namespace"), False))
            for ns in own_unfenced:
                check(lib.pc_engine_options_own(o, _lib.as_name(ns, "namespace"), True))
            flags = (
                (_lib.ADOPT_ON_FIRST_USE, adopt_on_first_use),
                (_lib.REGISTER_ON_FIRST_WRITE, register_on_first_write),
                (_lib.TRUNCATE_AFTER_CHECKPOINT, truncate_after_checkpoint),
                (_lib.WARM_ON_OPEN, warm_on_open),
                (_lib.SWEEP_EXPIRED_LEASES, sweep_expired_leases),
                (_lib.BACKGROUND_WARM, background_warm),
            )
            for flag, on in flags:
                if on is not None:
                    check(lib.pc_engine_options_flag(o, flag, bool(on)))
            numbers = (
                (_lib.POOL_THREADS, pool_threads),
                (_lib.POOL_STACK_SIZE, pool_stack_size),
                (_lib.WARM_PARALLELISM, warm_parallelism),
                (_lib.CHECKPOINT_EVERY, checkpoint_every),
                (_lib.CHECKPOINT_TAIL_BOUND, checkpoint_tail_bound),
                (_lib.MAX_RESIDENT_ENTITIES, max_resident_entities),
                (_lib.CLOSE_TIMEOUT_MS, None if close_timeout is None else _ms(close_timeout)),
                (_lib.SWEEP_INTERVAL_MS, None if sweep_interval is None else _ms(sweep_interval)),
            )
            for option, value in numbers:
                if value is not None:
                    check(lib.pc_engine_options_number(o, option, int(value)))
            if listener is not None:
                # Kept with the bridge, which lives until the engine is freed.
                bridge.listener = observe.c_listener(listener)
                check(lib.pc_engine_options_listener(o, bridge.listener, None))
            if fence is not None:
                check(
                    lib.pc_engine_options_fence(
                        o,
                        fence["epoch_lease_ms"],
                        fence["lease_margin_ms"],
                        fence["min_lease_budget_ms"],
                        fence["max_apply_window_ms"],
                    )
                )
            out = c_void_p()
            # On failure destroy has run on this thread before this returns; the bridge is
            # dropped after.
            check(lib.pc_engine_open(o, byref(bridge.struct), byref(out)))
        finally:
            lib.pc_engine_options_free(opts.value)
        return cls(out.value, bridge)

    # -- entities ------------------------------------------------------------------------

    def _call(self, entity: tuple[Any, Any], fn: Any, *args: Any) -> None:
        """Runs `fn(engine, ns, id, len, *args)`; a failure carries the Python callback error
        behind it (raised on this thread during the call, or earlier for a contained entity).
        A Ctrl-C (or `SystemExit`) a callback caught during the call is raised here, after
        releasing the entity if the interruption contained it."""
        ns, ident = _lib.as_name(entity[0], "namespace"), _lib.as_bytes(entity[1], "id")
        take_thread_error()
        take_interruption()
        with self._handle.use() as e:
            code = fn(e, ns, ident, len(ident), *args)
        interrupted = take_interruption()
        if interrupted is not None:
            if code == Contained.code:
                self._release_if_interrupted(ns.decode("utf-8"), ident)
            raise interrupted
        if code:
            err = take_thread_error()
            if err is None and code == Contained.code:
                err = self._bridge.errors.get(Entity(ns.decode("utf-8"), ident))
            raise error_for(code, err)

    def _release_if_interrupted(self, ns: str, ident: bytes) -> None:
        """Releases an entity whose containment an interruption caused (not its history)."""
        try:
            reason = self.containment(ns, ident)
            if reason is not None and INTERRUPTED in reason:
                self.release(ns, ident)
        except Exception as exc:  # noqa: BLE001 - the interruption is what the caller sees
            warnings.warn(f"could not release {ns}/{ident!r} after an interruption: {exc}")

    def register(self, ns: str, id: bytes | str) -> bool:
        """Registers entity `(ns, id)`; False if it was already registered."""
        created = c_bool()
        self._call((ns, id), lib.pc_engine_register, byref(created))
        return created.value

    def read(self, ns: str, id: bytes | str) -> bytes:
        """The entity's state as the machine's `encode` writes it (restoring it if pending).
        An `encode` that raises makes this raise `WriteRefused` with its text."""
        out = _lib.Bytes()
        self._call((ns, id), lib.pc_engine_read, byref(out))
        return self._bridge.encoded_of(_lib.take_bytes(out))

    def view(self, ns: str, id: bytes | str, fn: Callable[[Any], Any]) -> Any:
        """Runs `fn(state)` on the entity's state in place (restoring it if pending), without
        encoding it, and returns what `fn` returns. `fn` runs on this thread while the engine
        holds the entity: it must not change the state or call the engine for the entity."""
        result: list[Any] = []
        raised: list[BaseException] = []

        def visit(_ctx: Any, handle: int) -> int:
            with entering():
                try:
                    result.append(fn(self._bridge.state(handle)))
                except BaseException as exc:  # noqa: BLE001 - nothing may unwind into C
                    raised.append(exc)
            return 0

        callback = _lib.VISIT(visit)
        code = c_uint32()
        self._call((ns, id), lib.pc_engine_visit, callback, None, byref(code))
        if raised:
            raise raised[0]
        return result[0]

    def state(self, ns: str, id: bytes | str) -> Any:
        """A copy of the entity's state as a Python object (`copy.deepcopy` of it, taken in
        place: `encode` is not involved)."""
        return self.view(ns, id, copy.deepcopy)

    def append(self, ns: str, id: bytes | str, records: Sequence[bytes | str]) -> tuple[int, int]:
        """Appends records (bytes) as they are (behind the version envelope if the machine has
        a version), durably on return (SPEC L1); returns the first and last sequence numbers."""
        recs = [self._bridge.wrap(_lib.as_bytes(r, "record")) for r in records]
        slices = (_lib.Slice * max(1, len(recs)))()
        for i, r in enumerate(recs):
            slices[i].data = ctypes.cast(ctypes.c_char_p(r), c_void_p)
            slices[i].len = len(r)
        first, last = c_uint64(), c_uint64()
        self._call((ns, id), lib.pc_engine_append, slices, len(recs), byref(first), byref(last))
        return first.value, last.value

    def write(self, ns: str, id: bytes | str, decide: Callable[[Any], Any]) -> Written:
        """Decides records from the entity's current state and appends them (SPEC E2).
        `decide(state)` runs once on this thread and returns the records (an empty list
        writes nothing). Raising `WriteRefused(reason)` refuses the command: nothing is
        written and this raises `WriteRefused` with the reason (SPEC R12). Raising
        `Refused(msg, code)` writes nothing and answers `code` in `Written.decision`; any other
        exception writes nothing and is raised here."""
        raised: list[BaseException] = []

        def trampoline(_ctx: Any, handle: int, out: Any) -> int:
            # Counted as a callback: closing the engine or waiting for a warm from here
            # raises WouldDeadlock at once.
            with entering():
                try:
                    for rec in decide(self._bridge.state(handle)) or ():
                        rec = self._bridge.wrap(_lib.as_bytes(rec, "record"))
                        check(lib.pc_records_push(out, rec, len(rec)))
                    return 0
                except WriteRefused as r:
                    check(lib.pc_records_refuse(out, r.message.encode("utf-8")))
                    return 0
                except Refused as r:
                    return r.code
                except BaseException as exc:  # noqa: BLE001 - nothing may unwind into C
                    raised.append(exc)
                    return RAISED_CODE

        callback = _lib.DECIDE(trampoline)
        out = _lib.Written()
        self._call((ns, id), lib.pc_engine_write, callback, None, byref(out))
        if raised:
            raise raised[0]
        return Written(out.wrote, out.first_seq, out.last_seq, out.decision)

    def defer(
        self, ns: str, id: bytes | str, record: bytes | str, dedup_id: bytes | str | None = None
    ) -> Deferred:
        """Defers `record` (SPEC R8): queued for a pending entity without restoring it,
        appended to a restored one. A repeated `dedup_id` writes nothing."""
        rec = self._bridge.wrap(_lib.as_bytes(record, "record"))
        dedup = None if dedup_id is None else _lib.as_bytes(dedup_id, "dedup id")
        out = _lib.Deferred()
        self._call(
            (ns, id),
            lib.pc_engine_defer,
            dedup,
            0 if dedup is None else len(dedup),
            rec,
            len(rec),
            byref(out),
        )
        return Deferred(_DEFERRED[out.kind], out.seq)

    def checkpoint(self, ns: str, id: bytes | str) -> int:
        """Publishes a checkpoint (SPEC L3); returns the sequence number it covers. An `encode`
        that raises publishes nothing: this raises `WriteRefused` with its text."""
        seq = c_uint64()
        self._call((ns, id), lib.pc_engine_checkpoint, byref(seq))
        return seq.value

    def release(self, ns: str, id: bytes | str) -> bool:
        """Releases a contained entity so its next touch restores it again (SPEC R4); False if
        it was not contained."""
        released = c_bool()
        self._call((ns, id), lib.pc_engine_release, byref(released))
        if released.value:
            self._bridge.errors.pop(Entity(ns, _lib.as_bytes(id, "id")), None)
        return released.value

    def containment(self, ns: str, id: bytes | str) -> str | None:
        """Why the entity is contained (SPEC R4), or None if it is not. Does not touch it."""
        contained, reason = c_bool(), _lib.Bytes()
        self._call((ns, id), lib.pc_engine_containment, byref(contained), byref(reason))
        text = _lib.take_bytes(reason).decode("utf-8", errors="replace")
        return text if contained.value else None

    def entities(self) -> list[Entity]:
        """Every registered entity, in name order (no rows are read)."""
        out = c_void_p()
        with self._handle.use() as e:
            check(lib.pc_engine_entities(e, byref(out)))
        listed = out.value
        try:
            found = []
            for i in range(lib.pc_entity_list_len(listed)):
                view = _lib.EntityView()
                check(lib.pc_entity_list_get(listed, i, byref(view)))
                ns = ctypes.string_at(view.ns, view.ns_len).decode("utf-8")
                found.append(Entity(ns, ctypes.string_at(view.id, view.id_len)))
            return found
        finally:
            lib.pc_entity_list_free(listed)

    def history(
        self, ns: str, id: bytes | str, from_seq: int = 1, page_size: int = 256
    ) -> Iterator[Record]:
        """The entity's records from `from_seq` on, read a page at a time without restoring
        the entity (records a truncation removed are skipped), as the machine reads them (for a
        machine with a version: without the envelope, older versions upcast)."""
        next_seq = from_seq
        while True:
            out = c_void_p()
            self._call((ns, id), lib.pc_engine_history, next_seq, page_size, byref(out))
            page = out.value
            try:
                records = []
                for i in range(lib.pc_history_page_len(page)):
                    seq, data, n = c_uint64(), ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_size_t()
                    check(lib.pc_history_page_record(page, i, byref(seq), byref(data), byref(n)))
                    raw = ctypes.string_at(data, n.value)
                    records.append(Record(seq.value, self._bridge.record_of(raw)))
                more, following = c_bool(), c_uint64()
                check(lib.pc_history_page_next(page, byref(more), byref(following)))
            finally:
                lib.pc_history_page_free(page)
            yield from records
            if not more.value:
                return
            next_seq = following.value

    def warm(self) -> Warm:
        """Starts (or joins) a background warm of every pending entity; returns its `Warm`."""
        out = c_void_p()
        with self._handle.use() as e:
            check(lib.pc_engine_warm(e, byref(out)))
        return Warm(out.value)

    # -- namespaces and fencing (SPEC F) -------------------------------------------------

    def _ns(self, fn: Any, ns: str, *args: Any) -> None:
        with self._handle.use() as e:
            check(fn(e, _lib.as_name(ns, "namespace"), *args))

    def own(self, ns: str) -> int:
        """Adopts namespace `ns` (SPEC F11); returns the epoch it adopted."""
        grant = c_uint64()
        self._ns(lib.pc_engine_own, ns, byref(grant))
        return grant.value

    def release_namespace(self, ns: str) -> None:
        """Hands `ns` over cleanly: the next owner runs no unclean-restart repair for it."""
        self._ns(lib.pc_engine_release_namespace, ns)

    def current_epoch(self, ns: str) -> int:
        epoch = c_uint64()
        self._ns(lib.pc_engine_current_epoch, ns, byref(epoch))
        return epoch.value

    def bump_epoch(self, ns: str, new_epoch: int) -> None:
        """Advances the epoch (SPEC F1); older writes stop once revocation completes."""
        self._ns(lib.pc_engine_bump_epoch, ns, new_epoch)

    def revoke_step(self, ns: str, budget: float = 0.05) -> RevokeProgress:
        """One bounded revocation slice (SPEC F4) of at most `budget` seconds."""
        out = _lib.RevokeProgress()
        self._ns(lib.pc_engine_revoke_step, ns, max(1, _ms(budget)), byref(out))
        return RevokeProgress(out.complete, out.remaining)

    def revoke_to_completion(self, ns: str, timeout: float = 60.0) -> int:
        """Revokes until complete (SPEC F9) on the pool, at most `timeout` seconds; returns
        the slices run. Raises `Unavailable` if it could not complete in time."""
        if in_callback():
            raise WouldDeadlock("revoking from a state machine callback", code=13)
        slices = c_uint64()
        self._ns(lib.pc_engine_revoke_to_completion, ns, _ms(timeout), byref(slices))
        return slices.value

    def mark_recovered(self, ns: str) -> None:
        """Declares the namespace's lease table restored or rebuilt (SPEC F6)."""
        self._ns(lib.pc_engine_mark_recovered, ns)

    # -- the engine ----------------------------------------------------------------------

    def stats(self) -> Stats:
        out = _lib.sized(_lib.EngineStats)
        with self._handle.use() as e:
            check(lib.pc_engine_get_stats(e, byref(out)))
        return Stats(*(getattr(out, name) for name in _lib.STAT_NAMES))

    def degraded(self) -> observe.Degraded | None:
        """Why the engine (or the store it opened) is degraded, or None when it is healthy
        (SPEC E8): a latched sync failure, a background thread that ended, an owner lease that
        could not be renewed ..."""
        with self._handle.use() as e:
            return observe.degraded(lib.pc_engine_degraded, e)

    def close(self) -> None:
        """Closes the engine (SPEC R11) and frees it once no call is in flight; closing twice
        is harmless. From a state machine callback or a write's decision it raises
        `WouldDeadlock` and changes nothing. In a forked child it only forgets the engine."""
        if in_callback():
            raise WouldDeadlock("closing the engine from a state machine callback", code=13)
        try:
            if not self._handle.inherited:
                with self._handle.use() as e:
                    code = lib.pc_engine_close(e)
                check(code)
        except Closed:
            pass  # closed by another thread meanwhile
        finally:
            # Closes if needed, frees every state, runs destroy.
            if self._handle.free():
                _freed(self._handle, self._bridge)
            else:
                _open.pop(self._handle, None)

    @property
    def closed(self) -> bool:
        return self._handle.freed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
