"""Loads the C library of Portcullis and declares every function of `ffi/include/portcullis.h`.

Owns: finding the shared library (`PORTCULLIS_LIB`, else `target/release` or `target/debug`
of the workspace this package sits in), the ctypes mirror of the header's structs, callback
types and constants, and the argument and result types of each function.

The library is loaded with `ctypes.CDLL`, which releases the GIL for the duration of every
call: a call that blocks in C (a durable write, a warm wait, a revocation) never stops the
engine's pool threads from running Python callbacks. `PyDLL` would hold the GIL and deadlock.
"""

import ctypes
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

ENV_VAR = "PORTCULLIS_LIB"


def _file_name():
    if sys.platform == "win32":
        return "portcullis_ffi.dll"
    if sys.platform == "darwin":
        return "libportcullis_ffi.dylib"
    return "libportcullis_ffi.so"


def candidates():
    """The paths tried, in order: `$PORTCULLIS_LIB`, then `target/{release,debug}` under
    `$CARGO_TARGET_DIR` and under the workspace that holds this package."""
    found = []
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        found.append(Path(explicit))
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(Path(os.environ["CARGO_TARGET_DIR"]))
    roots.append(Path(__file__).resolve().parents[2] / "target")
    for root in roots:
        for profile in ("release", "debug"):
            found.append(root / profile / _file_name())
    return found


def _load():
    tried = candidates()
    explicit = os.environ.get(ENV_VAR)
    # A test-only switch (a negative control): PyDLL holds the GIL during every call.
    loader = ctypes.PyDLL if os.environ.get("PORTCULLIS_TEST_PYDLL") == "1" else ctypes.CDLL
    for path in tried:
        if path.is_file():
            return loader(str(path))
        if explicit and path == Path(explicit):
            raise OSError(
                f"{ENV_VAR} names {path}, which does not exist: build the C library with "
                "`cargo build --release -p portcullis-ffi` and point it at the shared library"
            )
    raise OSError(
        "the Portcullis C library was not found (tried "
        + ", ".join(str(p) for p in tried)
        + "): build it with `cargo build --release -p portcullis-ffi`, or set "
        + f"{ENV_VAR} to the path of {_file_name()}"
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
        ("done", c_uint64),
        ("total", c_uint64),
        ("refused", c_uint64),
        ("elapsed_ms", c_uint64),
        ("finished", c_bool),
        ("stopped", c_bool),
    ]


class RevokeProgress(Structure):
    _fields_ = [("complete", c_bool), ("remaining", c_uint64)]


class EngineStats(Structure):
    _fields_ = [
        (name, c_uint64)
        for name in (
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
        )
    ]


class Outcome(Structure):
    _fields_ = [("kind", c_uint32), ("index", c_uint64), ("now_ms", c_uint64)]


# -- Callback types (pc_machine's fields and pc_decide_fn) -------------------------------------

FRESH = CFUNCTYPE(c_void_p, c_void_p, POINTER(EntityView))
APPLY = CFUNCTYPE(c_uint32, c_void_p, c_void_p, POINTER(ApplyContextC), POINTER(c_uint8), c_size_t)
ENCODE = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)
DECODE = CFUNCTYPE(
    c_uint32, c_void_p, POINTER(EntityView), POINTER(c_uint8), c_size_t, POINTER(c_void_p)
)
VALIDATE = CFUNCTYPE(c_uint32, c_void_p, POINTER(c_uint8), c_size_t)
REPAIR = CFUNCTYPE(c_uint32, c_void_p, POINTER(EntityView), c_void_p, c_uint64, c_void_p)
FREE_STATE = CFUNCTYPE(None, c_void_p, c_void_p)
DESTROY = CFUNCTYPE(None, c_void_p)
DECIDE = CFUNCTYPE(c_uint32, c_void_p, c_void_p, c_void_p)


