"""A tour of Portcullis from Python, in small: open an engine over a directory, write, restart
with lazy restore (open reads no history; the first touch restores a room, exactly once), warm
the rest in the background with progress, and fence a stale writer after an epoch bump.

    pip install ./python
    python3 python/examples/tour.py [DIRECTORY]

Every claim it prints is checked: it fails rather than tell a story that did not happen.
"""

import json
import sys
import tempfile
import time

import portcullis
from portcullis import Engine, Refused, StateMachine, Store

ROOMS, MESSAGES = 200, 5


class ChatRooms(StateMachine):
    """A room's state: how many messages it holds and who wrote last. Records are JSON."""

    def fresh(self, entity):
        return {"messages": 0, "last_author": None}

    def apply(self, state, record, ctx):
        message = json.loads(record)
        if not message.get("text"):
            raise Refused("an empty message")
        return {"messages": state["messages"] + 1, "last_author": message["author"]}

    def encode(self, state):
        return json.dumps(state, sort_keys=True).encode()

    def decode(self, entity, data):
        return json.loads(data)

    def validate(self, record):
        self.apply(self.fresh(None), record, None)  # refuses what apply would refuse


def post(author, text):
    return json.dumps({"author": author, "text": text}).encode()


def check(claim, holds):
    if not holds:
        raise SystemExit(f"the tour expected {claim}, and it did not happen")


def write_history(directory):
    started = time.perf_counter()
    with Engine.open(ChatRooms(), directory, register_on_first_write=True) as engine:
        for room in range(ROOMS):
            messages = [post("ann", f"hello {i}") for i in range(MESSAGES)]
            engine.append("chat", f"room-{room}", messages)
        engine.checkpoint("chat", b"room-7")
        engine.append("chat", b"room-7", [post("bo", "after the checkpoint")])
        try:
            engine.append("chat", b"room-7", [post("bo", "")])
            check("an empty message to be refused", False)
        except portcullis.InvalidArgument as refused:
            print(f"An empty message is refused before it is written: {refused.callback_error}")
    took = time.perf_counter() - started
    print(f"Wrote {ROOMS} rooms x {MESSAGES} messages, each append durable ({took:.2f} s)")


def restart_and_warm(directory):
    # The background warm (on by default) would start restoring the rooms as soon as the first
    # touch adopts the namespace; off here, so the tour shows the first touch alone, then a warm.
    with Engine.open(ChatRooms(), directory, background_warm=False) as engine:
        stats = engine.stats()
        check("open to read no history", stats.pending == ROOMS and stats.restored == 0)
        print(f"Restarted: {stats.pending} rooms pending, none restored (open read no history).")
        room = engine.state("chat", b"room-7")
        check("room-7 to hold 6 messages", room == {"messages": MESSAGES + 1, "last_author": "bo"})
        check("one room restored", engine.stats().restored == 1)
        print(f"The first touch restored room-7 alone: {room}.")
        with engine.warm() as warm:
            check("the warm to end", warm.wait(timeout=60))
            p = warm.progress()
        stats = engine.stats()
        check("the warm to restore the rest", stats.restored == ROOMS and p.refused == 0)
        print(f"A warm restored the other {ROOMS - 1} rooms on the pool ({p.done} of them itself) in {p.elapsed_ms} ms.")


def fence_a_stale_writer(directory):
    with Store.open(directory) as store:
        with (
            Engine.open(ChatRooms(), store=store, owner="old") as old,
            Engine.open(ChatRooms(), store=store, owner="new", adopt_on_first_use=False) as new,
        ):
            old.own("chat")
            old.append("chat", b"room-1", [post("ann", "still the owner")])
            epoch = new.current_epoch("chat")
            new.bump_epoch("chat", epoch + 1)
            slices = new.revoke_to_completion("chat", timeout=60)
            new.own("chat")
            print(f"A new owner bumped the epoch to {epoch + 1} and revoked in {slices} slice(s).")
            try:
                old.append("chat", b"room-1", [post("ann", "too late")])
                check("the stale writer to be fenced", False)
            except portcullis.Fenced as fenced:
                print(f"The stale writer's append raised {fenced.name}: {fenced.message}")
            room = new.state("chat", b"room-1")
            check("the new owner to see the old owner's write", room["messages"] == MESSAGES + 1)
            print(f"The new owner sees every acknowledged write: room-1 holds {room['messages']}.")


def main():
    if len(sys.argv) > 1:
        run(sys.argv[1])
        return
    with tempfile.TemporaryDirectory(prefix="portcullis-tour-") as directory:
        run(directory)


def run(directory):
    write_history(directory)
    restart_and_warm(directory)
    fence_a_stale_writer(directory)
    print("Tour done.")


if __name__ == "__main__":
    main()
