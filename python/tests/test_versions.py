"""Versioned records and checkpoints from Python (SPEC E7): a machine with a `version` stores
every record and checkpoint behind the version envelope, reads older versions through its
upcast methods (records stored before it had a version are version 1), and refuses newer
ones, naming the versions; a checkpoint it cannot read falls back to the history. A machine
whose version the C library carries (as a C machine's is) reads the stores a Python machine
writes and the other way round: the bytes and the rules are the same on both sides."""

import json
from unittest import mock

from support import TempDirTest, small

import portcullis
from portcullis import _lib, versions
from portcullis import engine as engine_module
from portcullis.machine import Bridge, _data, _view


class NotesV1(portcullis.StateMachine):
    """Version 1: a record is a JSON object {"text": ...}; the state is the list of texts."""

    version = 1

    def fresh(self, entity):
        return []

    def apply(self, state, data, ctx):
        state.append(json.loads(data)["text"])

    def encode(self, state):
        return json.dumps(state).encode()

    def decode(self, entity, data):
        return json.loads(data)


class NotesV2(portcullis.StateMachine):
    """Version 2 adds "pinned" to a record and keeps the state as (text, pinned) pairs."""

    version = 2

    def fresh(self, entity):
        return []

    def apply(self, state, data, ctx):
        note = json.loads(data)
        state.append([note["text"], note["pinned"]])

    def encode(self, state):
        return json.dumps({"notes": state}).encode()

    def decode(self, entity, data):
        return json.loads(data)["notes"]

    def upcast_record(self, version, record):
        if version != 1:
            raise portcullis.Refused(f"no reader for version {version}", 9)
        return json.dumps({"text": json.loads(record)["text"], "pinned": False}).encode()

    def upcast_checkpoint(self, entity, version, data):
        if version != 1:
            raise portcullis.Refused(f"no reader for version {version}", 9)
        return [[text, False] for text in json.loads(data)]


class BareV2(NotesV2):
    """Version 2 without upcast methods: the defaults refuse."""

    upcast_record = portcullis.StateMachine.upcast_record
    upcast_checkpoint = portcullis.StateMachine.upcast_checkpoint


class Unversioned(NotesV1):
    """Version 1's machine before it had a version: bytes stored as they are."""

    version = None


class Raw(portcullis.StateMachine):
    """Reads stored bytes as they are: `seen` gets every record and checkpoint."""

    def __init__(self):
        self.seen = []

    def fresh(self, entity):
        return None

    def apply(self, state, data, ctx):
        self.seen.append(data)

    def encode(self, state):
        return b""

    def decode(self, entity, data):
        self.seen.append(data)


class InTheLibrary(Bridge):
    """A machine whose version the C library carries, as it does for a machine written in C
    (`pc_machine.version` and the upcast callbacks): this bridge hands bytes over as they are,
    and the library puts the envelope on them and takes it off."""

    def __init__(self, machine):
        version = type(machine).version
        machine.version = None  # the bridge leaves the bytes alone
        super().__init__(machine)
        self.struct.version = version
        self._upcasts = [
            _lib.UPCAST_RECORD(self._upcast_record),
            _lib.UPCAST_CHECKPOINT(self._upcast_checkpoint),
        ]
        self.struct.upcast_record, self.struct.upcast_checkpoint = self._upcasts

    def _upcast_record(self, _ud, version, record, n, sink):
        def body():
            data = self.machine.upcast_record(version, _data(record, n))
            code = _lib.lib.pc_sink_write(sink, data, len(data))
            if code:
                raise portcullis.Refused(f"pc_sink_write answered {code}", code)
            return 0

        return self._guard("upcast_record", None, body)

    def _upcast_checkpoint(self, _ud, view, version, data, n, out):
        entity = _view(view.contents)

        def body():
            out[0] = self._put(self.machine.upcast_checkpoint(entity, version, _data(data, n)))
            return 0

        return self._guard("upcast_checkpoint", entity, body)


def in_the_library(machine, directory, **options):
    """An engine over `machine` whose versions the C library handles."""
    with mock.patch.object(engine_module, "Bridge", InTheLibrary):
        return small(machine, directory, **options)


def note(text, pinned=None):
    body = {"text": text} if pinned is None else {"text": text, "pinned": pinned}
    return json.dumps(body).encode()


