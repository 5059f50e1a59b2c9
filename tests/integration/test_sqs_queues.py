"""Queue-level SQS semantics, end to end: queue attributes (persisted under the root), queue
statistics, listing with a prefix, capacity, purge, dead-letter queues and redrive
(issue 3; docs/api.md "Queues", "Capacity", "Purge", "Dead-letter queues and redrive").

Real daemons as subprocesses (mq-mover dead-letters and redelivers), real HTTP, real files.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
from http_checks import assert_error

from mqcore.names import QueueName
from mqcore.protocol import Store, now_ms


@pytest.fixture
def stack(request, shared_stack, stack_factory):
    """The module's shared stack, or a fresh one when parametrized with options (indirect)."""
    if hasattr(request, "param"):
        return stack_factory(**request.param)
    return shared_stack


async def put_json(stack, path: str, obj):
    return await stack.request("PUT", path, data=json.dumps(obj), headers={"Content-Type": "application/json"})


async def post_json(stack, path: str, obj=None):
    data = json.dumps(obj) if obj is not None else None
    return await stack.request("POST", path, data=data, headers={"Content-Type": "application/json"})


async def stats(stack, queue: str) -> dict:
    reply = await stack.request("GET", f"/{queue}")
    assert reply.status == 200, reply.body
    return reply.json


def message_files(stack, queue: str) -> list[str]:
    """Ready files of ``queue`` plus its files in delay/ (metadata files left out)."""
    ready = [n for n in stack.files(f"queues/{queue}") if not n.startswith(".")]
    return ready + [n for n in stack.files("delay") if f".{queue}." in n]


# -- attributes ------------------------------------------------------------------------


async def test_create_with_attributes_and_read_them_back(stack, queue):
    dlq = f"{queue}-dlq"
    await stack.create_queue(dlq)
    wanted = {"visibility_timeout_seconds": 45, "delay_seconds": 3, "dead_letter_queue": dlq, "capacity": 1000}
    reply = await put_json(stack, f"/{queue}", wanted)
    assert reply.status == 201, reply.body
    assert reply.json["created"] is True
    attrs = reply.json["attributes"]
    assert {k: attrs[k] for k in wanted} == wanted
    assert attrs["max_receive_count"] == 5  # a dead-letter queue alone gets SMQ's 5 receives
    assert attrs["retention_seconds"] == 345_600 and attrs["receive_wait_seconds"] == 0
    assert attrs["capacity_wait_seconds"] == 20 and attrs["max_message_bytes"] == 1_048_576
    got = await stack.request("GET", f"/{queue}/attributes")
    assert got.status == 200 and got.json == {"queue": queue, "attributes": attrs}

    # PUT again: idempotent with the same (or no) attributes, 409 with different ones.
    again = await put_json(stack, f"/{queue}", {"delay_seconds": 3})
    assert again.status == 201 and again.json["created"] is False and again.json["attributes"] == attrs
    plain = await stack.request("PUT", f"/{queue}")
    assert plain.status == 201 and plain.json["created"] is False
    body = assert_error(await put_json(stack, f"/{queue}", {"delay_seconds": 4}), 409, "queue_name_exists")
    assert body["details"]["attributes"] == ["delay_seconds"]
    assert (await stack.request("GET", f"/{queue}/attributes")).json["attributes"] == attrs
    # Values are compared with the effective ones: the daemon's defaults count as set.
    same = await put_json(stack, f"/{dlq}", {"visibility_timeout_seconds": 30, "delay_seconds": 0})
    assert same.status == 201 and same.json["created"] is False, same.body
    assert_error(await put_json(stack, f"/{dlq}", {"visibility_timeout_seconds": 31}), 409, "queue_name_exists")


