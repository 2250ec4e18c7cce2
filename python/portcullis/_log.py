"""The library's log lines, in Python's `logging` (logger "portcullis"): background failures
(a checkpoint that could not be published, a failed sync, a revocation that gave up) are
visible without a C log callback of one's own.

Owns: the process-wide `pc_log_callback` the package installs at import (warnings and errors
by default; `set_log_level` changes it) and removes at exit, before the interpreter stops
running callbacks.
"""

from __future__ import annotations

import atexit
import logging

from . import _lib
from .errors import check

log = logging.getLogger("portcullis")
log.addHandler(logging.NullHandler())  # the application decides where lines go

_LEVELS = {
    _lib.LOG_ERROR: logging.ERROR,
    _lib.LOG_WARN: logging.WARNING,
    _lib.LOG_INFO: logging.INFO,
    _lib.LOG_DEBUG: logging.DEBUG,
    _lib.LOG_TRACE: logging.DEBUG - 5,
}


def _forward(_ud: object, level: int, target: bytes, message: bytes) -> None:
    try:
        log.log(
            _LEVELS.get(level, logging.WARNING),
            "%s: %s",
            target.decode("utf-8", errors="replace"),
            message.decode("utf-8", errors="replace"),
        )
    except BaseException:  # noqa: BLE001 - nothing may unwind into C
        pass


# Referenced for the life of the process: C holds a pointer to it until `_uninstall` returns.
_CALLBACK = _lib.LOG(_forward)


def set_log_level(level: int) -> None:
    """Forwards the library's lines at `level` (a `logging` level) and above."""
    if level <= logging.DEBUG - 5:
        pc = _lib.LOG_TRACE
    elif level <= logging.DEBUG:
        pc = _lib.LOG_DEBUG
    elif level <= logging.INFO:
        pc = _lib.LOG_INFO
    elif level <= logging.WARNING:
        pc = _lib.LOG_WARN
    else:
        pc = _lib.LOG_ERROR
    check(_lib.lib.pc_log_callback(_CALLBACK, None, pc))


def _install() -> None:
    # Another logger for Rust's `log` facade in this process (PC_UNAVAILABLE) keeps the lines.
    if _lib.lib.pc_log_callback(_CALLBACK, None, _lib.LOG_WARN) == 0:
        atexit.register(_uninstall)


def _uninstall() -> None:
    # Returns once no line is being delivered: after it, C never calls `_forward` again.
    _lib.lib.pc_log_callback(_lib.LOG(), None, _lib.LOG_WARN)


_install()
