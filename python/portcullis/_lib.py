"""Loads the C library of Portcullis and declares every function of `portcullis.h`.

Owns: finding the shared library (the one `pip install` built into this package; for a
development checkout without an install, `PORTCULLIS_LIB` or the workspace's `target/release`
or `target/debug`), the ctypes mirror of the header's structs, callback types and constants,
and the argument and result types of each function (`tests/test_header.py` checks them against
the header).

The library is loaded with `ctypes.CDLL`, which releases the GIL for the duration of every
call: a call that blocks in C (a durable write, a warm wait, a revocation) never stops the
engine's pool threads from running Python callbacks. `PyDLL` would hold the GIL and deadlock.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import sys
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any

ENV_VAR = "PORTCULLIS_LIB"
#: The native library's module name inside this package (built by `pip install`).
NATIVE = "_native"


def _file_name() -> str:
    if sys.platform == "win32":
        return "portcullis_ffi.dll"
    if sys.platform == "darwin":
        return "libportcullis_ffi.dylib"
    return "libportcullis_ffi.so"


def bundled() -> Path | None:
    """The library `pip install` placed in this package, if any."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / (NATIVE + suffix)
        if path.is_file():
            return path
    return None


def candidates() -> list[Path]:
    """The paths tried, in order: `$PORTCULLIS_LIB` (an explicit override), the library
    installed with the package, then `target/{release,debug}` under `$CARGO_TARGET_DIR` and
    under the workspace that holds this package (a development checkout)."""
    found = []
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        found.append(Path(explicit))
    installed = bundled()
    if installed is not None:
        found.append(installed)
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(Path(os.environ["CARGO_TARGET_DIR"]))
    roots.append(Path(__file__).resolve().parents[2] / "target")
    for root in roots:
        for profile in ("release", "debug"):
            found.append(root / profile / _file_name())
    return found


def _load() -> ctypes.CDLL:
    tried = candidates()
    explicit = os.environ.get(ENV_VAR)
    # A test-only switch (a negative control): PyDLL holds the GIL during every call.
    loader = ctypes.PyDLL if os.environ.get("PORTCULLIS_TEST_PYDLL") == "1" else ctypes.CDLL
    for path in tried:
        if path.is_file():
            return loader(str(path))
        if explicit and path == Path(explicit):
            raise OSError(f"{ENV_VAR} names {path}, which does not exist")
    raise OSError(
        "the Portcullis C library was not found (tried "
        + ", ".join(str(p) for p in tried)
        + "): install the package with `pip install ./python` from the repository, which "
        + "builds it"
    )


# -- Structs (the header's, field for field) ---------------------------------------------------


class Bytes(Structure):
    _fields_ = [("data", POINTER(c_uint8)), ("len", c_size_t)]


class EntityView(Structure):
    _fields_ = [
        ("ns", POINTER(c_uint8)),
        ("ns_len", c_size_t),
        ("id", POINTER(c_uint8)),
        ("id_len", c_size_t),
    ]


class ApplyContextC(Structure):
    _fields_ = [("entity", EntityView), ("seq", c_uint64), ("origin", c_uint32)]


class Slice(Structure):
    _fields_ = [("data", c_void_p), ("len", c_size_t)]


class Written(Structure):
    _fields_ = [
        ("wrote", c_bool),
        ("first_seq", c_uint64),
        ("last_seq", c_uint64),
        ("decision", c_uint32),
    ]


class Deferred(Structure):
    _fields_ = [("kind", c_uint32), ("seq", c_uint64)]


class WarmProgress(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("done", c_uint64),
        ("total", c_uint64),
        ("refused", c_uint64),
        ("elapsed_ms", c_uint64),
        ("finished", c_bool),
        ("stopped", c_bool),
    ]


class RevokeProgress(Structure):
    _fields_ = [("complete", c_bool), ("remaining", c_uint64)]


STAT_NAMES = (
    "incarnation",
    "unclean_previous",
    "entities",
    "pending",
    "running",
    "restored",
    "contained",
    "units_run",
    "store_batches",
    "store_syncs",
    "store_partitions",
    "resident",
    "passivated",
    "max_resident_entities",
    "namespaces",
    "owner_lease_renewals",
    "owner_lease_failed_renewals",
    "store_stalls",
    "store_sync_count",
    "store_sync_total_us",
    "store_sync_max_us",
    "store_compactions",
    "store_compactions_failed",
    "degraded",
)


class EngineStats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, c_uint64) for name in STAT_NAMES]