async def test_bad_attributes_are_400_and_create_nothing(stack, queue):
    cases = [
        ({"visibility_timeout": 5}, "invalid_attribute", "visibility_timeout"),
        ({"visibility_timeout_seconds": 43_201}, "invalid_attribute", "visibility_timeout_seconds"),
        ({"delay_seconds": "5"}, "invalid_attribute", "delay_seconds"),
        ({"retention_seconds": 59}, "invalid_attribute", "retention_seconds"),
        ({"capacity": 0}, "invalid_attribute", "capacity"),
        ({"capacity_wait_seconds": 21}, "invalid_attribute", "capacity_wait_seconds"),
        ({"max_receive_count": True}, "invalid_attribute", "max_receive_count"),
        ({"dead_letter_queue": "no-such-queue-anywhere"}, "invalid_attribute", "dead_letter_queue"),
        ({"dead_letter_queue": "bad name"}, "invalid_attribute", "dead_letter_queue"),
    ]
    for obj, code, name in cases:
        body = assert_error(await put_json(stack, f"/{queue}", obj), 400, code, json.dumps(obj))
        assert body["details"]["name"] == name
    for data in (b"[1, 2]", b"not json", b'"text"'):  # sent as JSON (other bodies are ignored, as SoftLayer does)
        reply = await stack.request("PUT", f"/{queue}", data=data, headers={"Content-Type": "application/json"})
        assert_error(reply, 400, "invalid_request", repr(data))
    assert_error(await stack.request("GET", f"/{queue}"), 404, "queue_not_found")
    assert not [n for n in stack.files("queues") if queue in n]


async def test_set_attributes_merges_and_null_resets(stack, queue):
    await stack.create_queue(queue)
    reply = await put_json(stack, f"/{queue}/attributes", {"visibility_timeout_seconds": 5, "receive_wait_seconds": 2})
    assert reply.status == 200, reply.body
    assert reply.json["attributes"]["visibility_timeout_seconds"] == 5
    reply = await put_json(stack, f"/{queue}/attributes", {"delay_seconds": 1, "visibility_timeout_seconds": None})
    attrs = reply.json["attributes"]
    assert (attrs["visibility_timeout_seconds"], attrs["receive_wait_seconds"], attrs["delay_seconds"]) == (30, 2, 1)
    body = assert_error(await put_json(stack, f"/{queue}/attributes", {"delay_seconds": 901}), 400, "invalid_attribute")
    assert body["details"]["name"] == "delay_seconds"
    assert_error(await put_json(stack, f"/{queue}/attributes", [1]), 400, "invalid_request", "not an object")
    assert (await stack.request("GET", f"/{queue}/attributes")).json["attributes"] == attrs
    assert_error(await put_json(stack, "/no-such-queue-x/attributes", {"delay_seconds": 1}), 404, "queue_not_found")
    assert_error(await stack.request("GET", "/no-such-queue-x/attributes"), 404, "queue_not_found")


@pytest.mark.parametrize("stack", [{"visibility_timeout": 7, "max_message_size": 5000, "reaper": False}], indirect=True)
async def test_attributes_default_to_the_daemon_options_and_survive_a_restart(stack, queue):
    defaults = (await put_json(stack, f"/{queue[:60]}-plain", {})).json["attributes"]
    assert (defaults["visibility_timeout_seconds"], defaults["max_message_bytes"]) == (7, 5000)
    same = await put_json(stack, f"/{queue[:60]}-plain", {"visibility_timeout_seconds": 7})
    assert same.status == 201 and same.json["created"] is False, "the daemon's default is the queue's value"
    reply = await put_json(stack, f"/{queue}", {"visibility_timeout_seconds": 2, "max_message_bytes": 100_000})
    assert reply.status == 201, reply.body
    assert reply.json["attributes"]["max_message_bytes"] == 5000  # --max-message-size caps the queue's limit
    reply = await put_json(stack, f"/{queue}/attributes", {"max_message_bytes": 2000, "delay_seconds": 0})
    attrs = reply.json["attributes"]
    created_ms = (await stats(stack, queue))["created_ms"]
    assert abs(created_ms - now_ms()) < 60_000

    await stack.mq.arestart()  # kill -9 and start again: nothing lives in the daemon's memory
    got = await stack.request("GET", f"/{queue}/attributes")
    assert got.status == 200 and got.json["attributes"] == attrs
    assert (await stats(stack, queue))["created_ms"] == created_ms
    # ... and they still apply: the queue's visibility timeout, its size limit.
    assert_error(await stack.request("POST", f"/{queue}/messages", data=b"x" * 2001), 413, "message_too_large")
    await stack.send(queue, b"x" * 2000)
    reply = await stack.receive(queue)
    assert int(reply.header("X-Visibility-Deadline")) - int(reply.header("X-First-Receive-Timestamp")) == 2000