class EnvelopeTest(TempDirTest):
    def test_the_envelope_is_two_bytes_below_version_128_and_the_same_as_rusts(self):
        self.assertEqual(versions.envelope(1, b"x"), b"\x81\x00x")
        self.assertEqual(versions.envelope(300, b""), b"\xac\x82\x00")
        self.assertEqual(versions.split_version(b"\xac\x82\x00x"), (300, b"x", True))
        self.assertEqual(versions.split_version(b'{"a": 1}'), (1, b'{"a": 1}', False))
        with self.assertRaises(portcullis.Refused):
            versions.split_version(b"\x80\x00")  # version 0 is never written
        with self.assertRaises(ValueError):
            versions.envelope(0, b"")

    def test_a_versioned_machine_stores_its_version_with_every_record_and_checkpoint(self):
        with small(NotesV1(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("a")])
            engine.write("notes", b"n", lambda state: [note("b")])
            engine.defer("notes", b"n", note("c"))
            engine.checkpoint("notes", b"n")
            self.assertEqual(engine.read("notes", b"n"), b'["a", "b", "c"]')
        # Read as bytes by a machine without a version: every one behind version 1's envelope.
        seen = []

        class Raw(portcullis.StateMachine):
            def fresh(self, entity):
                return None

            def apply(self, state, data, ctx):
                seen.append(data)

            def encode(self, state):
                return b""

            def decode(self, entity, data):
                seen.append(data)

        with small(Raw(), self.dir) as engine:
            engine.read("notes", b"n")
        self.assertEqual(seen, [b'\x81\x00["a", "b", "c"]'])

    def test_version_2_reads_version_1_and_unversioned_history_through_its_upcasts(self):
        with small(Unversioned(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("old")])  # stored before versions
        with small(NotesV1(), self.dir) as engine:
            engine.append("notes", b"n", [note("one")])
            engine.checkpoint("notes", b"n")
            engine.append("notes", b"n", [note("after")])
        with small(NotesV2(), self.dir) as engine:
            self.assertEqual(
                engine.state("notes", b"n"), [["old", False], ["one", False], ["after", False]]
            )
            engine.append("notes", b"n", [note("two", True)])
            engine.checkpoint("notes", b"n")
        with small(NotesV2(), self.dir) as engine:
            self.assertEqual(engine.state("notes", b"n")[-1], ["two", True])

    def test_without_upcasts_old_records_contain_the_entity_naming_both_versions(self):
        with small(NotesV1(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("one")])
        with small(BareV2(), self.dir) as engine:
            with self.assertRaises(portcullis.Contained) as contained:
                engine.read("notes", b"n")
            said = contained.exception.callback_error
            self.assertIn("written by version 1 and this machine is version 2", said)
            self.assertIn("upcast_record", said)

    def test_newer_records_are_refused_never_guessed(self):
        with small(NotesV2(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("two", False)])
        with small(NotesV1(), self.dir) as engine:
            with self.assertRaises(portcullis.Contained) as contained:
                engine.read("notes", b"n")
            self.assertIn(
                "version 2, newer than this machine's version 1",
                contained.exception.callback_error,
            )

    def test_a_newer_checkpoint_falls_back_to_the_history(self):
        with small(NotesV1(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("one")])
        with small(NotesV2(), self.dir) as engine:
            engine.checkpoint("notes", b"n")  # a version 2 checkpoint over version 1 records
        with small(NotesV1(), self.dir) as engine:
            # Version 1 cannot read it, but the history is all there: it is replayed instead.
            self.assertEqual(engine.state("notes", b"n"), ["one"])
        with small(NotesV2(), self.dir) as engine:
            # ... and checkpointed again, in version 1, which version 2 reads.
            self.assertEqual(engine.state("notes", b"n"), [["one", False]])


class AcrossTheBoundaryTest(TempDirTest):
    """The Python package and the C library (a C machine with a `version`) write the same
    envelope and read it by the same rules: each reads the other's store."""

    def test_a_store_python_wrote_at_version_2_is_read_by_a_c_machine_at_version_2(self):
        with small(Unversioned(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("before")])
        with small(NotesV1(), self.dir) as engine:
            engine.append("notes", b"n", [note("one")])
            engine.checkpoint("notes", b"n")
            engine.append("notes", b"n", [note("after")])
        with small(NotesV2(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("two", True)])
            engine.append("notes", b"m", [note("solo", False)])
            engine.checkpoint("notes", b"m")
            state = engine.state("notes", b"n")
            history = list(engine.history("notes", b"n"))
        with in_the_library(NotesV2(), self.dir) as engine:
            self.assertEqual(engine.state("notes", b"n"), state)
            self.assertEqual(engine.state("notes", b"m"), [["solo", False]])
            self.assertEqual(list(engine.history("notes", b"n")), history)
            self.assertEqual(engine.read("notes", b"m"), b'{"notes": [["solo", false]]}')
            engine.append("notes", b"n", [note("from C", False)])
            engine.checkpoint("notes", b"n")
        with small(NotesV2(), self.dir) as engine:
            self.assertEqual(engine.state("notes", b"n"), state + [["from C", False]])

    def test_a_c_machine_writes_the_bytes_python_writes(self):
        with in_the_library(NotesV1(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("one")])
            engine.checkpoint("notes", b"n")
            engine.append("notes", b"n", [note("two")])
        raw = Raw()
        with small(raw, self.dir) as engine:
            engine.read("notes", b"n")
            stored = [r.data for r in engine.history("notes", b"n")]
            self.assertEqual(stored[-1], b"\x81\x00" + note("two"))
        self.assertEqual(raw.seen, [b'\x81\x00["one"]', b"\x81\x00" + note("two")])
        with small(NotesV2(), self.dir) as engine:
            self.assertEqual(engine.state("notes", b"n"), [["one", False], ["two", False]])

    def test_newer_records_are_refused_alike_with_the_same_code(self):
        with small(NotesV2(), self.dir, register_on_first_write=True) as engine:
            engine.append("notes", b"n", [note("two", False)])
            engine.append("notes", b"m", [note("two", False)])
        with in_the_library(NotesV1(), self.dir) as engine:
            with self.assertRaises(portcullis.Contained) as in_c:
                engine.read("notes", b"n")
        with small(NotesV1(), self.dir) as engine:
            with self.assertRaises(portcullis.Contained) as in_python:
                engine.read("notes", b"m")
        said = "version 2, newer than this machine's version 1"
        self.assertIn(said, str(in_c.exception))
        self.assertIn(said, in_python.exception.callback_error)
        self.assertEqual(in_c.exception.callback_code, versions.VERSION_CODE)
        self.assertEqual(in_python.exception.callback_code, versions.VERSION_CODE)