#: `pc_store_stats`' counters, in order (after `struct_size`).
STORE_STAT_NAMES = (
    "batches",
    "syncs",
    "bytes_written",
    "partitions",
    "partitions_loaded",
    "max_loaded_partitions",
    "segments",
    "compactions",
    "compactions_failed",
    "garbage_bytes",
    "stalls",
    "sync_count",
    "sync_total_us",
    "sync_max_us",
    "degraded",
)


class StoreStats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, c_uint64) for name in STORE_STAT_NAMES]


class Event(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kind", c_uint32),
        ("name", c_char_p),
        ("subject", c_char_p),
        ("message", c_char_p),
        ("elapsed_us", c_uint64),
        ("epoch", c_uint64),
    ]


class Outcome(Structure):
    _fields_ = [("kind", c_uint32), ("index", c_uint64), ("now_ms", c_uint64)]


def sized(struct_type: type[Structure]) -> Any:
    """A struct that starts with `struct_size`, with it set."""
    value = struct_type()
    value.struct_size = ctypes.sizeof(struct_type)
    return value


# -- Callback types (pc_machine's fields, pc_decide_fn, pc_visit_fn, pc_log_fn) ----------------

FRESH = CFUNCTYPE(c_uint32, c_void_p, POINTER(EntityView), POINTER(c_void_p))
APPLY = CFUNCTYPE(c_uint32, c_void_p, c_void_p, POINTER(ApplyContextC), POINTER(c_uint8), c_size_t)
ENCODE = CFUNCTYPE(c_uint32, c_void_p, c_void_p, c_void_p)
DECODE = CFUNCTYPE(
    c_uint32, c_void_p, POINTER(EntityView), POINTER(c_uint8), c_size_t, POINTER(c_void_p)
)
VALIDATE = CFUNCTYPE(c_uint32, c_void_p, POINTER(c_uint8), c_size_t)
REPAIR = CFUNCTYPE(c_uint32, c_void_p, POINTER(EntityView), c_void_p, c_uint64, c_void_p)
FREE_STATE = CFUNCTYPE(None, c_void_p, c_void_p)
DESTROY = CFUNCTYPE(None, c_void_p)
CHECK = CFUNCTYPE(c_uint32, c_void_p, c_void_p, POINTER(ApplyContextC), POINTER(c_uint8), c_size_t)
UPCAST_RECORD = CFUNCTYPE(c_uint32, c_void_p, c_uint32, POINTER(c_uint8), c_size_t, c_void_p)
UPCAST_CHECKPOINT = CFUNCTYPE(
    c_uint32,
    c_void_p,
    POINTER(EntityView),
    c_uint32,
    POINTER(c_uint8),
    c_size_t,
    POINTER(c_void_p),
)
DECIDE = CFUNCTYPE(c_uint32, c_void_p, c_void_p, c_void_p)
VISIT = CFUNCTYPE(c_uint32, c_void_p, c_void_p)
LOG = CFUNCTYPE(None, c_void_p, c_uint32, c_char_p, c_char_p)
EVENT = CFUNCTYPE(None, c_void_p, POINTER(Event))


class Machine(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("user_data", c_void_p),
        ("fresh", FRESH),
        ("apply", APPLY),
        ("encode", ENCODE),
        ("decode", DECODE),
        ("validate", VALIDATE),
        ("repair", REPAIR),
        ("free_state", FREE_STATE),
        ("destroy", DESTROY),
        ("check", CHECK),
        ("version", c_uint32),
        ("upcast_record", UPCAST_RECORD),
        ("upcast_checkpoint", UPCAST_CHECKPOINT),
    ]


# -- Constants (the header's, without the PC_ prefix) ------------------------------------------

ABI_VERSION = 1

#: The callback code of a refusal for a record or checkpoint of a version the machine does not
#: read (`pc_error_callback_code`; not an error code).
VERSION_REFUSED = 0x5056

SYNC_EVERY_COMMIT = 0x0101
SYNC_PERIODIC_MAY_LOSE_RECENT = 0x0102
SYNC_NEVER_MAY_LOSE_RECENT = 0x0103

ADOPT_ON_FIRST_USE = 0x0201
REGISTER_ON_FIRST_WRITE = 0x0202
TRUNCATE_AFTER_CHECKPOINT = 0x0203
WARM_ON_OPEN = 0x0204
SWEEP_EXPIRED_LEASES = 0x0205
BACKGROUND_WARM = 0x0206

