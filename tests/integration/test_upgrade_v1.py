"""Upgrading a root from protocol v1 (issue 18) with messages in flight loses nothing.

The root is prepared with the files protocol v1 made — leases ``delay/DL.Q.ID.RC``
and a delayed send ``delay/DL.Q.ID.0``, no lease token — exactly as v1's renames
left them, and then worked on by this version: the real daemons over HTTP, and a
brokerless client. Every v1 file is counted, peeked, moved at its deadline, and
deleted or changed by its v1 receipt handle (docs/protocol.md, 17.3).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from mqcore.client import LocalClient
from mqcore.names import MessageId, QueueName, parse_in_flight_name
from mqcore.protocol import Store, now_ms

Q = QueueName("upgraded")


def v1_lease(store: Store, mid: MessageId, deadline_ms: int) -> str:
    """Lease ``queues/Q/ID.0`` as v1 did (``delay/DL.Q.ID.1``); return the v1 receipt handle."""
    handle = f"{deadline_ms:013d}.{Q}.{mid}.1"
    os.rename(store.layout.ready_path(Q, mid, 0), store.layout.delay_path(handle))
    return handle


def v1_delayed_send(store: Store, body: bytes, deadline_ms: int) -> MessageId:
    """A delayed send as v1 published it: ``new/Q.ID`` renamed to ``delay/DL.Q.ID.0``."""
    pending = store.write_new(Q, body)
    os.rename(pending.path, store.layout.delay_path(f"{deadline_ms:013d}.{Q}.{pending.message_id}.0"))
    return pending.message_id


def ready(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "queues" / Q) if not n.startswith("."))


async def test_daemons_of_this_version_work_on_the_v1_files_of_a_root(tmp_path: Path, stack_factory, wait) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q)
    start = now_ms()
    due_id, held_id, changed_id = (store.send(Q, f"v1 {i}".encode()) for i in range(3))
    due = v1_lease(store, due_id, start + 1_000)
    held = v1_lease(store, held_id, start + 600_000)
    changed = v1_lease(store, changed_id, start + 600_000)
    delayed_id = v1_delayed_send(store, b"v1 delayed", start + 1_000)
    stack = stack_factory(root=root)

    # Counted and peeked while in flight (the two far deadlines at least).
    stats = (await stack.request("GET", f"/{Q}")).json
    assert stats["in_flight"] >= 2, stats
    peeked = (await stack.request("GET", f"/{Q}/peek")).json["messages"]
    states = {m["message_id"]: (m["state"], m["receive_count"]) for m in peeked}
    assert states[held_id] == states[changed_id] == ("in_flight", 1), states

    # The mover makes the due v1 lease and the v1 delayed send ready at their deadlines.
    await wait(
        lambda: {f"{due_id}.1", f"{delayed_id}.0"} <= set(ready(root)),
        message=lambda: f"{ready(root)} {os.listdir(root / 'delay')}\n{stack.logs()}",
    )
    assert now_ms() >= start + 1_000
    received = {}
    for _ in range(2):
        reply = await stack.receive(Q)
        assert reply.status == 200, reply.body
        received[reply.header("X-Message-Id")] = (reply.body, reply.header("X-Receive-Count"))
        handle = reply.header("X-Receipt-Handle")
        assert not parse_in_flight_name(handle).is_legacy, "new receives make v2 names"
    assert received == {due_id: (b"v1 0", "2"), delayed_id: (b"v1 delayed", "1")}
    # The v1 handle of the redelivered lease is stale now.
    reply = await stack.request("DELETE", f"/{Q}/messages/{due_id}?receipt_handle={quote(due)}")
    assert reply.status == 410, reply.body

    # v1 handles delete and change their own leases.
    reply = await stack.request("DELETE", f"/{Q}/messages/{held_id}?receipt_handle={quote(held)}")
    assert (reply.status, reply.json["was"] if reply.status == 200 else None) == (200, "in_flight"), reply.body
    body = json.dumps({"receipt_handle": changed, "visibility_timeout_seconds": 300})
    reply = await stack.request(
        "POST", f"/{Q}/messages/{changed_id}/visibility", data=body, headers={"Content-Type": "application/json"}
    )
    assert reply.status == 200, reply.body
    assert parse_in_flight_name(reply.json["receipt_handle"]).is_legacy, "a v1 lease keeps its v1 form"
    reply = await stack.request("DELETE", f"/{Q}/messages/{changed_id}?receipt_handle={quote(changed)}")
    assert reply.status == 200, reply.body
    stats = (await stack.request("GET", f"/{Q}")).json
    assert (stats["in_flight"], stats["delayed"]) == (2, 0), stats  # the two v2 receives above


def test_a_brokerless_client_works_on_the_v1_files_of_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q)
    start = now_ms()
    due_id, held_id = store.send(Q, b"due"), store.send(Q, b"held")
    v1_lease(store, due_id, start - 1)
    held = v1_lease(store, held_id, start + 600_000)
    delayed_id = v1_delayed_send(store, b"delayed", start - 1)
    with LocalClient(root) as client:
        stats = client.queue_stats(Q)
        assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 2, 1), stats
        page = client.peek(Q)
        assert {(m.message_id, m.state) for m in page.messages} == {
            (due_id, "in_flight"),
            (held_id, "in_flight"),
            (delayed_id, "delayed"),
        }
        got = client.receive(Q, max_messages=10, wait_time_seconds=0)
        assert {(m.message_id, m.body, m.receive_count) for m in got} == {
            (due_id, b"due", 2),
            (delayed_id, b"delayed", 1),
        }
        client.delete(Q, held)
        for message in got:
            client.delete(Q, message.receipt_handle)
        stats = client.queue_stats(Q)
        assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0), stats