# -- statistics and listing ------------------------------------------------------------


async def test_get_queue_statistics(stack, queue):
    await stack.create_queue(queue)
    before = now_ms()
    empty = await stats(stack, queue)
    assert {k: empty[k] for k in ("queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds", "redrive")} == {
        "queue": queue,
        "ready": 0,
        "in_flight": 0,
        "delayed": 0,
        "oldest_ready_age_seconds": None,
        "redrive": None,
    }
    assert before - 60_000 < empty["created_ms"] <= now_ms()
    assert empty["attributes"]["visibility_timeout_seconds"] == 30
    for i in range(4):
        await stack.send(queue, b"m%d" % i)
    await stack.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "600"})
    await stack.receive(queue)
    await asyncio.sleep(0.3)
    got = await stats(stack, queue)
    assert (got["ready"], got["in_flight"], got["delayed"]) == (3, 1, 1)
    assert 0.3 <= got["oldest_ready_age_seconds"] < 30


async def test_list_queues_with_a_prefix(stack, queue):
    prefix = queue[:60]
    for suffix in ("-b", "-a", "x"):
        await stack.create_queue(prefix + suffix)
    reply = await stack.request("GET", f"/?prefix={prefix}-")
    assert reply.status == 200 and reply.json == {"queues": [f"{prefix}-a", f"{prefix}-b"], "next_after": None}
    everything = (await stack.request("GET", "/")).json["queues"]
    assert {f"{prefix}-a", f"{prefix}-b", f"{prefix}x"} <= set(everything) and everything == sorted(everything)
    assert (await stack.request("GET", "/?prefix=zz-nothing-has-this")).json == {"queues": [], "next_after": None}
    for bad in ("a.b", "a%20b", "a" * 81, "%2e%2e"):
        assert_error(await stack.request("GET", f"/?prefix={bad}"), 400, "invalid_request", bad)
    assert_error(await stack.request("GET", "/?name=x"), 400, "invalid_request", "unknown parameter")


# -- capacity --------------------------------------------------------------------------


async def test_capacity_blocks_a_send_until_room_then_429(stack, queue):
    reply = await put_json(stack, f"/{queue}", {"capacity": 2, "capacity_wait_seconds": 1})
    assert reply.status == 201, reply.body
    first = await stack.send(queue, b"a")
    await stack.send(queue, b"b")

    start = time.monotonic()
    full = await stack.request("POST", f"/{queue}/messages", data=b"c")
    assert_error(full, 429, "queue_full", "third send")
    assert full.header("Retry-After") == "1"
    assert 0.9 <= time.monotonic() - start < 3, "waited capacity_wait_seconds before 429"
    await put_json(stack, f"/{queue}/attributes", {"capacity_wait_seconds": 0})
    start = time.monotonic()
    assert_error(await stack.request("POST", f"/{queue}/messages", data=b"c"), 429, "queue_full", "no wait")
    assert time.monotonic() - start < 0.5

    # A waiting send goes through as soon as a receive makes room.
    await put_json(stack, f"/{queue}/attributes", {"capacity_wait_seconds": 10})
    blocked = asyncio.create_task(stack.request("POST", f"/{queue}/messages", data=b"d"))
    await asyncio.sleep(0.5)
    assert not blocked.done()
    got = await stack.receive(queue)
    assert got.header("X-Message-Id") == first
    room_made = time.monotonic()
    reply = await asyncio.wait_for(blocked, 5)
    assert reply.status == 201, reply.body
    assert time.monotonic() - room_made < 0.5
    assert (await stats(stack, queue))["ready"] == 2  # in-flight messages do not count

    # A batch takes what fits; the rest fails with queue_full (retriable: not the sender's fault).
    await stack.receive(queue)
    await put_json(stack, f"/{queue}/attributes", {"capacity_wait_seconds": 0})
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": [{"body": "e"}, {"body": "f"}]})
    assert reply.status == 200, reply.body
    assert [s["id"] for s in reply.json["successful"]] == ["0"]
    assert [(f["id"], f["error"], f["sender_fault"]) for f in reply.json["failed"]] == [("1", "queue_full", False)]

    # Purge and removing the capacity make room too.
    assert (await post_json(stack, f"/{queue}/purge")).status == 200
    await stack.send(queue, b"g")
    await stack.send(queue, b"h")
    await put_json(stack, f"/{queue}/attributes", {"capacity": None})
    await stack.send(queue, b"i")
    assert (await stats(stack, queue))["ready"] == 3