POOL_THREADS = 0x0301
WARM_PARALLELISM = 0x0302
CHECKPOINT_EVERY = 0x0303
CHECKPOINT_TAIL_BOUND = 0x0304
CLOSE_TIMEOUT_MS = 0x0305
SWEEP_INTERVAL_MS = 0x0306
MAX_RESIDENT_ENTITIES = 0x0307
POOL_STACK_SIZE = 0x0308

OUTCOME_COMMITTED = 0x0401
OUTCOME_PRECONDITION_FAILED = 0x0402
OUTCOME_DEADLINE_PASSED = 0x0403

DEFERRED_QUEUED = 0x0501
DEFERRED_ALREADY_ACCEPTED = 0x0502
DEFERRED_APPLIED = 0x0503

ORIGIN_REPLAY = 0x0601
ORIGIN_DEFERRED = 0x0602
ORIGIN_REPAIR = 0x0603
ORIGIN_LIVE = 0x0604
ORIGIN_UNKNOWN = 0x06FF

LOG_ERROR = 0x0701
LOG_WARN = 0x0702
LOG_INFO = 0x0703
LOG_DEBUG = 0x0704
LOG_TRACE = 0x0705

EVENT_COMMIT_STALL = 0x0901
EVENT_SYNC_FAILED = 0x0902
EVENT_COMPACTION_STARTED = 0x0903
EVENT_COMPACTION_FINISHED = 0x0904
EVENT_COMPACTION_FAILED = 0x0905
EVENT_TORN_TAIL = 0x0906
EVENT_DAMAGED = 0x0907
EVENT_REBUILT = 0x0908
EVENT_SNAPSHOT_FAILED = 0x0909
EVENT_SNAPSHOTS_STOPPED = 0x090A
EVENT_BACKGROUND_THREAD_ENDED = 0x090B
EVENT_REFUSED = 0x090C
EVENT_DEFERRAL_REFUSED = 0x090D
EVENT_CONTAINED = 0x090E
EVENT_WARM_FINISHED = 0x090F
EVENT_WARM_FAILED = 0x0910
EVENT_REVOCATION_STARTED = 0x0911
EVENT_REVOCATION_COMPLETED = 0x0912
EVENT_TOOK_OVER = 0x0913
EVENT_DEPOSED = 0x0914
EVENT_SWEPT = 0x0915
EVENT_RENEWAL_FAILED = 0x0916

DEGRADED_SYNC_FAILED = 0x0A01
DEGRADED_BACKGROUND_THREAD_ENDED = 0x0A02
DEGRADED_SNAPSHOTS_STOPPED = 0x0A03
DEGRADED_SNAPSHOT_FAILED = 0x0A04
DEGRADED_COMPACTION_FAILED = 0x0A05
DEGRADED_OWNER_LEASE_NOT_RENEWED = 0x0A06

# -- Functions ---------------------------------------------------------------------------------

_u8p = POINTER(c_uint8)
_u32, _u64, _size, _ptr, _str = c_uint32, c_uint64, c_size_t, c_void_p, c_char_p

