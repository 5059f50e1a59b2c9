"""A send's ready name is indexed once, by its answer or by its inotify event, whichever mq meets first.

mq no longer reads inotify on a send's path (daemons/_own.py): the savers mark each name before its
rename. What a user sees must not change: a message is receivable as soon as its 201 (or batch answer)
came, counted once as ready, handed to one consumer, and gone from the count once deleted, also when
long polls and receives race the sends' answers. Real mq + mq-mover + mq-reaper, real HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter

import pytest

#: Messages per producer, and producers; every fourth request is a batch of 10.
PER_PRODUCER = 60
PRODUCERS = 6


@pytest.fixture
def stack(module_stacks, http):
    return module_stacks.get({}, http)


async def batch_send(stack, queue: str, bodies: list[bytes]) -> list[str]:
    entries = [{"id": f"e{i}", "body_base64": base64.b64encode(body).decode()} for i, body in enumerate(bodies)]
    reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"entries": entries}))
    assert reply.status == 200, reply.body
    assert reply.json["failed"] == [], reply.json
    return [entry["message_id"] for entry in reply.json["successful"]]


async def ready_count(stack, queue: str) -> int:
    stats = await stack.request("GET", f"/{queue}")
    assert stats.status == 200, stats.body
    return int(stats.json["ready"])


async def test_each_send_is_receivable_at_once_and_counted_once(stack, queue):
    await stack.create_queue(queue)
    sent: list[str] = []
    for i in range(20):
        if i % 2:
            sent.append(await stack.send(queue, b"single %d" % i))
        else:
            sent += await batch_send(stack, queue, [b"batch %d.%d" % (i, k) for k in range(10)])
        assert await ready_count(stack, queue) == len(sent), f"after send {i}\n{stack.logs()}"
    received = []
    for _ in range(len(sent)):
        reply = await stack.receive(queue)  # right after the answers: no window to wait for
        assert reply.status == 200, stack.logs()
        received.append(reply.header("X-Message-Id"))
        assert (await stack.delete(queue, received[-1])).status == 200
    assert received == sent  # FIFO, singles and batches in send order
    assert await ready_count(stack, queue) == 0
    assert (await stack.receive(queue)).status == 204


async def test_long_polls_racing_the_answers_take_each_message_once_and_leave_no_stale_ready(stack, queue):
    await stack.create_queue(queue)
    acknowledged: list[str] = []
    seen: Counter[str] = Counter()
    done = asyncio.Event()

    async def produce(p: int) -> None:
        for i in range(0, PER_PRODUCER, 10):
            if i % 40 == 0:
                acknowledged.extend(await batch_send(stack, queue, [b"%d.%d.%d" % (p, i, k) for k in range(10)]))
            else:
                for k in range(10):
                    acknowledged.append(await stack.send(queue, b"%d.%d.%d" % (p, i, k)))

    async def consume() -> None:
        while not done.is_set() or len(seen) < len(acknowledged):
            reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&wait_time_seconds=1")
            assert reply.status == 200, reply.body
            if not reply.json["messages"] and done.is_set():
                return
            for message in reply.json["messages"]:
                seen[message["message_id"]] += 1
                deleted = await stack.delete(queue, message["message_id"])
                assert deleted.status == 200, deleted.body

    consumers = [asyncio.create_task(consume()) for _ in range(4)]
    await asyncio.gather(*(produce(p) for p in range(PRODUCERS)))
    done.set()
    await asyncio.wait_for(asyncio.gather(*consumers), timeout=60)
    assert len(acknowledged) == PRODUCERS * PER_PRODUCER
    assert set(seen) == set(acknowledged), f"{len(set(acknowledged) - set(seen))} not received\n{stack.logs()}"
    assert [m for m, n in seen.items() if n > 1] == []
    # Nothing leased or deleted comes back as ready (a stale index entry would count here and be offered).
    assert await ready_count(stack, queue) == 0
    assert (await stack.receive(queue)).status == 204
