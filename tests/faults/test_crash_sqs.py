"""kill -9 during the SQS transitions of issue 3: batch sends and dead-lettering lose nothing.

Real daemons, real SIGKILL, real files; the checks are what a user would count: every message
acknowledged in a batch answer is received intact, and every message received max_receive_count
times ends up exactly once in its dead-letter queue, wherever the mover was killed.
"""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest

#: Messages dead-lettered in the mover crash test (enough that a kill lands mid-way).
TOTAL = 1000
#: Transport failures a client sees while mq is down or restarting.
DOWN = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


async def post_json(stack, path: str, obj) -> object:
    return await stack.request("POST", path, data=json.dumps(obj), headers={"Content-Type": "application/json"})


async def drain(stack, queue: str) -> dict[str, bytes]:
    """Receive and delete everything ready in ``queue``; message id -> body."""
    got: dict[str, bytes] = {}
    while True:
        reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=60")
        assert reply.status == 200, reply.body
        messages = reply.json["messages"]
        if not messages:
            return got
        for m in messages:
            got[m["message_id"]] = base64.b64decode(m["body_base64"])
        entries = [{"id": str(i), "receipt_handle": m["receipt_handle"]} for i, m in enumerate(messages)]
        deleted = await post_json(stack, f"/{queue}/messages/delete", {"entries": entries})
        assert deleted.status == 200 and not deleted.json["failed"], deleted.body


@pytest.mark.parametrize("stack", [{"visibility_timeout": 30}], indirect=True)
async def test_mq_killed_during_batch_sends_keeps_every_acknowledged_message(stack, queue):
    await stack.create_queue(queue)
    acked: dict[str, bytes] = {}
    unknown: set[bytes] = set()
    sending = True

    async def produce() -> None:
        n = 0
        while sending:
            bodies = [b"batch message %d" % (n + i) for i in range(10)]
            n += 10
            entries = [{"id": str(i), "body_base64": base64.b64encode(b).decode()} for i, b in enumerate(bodies)]
            try:
                reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": entries})
            except DOWN:
                unknown.update(bodies)
                await asyncio.sleep(0.05)
                continue
            if reply.status != 200:
                unknown.update(bodies)
                continue
            for ok in reply.json["successful"]:
                acked[ok["message_id"]] = bodies[int(ok["id"])]

    producers = [asyncio.create_task(produce()) for _ in range(4)]
    await asyncio.sleep(1.0)
    for _ in range(2):
        assert stack.mq.kill() == -9
        await asyncio.sleep(0.2)
        await stack.mq.astart()
        await asyncio.sleep(0.7)
    sending = False
    await asyncio.gather(*producers)

    got = await drain(stack, queue)
    lost = set(acked) - set(got)
    assert len(acked) > 100, f"too little load to mean anything: {len(acked)}"
    assert not lost, f"{len(lost)} acknowledged messages lost of {len(acked)}\n{stack.logs()}"
    assert all(got[i] == acked[i] for i in acked), "a body changed"
    strangers = {i for i, body in got.items() if i not in acked and body not in unknown}
    assert not strangers, f"received messages that were never sent: {sorted(strangers)[:5]}"


@pytest.mark.parametrize("stack", [{"visibility_timeout": 30, "mover_args": ["--rescan-interval", "1"]}], indirect=True)
async def test_mover_killed_while_dead_lettering_moves_each_message_exactly_once(stack, queue, wait):
    dlq = f"{queue[:70]}-dlq"
    await stack.create_queue(dlq)
    reply = await stack.request("PUT", f"/{queue}", data=json.dumps({"dead_letter_queue": dlq, "max_receive_count": 1}))
    assert reply.status == 201, reply.body
    bodies: dict[str, bytes] = {}
    for start in range(0, TOTAL, 10):
        batch = [{"id": str(i), "body": f"poison {start + i}"} for i in range(10)]
        reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": batch})
        assert reply.status == 200 and not reply.json["failed"], reply.body
        for ok in reply.json["successful"]:
            bodies[ok["message_id"]] = batch[int(ok["id"])]["body"].encode()
    assert stack.mover.kill() == -9  # no lease comes due while we receive
    # Receive every message once with a 1 s visibility timeout and never delete them.
    received = 0
    while received < TOTAL:
        reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=1")
        received += len(reply.json["messages"])
    await asyncio.sleep(1.2)  # every lease is due now
    # Start mq-mover and kill it as soon as it has dead-lettered some but not all: a real
    # crash in the middle of the transition, three times over.
    partial = []
    for _ in range(3):
        before = len(stack.files(f"queues/{dlq}"))
        stack.mover.spawn()
        while True:
            moved = len(stack.files(f"queues/{dlq}"))
            if moved > before or moved == TOTAL:
                break
            await asyncio.sleep(0.001)
        assert stack.mover.kill() == -9
        partial.append(len(stack.files(f"queues/{dlq}")))
    assert any(0 < n < TOTAL for n in partial), f"no kill landed mid-way: {partial}"
    await stack.mover.astart()
    await wait(
        lambda: len(stack.files(f"queues/{dlq}")) == TOTAL and not stack.files("delay"),
        timeout=20,
        message=lambda: f"dlq={len(stack.files(f'queues/{dlq}'))} delay={len(stack.files('delay'))}\n{stack.logs()}",
    )
    assert stack.files(f"queues/{queue}") == []
    got = await drain(stack, dlq)
    assert got == bodies  # same ids, same bodies, each exactly once
