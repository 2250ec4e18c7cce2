"""Python callbacks on the engine's threads: an exception in a callback becomes a refusal that
contains only its entity, with the exception's text in the error; several Python threads write
while the pool runs callbacks, without deadlock. Negative controls: with the exception guard
switched off (the exception ignored) the raising entity is served with a wrong state, and with
the library loaded as a `PyDLL` (the GIL held during C calls) a warm cannot make progress."""

import os
import subprocess
import sys
import threading

from support import TIMEOUT, Counter, TempDirTest, record, small

import portcullis
from portcullis import machine as machine_module

HERE = os.path.dirname(os.path.abspath(__file__))


def history(directory, entities, per_entity=3, poison=False):
    """Entities e0.. with records 1..per_entity; with `poison`, e1 also holds 666."""
    with small(Counter(), directory, register_on_first_write=True) as engine:
        for i in range(entities):
            engine.append("acct", f"e{i}", [record(v) for v in range(1, per_entity + 1)])
        if poison:
            engine.append("acct", b"e1", [record(666)])


class CallbackTest(TempDirTest):
    def test_a_raising_callback_contains_only_its_entity(self):
        history(self.dir, 4, poison=True)
        machine = Counter()
        machine.raise_on_replay_of = 666
        with small(machine, self.dir) as engine:
            with engine.warm() as warm:
                self.assertTrue(warm.wait(TIMEOUT))
                progress = warm.progress()
            self.assertEqual((progress.total, progress.refused), (4, 1))
            for i in (0, 2, 3):
                self.assertEqual(engine.state("acct", f"e{i}")["sum"], 6)
            with self.assertRaises(portcullis.Contained) as contained:
                engine.read("acct", b"e1")
            said = contained.exception.callback_error
            self.assertIn("ValueError: cannot fold the value 666", said)
            self.assertIn("apply", str(contained.exception))
            with self.assertRaises(portcullis.Contained):
                engine.append("acct", b"e1", [record(1)])
            self.assertEqual(engine.stats().contained, 1)

            machine.raise_on_replay_of = None  # the cause is fixed: release and restore again
            self.assertTrue(engine.release("acct", b"e1"))
            self.assertEqual(engine.state("acct", b"e1")["sum"], 6 + 666)

    def test_a_raising_fresh_contains_and_a_raising_encode_publishes_nothing(self):
        class Fragile(Counter):
            def fresh(self, entity):
                if entity.id == b"bad":
                    raise RuntimeError("no fresh state for bad")
                return super().fresh(entity)

            def encode(self, state):
                if state["sum"] == 13:
                    raise RuntimeError("13 cannot be encoded")
                return super().encode(state)

        with small(Fragile(), self.dir, register_on_first_write=True) as engine:
            with self.assertRaises(portcullis.Contained) as contained:
                engine.append("acct", b"bad", [record(1)])
            self.assertIn("fresh raised RuntimeError", contained.exception.callback_error)
            self.assertIn("no fresh state for bad", str(contained.exception))
            engine.append("acct", b"odd", [record(13)])
            with self.assertRaises(portcullis.WriteRefused) as unencodable:
                engine.read("acct", b"odd")
            self.assertIn("13 cannot be encoded", str(unencodable.exception))
            with self.assertRaises(portcullis.WriteRefused) as refused:
                engine.checkpoint("acct", b"odd")
            self.assertIn("no checkpoint was published", str(refused.exception))
            engine.append("acct", b"ok", [record(2)])  # other entities are served
            self.assertEqual(engine.state("acct", b"ok"), {"sum": 2, "records": 1, "repairs": 0})
        with small(
            Fragile(), self.dir, truncate_after_checkpoint=True, register_on_first_write=True
        ) as engine:
            engine.append("acct", b"cut", [record(13)])
            with self.assertRaises(portcullis.WriteRefused):
                engine.checkpoint("acct", b"cut")  # nothing published, so nothing truncated
        # Nothing was published from a state encode refused, and no history was truncated:
        # both entities restore from their history.
        with small(Fragile(), self.dir) as engine:
            self.assertEqual(engine.state("acct", b"odd")["sum"], 13)
            self.assertEqual(engine.state("acct", b"cut")["sum"], 13)
            self.assertEqual([r.seq for r in engine.history("acct", b"cut")], [1])

    def test_negative_control_an_escaping_exception_is_not_a_refusal(self):
        history(self.dir, 2, poison=True)
        machine = Counter()
        machine.raise_on_replay_of = 666
        machine_module._TEST_IGNORE_EXCEPTIONS = True
        try:
            with small(machine, self.dir) as engine:
                # An ignored exception reads as success in C (what ctypes does at best with
                # an exception that escapes): the entity is served with a state that skipped
                # the record it could not fold, instead of being contained.
                self.assertEqual(engine.state("acct", b"e1")["sum"], 6)
        finally:
            machine_module._TEST_IGNORE_EXCEPTIONS = False

    def test_python_threads_write_while_the_pool_runs_callbacks(self):
        entities, writers, rounds = 120, 6, 20
        history(self.dir, entities, per_entity=1)
        machine = Counter()
        with small(machine, self.dir, pool_threads=2, warm_parallelism=4) as engine:
            warm = engine.warm()
            errors, python_threads = [], set()

            def writer(w):
                python_threads.add(threading.current_thread().name)
                try:
                    for r in range(rounds):
                        ident = f"e{(w * 7 + r * 13) % entities}"  # pending or restored
                        engine.append("acct", ident, [record(1)])
                        engine.write("acct", ident, lambda state: [record(1)])
                        engine.read("acct", ident)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            threads = [
                threading.Thread(target=writer, args=(w,), name=f"writer-{w}", daemon=True)
                for w in range(writers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            stuck = [t.name for t in threads if t.is_alive()]
            self.assertEqual(stuck, [], "writers deadlocked")
            self.assertEqual(errors, [])
            self.assertTrue(warm.wait(TIMEOUT), "the warm did not end in time")
            warm.close()

            total = sum(engine.state("acct", f"e{i}")["sum"] for i in range(entities))
            self.assertEqual(total, entities + writers * rounds * 2)
            pool = machine.apply_threads - python_threads - {threading.main_thread().name}
            self.assertTrue(pool, "no callback ran on a thread the pool owns")

    def test_negative_control_a_pydll_holds_the_gil_and_deadlocks(self):
        history(self.dir, 8, per_entity=1)
        script = (
            "import os, sys; sys.path.insert(0, sys.argv[1]); from support import *\n"
            "e = small(Counter(), sys.argv[2]); w = e.warm()\n"
            "print('finished' if w.wait(3) else 'stuck', flush=True)\n"
            "os._exit(0)  # closing would wait for the blocked pool\n"
        )
        outcomes = {}
        for switch in ("0", "1"):
            env = dict(os.environ, PORTCULLIS_TEST_PYDLL=switch)
            done = subprocess.run(
                [sys.executable, "-c", script, HERE, self.dir],
                env=env,
                capture_output=True,
                timeout=TIMEOUT,
                text=True,
            )
            outcomes[switch] = done.stdout.strip()
        # With CDLL the warm ends; with PyDLL it cannot start a callback while this thread
        # waits in C holding the GIL.
        self.assertEqual(outcomes, {"0": "finished", "1": "stuck"})
