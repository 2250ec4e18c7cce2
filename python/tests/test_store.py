"""The store through Python: a round trip on a file store, guarded batches, scan paging, and
exceptions carrying the stable code and the library's message."""

import os

from support import TempDirTest

import portcullis
from portcullis import Batch, ManualClock, Store


class StoreTest(TempDirTest):
    def test_round_trip_survives_a_reopen_and_the_directory_is_locked(self):
        path = os.path.join(self.dir, "store")
        with Store.open(path) as store:
            batch = Batch().put(b"balance", b"100").put("owner", "alice")
            out = store.apply("accounts/alice", batch)
            self.assertTrue(out.committed)
            self.assertEqual(store.get("accounts/alice", b"balance"), b"100")
            self.assertIsNone(store.get("accounts/alice", b"missing"))
            with self.assertRaises(portcullis.Locked) as locked:
                Store.open(path)
            self.assertEqual(locked.exception.code, 3)
            self.assertEqual(locked.exception.name, "PC_LOCKED")
            self.assertTrue(locked.exception.message)
        self.assertTrue(store.closed)
        with self.assertRaises(portcullis.Closed):
            store.get("accounts/alice", b"balance")
        with Store.open(path) as store:
            self.assertEqual(store.get("accounts/alice", b"owner"), b"alice")

    def test_guarded_batches_commit_all_or_nothing(self):
        with ManualClock(5_000) as clock, Store.memory(clock) as store:
            p = "accounts/bob"
            first = Batch().absent(b"balance").put(b"balance", b"1")
            self.assertTrue(store.apply(p, first).committed)
            again = store.apply(p, first)
            self.assertEqual((again.kind, again.index), ("precondition_failed", 0))
            swap = Batch().present(b"x").equals(b"balance", b"1").put(b"balance", b"2")
            failed = store.apply(p, swap)
            self.assertEqual((failed.kind, failed.index), ("precondition_failed", 0))
            swap = Batch().equals(b"balance", b"1").put(b"balance", b"2").put(b"k1", b"v")
            self.assertTrue(store.apply(p, swap.put(b"k2", b"v")).committed)
            self.assertEqual(store.get(p, b"balance"), b"2")
            store.apply(p, Batch().delete(b"balance").delete_range(b"k1", b"k3"))
            self.assertEqual(list(store.scan_all(p)), [])
            late = Batch().not_after(5_500).put(b"late", b"1")
            clock.advance(1_000)
            passed = store.apply(p, late)
            self.assertEqual((passed.kind, passed.now_ms), ("deadline_passed", 6_000))
            self.assertIsNone(store.get(p, b"late"))

    def test_scan_pages_follow_the_cursor_to_the_end(self):
        with Store.memory() as store:
            batch = Batch()
            for i in range(25):
                batch.put(f"k{i:02}", f"v{i}")
            store.apply("p", batch)
            pages, cursor = [], None
            while True:
                page = store.scan("p", limit=10, cursor=cursor)
                pages.append([k for k, _ in page.entries])
                cursor = page.cursor
                if cursor is None:
                    break
            self.assertEqual([len(p) for p in pages], [10, 10, 5])
            self.assertEqual(sum(pages, []), [f"k{i:02}".encode() for i in range(25)])
            ranged = list(store.scan_all("p", start=b"k05", end=b"k08", page_size=2))
            self.assertEqual(ranged, [(b"k05", b"v5"), (b"k06", b"v6"), (b"k07", b"v7")])

    def test_bad_arguments_raise_invalid_argument_with_the_message(self):
        with Store.memory() as store:
            with self.assertRaises(portcullis.InvalidArgument) as bad:
                store.scan("p", limit=0)
            self.assertIsInstance(bad.exception, portcullis.PortcullisError)
            self.assertEqual(bad.exception.code, 1)
            self.assertIn("limit", str(bad.exception))
            with self.assertRaises(portcullis.TooLarge):
                store.apply("p", Batch().put(b"k" * (1 << 20), b"v"))
