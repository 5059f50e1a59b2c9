"""Bulk leases end to end (issue 17, docs/protocol.md 20): ``POST``/``DELETE /{queue}/leases/{key}`` on a real stack.

One stack per test where a test restarts or kills a daemon; real files, real HTTP, real SIGKILL.
What is checked is what a user (or the Spark source) relies on: a retry with the same key gets
the same messages, a delete by key deletes exactly them, a lease that ends gives its messages
back to the queue, a kill of mq at any point loses nothing, and a key can never name a path.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from mqcore.client import Client, LocalClient
from mqcore.names import QueueName
from mqcore.protocol import Store
from mqcore.protocol.bulk import BULK_RECORD_GRACE_MS, sweep_bulk_record

pytestmark = pytest.mark.timeout(120)

Q = "bulk"


def record_path(root: Path, queue: str, key: str) -> Path:
    return root / "queues" / queue / f".lease.{key}"


async def lease(stack, key: str, **body) -> dict:
    reply = await stack.request("POST", f"/{Q}/leases/{key}", data=json.dumps(body))
    assert reply.status == 200, f"{reply.status} {reply.body[:300]!r}\n{stack.logs()}"
    return reply.json


async def test_replay_with_the_same_key_and_delete_by_key(stack) -> None:
    await stack.create_queue(Q)
    sent = [await stack.send(Q, f"m{i}".encode()) for i in range(25)]

    first = await lease(stack, "c:1:0", max_messages=20, visibility_timeout_seconds=60)
    assert first["replayed"] is False
    ids = [m["message_id"] for m in first["messages"]]
    assert ids == sent[:20]  # oldest first
    assert record_path(stack.root, Q, "c:1:0").is_file()  # written before the answer

    again = await lease(stack, "c:1:0", max_messages=20)  # a retried task: the same messages, nothing new
    assert again["replayed"] is True
    assert [m["message_id"] for m in again["messages"]] == ids
    assert again["messages"][3]["body_base64"] == first["messages"][3]["body_base64"]
    assert {m["receive_count"] for m in again["messages"]} == {2}  # leased again (15.7's re-let): new handles
    old_handle = first["messages"][0]["receipt_handle"]
    stale = await stack.request("DELETE", f"/{Q}/messages/{ids[0]}?receipt_handle={old_handle}")
    assert stale.status == 410  # the first answer's handles are stale; the record names the new ones

    other = await lease(stack, "c:1:1", max_messages=20)  # another key: only what is left
    assert [m["message_id"] for m in other["messages"]] == sent[20:]

    reply = await stack.request("DELETE", f"/{Q}/leases/c:1:0")
    assert reply.status == 200, reply.body
    assert reply.json == {"key": "c:1:0", "found": True, "deleted": 20, "missing": 0}
    assert not record_path(stack.root, Q, "c:1:0").exists()
    assert all(not n.endswith(tuple(ids)) for n in stack.files("delay"))  # the key's leases are gone...
    assert len(stack.files("delay")) == 5  # ...and only they: c:1:1's five are still in flight

    reply = await stack.request("DELETE", f"/{Q}/leases/c:1:0")  # idempotent
    assert reply.json == {"key": "c:1:0", "found": False, "deleted": 0, "missing": 0}
    stats = (await stack.request("GET", f"/{Q}")).json
    assert (stats["ready"], stats["in_flight"]) == (0, 5)
    for method in ("POST", "DELETE"):
        missing = await stack.request(method, "/no-such-queue/leases/c:1:0")
        assert (missing.status, missing.json["error"]) == (404, "queue_not_found"), (method, missing.body)


@pytest.mark.parametrize("stack", [{"mover_args": ["--rescan-interval", "1"]}], indirect=True)
async def test_a_lease_that_ends_gives_its_messages_back_and_its_key_no_longer_owns_them(stack) -> None:
    await stack.create_queue(Q)
    sent = [await stack.send(Q, f"m{i}".encode()) for i in range(5)]
    first = await lease(stack, "short", max_messages=10, visibility_timeout_seconds=1)
    assert [m["message_id"] for m in first["messages"]] == sent

    async def ready_again() -> bool:
        return (await stack.request("GET", f"/{Q}")).json["ready"] == 5

    from tests.conftest import wait_for

    await wait_for(ready_again, timeout=20, message="the expired bulk lease's messages are ready again")
    taken = await lease(stack, "someone-else", max_messages=10, visibility_timeout_seconds=60)
    assert sorted(m["message_id"] for m in taken["messages"]) == sent
    assert all(m["receive_count"] == 2 for m in taken["messages"])
    replay = await lease(stack, "short")  # someone else has them now: the old key gets nothing back
    assert replay == {"key": "short", "replayed": True, "messages": []}
    reply = await stack.request("DELETE", f"/{Q}/leases/short")  # the old key never deletes the new leases
    assert reply.json == {"key": "short", "found": True, "deleted": 0, "missing": 5}
    assert len(stack.files("delay")) == 5


async def test_keys_that_would_name_a_path_are_refused_with_a_json_400(stack) -> None:
    await stack.create_queue(Q)
    await stack.send(Q, b"x")
    for key in ("..%2F..%2Fetc", "a%2Fb", "a.b", "%2E%2E", "k" * 129, "a%00b", "a%20b"):
        for method in ("POST", "DELETE"):
            reply = await stack.request(method, f"/{Q}/leases/{key}")
            assert reply.status == 400, (method, key, reply.status, reply.body)
            body = reply.json
            assert body["error"] == "invalid_request", body
            assert body["details"]["parameter"] == "key", body
            assert "lease keys are 1-128 characters" in body["message"]
    bad = await stack.request("POST", f"/{Q}/leases/ok", data=json.dumps({"max_messages": 10_001}))
    assert (bad.status, bad.json["details"]) == (400, {"parameter": "max_messages"})
    assert not [n for n in os.listdir(stack.root / "queues" / Q) if n.startswith(".lease")]
    assert (await stack.request("GET", f"/{Q}")).json["ready"] == 1  # nothing was leased


async def test_sigkill_of_mq_during_bulk_leases_and_deletes_loses_nothing(stack) -> None:
    """Consumers lease and delete by key while mq is killed -9 and restarted; every message is processed."""
    await stack.create_queue(Q)
    total = 400
    with LocalClient(stack.root) as local:  # a fast backlog, written brokerless beside the daemon
        sent = {i for i in local.send_batch(Q, [f"m{i}".encode() for i in range(total)]) if isinstance(i, str)}
    assert len(sent) == total
    processed: set[str] = set()
    errors: list[str] = []
    stop = threading.Event()

    def consume(worker: int) -> None:
        batch = 0
        while not stop.is_set() and len(processed) < total:
            key = f"w{worker}:{batch}"
            try:
                with Client(stack.url, max_retries=0) as client:
                    got = client.lease_bulk(Q, key, max_messages=15, visibility_timeout_seconds=3)
                    processed.update(m.message_id for m in got)  # "processed" before the delete, as a sink
                    client.delete_bulk(Q, key)
                batch += 1  # the next key only once this one was deleted; a failure retries the same key
            except Exception as exc:  # noqa: BLE001  # mq is down (connection refused, no URL yet): retry
                errors.append(repr(exc))
                stop.wait(0.05)

    threads = [threading.Thread(target=consume, args=(w,), daemon=True) for w in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 90
    try:
        for kill in range(1, 4):
            while len(processed) < total * 0.2 * kill and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await stack.mq.arestart()  # kill -9, then start again
        while len(processed) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert processed == sent
    assert errors, "the kills were not seen by any consumer"

    async def nothing_left() -> bool:
        stats = (await stack.request("GET", f"/{Q}")).json
        return (stats["ready"] == 0 and stats["in_flight"] == 0) or stats

    # Leases of requests cut by a kill end at their deadline; a consumer then deletes them (or they are
    # received again): here the queue is drained with plain receives, so nothing may stay behind.
    with Client(stack.url) as client:
        for _ in range(200):
            got = client.receive(Q, max_messages=10, wait_time_seconds=1)
            for message in got:
                assert message.message_id in sent
                client.ack(message)
            stats = client.queue_stats(Q)
            if not got and stats["ready"] == 0 and stats["in_flight"] == 0:
                break
    assert await nothing_left() is True


def test_the_states_a_crash_between_two_steps_leaves(tmp_path: Path) -> None:
    """docs/protocol.md 20.4, each state made by hand with the Store, then taken up by a brokerless client."""
    root = tmp_path / "root"
    store = Store(root)
    queue = QueueName(Q)
    store.create_queue(queue)
    ids = [store.send(queue, f"m{i}".encode()) for i in range(6)]
    with LocalClient(root) as client:
        # Leases made, killed before the record was written: the key leases anew; the orphan leases end at
        # their deadline (here 1 s) and are delivered again.
        orphan = store.lease(queue, f"{ids[0]}.0", 1000)
        assert orphan is not None
        got = client.lease_bulk(Q, "k1", max_messages=2, visibility_timeout_seconds=60)
        assert [m.message_id for m in got] == ids[1:3]
        # Record written, deletes done, killed before the unlink: a delete again deletes nothing and unlinks.
        assert store.load_bulk_lease(queue, "k1") is not None
        for message in got:
            client.delete(Q, message.receipt_handle)
        assert client.lease_bulk(Q, "k1") == []  # the record's messages are gone: nothing new is leased
        assert client.delete_bulk(Q, "k1") == 0
        assert not record_path(root, Q, "k1").exists()
        # Half of the deletes done: the rest are deleted by the retry.
        got = client.lease_bulk(Q, "k2", max_messages=2, visibility_timeout_seconds=60)
        client.delete(Q, got[0].receipt_handle)
        assert client.delete_bulk(Q, "k2") == 1
        # The key's leases ended and nobody received the messages since: a retry leases them again.
        got = client.lease_bulk(Q, "k4", max_messages=1, visibility_timeout_seconds=1)
        time.sleep(1.1)
        again = client.lease_bulk(Q, "k4", visibility_timeout_seconds=60)
        assert [(m.message_id, m.receive_count) for m in again] == [(got[0].message_id, 2)]
        assert client.delete_bulk(Q, "k4") == 1
        # A record whose deadline is past its grace is swept by mq-reaper (expire_queue), not before.
        client.lease_bulk(Q, "k3", max_messages=1, visibility_timeout_seconds=60)
        path = record_path(root, Q, "k3")
        deadline = json.loads(path.read_bytes())["deadline_ms"]
        assert not sweep_bulk_record(str(path), deadline + BULK_RECORD_GRACE_MS - 1)
        assert sweep_bulk_record(str(path), deadline + BULK_RECORD_GRACE_MS)
        assert not path.exists()