# name: (result type, argument types, takes the trailing `pc_error *err`); every pointer to an
# opaque handle is a c_void_p.
_SIGNATURES: dict[str, tuple[Any, list[Any], bool]] = {
    "pc_abi_version": (_u32, [], False),
    "pc_version": (_str, [], False),
    "pc_bytes_free": (None, [POINTER(Bytes)], False),
    "pc_last_error_message": (_u32, [POINTER(c_char), _size, POINTER(_size)], False),
    "pc_error_name": (_str, [_u32], False),
    "pc_error_new": (_u32, [POINTER(_ptr)], False),
    "pc_error_free": (None, [_ptr], False),
    "pc_error_code": (_u32, [_ptr], False),
    "pc_error_message": (_str, [_ptr], False),
    "pc_error_retry_after_ms": (_u64, [_ptr], False),
    "pc_error_callback_code": (_u32, [_ptr], False),
    "pc_error_last": (_u32, [_ptr], False),
    "pc_log_callback": (_u32, [LOG, _ptr, _u32], True),
    "pc_engine_options_new": (_u32, [POINTER(_ptr)], True),
    "pc_engine_options_free": (None, [_ptr], False),
    "pc_engine_options_directory": (_u32, [_ptr, _str], True),
    "pc_engine_options_store": (_u32, [_ptr, _ptr], True),
    "pc_engine_options_clock": (_u32, [_ptr, _ptr], True),
    "pc_engine_options_sync_policy": (_u32, [_ptr, _u32, _u64], True),
    "pc_engine_options_owner": (_u32, [_ptr, _str], True),
    "pc_engine_options_own": (_u32, [_ptr, _str, c_bool], True),
    "pc_engine_options_flag": (_u32, [_ptr, _u32, c_bool], True),
    "pc_engine_options_number": (_u32, [_ptr, _u32, _u64], True),
    "pc_engine_options_fence": (_u32, [_ptr, _u64, _u64, _u64, _u64], True),
    "pc_engine_open": (_u32, [_ptr, POINTER(Machine), POINTER(_ptr)], True),
    "pc_engine_close": (_u32, [_ptr], True),
    "pc_engine_free": (None, [_ptr], False),
    "pc_engine_register": (_u32, [_ptr, _str, _ptr, _size, POINTER(c_bool)], True),
    "pc_engine_read": (_u32, [_ptr, _str, _ptr, _size, POINTER(Bytes)], True),
    "pc_engine_visit": (_u32, [_ptr, _str, _ptr, _size, VISIT, _ptr, POINTER(_u32)], True),
    "pc_engine_append": (
        _u32,
        [_ptr, _str, _ptr, _size, POINTER(Slice), _size, POINTER(_u64), POINTER(_u64)],
        True,
    ),
    "pc_engine_write": (_u32, [_ptr, _str, _ptr, _size, DECIDE, _ptr, POINTER(Written)], True),
    "pc_engine_defer": (
        _u32,
        [_ptr, _str, _ptr, _size, _ptr, _size, _ptr, _size, POINTER(Deferred)],
        True,
    ),
    "pc_engine_checkpoint": (_u32, [_ptr, _str, _ptr, _size, POINTER(_u64)], True),
    "pc_engine_release": (_u32, [_ptr, _str, _ptr, _size, POINTER(c_bool)], True),
    "pc_engine_entities": (_u32, [_ptr, POINTER(_ptr)], True),
    "pc_entity_list_len": (_size, [_ptr], False),
    "pc_entity_list_get": (_u32, [_ptr, _size, POINTER(EntityView)], True),
    "pc_entity_list_free": (None, [_ptr], False),
    "pc_engine_history": (_u32, [_ptr, _str, _ptr, _size, _u64, _size, POINTER(_ptr)], True),
    "pc_history_page_len": (_size, [_ptr], False),
    "pc_history_page_record": (
        _u32,
        [_ptr, _size, POINTER(_u64), POINTER(_u8p), POINTER(_size)],
        True,
    ),
    "pc_history_page_next": (_u32, [_ptr, POINTER(c_bool), POINTER(_u64)], True),
    "pc_history_page_free": (None, [_ptr], False),
    "pc_engine_containment": (
        _u32,
        [_ptr, _str, _ptr, _size, POINTER(c_bool), POINTER(Bytes)],
        True,
    ),
    "pc_engine_warm": (_u32, [_ptr, POINTER(_ptr)], True),
    "pc_warm_get_progress": (_u32, [_ptr, POINTER(WarmProgress)], True),
    "pc_warm_wait": (_u32, [_ptr, _u64, POINTER(c_bool)], True),
    "pc_warm_stop": (_u32, [_ptr], True),
    "pc_warm_free": (None, [_ptr], False),
    "pc_engine_own": (_u32, [_ptr, _str, POINTER(_u64)], True),
    "pc_engine_release_namespace": (_u32, [_ptr, _str], True),
    "pc_engine_current_epoch": (_u32, [_ptr, _str, POINTER(_u64)], True),
    "pc_engine_bump_epoch": (_u32, [_ptr, _str, _u64], True),
    "pc_engine_revoke_step": (_u32, [_ptr, _str, _u64, POINTER(RevokeProgress)], True),
    "pc_engine_revoke_to_completion": (_u32, [_ptr, _str, _u64, POINTER(_u64)], True),
    "pc_engine_mark_recovered": (_u32, [_ptr, _str], True),
    "pc_envelope_write": (_u32, [_u32, _ptr, _size, POINTER(Bytes)], True),
    "pc_envelope_split": (
        _u32,
        [_ptr, _size, POINTER(_u32), POINTER(_size), POINTER(c_bool)],
        True,
    ),
    "pc_sink_write": (_u32, [_ptr, _ptr, _size], True),
    "pc_records_push": (_u32, [_ptr, _ptr, _size], True),
    "pc_records_refuse": (_u32, [_ptr, _str], True),
    "pc_refuse": (_u32, [_str], True),
    "pc_engine_get_stats": (_u32, [_ptr, POINTER(EngineStats)], True),
    "pc_engine_options_listener": (_u32, [_ptr, EVENT, _ptr], True),
    "pc_store_open_file_listened": (
        _u32,
        [_str, _u32, _u64, _ptr, EVENT, _ptr, POINTER(_ptr)],
        True,
    ),
    "pc_store_get_stats": (_u32, [_ptr, POINTER(StoreStats)], True),
    "pc_store_degraded": (_u32, [_ptr, POINTER(_u32), POINTER(Bytes)], True),
    "pc_engine_degraded": (_u32, [_ptr, POINTER(_u32), POINTER(Bytes)], True),
    "pc_clock_new_manual": (_u32, [_u64, POINTER(_ptr)], True),
    "pc_clock_advance": (_u32, [_ptr, _u64], True),
    "pc_clock_free": (None, [_ptr], False),
    "pc_store_open_file": (_u32, [_str, _u32, _u64, _ptr, POINTER(_ptr)], True),
    "pc_store_open_memory": (_u32, [_ptr, POINTER(_ptr)], True),
    "pc_store_get": (
        _u32,
        [_ptr, _ptr, _size, _ptr, _size, POINTER(Bytes), POINTER(c_bool)],
        True,
    ),
    "pc_store_scan": (
        _u32,
        [_ptr, _ptr, _size, _ptr, _size, _ptr, _size, _ptr, _size, _size, POINTER(_ptr)],
        True,
    ),
    "pc_scan_page_len": (_size, [_ptr], False),
    "pc_scan_page_entry": (
        _u32,
        [_ptr, _size, POINTER(_u8p), POINTER(_size), POINTER(_u8p), POINTER(_size)],
        True,
    ),
    "pc_scan_page_next": (_u32, [_ptr, POINTER(c_bool), POINTER(_u8p), POINTER(_size)], True),
    "pc_scan_page_free": (None, [_ptr], False),
    "pc_batch_new": (_u32, [POINTER(_ptr)], True),
    "pc_batch_equals": (_u32, [_ptr, _ptr, _size, _ptr, _size], True),
    "pc_batch_absent": (_u32, [_ptr, _ptr, _size], True),
    "pc_batch_present": (_u32, [_ptr, _ptr, _size], True),
    "pc_batch_not_after": (_u32, [_ptr, _u64], True),
    "pc_batch_put": (_u32, [_ptr, _ptr, _size, _ptr, _size], True),
    "pc_batch_delete": (_u32, [_ptr, _ptr, _size], True),
    "pc_batch_delete_range": (_u32, [_ptr, _ptr, _size, _ptr, _size], True),
    "pc_batch_free": (None, [_ptr], False),
    "pc_store_apply": (_u32, [_ptr, _ptr, _size, _ptr, POINTER(Outcome)], True),
    "pc_store_close": (_u32, [_ptr], True),
    "pc_store_free": (None, [_ptr], False),
}


