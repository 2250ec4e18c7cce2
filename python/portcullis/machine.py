"""The state machine written in Python, handed to the engine through the C callback struct.

Owns: `StateMachine` (the class an application subclasses), `Entity` and `ApplyContext`, and
`Bridge`, which turns one machine into a `pc_machine`: each C callback looks up the Python
state behind an opaque handle, calls the machine, and answers a code. Python states live in a
table keyed by the handle that `fresh`/`decode` return and `free_state` drops.

Threads: the engine calls these callbacks on its pool threads and on any thread touching an
entity; ctypes takes the GIL for each. No callback takes a lock (the table is a dict, whose
single operations are atomic under the GIL), so no callback can wait for a lock that a Python
thread blocked in C holds. An exception never escapes into C (ctypes would print it and
answer 0, which C reads as success): `Refused` answers its code, anything else `RAISED_CODE`,
and the text is kept per entity so the exception a later call raises can say what happened.
"""

import ctypes
import itertools
import logging
import threading
from typing import NamedTuple

from . import _lib
from .errors import RAISED_CODE, Refused

log = logging.getLogger("portcullis")
log.addHandler(logging.NullHandler())  # the application decides where warnings go

#: Written instead of a checkpoint when `encode` raised (the C ABI gives `encode` no way to
#: refuse); `decode` refuses it, so a restore from it contains the entity instead of
#: inventing a state.
UNENCODABLE = b"\xffportcullis-python: encode raised: "

ORIGINS = {0: "replay", 1: "deferred", 2: "repair", 3: "live"}

# A test-only switch (a negative control): a callback's exception is ignored as if the callback
# had succeeded, instead of becoming a refusal.
_TEST_IGNORE_EXCEPTIONS = False

# Per thread: how deep in callbacks this thread is, and the last callback error it saw.
_tls = threading.local()


class Entity(NamedTuple):
    namespace: str
    id: bytes


class ApplyContext(NamedTuple):
    """What `apply` learns besides the record: its sequence number and origin ("replay":
    history folded again, suppress side effects; "deferred", "repair", "live")."""

    entity: Entity
    seq: int
    origin: str


class StateMachine:
    """Subclass this. `fresh`, `apply`, `encode` and `decode` are required; define `validate`
    and `repair` to use them. Raise `Refused(message, code)` to refuse; any other exception
    refuses too. A refusal during a restore contains the entity (SPEC R4). Methods run on the
    engine's threads, concurrently for different entities (one entity at a time), and must
    not call the engine for the entity they work on."""

    def fresh(self, entity):
        """The state of an entity with no history."""
        raise NotImplementedError

    def apply(self, state, record, ctx):
        """Folds `record` (bytes) into `state`: return the new state, or None after changing
        `state` in place. Raise before changing anything to refuse."""
        raise NotImplementedError

    def encode(self, state):
        """The state as bytes (checkpoints and `Engine.read`). Must not raise."""
        raise NotImplementedError

    def decode(self, entity, data):
        """A state from bytes `encode` wrote."""
        raise NotImplementedError

    validate = None  # optional: def validate(self, record) -> None, raising to refuse
    repair = None  # optional: def repair(self, entity, state, unclean) -> list of records


def in_callback():
    return getattr(_tls, "depth", 0) > 0


def take_thread_error():
    """The callback error this thread recorded since the last call, cleared."""
    err = getattr(_tls, "error", None)
    _tls.error = None
    return err


class _Poisoned:
    """Stands for the state of an entity whose `fresh` raised: every use refuses."""

    def __init__(self, text):
        self.text = text


def _view(view):
    ns = ctypes.string_at(view.ns, view.ns_len).decode("utf-8")
    return Entity(ns, ctypes.string_at(view.id, view.id_len) if view.id_len else b"")


def _data(ptr, n):
    return ctypes.string_at(ptr, n) if n else b""


