"""Shared set-up of the Python tests: a counting state machine and temporary directories. The
tests import the installed package (`pip install ./python`); nothing here edits `sys.path`.

Counter: an entity's state sums 8-byte little-endian records and counts one-byte repair
markers b"R". Switches make it refuse or raise on chosen records, and it notes the threads
its callbacks ran on.
"""

import struct
import tempfile
import threading
import unittest

import portcullis

#: What a test waits for a thread or a warm at most; reaching it fails the test.
TIMEOUT = 60.0


def record(value):
    return struct.pack("<Q", value)


class Counter(portcullis.StateMachine):
    def __init__(self):
        self.raise_on_replay_of = None  # apply raises ValueError replaying this value
        self.apply_threads = set()  # names of the threads apply ran on
        self.applies = 0
        self._lock = threading.Lock()  # held only inside a callback, never across a C call

    def fresh(self, entity):
        return {"sum": 0, "records": 0, "repairs": 0}

    def apply(self, state, data, ctx):
        with self._lock:
            self.applies += 1
            self.apply_threads.add(threading.current_thread().name)
        if data == b"R":
            state["repairs"] += 1
            return None
        if len(data) != 8:
            raise portcullis.Refused("not an 8-byte record", code=3)
        (value,) = struct.unpack("<Q", data)
        if value == self.raise_on_replay_of and ctx.origin == "replay":
            raise ValueError(f"cannot fold the value {value}")
        state["sum"] += value
        state["records"] += 1
        return None

    def encode(self, state):
        return struct.pack("<QQQ", state["sum"], state["records"], state["repairs"])

    def decode(self, entity, data):
        if len(data) != 24:
            raise portcullis.Refused("not a counter checkpoint", code=5)
        s, r, p = struct.unpack("<QQQ", data)
        return {"sum": s, "records": r, "repairs": p}

    def validate(self, data):
        if data != b"R" and len(data) != 8:
            raise portcullis.Refused("a record is 8 bytes", code=7)

    def repair(self, entity, state, unclean):
        return [b"R"]


class TempDirTest(unittest.TestCase):
    """A test with a fresh temporary directory in `self.dir`."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="portcullis-py-")
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name


def small(machine, directory=None, **options):
    """An engine with a small pool, as the tests use. The background warm is off unless a test
    turns it on: these tests count restores and listen for events, and the background warm
    restores an adopted namespace's entities on the engine's own schedule."""
    options.setdefault("pool_threads", 2)
    options.setdefault("background_warm", False)
    options.setdefault("close_timeout", 20)
    return portcullis.Engine.open(machine, directory, **options)