class _Functions:
    """The library's functions. A function that takes the trailing `pc_error *err` is called
    without it here: the wrapper passes NULL and reads the calling thread's last error (a ctypes
    call and the read after it run on the same thread)."""

    def __init__(self, dll: ctypes.CDLL) -> None:
        self.dll = dll
        for name, (restype, argtypes, takes_err) in _SIGNATURES.items():
            f = getattr(dll, name)
            f.restype = restype
            f.argtypes = argtypes + ([c_void_p] if takes_err else [])
            if takes_err:
                setattr(self, name, _without_err(f))
            else:
                setattr(self, name, f)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"portcullis.h declares no function {name}")


def _without_err(f: Any) -> Any:
    def call(*args: Any) -> Any:
        return f(*args, None)

    call.__name__ = f.__name__
    call.raw = f  # type: ignore[attr-defined]
    return call


dll = _load()
lib: Any = _Functions(dll)

if lib.pc_abi_version() < ABI_VERSION:
    raise OSError(
        f"the Portcullis C library has ABI version {lib.pc_abi_version()}, older than the "
        f"{ABI_VERSION} this package needs: reinstall the package"
    )


def take_bytes(buf: Bytes) -> bytes:
    """Copies a `pc_bytes` the library filled into Python bytes and frees it."""
    try:
        return ctypes.string_at(buf.data, buf.len) if buf.len else b""
    finally:
        lib.pc_bytes_free(ctypes.byref(buf))


def as_bytes(value: Any, what: str) -> bytes:
    """An id, key, value or record: bytes (or bytes-like), or a str encoded as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def as_name(value: Any, what: str) -> bytes:
    """A namespace, owner or path: a str (or bytes) passed NUL-terminated."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if b"\0" in value:
        raise ValueError(f"{what} must not contain a NUL character")
    return value