# -- purge -----------------------------------------------------------------------------


async def test_purge_removes_every_message_sent_before_it(stack, queue):
    await stack.create_queue(queue)
    for i in range(5):
        await stack.send(queue, b"m%d" % i)
    leased = [await stack.receive(queue) for _ in range(2)]
    await stack.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "60"})
    reply = await post_json(stack, f"/{queue}/purge")
    assert reply.status == 200 and reply.json == {"queue": queue, "purged": True, "removed": 6}, reply.body
    got = await stats(stack, queue)
    assert (got["ready"], got["in_flight"], got["delayed"]) == (0, 0, 0)
    assert message_files(stack, queue) == []
    assert (await stack.receive(queue)).status == 204
    old = leased[0]
    reply = await stack.request(
        "DELETE", f"/{queue}/messages/{old.header('X-Message-Id')}?receipt_handle={old.header('X-Receipt-Handle')}"
    )
    assert_error(reply, 404, "message_not_found", "handle of a purged message")
    after = await stack.send(queue, b"after the purge")
    reply = await stack.receive(queue)
    assert reply.header("X-Message-Id") == after and reply.body == b"after the purge"
    assert_error(await post_json(stack, "/no-such-queue-x/purge"), 404, "queue_not_found")


# -- dead-letter queues and redrive ------------------------------------------------------


