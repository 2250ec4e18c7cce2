"""The engine of durable entities over a Python state machine (SPEC R, F, E2).

Owns: `Engine` (open with options, register, read, append, write with a decision, defer,
checkpoint, release, warm, the fencing calls, stats, close; a context manager), `Warm`, and
the result types. Entity ids are bytes (or str, encoded as UTF-8); namespaces are str.

Every call releases the GIL while it runs in C (the library is a `CDLL`), so the pool's
callbacks run while a Python thread waits. The engine keeps its `Bridge` (and with it every
ctypes callback) alive until `pc_engine_free` has returned and `destroy` has run.
"""

import atexit
import ctypes
import warnings
from ctypes import byref, c_bool, c_uint64, c_void_p
from dataclasses import dataclass

from . import _lib
from ._handle import Handle
from .errors import (
    RAISED_CODE,
    CallbackError,
    Closed,
    Contained,
    Refused,
    WouldDeadlock,
    check,
    error_for,
)
from .machine import UNENCODABLE, Bridge, Entity, in_callback, take_thread_error
from .store import _quietly, sync_policy

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


def _ms(seconds):
    return max(0, int(seconds * 1000))


class Warm:
    """A background warm restoring every pending entity on the pool (SPEC R6). Closing the
    handle does not stop the warm; `stop` does."""

    def __init__(self, ptr):
        self._handle = Handle(ptr, lib.pc_warm_free, "warm handle")

    def wait(self, timeout=60.0):
        """Waits at most `timeout` seconds; True if the warm ended. Never from a callback."""
        if in_callback():
            raise WouldDeadlock("waiting for a warm from a state machine callback", code=13)
        finished = c_bool()
        with self._handle.use() as w:
            check(lib.pc_warm_wait(w, _ms(timeout), byref(finished)))
        return finished.value

    def progress(self):
        out = _lib.WarmProgress()
        with self._handle.use() as w:
            check(lib.pc_warm_get_progress(w, byref(out)))
        return WarmProgress(
            out.done, out.total, out.refused, out.elapsed_ms, out.finished, out.stopped
        )

    def stop(self):
        with self._handle.use() as w:
            check(lib.pc_warm_stop(w))

    def close(self):
        self._handle.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        _quietly(self, "_handle")


# Every engine not freed yet, with its bridge: the ctypes callbacks must outlive the C engine
# even when the `Engine` object is dropped without `close`, or C would call freed memory.
_open = {}


@atexit.register
def _close_all():
    # Callbacks must not arrive while the interpreter shuts down: close what is still open.
    for handle in list(_open):
        try:
            handle.free()
        except Exception:
            pass
        _open.pop(handle, None)


