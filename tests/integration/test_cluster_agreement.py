"""Two mq daemons on one root agree on every piece of SQS state (issue 3: "every piece of state
lives in the folder tree").

Node A is a full stack (mq + mq-mover + mq-reaper) on 127.0.0.1; node B is a second mq on
127.0.0.2 sharing the root, as a second host would. What one node does through HTTP, the
other sees: receipt handles, visibility changes, receive request attempts, purges, delays.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import pytest

from mqcore.names import QueueName
from mqcore.protocol import Store


@pytest.fixture(scope="module")
def _module_nodes(module_daemons, tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes") / "root"
    a = module_daemons.stack(root, visibility_timeout=30)
    b = module_daemons.stack(root, mover=False, reaper=False, mq_args=["--address", "127.0.0.2"])
    return a, b


@pytest.fixture
def nodes(_module_nodes, http):
    """(A, B): a full stack and a second mq on another loopback address, one root, shared by the
    module's tests (start-up paid once; each test uses its own queue names)."""
    return tuple(dataclasses.replace(node, session=http) for node in _module_nodes)


async def receive_json(node, queue: str, query: str = "") -> list[dict]:
    reply = await node.request("GET", f"/{queue}/messages?max_messages=10{query}")
    assert reply.status == 200, reply.body
    return reply.json["messages"]


async def test_a_handle_from_one_node_works_on_the_other_and_goes_stale_everywhere(nodes, queue):
    a, b = nodes
    await a.create_queue(queue)
    await b.send(queue, b"job")
    [first] = await receive_json(a, queue, "&visibility_timeout_seconds=30")
    # B extends A's lease, then releases it; A's handle is the latest receive until B receives again.
    body = json.dumps({"receipt_handle": first["receipt_handle"], "visibility_timeout_seconds": 0})
    reply = await b.request("POST", f"/{queue}/messages/{first['message_id']}/visibility", data=body)
    assert reply.status == 200, reply.body
    [second] = await receive_json(b, queue)
    assert second["message_id"] == first["message_id"] and second["receive_count"] == 2
    stale = await a.request(
        "DELETE", f"/{queue}/messages/{first['message_id']}?receipt_handle={first['receipt_handle']}"
    )
    assert stale.status == 410 and stale.json["error"] == "stale_receipt_handle"
    ok = await a.request(
        "DELETE", f"/{queue}/messages/{second['message_id']}?receipt_handle={second['receipt_handle']}"
    )
    assert ok.status == 200, ok.body
    assert [n for n in a.files("delay") if f".{queue}." in n] == [] and a.files(f"queues/{queue}") == []


async def test_a_receive_retried_on_the_other_node_gets_the_same_messages(nodes, queue):
    a, b = nodes
    await a.create_queue(queue)
    for i in range(3):
        await a.send(queue, b"m%d" % i)
    got = await receive_json(a, queue, "&attempt_id=batch-7")
    retried = await receive_json(b, queue, "&attempt_id=batch-7")
    assert [m["message_id"] for m in retried] == [m["message_id"] for m in got]
    assert {m["receipt_handle"] for m in retried}.isdisjoint(m["receipt_handle"] for m in got)
    assert await receive_json(b, queue) == []  # nothing else is left to receive


async def test_a_purge_through_one_node_is_seen_at_once_by_the_other(nodes, queue):
    a, b = nodes
    await a.create_queue(queue)
    for i in range(5):
        await a.send(queue, b"old %d" % i)
    assert len(await receive_json(b, queue, "&visibility_timeout_seconds=30")) == 5  # B has indexed the queue
    for i in range(3):
        await a.send(queue, b"old again %d" % i)
    reply = await a.request("POST", f"/{queue}/purge")
    assert reply.status == 200, reply.body
    assert await receive_json(b, queue) == []
    new = await b.send(queue, b"after the purge")
    [got] = await receive_json(a, queue)
    assert got["message_id"] == new
    stats = (await b.request("GET", f"/{queue}")).json
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 1, 0)


async def test_a_delayed_send_through_one_node_is_received_through_the_other(nodes, queue):
    a, b = nodes
    await a.create_queue(queue)
    sent = await b.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "1"})
    assert sent.status == 201, sent.body
    assert (await a.request("GET", f"/{queue}")).json["delayed"] == 1
    # A long poll on A is woken when A's mq-mover makes the message ready.
    reply = await a.request("GET", f"/{queue}/messages?wait_time_seconds=5")
    assert reply.status == 200 and reply.header("X-Message-Id") == sent.header("X-Message-Id")
    assert reply.body == b"later"


async def test_two_redrives_started_at_once_through_two_nodes_move_everything(nodes, queue, wait):
    a, b = nodes
    dlq = f"{queue[:70]}-dlq"
    await a.create_queue(queue)
    await a.create_queue(dlq)
    sent = {await a.send(dlq, b"dead %d" % i) for i in range(40)}
    bodies = {b"dead %d" % i for i in range(40)}
    body = json.dumps({"destination": queue, "max_messages_per_second": 20})
    replies = await asyncio.gather(*(node.request("POST", f"/{dlq}/redrive", data=body) for node in (a, b)))
    assert {r.status for r in replies} <= {202, 409} and 202 in {r.status for r in replies}, [r.body for r in replies]

    async def completed() -> dict | None:
        task = (await b.request("GET", f"/{dlq}/redrive")).json["task"]
        return task if task and task["state"] == "completed" else None

    task = await wait(completed, timeout=15, message=lambda: a.logs())
    assert a.files(f"queues/{dlq}") == []
    back = await receive_json(a, queue)
    while len(back) < len(sent):
        batch = await receive_json(a, queue)
        assert batch, f"only {len(back)} of {len(sent)} came back; task {task}"
        back += batch
    assert {base64.b64decode(m["body_base64"]) for m in back} == bodies and len(back) == len(bodies)
    assert sent.isdisjoint(m["message_id"] for m in back)  # a redrive gives each message a new id


async def test_a_redrive_that_sees_another_task_yields_without_overwriting_it(nodes, queue, wait):
    """The race of the test above, made certain: another daemon's task writes its status over ours."""
    a, _ = nodes
    dlq = f"{queue[:70]}-dlq"
    await a.create_queue(queue)
    await a.create_queue(dlq)
    for i in range(20):
        await a.send(dlq, b"dead %d" % i)
    body = json.dumps({"destination": queue, "max_messages_per_second": 2})
    assert (await a.request("POST", f"/{dlq}/redrive", data=body)).status == 202
    store = Store(a.root)
    other = {**store.read_redrive_status(QueueName(dlq)), "task_id": "started-through-another-daemon"}
    store.write_redrive_status(QueueName(dlq), other)
    await asyncio.sleep(1.5)  # three status intervals of the task on A
    assert store.read_redrive_status(QueueName(dlq))["task_id"] == "started-through-another-daemon"
    await wait(lambda: "redrive yielded" in a.mq.log, message=a.mq.log_tail)  # stderr is read by a thread
