"""Lifetimes and failures at the boundary, from Python: a warm outliving its engine, callbacks
kept alive until the engine's `destroy` ran (also after a close that timed out), closing from
inside a write's decision, an `encode` that raises (nothing published, the write that owed the
checkpoint committed), state bytes that look like a failure marker, Ctrl-C inside a callback,
and a forked child that exits normally.

The scenarios that could crash the interpreter run in a child process: the test reads its
exit status and output."""

import os
import signal
import subprocess
import sys
import textwrap

from support import TIMEOUT, Counter, TempDirTest, record, small

import portcullis

HERE = os.path.dirname(os.path.abspath(__file__))


def run_script(body, *args, timeout=TIMEOUT):
    """Runs `body` in a child interpreter with the tests' support module importable."""
    script = "import sys; sys.path.insert(0, sys.argv[1])\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, HERE, *args],
        capture_output=True,
        timeout=timeout,
        text=True,
    )


def history(directory, entities, per_entity=1):
    with small(Counter(), directory, register_on_first_write=True) as engine:
        for i in range(entities):
            engine.append("acct", f"e{i}", [record(v) for v in range(1, per_entity + 1)])


class LifetimeTest(TempDirTest):
    def assert_clean_exit(self, done, last_line):
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual(done.stdout.strip().splitlines()[-1:], [last_line], done.stderr)

    def test_a_warm_outliving_its_engine_calls_nothing_after_close(self):
        history(self.dir, 200)
        done = run_script(
            """
            import gc
            from support import Counter, small
            machine = Counter()
            engine = small(machine, sys.argv[2])
            warm = engine.warm()
            engine.close()
            bridge = engine._bridge
            del engine
            gc.collect()
            assert bridge.destroyed.is_set(), "destroy ran before close returned"
            applies = machine.applies
            print("finished" if warm.wait(60) else "stuck")
            warm.progress()
            warm.close()
            assert machine.applies == applies, "a callback ran after close"
            print("done")
            """,
            self.dir,
        )
        self.assert_clean_exit(done, "done")

    def test_callbacks_stay_alive_until_destroy_after_a_close_that_timed_out(self):
        history(self.dir, 4)
        done = run_script(
            """
            import gc, threading
            from support import Counter, small
            import portcullis

            class Slow(Counter):
                def __init__(self):
                    super().__init__()
                    self.entered = threading.Event()
                    self.go = threading.Event()

                def apply(self, state, data, ctx):
                    if threading.current_thread() is not threading.main_thread():
                        self.entered.set()
                        self.go.wait(60)
                    return super().apply(state, data, ctx)

            machine = Slow()
            engine = small(machine, sys.argv[2], pool_threads=1, warm_parallelism=1,
                           close_timeout=0.2)
            warm = engine.warm()
            assert machine.entered.wait(60)
            try:
                engine.close()
            except portcullis.Unavailable:
                pass  # the close timed out: a callback is still running on the pool
            import weakref
            bridge, destroyed = weakref.ref(engine._bridge), engine._bridge.destroyed
            del engine
            gc.collect()
            assert bridge() is not None, "the callbacks were dropped while one still runs"
            machine.go.set()  # the pool thread returns into the callbacks and goes on
            assert destroyed.wait(60), "destroy never ran"
            warm.close()
            gc.collect()
            # destroy ran on a pool thread, which may still be returning through it: the
            # callbacks are kept for the life of the process.
            assert bridge() is not None, "the callbacks were dropped after destroy elsewhere"
            print("done")
            """,
            self.dir,
        )
        self.assert_clean_exit(done, "done")

    def test_closing_from_a_write_decision_raises_would_deadlock(self):
        done = run_script(
            """
            from support import Counter, record, small
            import portcullis
            engine = small(Counter(), sys.argv[2], register_on_first_write=True)
            engine.append("acct", b"a", [record(1)])
            try:
                engine.write("acct", b"a", lambda state: engine.close())
            except portcullis.WouldDeadlock:
                print("refused")
            engine.append("acct", b"a", [record(2)])  # still open
            engine.close()
            print("done")
            """,
            self.dir,
            timeout=30,
        )
        self.assertIn("refused", done.stdout)
        self.assert_clean_exit(done, "done")

    def test_an_encode_that_raises_publishes_nothing(self):
        class Fragile(Counter):
            def encode(self, state):
                if state["sum"] == 13:
                    raise RuntimeError("13 cannot be encoded")
                return super().encode(state)

        with small(Fragile(), self.dir, register_on_first_write=True) as engine:
            engine.append("acct", b"odd", [record(13)])
            with self.assertRaises(portcullis.WriteRefused) as refused:
                engine.checkpoint("acct", b"odd")
            self.assertIn("13 cannot be encoded", str(refused.exception))
            with self.assertRaises(portcullis.WriteRefused):
                engine.read("acct", b"odd")
            self.assertEqual(engine.state("acct", b"odd")["sum"], 13)  # decode of nothing
        with small(Counter(), self.dir) as engine:
            self.assertEqual(engine.state("acct", b"odd"), {"sum": 13, "records": 1, "repairs": 0})

    def test_a_checkpoint_owed_after_a_write_that_cannot_be_encoded_leaves_the_write(self):
        class Fragile(Counter):
            def encode(self, state):
                if state["sum"] >= 3:
                    raise RuntimeError("too big to encode")
                return super().encode(state)

        with small(Fragile(), self.dir, register_on_first_write=True, checkpoint_every=1) as e:
            self.assertEqual(e.append("acct", b"a", [record(1)]), (1, 1))
            self.assertEqual(e.append("acct", b"a", [record(2)]), (2, 2))  # owed: refused
            self.assertEqual(e.append("acct", b"a", [record(4)]), (3, 3))
        with small(Counter(), self.dir) as engine:
            self.assertEqual(engine.state("acct", b"a"), {"sum": 7, "records": 3, "repairs": 0})

    def test_state_bytes_that_look_like_a_failure_marker_are_just_state(self):
        marker = b"\xffportcullis-python: encode raised: "

        class Raw(portcullis.StateMachine):
            def fresh(self, entity):
                return b""

            def apply(self, state, data, ctx):
                return state + data

            def encode(self, state):
                return state

            def decode(self, entity, data):
                return data

        with small(Raw(), self.dir, register_on_first_write=True) as engine:
            engine.append("raw", b"x", [marker, b"ok"])
            engine.checkpoint("raw", b"x")
        with small(Raw(), self.dir) as engine:
            self.assertEqual(engine.read("raw", b"x"), marker + b"ok")

    def test_ctrl_c_inside_a_callback_interrupts_the_call_and_contains_nothing(self):
        class Interrupted(Counter):
            armed = True

            def apply(self, state, data, ctx):
                if self.armed and ctx.origin == "replay":
                    self.armed = False
                    signal.raise_signal(signal.SIGINT)  # Ctrl-C, delivered here
                return super().apply(state, data, ctx)

        history(self.dir, 1, per_entity=3)
        with small(Interrupted(), self.dir) as engine:
            with self.assertRaises(KeyboardInterrupt):
                engine.read("acct", b"e0")
            self.assertIsNone(engine.containment("acct", b"e0"))
            self.assertEqual(engine.state("acct", b"e0")["sum"], 6)

    def test_a_forked_child_that_exits_normally_writes_nothing(self):
        done = run_script(
            """
            import os
            from support import Counter, record, small
            import portcullis
            engine = small(Counter(), sys.argv[2] + "/engine", register_on_first_write=True)
            store = portcullis.Store.open(sys.argv[2] + "/store")
            engine.append("acct", b"a", [record(1)])
            pid = os.fork()
            if pid == 0:
                try:
                    engine.append("acct", b"a", [record(100)])
                    print("child wrote", flush=True)
                except portcullis.Closed as e:
                    assert "fork" in str(e), e
                sys.exit(0)  # a normal exit: atexit and collection run
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
            engine.append("acct", b"a", [record(2)])
            store.apply("p", portcullis.Batch().put(b"k", b"v"))
            store.close()
            engine.close()
            with small(Counter(), sys.argv[2] + "/engine") as again:
                assert again.state("acct", b"a")["sum"] == 3, again.state("acct", b"a")
            with portcullis.Store.open(sys.argv[2] + "/store") as again:
                assert again.get("p", b"k") == b"v"
            print("done")
            """,
            self.dir,
        )
        self.assertNotIn("child wrote", done.stdout)
        self.assert_clean_exit(done, "done")
