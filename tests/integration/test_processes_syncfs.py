"""``mq --processes 2 --file-sync syncfs``: the workers share their ``syncfs`` rounds (mqcore/protocol/_rounds.py).

Many concurrent sends over new connections (so both workers serve them, each leading rounds of its
own group commit): every ``201`` is a message received afterwards with its body, and the ``syncfs``
calls counted over both workers are fewer than the sends (group commits, shared or not).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import aiohttp

from tests.conftest import Daemons, Stack
from tests.integration.test_processes import ready, served_by_both

#: Sends in flight at once, and in all.
CLIENTS = 32
SENDS = 4


def syncfs_stack(daemons: Daemons, root: Path) -> Stack:
    """mq --processes 2 --file-sync syncfs, mq-mover and mq-reaper on ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    front = daemons.spawn("mq", "--root", root, "--port", "0", "--processes", "2", "--file-sync", "syncfs")
    mover = daemons.spawn("mq-mover", "--root", root)
    reaper = daemons.spawn("mq-reaper", "--root", root)
    return Stack(root=root, mq=ready(front), mover=ready(mover), reaper=ready(reaper))


async def test_concurrent_sends_through_both_workers_are_all_received_with_their_bodies(
    daemons: Daemons, tmp_path: Path, queue: str
) -> None:
    stack = syncfs_stack(daemons, tmp_path / "root")
    assert len(re.findall(r"mq\[[12]/2\] .*file sync syncfs \(--file-sync syncfs", stack.mq.log)) == 2, stack.mq.log
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
        two = dataclasses.replace(stack, session=fresh)
        await two.create_queue(queue)

        async def client(k: int) -> dict[str, bytes]:
            sent = {}
            for i in range(SENDS):
                body = f"client {k} message {i}".encode()
                sent[await two.send(queue, body)] = body
            return sent

        acknowledged: dict[str, bytes] = {}
        for sent in await asyncio.gather(*(client(k) for k in range(CLIENTS))):
            acknowledged.update(sent)
        await served_by_both(two, queue)
        text = (await two.request("GET", "/metrics")).body.decode()
        syncfs = re.search(r'^mq_storage_fsync_duration_seconds_count\{kind="syncfs"\} ([0-9.]+)$', text, re.M)
        assert syncfs is not None and 1 <= float(syncfs.group(1)) < CLIENTS * SENDS, text
        received: dict[str, bytes] = {}
        while len(received) < len(acknowledged):
            reply = await two.receive(queue)
            assert reply.status == 200, f"{len(received)} of {len(acknowledged)} acknowledged messages received"
            received[reply.header("X-Message-Id")] = reply.body
    assert received == acknowledged
