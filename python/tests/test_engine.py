"""The engine through Python with a state machine written in Python: open, register, append,
write with a decision, read, checkpoint, close; a restart with lazy restore, deferred work and
a warm with progress; refusals and the context manager."""

import struct
import threading

from support import TIMEOUT, Counter, TempDirTest, record, small

import portcullis


def sum_of(engine, ns, ident):
    return engine.state(ns, ident)["sum"]


class EngineTest(TempDirTest):
    def first_run(self, machine):
        with small(machine, self.dir, register_on_first_write=True) as engine:
            self.assertTrue(engine.register("acct", b"a1"))
            self.assertFalse(engine.register("acct", "a1"))
            seqs = engine.append("acct", b"a1", [record(1), record(2), record(3)])
            self.assertEqual(seqs, (1, 3))
            self.assertEqual(engine.state("acct", b"a1"), {"sum": 6, "records": 3, "repairs": 0})
            self.assertEqual(engine.read("acct", b"a1"), struct.pack("<QQQ", 6, 3, 0))

            seen = []

            def double(state):
                seen.append(state["sum"])
                return [record(state["sum"])]

            written = engine.write("acct", b"a1", double)
            self.assertEqual(written, portcullis.Written(True, 4, 4, 0))
            self.assertEqual(seen, [6])
            self.assertEqual(engine.checkpoint("acct", b"a1"), 4)
            engine.append("acct", b"a1", [record(100)])
            for i in range(6):
                engine.append("acct", f"b{i}", [record(i + 1)])
            stats = engine.stats()
            self.assertEqual((stats.entities, stats.unclean_previous), (7, 0))
        self.assertTrue(engine.closed)
        self.assertTrue(engine._bridge.destroyed.is_set())
        self.assertEqual(engine._bridge.states, {}, "every state was freed")
        with self.assertRaises(portcullis.Closed):
            engine.register("acct", b"a1")

    def test_open_write_read_restart_with_lazy_restore_and_a_warm(self):
        self.first_run(Counter())
        with small(Counter(), self.dir) as engine:
            stats = engine.stats()
            self.assertEqual((stats.pending, stats.restored), (7, 0), "open read no history")
            self.assertEqual(engine.defer("acct", b"b0", record(1000)).kind, "queued")
            once = engine.defer("acct", b"b1", record(1000), dedup_id=b"once")
            self.assertEqual(once.kind, "queued")
            again = engine.defer("acct", b"b1", record(1000), dedup_id=b"once")
            self.assertEqual(again.kind, "already_accepted")

            # The first touch restores from the checkpoint and the record after it.
            self.assertEqual(engine.state("acct", b"a1"), {"sum": 112, "records": 5, "repairs": 0})
            self.assertEqual(engine.stats().restored, 1)

            with engine.warm() as warm:
                self.assertTrue(warm.wait(TIMEOUT), "the warm did not end in time")
                progress = warm.progress()
            self.assertTrue(progress.finished and not progress.stopped)
            self.assertEqual((progress.done, progress.total, progress.refused), (6, 6, 0))
            self.assertEqual(sum_of(engine, "acct", b"b0"), 1001)
            self.assertEqual(sum_of(engine, "acct", b"b1"), 1002)
            applied = engine.defer("acct", b"b2", record(1000))
            self.assertEqual(applied, portcullis.Deferred("applied", 2))
            stats = engine.stats()
            self.assertEqual((stats.pending, stats.restored, stats.contained), (0, 7, 0))

    def test_a_decision_refuses_or_raises_and_writes_nothing(self):
        with small(Counter(), self.dir, register_on_first_write=True) as engine:
            engine.append("acct", b"a", [record(5)])

            def refuse(state):
                raise portcullis.Refused("not now", code=9)

            self.assertEqual(engine.write("acct", b"a", refuse), portcullis.Written(False, 0, 0, 9))

            def broken(state):
                raise KeyError("no such field")

            with self.assertRaises(KeyError):
                engine.write("acct", b"a", broken)
            self.assertEqual(engine.write("acct", b"a", lambda state: []).wrote, False)
            self.assertEqual(engine.state("acct", b"a")["records"], 1)

    def test_a_decision_raising_write_refused_refuses_the_command_with_its_reason(self):
        # SPEC R12: the same code as Rust's Error::Refused and C's PC_REFUSED, with the reason.
        with small(Counter(), self.dir, register_on_first_write=True) as engine:
            engine.append("acct", b"a", [record(5)])

            def overdraw(state):
                yield record(1)  # pushed, then dropped by the refusal
                raise portcullis.WriteRefused(f"only {state['sum']} held")

            with self.assertRaises(portcullis.WriteRefused) as refused:
                engine.write("acct", b"a", overdraw)
            self.assertEqual((refused.exception.code, refused.exception.name), (17, "PC_REFUSED"))
            self.assertIn("only 5 held", refused.exception.message)
            self.assertIn("nothing was written", refused.exception.message)
            self.assertIsInstance(refused.exception, portcullis.PortcullisError)
            self.assertEqual(engine.state("acct", b"a"), {"sum": 5, "records": 1, "repairs": 0})
            engine.append("acct", b"a", [record(1)])  # the entity keeps serving
            self.assertEqual(engine.state("acct", b"a")["sum"], 6)

    def test_a_refusing_validate_answers_invalid_argument_with_its_reason(self):
        with small(Counter(), self.dir, register_on_first_write=True) as engine:
            with self.assertRaises(portcullis.InvalidArgument) as bad:
                engine.append("acct", b"a", [b"short"])
            self.assertIn("a record is 8 bytes", bad.exception.callback_error)
            self.assertIn("a record is 8 bytes", str(bad.exception))
            with self.assertRaises(portcullis.UnknownEntity):
                engine.read("acct", b"a")

    def test_a_failed_open_runs_destroy_and_raises(self):
        machine = Counter()
        with self.assertRaises(portcullis.InvalidArgument):
            portcullis.Engine.open(machine, self.dir, pool_threads=0)
        with self.assertRaises(TypeError):
            portcullis.Engine.open(object(), self.dir)

    def test_closing_while_threads_write_ends_each_call_in_success_or_closed(self):
        engine = small(Counter(), self.dir, register_on_first_write=True)
        started = threading.Barrier(5)
        outcomes = []

        def writer(w):
            started.wait(TIMEOUT)
            for r in range(1000):
                try:
                    engine.append("acct", f"w{w}", [record(1)])
                except portcullis.Closed:
                    outcomes.append("closed")
                    return
            outcomes.append("done")

        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(4)]
        for t in threads:
            t.start()
        started.wait(TIMEOUT)
        engine.close()
        for t in threads:
            t.join(TIMEOUT)
        self.assertEqual([t.is_alive() for t in threads], [False] * 4, "a writer hung")
        self.assertEqual(len(outcomes), 4)
        self.assertTrue(engine._bridge.destroyed.is_set())
        engine.close()  # closing twice is harmless

    def test_every_option_reaches_the_engine(self):
        fence = {
            "epoch_lease_ms": 30_000,
            "lease_margin_ms": 5_000,
            "min_lease_budget_ms": 1_000,
            "max_apply_window_ms": 10_000,
        }
        with small(
            Counter(),
            self.dir,
            owner="me",
            own=["fenced"],
            own_unfenced=["free"],
            register_on_first_write=True,
            truncate_after_checkpoint=True,
            checkpoint_every=2,
            checkpoint_tail_bound=100,
            warm_parallelism=2,
            sync="never",
            fence=fence,
        ) as engine:
            for ns in ("fenced", "free"):
                engine.append(ns, b"x", [record(1), record(2), record(3)])
            self.assertGreaterEqual(engine.current_epoch("fenced"), 0)
            with self.assertRaises(portcullis.InvalidArgument):
                engine.bump_epoch("free", 1)  # declared unfenced
        with small(Counter(), self.dir, owner="me", warm_on_open=True) as engine:
            with engine.warm() as warm:  # joins the warm that opening started
                self.assertTrue(warm.wait(TIMEOUT))
            self.assertEqual(engine.stats().pending, 0)
            self.assertEqual(engine.state("fenced", b"x")["sum"], 6)
        with self.assertRaises(ValueError):
            small(Counter(), self.dir, sync="sometimes")
        with self.assertRaises(portcullis.InvalidArgument):
            small(Counter(), self.dir, fence=dict(fence, lease_margin_ms=0))