class Engine:
    """An open engine over a Python `StateMachine`. Any number of threads may share it.
    Use it as a context manager (closed on exit) or call `close`."""

    def __init__(self, ptr, bridge):
        self._bridge = bridge
        self._handle = Handle(ptr, lib.pc_engine_free, "engine")
        _open[self._handle] = bridge

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and not handle.freed:
            # Not closed here: a collection may run on a callback thread. It stays open (and
            # its callbacks alive) until the interpreter exits.
            warnings.warn("an Engine was not closed", ResourceWarning, stacklevel=1)

    @classmethod
    def open(
        cls,
        machine,
        directory=None,
        *,
        store=None,
        clock=None,
        owner=None,
        own=(),
        own_unfenced=(),
        adopt_on_first_use=None,
        register_on_first_write=None,
        truncate_after_checkpoint=None,
        warm_on_open=None,
        pool_threads=None,
        warm_parallelism=None,
        checkpoint_every=None,
        checkpoint_tail_bound=None,
        close_timeout=None,
        sync=None,
        sync_interval_ms=0,
        fence=None,
    ):
        """Opens an engine over `directory` (a file store, created if missing) or an open
        `store`. Returns at once: entities restore on their first touch. `fence` is a dict of
        `epoch_lease_ms`, `lease_margin_ms`, `min_lease_budget_ms`, `max_apply_window_ms`."""
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
            )
            for flag, on in flags:
                if on is not None:
                    check(lib.pc_engine_options_flag(o, flag, bool(on)))
            numbers = (
                (_lib.POOL_THREADS, pool_threads),
                (_lib.WARM_PARALLELISM, warm_parallelism),
                (_lib.CHECKPOINT_EVERY, checkpoint_every),
                (_lib.CHECKPOINT_TAIL_BOUND, checkpoint_tail_bound),
                (_lib.CLOSE_TIMEOUT_MS, None if close_timeout is None else _ms(close_timeout)),
            )
            for option, value in numbers:
                if value is not None:
                    check(lib.pc_engine_options_number(o, option, int(value)))
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
            # On failure destroy has run before this returns; the bridge is dropped after.
            check(lib.pc_engine_open(o, byref(bridge.struct), byref(out)))
        finally:
            lib.pc_engine_options_free(opts.value)
        return cls(out.value, bridge)

    # -- entities ------------------------------------------------------------------------

    def _call(self, entity, fn, *args):
        """Runs `fn(engine, ns, id, len, *args)`; a failure carries the Python callback error
        behind it (raised on this thread during the call, or earlier for a contained entity)."""
        ns, ident = _lib.as_name(entity[0], "namespace"), _lib.as_bytes(entity[1], "id")
        take_thread_error()
        with self._handle.use() as e:
            code = fn(e, ns, ident, len(ident), *args)
        if code:
            err = take_thread_error()
            if err is None and code == Contained.code:
                err = self._bridge.errors.get(Entity(ns.decode("utf-8"), ident))
            raise error_for(code, err)

    def register(self, ns, id):
        """Registers entity `(ns, id)`; False if it was already registered."""
        created = c_bool()
        self._call((ns, id), lib.pc_engine_register, byref(created))
        return created.value

    def read(self, ns, id):
        """The entity's state as the machine's `encode` writes it (restoring it if pending)."""
        out = _lib.Bytes()
        self._call((ns, id), lib.pc_engine_read, byref(out))
        data = _lib.take_bytes(out)
        if data.startswith(UNENCODABLE):
            said = data[len(UNENCODABLE) :].decode("utf-8", errors="replace")
            raise CallbackError("the state could not be encoded", callback_error=said)
        return data

    def state(self, ns, id):
        """The entity's state as a Python object: `decode` of what `read` answers."""
        data = self.read(ns, id)
        return self._bridge.machine.decode(Entity(ns, _lib.as_bytes(id, "id")), data)

    def append(self, ns, id, records):
        """Appends records (bytes) as they are, durably on return (SPEC L1); returns the first
        and last sequence numbers."""
        recs = [_lib.as_bytes(r, "record") for r in records]
        slices = (_lib.Slice * max(1, len(recs)))()
        for i, r in enumerate(recs):
            slices[i].data = ctypes.cast(ctypes.c_char_p(r), c_void_p)
            slices[i].len = len(r)
        first, last = c_uint64(), c_uint64()
        self._call((ns, id), lib.pc_engine_append, slices, len(recs), byref(first), byref(last))
        return first.value, last.value

    def write(self, ns, id, decide):
        """Decides records from the entity's current state and appends them (SPEC E2).
        `decide(state)` runs once on this thread and returns the records (an empty list
        writes nothing); raising `Refused(msg, code)` writes nothing and answers `code` in
        `Written.decision`; any other exception writes nothing and is raised here."""
        raised = []

        def trampoline(_ctx, handle, out):
            try:
                for rec in decide(self._bridge.state(handle)) or ():
                    rec = _lib.as_bytes(rec, "record")
                    check(lib.pc_records_push(out, rec, len(rec)))
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

    def defer(self, ns, id, record, dedup_id=None):
        """Defers `record` (SPEC R8): queued for a pending entity without restoring it,
        appended to a restored one. A repeated `dedup_id` writes nothing."""
        rec = _lib.as_bytes(record, "record")
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

    def checkpoint(self, ns, id):
        """Publishes a checkpoint (SPEC L3); returns the sequence number it covers."""
        seq = c_uint64()
        self._call((ns, id), lib.pc_engine_checkpoint, byref(seq))
        said = take_thread_error()
        if said is not None and said.startswith("encode"):
            raise CallbackError(
                f"the checkpoint at {seq.value} was published, but encode raised: a restore "
                "from it contains the entity (fix encode, then release the entity)",
                callback_error=said,
            )
        return seq.value

    def release(self, ns, id):
        """Releases a contained entity so its next touch restores it again (SPEC R4); False if
        it was not contained."""
        released = c_bool()
        self._call((ns, id), lib.pc_engine_release, byref(released))
        if released.value:
            self._bridge.errors.pop(Entity(ns, _lib.as_bytes(id, "id")), None)
        return released.value

    def warm(self):
        """Starts (or joins) a background warm of every pending entity; returns its `Warm`."""
        out = c_void_p()
        with self._handle.use() as e:
            check(lib.pc_engine_warm(e, byref(out)))
        return Warm(out.value)

    # -- namespaces and fencing (SPEC F) -------------------------------------------------

    def _ns(self, fn, ns, *args):
        with self._handle.use() as e:
            check(fn(e, _lib.as_name(ns, "namespace"), *args))

    def own(self, ns):
        """Adopts namespace `ns` (SPEC F11); returns the epoch it adopted."""
        grant = c_uint64()
        self._ns(lib.pc_engine_own, ns, byref(grant))
        return grant.value

    def release_namespace(self, ns):
        """Hands `ns` over cleanly: the next owner runs no unclean-restart repair for it."""
        self._ns(lib.pc_engine_release_namespace, ns)

    def current_epoch(self, ns):
        epoch = c_uint64()
        self._ns(lib.pc_engine_current_epoch, ns, byref(epoch))
        return epoch.value

    def bump_epoch(self, ns, new_epoch):
        """Advances the epoch (SPEC F1); older writes stop once revocation completes."""
        self._ns(lib.pc_engine_bump_epoch, ns, new_epoch)

    def revoke_step(self, ns, budget=0.05):
        """One bounded revocation slice (SPEC F4) of at most `budget` seconds."""
        out = _lib.RevokeProgress()
        self._ns(lib.pc_engine_revoke_step, ns, max(1, _ms(budget)), byref(out))
        return RevokeProgress(out.complete, out.remaining)

    def revoke_to_completion(self, ns, timeout=60.0):
        """Revokes until complete (SPEC F9) on the pool, at most `timeout` seconds; returns
        the slices run. Raises `Unavailable` if it could not complete in time."""
        if in_callback():
            raise WouldDeadlock("revoking from a state machine callback", code=13)
        slices = c_uint64()
        self._ns(lib.pc_engine_revoke_to_completion, ns, _ms(timeout), byref(slices))
        return slices.value

    def mark_recovered(self, ns):
        """Declares the namespace's lease table restored or rebuilt (SPEC F6)."""
        self._ns(lib.pc_engine_mark_recovered, ns)

    # -- the engine ----------------------------------------------------------------------

    def stats(self):
        out = _lib.EngineStats()
        with self._handle.use() as e:
            check(lib.pc_engine_get_stats(e, byref(out)))
        return Stats(*(getattr(out, name) for name, _ in _lib.EngineStats._fields_))

    def close(self):
        """Closes the engine (SPEC R11) and frees it once no call is in flight; closing twice
        is harmless. Not from a state machine callback (`WouldDeadlock`)."""
        if in_callback():
            raise WouldDeadlock("closing the engine from a state machine callback", code=13)
        try:
            with self._handle.use() as e:
                code = lib.pc_engine_close(e)
            check(code)
        except Closed:
            pass  # closed by another thread meanwhile
        finally:
            if self._handle.free():  # closes if needed, frees every state, runs destroy
                _open.pop(self._handle, None)

    @property
    def closed(self):
        return self._handle.freed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
