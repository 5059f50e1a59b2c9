"""A queue filled behind mq's back and drained while its periodic rescan turns come and go.

The drain bench's situation (issue 12, docs/performance.md "The drain after a restart"): the ready
files are written directly (no HTTP) and mq is started on them, so its index comes from a listing;
then consumers receive and delete while the queue's rescan turns compare listings with the index
(``IndexSnapshot.compare`` on a saver, in chunks, the loop applying the differences). What a user
checks: every message is received exactly once, and no receive answers empty while messages are
ready.
"""

from __future__ import annotations

import asyncio

from mqcore.names import QueueName
from mqcore.protocol import Store

Q = QueueName("deep")
#: More than two chunks of a rescan's comparison (1,024 names), so its paused path runs.
MESSAGES = 3000
CLIENTS = 4


async def test_every_message_once_and_no_empty_receive_while_rescans_compare(daemons, http, tmp_path) -> None:
    root = tmp_path / "root"
    store = Store(root, fsync=False)
    store.create_queue(Q)
    sent = {store.send(Q, f"m{i}".encode()) for i in range(MESSAGES)}
    # One periodic rescan every 0.05 s: the queue's turn (one rescan in 30) comes every ~1.5 s.
    mq = daemons.start("mq", "--root", root, "--port", "0", "--rescan-interval", "0.05")
    received: list[str] = []
    empty_while_ready: list[int] = []

    async def consumer() -> None:
        while True:
            async with http.get(f"{mq.url}/{Q}/messages") as resp:
                if resp.status == 204:
                    left = len(sent) - len(received)
                    if left == 0:
                        return
                    empty_while_ready.append(left)
                    await asyncio.sleep(0.01)
                    continue
                assert resp.status == 200, await resp.text()
                message_id = resp.headers["X-Message-Id"]
            received.append(message_id)
            async with http.delete(f"{mq.url}/{Q}/messages/{message_id}") as resp:
                assert resp.status == 200, await resp.text()

    await asyncio.wait_for(asyncio.gather(*(consumer() for _ in range(CLIENTS))), timeout=120)
    assert sorted(received) == sorted(sent), "a message was lost or received twice"
    # A consumer may see 204 in the instant between another one's receive and its own: at the end only.
    assert not [left for left in empty_while_ready if left > CLIENTS], empty_while_ready
