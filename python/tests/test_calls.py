"""The calls beside the basics from Python: list the entities, read a history, ask about
containment, view a state in place, bound the resident entities; a `check` that refuses a
write before it is written (with the callback's code on the exception); the library's
warnings in Python's `logging`."""

import logging
import struct

from support import Counter, TempDirTest, record, small

import portcullis


class Guarded(Counter):
    """Refuses a record of 100 while the sum is below 100, before it is written."""

    def check(self, state, data, ctx):
        assert ctx.origin in ("live", "deferred"), ctx
        if struct.unpack("<Q", data)[0] == 100 and state["sum"] < 100:
            raise portcullis.Refused("not before the sum reaches 100", code=21)


class CallsTest(TempDirTest):
    def test_entities_history_containment_and_views(self):
        with small(Counter(), self.dir, register_on_first_write=True, max_resident_entities=2) as e:
            for v in range(1, 6):
                e.append("acct", b"h", [record(v)])
            e.append("acct", b"a", [record(1)])
            e.append("other", b"z", [record(1)])
            self.assertEqual(
                e.entities(),
                [("acct", b"a"), ("acct", b"h"), ("other", b"z")],
            )
            history = list(e.history("acct", b"h", from_seq=2, page_size=2))
            self.assertEqual([r.seq for r in history], [2, 3, 4, 5])
            self.assertEqual(history[0], portcullis.Record(2, record(2)))
            self.assertIsNone(e.containment("acct", b"h"))
            self.assertEqual(e.view("acct", b"h", lambda s: s["sum"]), 15)
            copy = e.state("acct", b"h")
            copy["sum"] = 0  # a copy: the engine's state is untouched
            self.assertEqual(e.view("acct", b"h", lambda s: s["sum"]), 15)
            self.assertLessEqual(e.stats().resident, 2)
            self.assertGreaterEqual(e.stats().passivated, 1)

    def test_check_refuses_before_writing(self):
        with small(Guarded(), self.dir, register_on_first_write=True) as engine:
            engine.append("acct", b"a", [record(5)])
            with self.assertRaises(portcullis.WriteRefused) as refused:
                engine.append("acct", b"a", [record(100)])
            self.assertEqual(refused.exception.callback_code, 21)
            self.assertIn("not before the sum reaches 100", str(refused.exception))
            self.assertEqual(engine.state("acct", b"a")["records"], 1)  # nothing written
            engine.append("acct", b"a", [record(95)])
            engine.append("acct", b"a", [record(100)])
            self.assertEqual(engine.state("acct", b"a")["sum"], 200)

    def test_the_pool_stack_size_is_an_option(self):
        with small(Counter(), self.dir, pool_stack_size=8 << 20) as engine:
            self.assertEqual(engine.entities(), [])
        with self.assertRaises(portcullis.InvalidArgument):
            small(Counter(), self.dir, pool_stack_size=1024)

    def test_background_failures_reach_python_logging(self):
        class Fragile(Counter):
            def encode(self, state):
                if state["sum"] >= 3:
                    raise RuntimeError("too big to encode")
                return super().encode(state)

        with self.assertLogs("portcullis", level=logging.WARNING) as logs:
            with small(Fragile(), self.dir, register_on_first_write=True, checkpoint_every=1) as e:
                e.append("acct", b"a", [record(1)])
                e.append("acct", b"a", [record(2)])  # the owed checkpoint is refused
        said = "\n".join(logs.output)
        self.assertIn("the checkpoint owed after a write", said)
        self.assertIn("too big to encode", said)
