"""``mq --file-sync``: how a send's message files are made durable, as /metrics shows it (docs/api.md "File sync").

``fsync``: one fsync per message file. ``syncfs``: the savers' files are covered by ``syncfs`` rounds
(the ``syncfs`` kind of the fsync histogram), with no file fsync, and each round covers many files when
sends overlap. ``auto``: a lone send's file is fsynced. Every acknowledged message is received
with its body, whichever form stored it.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.integration.test_metrics import scrape, value

#: Concurrent single sends and batches of 10, and the messages they store.
SINGLES, BATCHES = 64, 8
MESSAGES = SINGLES + 10 * BATCHES


async def send_all(stack, queue: str) -> dict[str, bytes]:
    """SINGLES single sends and BATCHES batches of 10, all at once; every message id -> its body."""

    async def single(i: int) -> list[tuple[str, bytes]]:
        body = f"single {i}".encode()
        reply = await stack.request("POST", f"/{queue}/messages", data=body)
        assert reply.status == 201, reply.body
        return [(reply.header("X-Message-Id"), body)]

    async def batch(b: int) -> list[tuple[str, bytes]]:
        bodies = [f"batch {b} entry {i}" for i in range(10)]
        entries = [{"id": str(i), "body": body} for i, body in enumerate(bodies)]
        reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"messages": entries}))
        assert reply.status == 200 and not reply.json["failed"], reply.body
        return [(e["message_id"], bodies[int(e["id"])].encode()) for e in reply.json["successful"]]

    done = await asyncio.gather(*(single(i) for i in range(SINGLES)), *(batch(b) for b in range(BATCHES)))
    return dict(pair for pairs in done for pair in pairs)


@pytest.mark.parametrize("mode", ["fsync", "syncfs", "auto"])
async def test_file_sync_modes_store_every_message_and_show_their_fsyncs(stack_factory, http, queue, mode):
    # --inline-io never: every send goes through the savers, so the counts below are only theirs.
    stack = stack_factory(mq_args=["--file-sync", mode, "--inline-io", "never", "--workers", "4"])
    assert f"(--file-sync {mode}, root on " in stack.mq.log
    await stack.create_queue(queue)
    start = value(await scrape(http, stack.url + "/metrics"), "mq_storage_fsync_duration_seconds_count", kind="file")
    sent = await send_all(stack, queue)
    assert len(sent) == MESSAGES
    samples = await scrape(http, stack.url + "/metrics")
    files = value(samples, "mq_storage_fsync_duration_seconds_count", kind="file") - start  # not the queue's file
    rounds = value(samples, "mq_storage_fsync_duration_seconds_count", kind="syncfs")
    if mode == "fsync":
        assert files >= MESSAGES and rounds == 0
    elif mode == "syncfs":
        assert files == 0 and 1 <= rounds < MESSAGES  # a round covers several files when sends overlap
    # auto: file fsyncs while at most --workers sends are in flight, rounds beyond (how many of each
    # depends on how the requests arrive); the lone send below is the certain case.

    # A lone send alone: file fsyncs with auto (nothing overlaps), a round with syncfs.
    before = files
    reply = await stack.request("POST", f"/{queue}/messages", data=b"alone")
    assert reply.status == 201
    sent[reply.header("X-Message-Id")] = b"alone"
    after = (
        value(await scrape(http, stack.url + "/metrics"), "mq_storage_fsync_duration_seconds_count", kind="file")
        - start
    )
    assert after == (before if mode == "syncfs" else before + 1)

    got: dict[str, bytes] = {}
    while True:
        reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=600")
        assert reply.status == 200, reply.body
        if not reply.json["messages"]:
            break
        for m in reply.json["messages"]:
            got[m["message_id"]] = base64.b64decode(m["body_base64"])
    assert got == sent
