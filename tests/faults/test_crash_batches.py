"""kill -9 of mq under batch sends, batch receives (max_messages=10) and batch deletes: nothing acknowledged is lost.

The load of tests/faults/test_crash_restart.py (Jepsen's total-queue checker: lost = 0, nothing foreign,
bodies intact, duplicates across a crash only counted) through the batch routes, whose per-entry checks
and leases (no ``lstat`` of a new lease name on a local filesystem since issue 12's stop 17,
docs/protocol.md 13.5) take a shorter path. Also: no message is handed to two batch receives inside
its visibility timeout, across the crashes too (a lease is a rename the kernel has made: SIGKILL
undoes nothing).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from tests.faults.test_crash_restart import CRASH_STACK, DOWN, Load, drain_and_sweep, run_with_crash

logger = logging.getLogger(__name__)


@dataclass
class BatchLoad(Load):
    """:class:`Load` through ``POST /Q/messages/batch``, ``GET /Q/messages?max_messages=10`` and
    ``POST /Q/messages/delete`` (by receipt handle)."""

    #: message id -> the visibility deadline (epoch ms) of each receive of it
    leases: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    async def produce(self, number: int) -> None:
        seq = 0
        while self.producing:
            bodies = []
            for _ in range(10):
                bodies.append(f"{number}:{seq}:{uuid.uuid4()}".encode() + b"." * random.randrange(0, 1500))
                seq += 1
            entries = [{"id": str(i), "body_base64": base64.b64encode(b).decode()} for i, b in enumerate(bodies)]
            try:
                reply = await self.stack.request(
                    "POST", f"/{self.queue}/messages/batch", data=json.dumps({"entries": entries})
                )
            except DOWN as exc:
                self.maybe.update(bodies)
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.05)
                continue
            if reply.status != 200:
                assert reply.status == 503, f"batch send -> {reply.status} {reply.body[:200]!r}"
                self.maybe.update(bodies)
                await asyncio.sleep(0.05)
                continue
            for entry in reply.json["successful"]:
                self.acked[entry["message_id"]] = bodies[int(entry["id"])]
            for entry in reply.json["failed"]:
                assert entry["error"] == "storage_unavailable", entry
                self.maybe.add(bodies[int(entry["id"])])

    async def consume(self) -> None:
        while self.consuming:
            try:
                reply = await self.stack.request(
                    "GET", f"/{self.queue}/messages?max_messages=10&visibility_timeout_seconds=2"
                )
            except DOWN as exc:
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.05)
                continue
            assert reply.status == 200, f"batch receive -> {reply.status} {reply.body[:200]!r}"
            messages = reply.json["messages"]
            if not messages:
                await asyncio.sleep(0.02)
                continue
            now_ms = time.time_ns() // 1_000_000
            handles = []
            for m in messages:
                message_id, body = m["message_id"], base64.b64decode(m["body_base64"])
                for deadline in self.leases[message_id]:  # every earlier lease of it has run out
                    assert deadline <= now_ms + 50, f"{message_id} handed out again inside its visibility timeout"
                self.leases[message_id].append(m["visibility_deadline_ms"])
                self.received[message_id] += 1
                previous = self.bodies.setdefault(message_id, body)
                assert previous == body, f"{message_id} came back with another body"
                if self.received[message_id] == 1 and int(message_id[-4:], 16) % self.skip_delete_every == 0:
                    self.skipped.add(message_id)
                    continue
                handles.append((message_id, m["receipt_handle"]))
            if not handles:
                continue
            entries = [{"id": str(i), "receipt_handle": h} for i, (_, h) in enumerate(handles)]
            try:
                deleted = await self.stack.request(
                    "POST", f"/{self.queue}/messages/delete", data=json.dumps({"entries": entries})
                )
            except DOWN as exc:
                self.errors[type(exc).__name__] += 1
                continue  # unknown outcome: what was not deleted comes back after the visibility timeout
            assert deleted.status == 200, f"batch delete -> {deleted.status} {deleted.body[:200]!r}"
            for entry in deleted.json["successful"]:
                self.deleted.add(handles[int(entry["id"])][0])
            for entry in deleted.json["failed"]:
                # After a crash a handle may be stale (the lease expired and was taken again) or its message gone.
                assert entry["error"] in ("message_not_found", "stale_receipt_handle", "storage_unavailable"), entry


@pytest.mark.parametrize("stack", [CRASH_STACK], indirect=True)
async def test_sigkill_of_mq_under_batch_sends_receives_and_deletes_loses_nothing(stack, queue, wait):
    await stack.create_queue(queue)
    load = BatchLoad(stack, queue)

    async def crash():
        for _ in range(2):
            assert stack.mq.kill() == -9
            await asyncio.sleep(0.3)
            await stack.mq.astart()
            await asyncio.sleep(0.5)

    await run_with_crash(stack, load, crash, producers=2, consumers=3)
    summary = load.check()
    logger.info("batches: %s", summary)
    assert len(load.acked) > 100, f"too little load to mean anything: {summary}\n{stack.logs()}"
    await drain_and_sweep(stack, queue, wait)
