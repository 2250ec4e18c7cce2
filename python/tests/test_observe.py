"""Observability through Python (SPEC E8): an engine's listener hears a refusal before the call
returns and may call the engine back; a containment during a restore is told; a store's
listener hears the torn tail its open truncated; stats and `degraded()` of both; a listener
that raises is logged and never reaches the library."""

import os
import threading

from support import Counter, TempDirTest, record, small

import portcullis
from portcullis import Store


class ObserveTest(TempDirTest):
    def test_an_engine_tells_its_listener_and_the_listener_may_call_back(self):
        heard = []
        seen_entities = []
        box = {}

        def listener(event):
            heard.append(event)
            seen_entities.append(box["engine"].stats().entities)

        with small(Counter(), self.dir, register_on_first_write=True, listener=listener) as engine:
            box["engine"] = engine
            engine.append("acct", b"a", [record(5)])
            self.assertEqual(heard, [])  # a healthy engine says nothing

            def refuse(state):
                raise portcullis.WriteRefused("sold out")

            with self.assertRaises(portcullis.WriteRefused):
                engine.write("acct", b"a", refuse)
            self.assertEqual([e.name for e in heard], ["refused"])
            self.assertEqual(heard[0].kind, portcullis._lib.EVENT_REFUSED)
            self.assertEqual(heard[0].subject, "acct/a")
            self.assertIn("sold out", heard[0].message)
            self.assertEqual(seen_entities, [1])
            stats = engine.stats()
            self.assertEqual(stats.degraded, 0)
            self.assertEqual(stats.namespaces, 1)
            self.assertGreaterEqual(stats.store_sync_count, 1)
            self.assertIsNone(engine.degraded())

    def test_a_containment_during_a_restore_is_told(self):
        with small(Counter(), self.dir, register_on_first_write=True) as engine:
            engine.append("acct", b"a", [record(7)])
        machine = Counter()
        machine.raise_on_replay_of = 7
        heard = []
        with small(machine, self.dir, listener=heard.append) as engine:
            with self.assertRaises(portcullis.Contained):
                engine.state("acct", b"a")
            self.assertEqual([e.name for e in heard], ["contained"])
            self.assertEqual(heard[0].subject, "acct/a")

    def test_a_listener_that_raises_is_logged_and_the_call_goes_on(self):
        def broken(event):
            raise RuntimeError("the listener is broken")

        with small(Counter(), self.dir, register_on_first_write=True, listener=broken) as engine:
            engine.append("acct", b"a", [record(5)])
            with self.assertLogs("portcullis", "ERROR"):
                with self.assertRaises(portcullis.WriteRefused):
                    engine.write("acct", b"a", lambda s: (_ for _ in ()).throw(
                        portcullis.WriteRefused("no")))
            self.assertEqual(engine.state("acct", b"a")["sum"], 5)

    def test_a_store_tells_the_torn_tail_its_open_truncated(self):
        path = os.path.join(self.dir, "store")
        with Store.open(path) as store:
            store.apply("p", portcullis.Batch().put(b"k", b"v"))
            stats = store.stats()
            self.assertEqual((stats.batches, stats.degraded), (1, 0))
            self.assertGreaterEqual(stats.sync_count, 1)
            self.assertIsNone(store.degraded())
        journal = os.path.join(path, "journal")
        newest = max(name for name in os.listdir(journal) if name.endswith(".seg"))
        with open(os.path.join(journal, newest), "ab") as f:
            f.write(b"\xab" * 40)
        heard = []
        threads = []

        def listener(event):
            heard.append(event)
            threads.append(threading.current_thread().name)

        with Store.open(path, listener=listener) as store:
            self.assertEqual([e.name for e in heard], ["torn_tail"])
            self.assertEqual(heard[0].kind, portcullis._lib.EVENT_TORN_TAIL)
            self.assertEqual(store.get("p", b"k"), b"v")