class Machine(Structure):
    _fields_ = [
        ("user_data", c_void_p),
        ("fresh", FRESH),
        ("apply", APPLY),
        ("encode", ENCODE),
        ("decode", DECODE),
        ("validate", VALIDATE),
        ("repair", REPAIR),
        ("free_state", FREE_STATE),
        ("destroy", DESTROY),
    ]


# -- Constants (the header's) ------------------------------------------------------------------

ADOPT_ON_FIRST_USE = 0
REGISTER_ON_FIRST_WRITE = 1
TRUNCATE_AFTER_CHECKPOINT = 2
WARM_ON_OPEN = 3

POOL_THREADS = 0
WARM_PARALLELISM = 1
CHECKPOINT_EVERY = 2
CHECKPOINT_TAIL_BOUND = 3
CLOSE_TIMEOUT_MS = 4

SYNC_EVERY_COMMIT = 0
SYNC_PERIODIC_MAY_LOSE_RECENT = 1
SYNC_NEVER_MAY_LOSE_RECENT = 2

OUTCOME_COMMITTED = 0
OUTCOME_PRECONDITION_FAILED = 1
OUTCOME_DEADLINE_PASSED = 2

DEFERRED_QUEUED = 0
DEFERRED_ALREADY_ACCEPTED = 1
DEFERRED_APPLIED = 2

# -- Functions ---------------------------------------------------------------------------------

_u8p = POINTER(c_uint8)
_u32, _u64, _size, _ptr, _str = c_uint32, c_uint64, c_size_t, c_void_p, c_char_p

