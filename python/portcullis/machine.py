"""The state machine written in Python, handed to the engine through the C callback struct.

Owns: `StateMachine` (the class an application subclasses), `Entity` and `ApplyContext`, and
`Bridge`, which turns one machine into a `pc_machine`: each C callback looks up the Python
state behind an opaque handle, calls the machine, and answers a code. Python states live in a
table keyed by the handle that `fresh`/`decode` return and `free_state` drops. For a machine
with a `version` (SPEC E7), the bridge puts the version envelope (`versions.py`) in front of
every record and checkpoint it hands to C, and reads the envelope of every one C hands back,
through the machine's upcast methods for older versions. The `pc_machine` the bridge hands to
C keeps `version` 0 and no upcast callbacks: the bridge does that work itself, with the bytes
and rules the C library applies for a C machine with a version, so each reads the other's
stores.

Threads: the engine calls these callbacks on its pool threads and on any thread touching an
entity; ctypes takes the GIL for each. No callback takes a lock (the table is a dict, whose
single operations are atomic under the GIL), so no callback can wait for a lock that a Python
thread blocked in C holds. An exception never escapes into C (ctypes would print it and
answer 0, which C reads as success): `Refused` answers its code, any other exception
`RAISED_CODE`, and the text goes to the library as the refusal's reason (`pc_refuse`) and is
kept per entity, so the exception a later call raises can say what happened. Ctrl-C
(`KeyboardInterrupt`) or `SystemExit` inside a callback refuses too, but is remembered as an
interruption: the engine call raises it once it returns, and releases an entity the
interruption contained (it was no fault of the entity's).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from typing import Any, Callable, NamedTuple

from . import _lib, versions
from .errors import RAISED_CODE, Refused

log = logging.getLogger("portcullis")
log.addHandler(logging.NullHandler())  # the application decides where warnings go

ORIGINS = {
    _lib.ORIGIN_REPLAY: "replay",
    _lib.ORIGIN_DEFERRED: "deferred",
    _lib.ORIGIN_REPAIR: "repair",
    _lib.ORIGIN_LIVE: "live",
}

#: What an interruption's refusal says; an entity it contained is released.
INTERRUPTED = "interrupted by "

# A test-only switch (a negative control): a callback's exception is ignored as if the callback
# had succeeded, instead of becoming a refusal.
_TEST_IGNORE_EXCEPTIONS = False

# Per thread: how deep in callbacks this thread is, the last callback error it saw, and an
# interruption (KeyboardInterrupt, SystemExit) a callback caught that the call must raise.
_tls = threading.local()


class Entity(NamedTuple):
    namespace: str
    id: bytes


class ApplyContext(NamedTuple):
    """What `apply` (and `check`) learns besides the record: its sequence number and origin
    ("replay": history folded again, suppress side effects; "deferred", "repair", "live";
    "unknown" for one a newer library added: treat it as a replay)."""

    entity: Entity
    seq: int
    origin: str


class StateMachine:
    """Subclass this. `fresh`, `apply`, `encode` and `decode` are required; define `validate`,
    `check` and `repair` to use them. Raise `Refused(message, code)` to refuse; any other
    exception refuses too, with its text as the reason. A refusal during a restore contains the
    entity (SPEC R4). Methods run on the engine's threads, concurrently for different entities
    (one entity at a time), and must not call the engine for the entity they work on.

    Where a refusal belongs (SPEC R12): a command the current state does not allow is refused
    in `check` (every record of a write, before it is written) or in a write's decision
    (`Engine.write`, raising `WriteRefused`); the write raises `WriteRefused` and nothing is
    written. `validate` refuses bytes that are not a record. `apply` folds records that are
    already history, so refusing one means the code and the history disagree: it contains the
    entity. `encode` refusing publishes no checkpoint (the call raises `WriteRefused`)."""

    def fresh(self, entity: Entity) -> Any:
        """The state of an entity with no history. Raising contains the entity."""
        raise NotImplementedError

    def apply(self, state: Any, record: bytes, ctx: ApplyContext) -> Any:
        """Folds `record` (bytes) into `state`: return the new state, or None after changing
        `state` in place. Raise before changing anything to refuse."""
        raise NotImplementedError

    def encode(self, state: Any) -> bytes:
        """The state as bytes (checkpoints and `Engine.read`). Raising publishes nothing."""
        raise NotImplementedError

    def decode(self, entity: Entity, data: bytes) -> Any:
        """A state from bytes `encode` wrote."""
        raise NotImplementedError

    #: Optional: `def validate(self, record) -> None`, raising to refuse bytes that are not a
    #: record.
    validate: Callable[..., None] | None = None
    #: Optional: `def check(self, state, record, ctx) -> None`, raising to refuse a record the
    #: current state does not allow, before it is written (must change nothing).
    check: Callable[..., None] | None = None
    #: Optional: `def repair(self, entity, state, unclean) -> list of records`.
    repair: Callable[..., list[bytes] | None] | None = None

    #: None (the default): records and checkpoints are stored as the machine's bytes, as they
    #: are. An int from 1 up: every record and checkpoint is stored behind a version envelope
    #: naming it, and `apply`, `check`, `decode` and `validate` see only bytes of this version:
    #: older ones come through `upcast_record` / `upcast_checkpoint`, newer ones are refused.
    #: Bytes stored without an envelope are version 1 (docs/SCHEMA.md, SPEC E7).
    version: int | None = None

    def upcast_record(self, version: int, record: bytes) -> bytes:
        """Returns `record`, bytes of an older `version`, as bytes of `self.version`. The
        default refuses, naming both versions (a restore meeting it contains the entity)."""
        raise versions.no_upcast("record", "upcast_record", version, self.version)

    def upcast_checkpoint(self, entity: Entity, version: int, data: bytes) -> Any:
        """Returns the state of a checkpoint of an older `version` (`data` without its
        envelope). The default refuses, naming both versions; restore then replays the
        entity's history instead, if it is all still stored, and checkpoints it again."""
        raise versions.no_upcast("checkpoint", "upcast_checkpoint", version, self.version)