class Bridge:
    """One Python machine as a `pc_machine`. Keep it alive as long as the engine: C holds
    pointers to its callbacks until `destroy` runs."""

    def __init__(self, machine):
        if not isinstance(machine, StateMachine):
            raise TypeError("the machine must be a portcullis.StateMachine")
        self.machine = machine
        self.states = {}
        self.errors = {}  # Entity -> the text of the last exception a callback raised for it
        self.destroyed = threading.Event()
        self._ids = itertools.count(1)
        cls = type(machine)
        self._callbacks = [
            _lib.FRESH(self._fresh),
            _lib.APPLY(self._apply),
            _lib.ENCODE(self._encode),
            _lib.DECODE(self._decode),
            _lib.VALIDATE(self._validate) if cls.validate is not None else _lib.VALIDATE(),
            _lib.REPAIR(self._repair) if cls.repair is not None else _lib.REPAIR(),
            _lib.FREE_STATE(self._free_state),
            _lib.DESTROY(self._destroy),
        ]
        self.struct = _lib.Machine(None, *self._callbacks)

    # -- helpers -------------------------------------------------------------------------

    def _put(self, state):
        handle = next(self._ids)
        self.states[handle] = state
        return handle

    def state(self, handle):
        st = self.states[handle]
        if isinstance(st, _Poisoned):
            raise RuntimeError(f"the entity has no state: {st.text}")
        return st

    def _failed(self, callback, entity, exc):
        if isinstance(exc, Refused):
            text = f"{callback} refused with code {exc.code}: {exc}"
        else:
            text = f"{callback} raised {type(exc).__name__}: {exc}"
            log.warning("the state machine's %s raised (%s)", callback, entity, exc_info=exc)
        if _TEST_IGNORE_EXCEPTIONS:
            return 0
        _tls.error = text
        if entity is not None:
            self.errors[entity] = text
        return exc.code if isinstance(exc, Refused) else RAISED_CODE

    def _guard(self, callback, entity, body):
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return body()
        except BaseException as exc:  # noqa: BLE001 - nothing may unwind into C
            return self._failed(callback, entity, exc)
        finally:
            _tls.depth -= 1

    # -- the callbacks -------------------------------------------------------------------

    def _fresh(self, _ud, view):
        entity = _view(view.contents)
        made = []

        def body():
            made.append(self.machine.fresh(entity))
            return 0

        if self._guard("fresh", entity, body) != 0:
            # fresh cannot refuse in the C ABI: a state every later use refuses.
            return self._put(_Poisoned(self.errors[entity]))
        return self._put(made[0])

    def _apply(self, _ud, handle, ctx, record, n):
        c = ctx.contents
        entity = _view(c.entity)

        def body():
            new = self.machine.apply(
                self.state(handle), _data(record, n), ApplyContext(entity, c.seq, ORIGINS[c.origin])
            )
            if new is not None:
                self.states[handle] = new
            return 0

        return self._guard("apply", entity, body)

    def _encode(self, _ud, handle, sink):
        def body():
            data = self.machine.encode(self.state(handle))
            return _lib.as_bytes(data, "encode's result")

        data = self._guard("encode", None, body)
        if not isinstance(data, bytes):
            data = UNENCODABLE + _tls.error.encode("utf-8", errors="replace")
        _lib.lib.pc_sink_write(sink, data, len(data))

    def _decode(self, _ud, view, data, n, out):
        entity = _view(view.contents)

        def body():
            raw = _data(data, n)
            if raw.startswith(UNENCODABLE):
                text = raw[len(UNENCODABLE) :].decode("utf-8", errors="replace")
                raise Refused(f"the checkpoint was written while encode raised ({text})", 1)
            out[0] = self._put(self.machine.decode(entity, raw))
            return 0

        return self._guard("decode", entity, body)

    def _validate(self, _ud, record, n):
        def body():
            self.machine.validate(_data(record, n))
            return 0

        return self._guard("validate", None, body)

    def _repair(self, _ud, view, handle, unclean, out):
        entity = _view(view.contents)

        def body():
            for rec in self.machine.repair(entity, self.state(handle), unclean) or ():
                rec = _lib.as_bytes(rec, "a repair record")
                code = _lib.lib.pc_records_push(out, rec, len(rec))
                if code:
                    raise Refused(f"pc_records_push answered {code}", code)
            return 0

        return self._guard("repair", entity, body)

    def _free_state(self, _ud, handle):
        self.states.pop(handle, None)

    def _destroy(self, _ud):
        # The callbacks stay referenced: C may still be returning through this one. The
        # engine drops the bridge after the C call that ran destroy has returned.
        self.destroyed.set()