async def wait_redrive(stack, dlq: str, state: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        task = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
        if task and task["state"] == state:
            return task
        assert time.monotonic() < deadline, f"redrive not {state}: {task}\n{stack.logs()}"
        await asyncio.sleep(0.1)


async def test_dead_letter_after_max_receives_and_redrive_restores_it(stack, queue, wait):
    dlq = f"{queue}-dlq"
    await stack.create_queue(dlq)
    attrs = {"dead_letter_queue": dlq, "max_receive_count": 2, "visibility_timeout_seconds": 1}
    assert (await put_json(stack, f"/{queue}", attrs)).status == 201
    assert (await stack.request("GET", f"/{dlq}/redrive")).json == {"task": None}
    reply = await stack.request(
        "POST",
        f"/{queue}/messages",
        data=b"poison",
        headers={"Content-Type": "text/x-poison", "X-Message-Attributes": '{"tenant": "acme"}'},
    )
    message_id = reply.header("X-Message-Id")
    for count in ("1", "2"):
        got = await stack.request("GET", f"/{queue}/messages?wait_time_seconds=10")
        assert got.status == 200 and got.header("X-Receive-Count") == count, stack.logs()
    await wait(lambda: f"{message_id}.2" in stack.files(f"queues/{dlq}"), message=stack.logs)
    assert (await stack.request("GET", f"/{queue}/messages?wait_time_seconds=2")).status == 204
    assert (await stats(stack, dlq))["ready"] == 1

    reply = await post_json(stack, f"/{dlq}/redrive", {})
    assert reply.status == 202, reply.body
    task = reply.json["task"]
    assert (task["source"], task["destination"], task["state"], task["to_move"]) == (dlq, None, "running", 1)
    assert task["max_messages_per_second"] == 500
    done = await wait_redrive(stack, dlq, "completed")
    assert (done["moved"], done["skipped"], done["task_id"]) == (1, 0, task["task_id"])
    assert (await stats(stack, dlq))["redrive"]["state"] == "completed"

    back = await stack.request("GET", f"/{queue}/messages?wait_time_seconds=5")
    assert back.status == 200, stack.logs()
    assert (back.body, back.content_type) == (b"poison", "text/x-poison")
    assert json.loads(back.header("X-Message-Attributes")) == {"tenant": "acme"}
    assert back.header("X-Receive-Count") == "1"  # the receive count starts again
    # ... so the id changes: a handle from before the dead-lettering never matches the new leases.
    redriven = back.header("X-Message-Id")
    assert redriven != message_id and redriven > message_id
    assert stack.files(f"queues/{dlq}") == []


async def test_redrive_rate_conflict_cancel_destination_and_skips(stack, queue):
    dlq, dest = f"{queue}-dlq", f"{queue}-dest"
    for name in (dlq, dest):
        await stack.create_queue(name)
    ids = [await stack.send(dlq, b"d%d" % i) for i in range(5)]  # sent straight to the DLQ: no other source
    assert_error(await post_json(stack, f"/{dlq}/redrive", {"destination": "no-such-queue-x"}), 404, "queue_not_found")
    assert_error(await post_json(stack, f"/{dlq}/redrive", {"destination": dlq}), 400, "invalid_request")
    for bad in ({"max_messages_per_second": 0}, {"max_messages_per_second": 10_001}, {"speed": 1}):
        assert_error(await post_json(stack, f"/{dlq}/redrive", bad), 400, "invalid_request", json.dumps(bad))
    assert_error(await stack.request("DELETE", f"/{dlq}/redrive"), 404, "redrive_not_running")

    reply = await post_json(stack, f"/{dlq}/redrive", {"destination": dest, "max_messages_per_second": 2})
    assert reply.status == 202, reply.body
    assert_error(await post_json(stack, f"/{dlq}/redrive", {}), 409, "redrive_in_progress", "second start")
    await asyncio.sleep(0.8)
    cancel = await stack.request("DELETE", f"/{dlq}/redrive")
    assert cancel.status == 200 and cancel.json["task"]["state"] == "cancelled", cancel.body
    await asyncio.sleep(0.3)
    final = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
    await asyncio.sleep(0.7)  # at 2 messages/s a task still running would move one more meanwhile
    stopped = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
    assert stopped == final and stopped["state"] == "cancelled", (final, stopped)  # the task has ended
    assert 1 <= stopped["moved"] < 5, stopped  # 2/s: some, not all
    assert stopped["cancel_requested_ms"] >= stopped["started_ms"]
    moved = stopped["moved"]
    assert (await stats(stack, dest))["ready"] == moved
    assert (await stats(stack, dlq))["ready"] == 5 - moved

    # Without a destination, messages whose source is unknown are skipped and stay.
    reply = await post_json(stack, f"/{dlq}/redrive")
    assert reply.status == 202, reply.body
    skipped = await wait_redrive(stack, dlq, "completed")
    assert (skipped["moved"], skipped["skipped"]) == (0, 5 - moved)
    assert (await stats(stack, dlq))["ready"] == 5 - moved
    # A fast redrive to the destination completes; every message arrives, oldest first.
    assert (await post_json(stack, f"/{dlq}/redrive", {"destination": dest})).status == 202
    await wait_redrive(stack, dlq, "completed")
    got = await stack.request("GET", f"/{dest}/messages?max_messages=10")
    messages = got.json["messages"]
    assert [base64.b64decode(m["body_base64"]) for m in messages] == [b"d%d" % i for i in range(5)]
    assert all(m["receive_count"] == 1 for m in messages)
    assert set(ids).isdisjoint(m["message_id"] for m in messages)  # a redrive gives each a new id


async def test_redrive_cancelled_through_another_daemon_stops(stack, queue, daemons, http, wait):
    dlq, dest = f"{queue[:60]}-dlq", f"{queue[:60]}-dest"
    for name in (dlq, dest):
        await stack.create_queue(name)
    for i in range(6):
        await stack.send(dlq, b"d%d" % i)
    other = daemons.start("mq", "--root", stack.root, "--port", "0")
    reply = await post_json(stack, f"/{dlq}/redrive", {"destination": dest, "max_messages_per_second": 2})
    assert reply.status == 202, reply.body
    async with http.post(f"{other.url}/{dlq}/redrive", json={}) as resp:
        assert resp.status == 409  # the status file says running: one task per queue across daemons
    await asyncio.sleep(0.6)
    async with http.delete(f"{other.url}/{dlq}/redrive") as resp:
        assert resp.status == 200 and (await resp.json())["task"]["state"] == "cancelled"
    await asyncio.sleep(1.1)  # the running task looks at the status file at least every second
    final = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
    await asyncio.sleep(0.7)  # at 2 messages/s a task still running would move one more meanwhile
    stopped = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
    assert stopped == final and stopped["state"] == "cancelled", (final, stopped)
    assert 1 <= stopped["moved"] < 6 and (await stats(stack, dest))["ready"] == stopped["moved"]
    await wait(lambda: "redrive cancelled" in stack.mq.log, message=stack.mq.log_tail)  # stderr is read by a thread


async def test_a_running_redrive_not_updated_for_10_s_is_reported_failed(stack, queue):
    dlq = queue
    await stack.create_queue(dlq)
    stale = {
        "task_id": "deadbeef",
        "source": dlq,
        "destination": None,
        "max_messages_per_second": 500,
        "state": "running",
        "moved": 3,
        "skipped": 0,
        "to_move": 10,
        "started_ms": now_ms() - 60_000,
        "updated_ms": now_ms() - 11_000,
    }
    Store(stack.root).write_redrive_status(QueueName(dlq), stale)  # what a daemon killed mid-redrive leaves
    task = (await stack.request("GET", f"/{dlq}/redrive")).json["task"]
    assert task["state"] == "failed" and task["error"] and task["moved"] == 3
    assert (await stats(stack, dlq))["redrive"]["state"] == "failed"
    assert_error(await stack.request("DELETE", f"/{dlq}/redrive"), 404, "redrive_not_running")
    reply = await post_json(stack, f"/{dlq}/redrive")  # a new task may start at once
    assert reply.status == 202 and reply.json["task"]["task_id"] != "deadbeef"
    await wait_redrive(stack, dlq, "completed")


async def test_attribute_changes_through_another_daemon_apply(stack, queue, daemons, http, wait):
    """The cached attributes of one mq follow changes made through another (inotify on .attributes)."""
    await stack.create_queue(queue)
    await stats(stack, queue)  # this daemon has loaded (and cached) the queue
    other = daemons.start("mq", "--root", stack.root, "--port", "0")
    async with http.put(f"{other.url}/{queue}/attributes", json={"visibility_timeout_seconds": 2}) as resp:
        assert resp.status == 200

    async def seen() -> bool:
        reply = await stack.request("GET", f"/{queue}/attributes")
        return reply.json["attributes"]["visibility_timeout_seconds"] == 2

    await wait(seen, timeout=2, message="the change made through the other daemon was not seen")
    await stack.send(queue, b"x")
    reply = await stack.receive(queue)
    assert int(reply.header("X-Visibility-Deadline")) - int(reply.header("X-First-Receive-Timestamp")) == 2000


async def _ready_is(stack, queue: str, count: int) -> bool:
    return (await stats(stack, queue))["ready"] == count


async def test_redrive_into_a_queue_purged_after_the_send_keeps_the_messages(stack, queue, wait):
    """Redriven messages keep their id unless the destination was purged after their send: then they
    get a fresh one (a purge must not swallow what a redrive restores) and are still counted once."""
    dlq, dest = f"{queue[:60]}-dlq", f"{queue[:60]}-dest"
    for name in (dlq, dest):
        await stack.create_queue(name)
    bodies = [b"r%d" % i for i in range(3)]
    ids = [await stack.send(dlq, body) for body in bodies]
    assert (await post_json(stack, f"/{dest}/purge")).status == 200
    assert (await post_json(stack, f"/{dlq}/redrive", {"destination": dest})).status == 202
    done = await wait_redrive(stack, dlq, "completed")
    assert done["moved"] == 3
    await wait(lambda: _ready_is(stack, dest, 3), timeout=5, message="the moved messages were not indexed")
    await asyncio.sleep(0.2)
    assert (await stats(stack, dest))["ready"] == 3  # each counted once: no guessed names in the index
    got = (await stack.request("GET", f"/{dest}/messages?max_messages=10")).json["messages"]
    assert [base64.b64decode(m["body_base64"]) for m in got] == bodies
    assert not {m["message_id"] for m in got} & set(ids)
    assert (await stats(stack, dest))["ready"] == 0