# name: (result type, argument types); every pointer to an opaque handle is a c_void_p.
_SIGNATURES = {
    "pc_bytes_free": (None, [POINTER(Bytes)]),
    "pc_last_error_message": (_u32, [POINTER(c_char), _size, POINTER(_size)]),
    "pc_error_name": (_str, [_u32]),
    "pc_engine_options_new": (_u32, [POINTER(_ptr)]),
    "pc_engine_options_free": (None, [_ptr]),
    "pc_engine_options_directory": (_u32, [_ptr, _str]),
    "pc_engine_options_store": (_u32, [_ptr, _ptr]),
    "pc_engine_options_clock": (_u32, [_ptr, _ptr]),
    "pc_engine_options_sync_policy": (_u32, [_ptr, _u32, _u64]),
    "pc_engine_options_owner": (_u32, [_ptr, _str]),
    "pc_engine_options_own": (_u32, [_ptr, _str, c_bool]),
    "pc_engine_options_flag": (_u32, [_ptr, _u32, c_bool]),
    "pc_engine_options_number": (_u32, [_ptr, _u32, _u64]),
    "pc_engine_options_fence": (_u32, [_ptr, _u64, _u64, _u64, _u64]),
    "pc_engine_open": (_u32, [_ptr, POINTER(Machine), POINTER(_ptr)]),
    "pc_engine_close": (_u32, [_ptr]),
    "pc_engine_free": (None, [_ptr]),
    "pc_engine_register": (_u32, [_ptr, _str, _ptr, _size, POINTER(c_bool)]),
    "pc_engine_read": (_u32, [_ptr, _str, _ptr, _size, POINTER(Bytes)]),
    "pc_engine_append": (
        _u32,
        [_ptr, _str, _ptr, _size, POINTER(Slice), _size, POINTER(_u64), POINTER(_u64)],
    ),
    "pc_engine_write": (_u32, [_ptr, _str, _ptr, _size, DECIDE, _ptr, POINTER(Written)]),
    "pc_engine_defer": (
        _u32,
        [_ptr, _str, _ptr, _size, _ptr, _size, _ptr, _size, POINTER(Deferred)],
    ),
    "pc_engine_checkpoint": (_u32, [_ptr, _str, _ptr, _size, POINTER(_u64)]),
    "pc_engine_release": (_u32, [_ptr, _str, _ptr, _size, POINTER(c_bool)]),
    "pc_engine_warm": (_u32, [_ptr, POINTER(_ptr)]),
    "pc_warm_get_progress": (_u32, [_ptr, POINTER(WarmProgress)]),
    "pc_warm_wait": (_u32, [_ptr, _u64, POINTER(c_bool)]),
    "pc_warm_stop": (_u32, [_ptr]),
    "pc_warm_free": (None, [_ptr]),
    "pc_engine_own": (_u32, [_ptr, _str, POINTER(_u64)]),
    "pc_engine_release_namespace": (_u32, [_ptr, _str]),
    "pc_engine_current_epoch": (_u32, [_ptr, _str, POINTER(_u64)]),
    "pc_engine_bump_epoch": (_u32, [_ptr, _str, _u64]),
    "pc_engine_revoke_step": (_u32, [_ptr, _str, _u64, POINTER(RevokeProgress)]),
    "pc_engine_revoke_to_completion": (_u32, [_ptr, _str, _u64, POINTER(_u64)]),
    "pc_engine_mark_recovered": (_u32, [_ptr, _str]),
    "pc_sink_write": (_u32, [_ptr, _ptr, _size]),
    "pc_records_push": (_u32, [_ptr, _ptr, _size]),
    "pc_engine_get_stats": (_u32, [_ptr, POINTER(EngineStats)]),
    "pc_clock_new_manual": (_u32, [_u64, POINTER(_ptr)]),
    "pc_clock_advance": (_u32, [_ptr, _u64]),
    "pc_clock_free": (None, [_ptr]),
    "pc_store_open_file": (_u32, [_str, _u32, _u64, _ptr, POINTER(_ptr)]),
    "pc_store_open_memory": (_u32, [_ptr, POINTER(_ptr)]),
    "pc_store_get": (
        _u32,
        [_ptr, _ptr, _size, _ptr, _size, POINTER(Bytes), POINTER(c_bool)],
    ),
    "pc_store_scan": (
        _u32,
        [_ptr, _ptr, _size, _ptr, _size, _ptr, _size, _ptr, _size, _size, POINTER(_ptr)],
    ),
    "pc_scan_page_len": (_size, [_ptr]),
    "pc_scan_page_entry": (
        _u32,
        [_ptr, _size, POINTER(_u8p), POINTER(_size), POINTER(_u8p), POINTER(_size)],
    ),
    "pc_scan_page_next": (_u32, [_ptr, POINTER(c_bool), POINTER(_u8p), POINTER(_size)]),
    "pc_scan_page_free": (None, [_ptr]),
    "pc_batch_new": (_u32, [POINTER(_ptr)]),
    "pc_batch_equals": (_u32, [_ptr, _ptr, _size, _ptr, _size]),
    "pc_batch_absent": (_u32, [_ptr, _ptr, _size]),
    "pc_batch_present": (_u32, [_ptr, _ptr, _size]),
    "pc_batch_not_after": (_u32, [_ptr, _u64]),
    "pc_batch_put": (_u32, [_ptr, _ptr, _size, _ptr, _size]),
    "pc_batch_delete": (_u32, [_ptr, _ptr, _size]),
    "pc_batch_delete_range": (_u32, [_ptr, _ptr, _size, _ptr, _size]),
    "pc_batch_free": (None, [_ptr]),
    "pc_store_apply": (_u32, [_ptr, _ptr, _size, _ptr, POINTER(Outcome)]),
    "pc_store_close": (_u32, [_ptr]),
    "pc_store_free": (None, [_ptr]),
}

lib = _load()
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype = _restype
    _f.argtypes = _argtypes


def take_bytes(buf):
    """Copies a `pc_bytes` the library filled into Python bytes and frees it."""
    try:
        return ctypes.string_at(buf.data, buf.len) if buf.len else b""
    finally:
        lib.pc_bytes_free(ctypes.byref(buf))


def as_bytes(value, what):
    """An id, key, value or record: bytes (or bytes-like), or a str encoded as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def as_name(value, what):
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