def in_callback() -> bool:
    return getattr(_tls, "depth", 0) > 0


def take_thread_error() -> str | None:
    """The callback error this thread recorded since the last call, cleared."""
    err = getattr(_tls, "error", None)
    _tls.error = None
    return err


def take_interruption() -> BaseException | None:
    """The interruption a callback on this thread caught during the last call, cleared."""
    exc = getattr(_tls, "interrupted", None)
    _tls.interrupted = None
    return exc


class entering:
    """Counts this thread as inside a callback (also a write's decision and a visit), so calls
    that would wait for the engine from there refuse at once."""

    def __enter__(self) -> None:
        _tls.depth = getattr(_tls, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _tls.depth -= 1


def _view(view: _lib.EntityView) -> Entity:
    ns = ctypes.string_at(view.ns, view.ns_len).decode("utf-8")
    return Entity(ns, ctypes.string_at(view.id, view.id_len) if view.id_len else b"")


def _data(ptr: Any, n: int) -> bytes:
    return ctypes.string_at(ptr, n) if n else b""


def _context(c: _lib.ApplyContextC) -> ApplyContext:
    return ApplyContext(_view(c.entity), c.seq, ORIGINS.get(c.origin, "unknown"))


class Bridge:
    """One Python machine as a `pc_machine`. Keep it alive as long as C may call it: until
    `destroy` ran (`destroyed`) and the thread that ran it returned from it."""

    def __init__(self, machine: StateMachine) -> None:
        if not isinstance(machine, StateMachine):
            raise TypeError("the machine must be a portcullis.StateMachine")
        self.machine = machine
        self.version = machine.version
        if self.version is not None:
            versions.envelope(self.version, b"")  # refuses a version that is not one
        self.states: dict[int, Any] = {}
        self.errors: dict[Entity, str] = {}  # the text of the last exception per entity
        self.destroyed = threading.Event()
        #: The thread `destroy` ran on (the bridge may be dropped once that thread returned).
        self.destroyed_by: int | None = None
        self._ids = itertools.count(1)
        cls = type(machine)
        self._callbacks = [
            _lib.FRESH(self._fresh),
            _lib.APPLY(self._apply),
            _lib.ENCODE(self._encode),
            _lib.DECODE(self._decode),
            _lib.VALIDATE(self._validate)
            if cls.validate is not None or self.version is not None
            else _lib.VALIDATE(),
            _lib.REPAIR(self._repair) if cls.repair is not None else _lib.REPAIR(),
            _lib.FREE_STATE(self._free_state),
            _lib.DESTROY(self._destroy),
            _lib.CHECK(self._check) if cls.check is not None else _lib.CHECK(),
        ]
        self.struct = _lib.Machine(ctypes.sizeof(_lib.Machine), None, *self._callbacks)

    # -- helpers -------------------------------------------------------------------------

    def wrap(self, data: bytes) -> bytes:
        """Bytes as the engine stores them: behind the envelope of the machine's version."""
        return data if self.version is None else versions.envelope(self.version, data)

    def record_of(self, data: bytes) -> bytes:
        """A stored record as the machine reads it: bytes of its version."""
        if self.version is None:
            return data
        version, payload, _ = versions.split_version(data)
        if version == self.version:
            return payload
        if version > self.version:
            raise versions.newer("record", version, self.version)
        return _lib.as_bytes(self.machine.upcast_record(version, payload), "upcast_record's result")

    def state_of(self, entity: Entity, data: bytes) -> Any:
        """The state a stored checkpoint holds, through `upcast_checkpoint` if it is older."""
        if self.version is None:
            return self.machine.decode(entity, data)
        version, payload, _ = versions.split_version(data)
        if version == self.version:
            return self.machine.decode(entity, payload)
        if version > self.version:
            raise versions.newer("checkpoint", version, self.version)
        return self.machine.upcast_checkpoint(entity, version, payload)

    def encoded_of(self, data: bytes) -> bytes:
        """What `encode` wrote, from the bytes the engine answers for a state."""
        if self.version is None:
            return data
        return versions.split_version(data)[1]

    def _put(self, state: Any) -> int:
        handle = next(self._ids)
        self.states[handle] = state
        return handle

    def state(self, handle: int) -> Any:
        return self.states[handle]

    def _failed(self, callback: str, entity: Entity | None, exc: BaseException) -> int:
        if isinstance(exc, Refused):
            text = f"{callback} refused with code {exc.code}: {exc}"
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            text = f"{callback} was {INTERRUPTED}{type(exc).__name__}"
            _tls.interrupted = exc
        else:
            text = f"{callback} raised {type(exc).__name__}: {exc}"
            log.warning("the state machine's %s raised (%s)", callback, entity, exc_info=exc)
        if _TEST_IGNORE_EXCEPTIONS:
            return 0
        _tls.error = text
        if entity is not None:
            self.errors[entity] = text
        _lib.lib.pc_refuse(text.encode("utf-8", errors="replace"))
        return exc.code if isinstance(exc, Refused) else RAISED_CODE

    def _guard(self, callback: str, entity: Entity | None, body: Callable[[], int]) -> int:
        with entering():
            try:
                return body()
            except BaseException as exc:  # noqa: BLE001 - nothing may unwind into C
                return self._failed(callback, entity, exc)

    # -- the callbacks -------------------------------------------------------------------

    def _fresh(self, _ud: Any, view: Any, out: Any) -> int:
        entity = _view(view.contents)

        def body() -> int:
            out[0] = self._put(self.machine.fresh(entity))
            return 0

        return self._guard("fresh", entity, body)

    def _apply(self, _ud: Any, handle: int, ctx: Any, record: Any, n: int) -> int:
        c = _context(ctx.contents)

        def body() -> int:
            new = self.machine.apply(self.state(handle), self.record_of(_data(record, n)), c)
            if new is not None:
                self.states[handle] = new
            return 0

        return self._guard("apply", c.entity, body)

    def _encode(self, _ud: Any, handle: int, sink: Any) -> int:
        def body() -> int:
            data = _lib.as_bytes(self.machine.encode(self.state(handle)), "encode's result")
            data = self.wrap(data)
            code = _lib.lib.pc_sink_write(sink, data, len(data))
            if code:
                raise Refused(f"pc_sink_write answered {code}", code)
            return 0

        return self._guard("encode", None, body)

    def _decode(self, _ud: Any, view: Any, data: Any, n: int, out: Any) -> int:
        entity = _view(view.contents)

        def body() -> int:
            out[0] = self._put(self.state_of(entity, _data(data, n)))
            return 0

        return self._guard("decode", entity, body)

    def _validate(self, _ud: Any, record: Any, n: int) -> int:
        def body() -> int:
            data = self.record_of(_data(record, n))
            if self.machine.validate is not None:
                self.machine.validate(data)
            return 0

        return self._guard("validate", None, body)

    def _check(self, _ud: Any, handle: int, ctx: Any, record: Any, n: int) -> int:
        c = _context(ctx.contents)

        def body() -> int:
            assert self.machine.check is not None
            self.machine.check(self.state(handle), self.record_of(_data(record, n)), c)
            return 0

        return self._guard("check", None, body)

    def _repair(self, _ud: Any, view: Any, handle: int, unclean: int, out: Any) -> int:
        entity = _view(view.contents)

        def body() -> int:
            assert self.machine.repair is not None
            for rec in self.machine.repair(entity, self.state(handle), unclean) or ():
                rec = self.wrap(_lib.as_bytes(rec, "a repair record"))
                code = _lib.lib.pc_records_push(out, rec, len(rec))
                if code:
                    raise Refused(f"pc_records_push answered {code}", code)
            return 0

        return self._guard("repair", entity, body)

    def _free_state(self, _ud: Any, handle: int) -> None:
        self.states.pop(handle, None)

    def _destroy(self, _ud: Any) -> None:
        # The callbacks stay referenced: C is still returning through this one. The engine
        # drops the bridge once the call that ran destroy on its own thread has returned.
        self.destroyed_by = threading.get_ident()
        self.destroyed.set()
