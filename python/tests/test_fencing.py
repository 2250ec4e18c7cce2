"""Fencing through Python (SPEC F): two owners share a store on a manual clock. Owner B takes
the namespace from owner A (bump, revoke to completion, adopt); A's next write raises
`Fenced`; B sees every write A made and repairs each account once."""

import unittest

from support import Counter, record, small

import portcullis
from portcullis import ManualClock, Store


def owner(store, name, machine):
    return small(
        machine,
        store=store,
        owner=name,
        adopt_on_first_use=False,
        register_on_first_write=True,
    )


class FencingTest(unittest.TestCase):
    def test_a_stale_writer_is_fenced_after_a_bump_and_a_completed_revocation(self):
        with ManualClock() as clock, Store.memory(clock) as store:
            with owner(store, "owner-a", Counter()) as a, owner(store, "owner-b", Counter()) as b:
                a.own("bank")
                for i in range(4):
                    a.append("bank", f"acct-{i}", [record(10)])
                with self.assertRaises(portcullis.NotServed):
                    b.read("bank", b"acct-0")

                epoch = b.current_epoch("bank")
                with self.assertRaises(portcullis.InvalidArgument):
                    b.bump_epoch("bank", epoch + 2000)
                b.bump_epoch("bank", epoch + 1)
                self.assertGreaterEqual(b.revoke_to_completion("bank", timeout=60), 1)
                self.assertEqual(b.own("bank"), epoch + 1)

                with self.assertRaises(portcullis.Fenced) as fenced:
                    a.append("bank", b"acct-0", [record(5)])
                self.assertEqual(fenced.exception.code, 9)
                self.assertIn("epoch", str(fenced.exception).lower())
                with self.assertRaises((portcullis.Fenced, portcullis.NotServed)):
                    a.append("bank", b"acct-1", [record(5)])

                for i in range(4):
                    state = b.state("bank", f"acct-{i}")
                    self.assertEqual(state, {"sum": 10, "records": 1, "repairs": 1})
                b.append("bank", b"acct-0", [record(1)])
                self.assertEqual(b.state("bank", b"acct-0")["sum"], 11)

    def test_a_declared_recovery_holds_revocation_off_until_the_clock_moves(self):
        with ManualClock() as clock, Store.memory(clock) as store:
            with owner(store, "owner-a", Counter()) as a:
                a.own("bank")
                a.append("bank", b"acct", [record(1)])
                a.release_namespace("bank")
            with owner(store, "owner-c", Counter()) as c:
                c.mark_recovered("bank")
                c.bump_epoch("bank", c.current_epoch("bank") + 1)
                progress = c.revoke_step("bank", budget=0.05)
                self.assertFalse(progress.complete)
                self.assertGreaterEqual(progress.remaining, 1)
                clock.advance(30_000 + 5_000)
                for _ in range(100):
                    if c.revoke_step("bank").complete:
                        break
                else:
                    self.fail("revocation did not complete after a lease and its margin")
                c.own("bank")
                self.assertEqual(c.state("bank", b"acct"), {"sum": 1, "records": 1, "repairs": 0})
