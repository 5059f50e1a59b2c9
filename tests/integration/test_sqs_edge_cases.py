"""Edge cases of the SQS semantics that a review caught: stale indexes across hosts, one message
per receive, delayed sends at capacity, long attribute headers, bounded memory.

Real daemons as subprocesses (the fixtures of ``tests/conftest.py``), real HTTP, real files;
nothing is mocked. Each test names the defect it guards against. One test serves mq's broker in
this process instead (as ``serve()`` does, on a real socket), to look at what it keeps in memory.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time

import pytest
from http_checks import assert_error, mq_in_process

from mqcore.names import QueueName
from mqcore.protocol import Store


async def put_json(node, path: str, obj):
    return await node.request("PUT", path, data=json.dumps(obj), headers={"Content-Type": "application/json"})


async def stats(node, queue: str) -> dict:
    reply = await node.request("GET", f"/{queue}")
    assert reply.status == 200, reply.body
    return reply.json


async def receive_json(node, queue: str, query: str = "") -> list[dict]:
    reply = await node.request("GET", f"/{queue}/messages?max_messages=10{query}")
    assert reply.status == 200, reply.body
    return reply.json["messages"]


async def delete_by_handle(node, queue: str, message: dict):
    return await node.request(
        "DELETE", f"/{queue}/messages/{message['message_id']}?receipt_handle={message['receipt_handle']}"
    )


# -- a rescan drops names another host took (no inotify, as on NFS across hosts) ----------------


@pytest.fixture(scope="module")
def _module_hosts(module_daemons, tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts") / "root"
    options = {"mover": False, "reaper": False, "env": {"MQ_NO_INOTIFY": "1"}}
    a = module_daemons.stack(root, mq_args=["--rescan-interval", "1"], **options)
    b = module_daemons.stack(root, mq_args=["--rescan-interval", "1", "--address", "127.0.0.2"], **options)
    return a, b


@pytest.fixture
def hosts(_module_hosts, http):
    """(A, B): two mq daemons on one root without inotify, each rescanning every second (two NFS hosts);
    shared by the module's tests, which use their own queue names."""
    return tuple(dataclasses.replace(host, session=http) for host in _module_hosts)


async def test_a_rescan_forgets_messages_another_host_took_and_frees_the_capacity(hosts, queue, wait):
    """Defect: a rescan only added names, so A's ready count, oldest age and capacity stayed inflated for ever."""
    a, b = hosts
    reply = await put_json(a, f"/{queue}", {"capacity": 3, "capacity_wait_seconds": 10})
    assert reply.status == 201, reply.body
    for i in range(3):
        await a.send(queue, b"m%d" % i)
    assert (await stats(a, queue))["ready"] == 3
    # A's next send waits for room; B (another host: A sees nothing of it but its own rescans) makes it.
    waiting = asyncio.create_task(a.request("POST", f"/{queue}/messages", data=b"fourth"))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "the queue is full: the fourth send waits for room"
    taken = await receive_json(b, queue)
    assert len(taken) == 3
    for message in taken:
        assert (await delete_by_handle(b, queue, message)).status == 200
    start = time.monotonic()
    fourth = await asyncio.wait_for(waiting, 8)
    assert fourth.status == 201, f"{fourth.status} {fourth.body!r}\n{a.logs()}"
    assert time.monotonic() - start < 5, "a rescan (every second) made room"
    await wait(lambda: "rescan dropped" in a.mq.log, message=a.mq.log_tail)  # stderr is read by a thread

    async def settled() -> dict | None:
        s = await stats(a, queue)
        return s if s["ready"] == 1 else None

    # The fourth message is the only ready one, its age is its own, and two more sends fit at once.
    now = await wait(settled, timeout=5, message=lambda: a.logs())
    assert now["oldest_ready_age_seconds"] is not None and now["oldest_ready_age_seconds"] < 5
    await put_json(a, f"/{queue}/attributes", {"capacity_wait_seconds": 0})
    for i in range(2):
        await a.send(queue, b"more %d" % i)
    assert_error(await a.request("POST", f"/{queue}/messages", data=b"one too many"), 429, "queue_full")
    assert [m["body_base64"] for m in await receive_json(a, queue)] == ["Zm91cnRo", "bW9yZSAw", "bW9yZSAx"]


async def test_an_emptied_queue_shows_no_ready_message_and_no_oldest_age_on_the_other_host(hosts, queue, wait):
    a, b = hosts
    await a.create_queue(queue)
    for i in range(5):
        await a.send(queue, b"m%d" % i)
    assert (await stats(a, queue))["oldest_ready_age_seconds"] is not None
    reply = await b.request("POST", f"/{queue}/purge")
    assert reply.status == 200 and reply.json["removed"] == 5

    async def empty() -> dict | None:
        s = await stats(a, queue)
        return s if s["ready"] == 0 else None

    now = await wait(empty, timeout=5, message=lambda: a.logs())
    assert now["oldest_ready_age_seconds"] is None


# -- one receive returns each message at most once --------------------------------------------


async def test_a_batch_receive_returns_each_message_once_even_when_it_comes_back_meanwhile(shared_stack, queue):
    """Defect: a receive of 10 looped after each round trip; with visibility 0, mq-mover made the
    messages it had just leased ready again, inotify re-indexed them, and the same receive leased
    them again: 4-10 entries for 3 messages, all but the last handle of each already stale."""
    stack = shared_stack
    await stack.create_queue(queue)
    sent = {await stack.send(queue, b"m%d" % i) for i in range(3)}
    for attempt in range(15):
        messages = await receive_json(stack, queue, "&visibility_timeout_seconds=0&wait_time_seconds=5")
        ids = [m["message_id"] for m in messages]
        assert len(ids) == len(set(ids)), f"attempt {attempt}: the same message twice in one answer: {ids}"
        assert set(ids) <= sent and ids, f"attempt {attempt}: {ids}"
    # Every handle of an answer is its message's latest receive: each deletes it.
    got: dict[str, dict] = {}
    while len(got) < len(sent):
        for message in await receive_json(stack, queue, "&visibility_timeout_seconds=30&wait_time_seconds=5"):
            assert message["message_id"] not in got
            got[message["message_id"]] = message
    for message in got.values():
        reply = await delete_by_handle(stack, queue, message)
        assert reply.status == 200, f"{reply.status} {reply.body!r}"
    assert (await stats(stack, queue))["ready"] == 0


# -- capacity never holds a delayed send -------------------------------------------------------


async def test_a_full_queue_takes_delayed_sends_at_once_single_and_batch(shared_stack, queue, wait):
    """Defect: a delayed send to a full queue waited capacity_wait_seconds and got 429, although
    capacity counts ready messages only and a delayed message is not ready (docs/api.md, Capacity)."""
    stack = shared_stack
    reply = await put_json(stack, f"/{queue}", {"capacity": 1, "capacity_wait_seconds": 3})
    assert reply.status == 201, reply.body
    ready_id = await stack.send(queue, b"fills the queue")
    start = time.monotonic()
    delayed = await stack.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "1"})
    assert delayed.status == 201, delayed.body
    # The queue's own delay_seconds makes a send delayed too.
    assert (await put_json(stack, f"/{queue}/attributes", {"delay_seconds": 1})).status == 200
    by_default = await stack.request("POST", f"/{queue}/messages", data=b"delayed by the queue")
    assert by_default.status == 201, by_default.body
    assert time.monotonic() - start < 2, "no delayed send waited for room"
    assert (await put_json(stack, f"/{queue}/attributes", {"delay_seconds": None, "capacity_wait_seconds": 0})).status
    batch = {
        "messages": [
            {"id": "late", "body": "a", "delay_seconds": 1},
            {"id": "now", "body": "b", "delay_seconds": 0},
            {"id": "later", "body": "c", "delay_seconds": 2},
        ]
    }
    reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps(batch))
    assert reply.status == 200, reply.body
    assert [e["id"] for e in reply.json["successful"]] == ["late", "later"]
    [failed] = reply.json["failed"]
    assert failed["id"] == "now" and failed["error"] == "queue_full" and failed["sender_fault"] is False
    now = await stats(stack, queue)
    assert (now["ready"], now["delayed"]) == (1, 4), now

    # Coming due, they are never refused: ready exceeds the capacity for a while.
    async def all_ready() -> dict | None:
        s = await stats(stack, queue)
        return s if s["ready"] == 5 else None

    await wait(all_ready, timeout=10, message=lambda: stack.logs())
    got = [m["message_id"] for m in await receive_json(stack, queue, "&visibility_timeout_seconds=30")]
    assert len(got) == 5 and got[0] == ready_id


# -- attribute headers longer than aiohttp's default field limit reach mq -----------------------


async def test_an_attributes_header_over_8190_bytes_reaches_mq_accepted_or_refused_as_json(shared_stack, queue):
    """Defect: aiohttp refused any header over 8,190 bytes with a plain-text 400 before mq saw it, so
    valid attributes sent with spaces failed, and oversized ones got no JSON error body."""
    stack = shared_stack
    await stack.create_queue(queue)
    attributes = {f"key-{i}": "v" * 760 for i in range(10)}
    compact = json.dumps(attributes, separators=(",", ":"))
    assert len(compact) <= 8000  # within mq's limit (mqcore.attributes.MAX_ATTRIBUTES_JSON_BYTES)
    spaced = json.dumps(attributes, separators=(",  " + " " * 40, ":  " + " " * 40))
    assert len(spaced) > 8190
    sent = await stack.request("POST", f"/{queue}/messages", data=b"spaced", headers={"X-Message-Attributes": spaced})
    assert sent.status == 201, f"{sent.status} {sent.body[:300]!r}"
    got = await stack.request("GET", f"/{queue}/messages")
    assert got.status == 200 and got.body == b"spaced"
    assert json.loads(got.header("X-Message-Attributes")) == attributes

    too_big = json.dumps({"big": "x" * 9000})
    assert 9000 < len(too_big) < 9100
    reply = await stack.request("POST", f"/{queue}/messages", data=b"no", headers={"X-Message-Attributes": too_big})
    assert_error(reply, 400, "invalid_attribute", "9 KB of attributes")
    assert "8000" in reply.json["message"]
    assert (await stats(stack, queue))["ready"] == 0


# -- a send leased at once by a waiting long poll leaves no phantom behind --------------------------


async def test_a_message_a_long_poll_took_at_once_is_not_counted_ready_afterwards(shared_stack, queue):
    """Defect (found while testing the others): inotify indexed a sent message and woke a waiting long
    poll, which leased it before the send noted the name itself; the send then put it back, a stale
    entry counted as ready (and against capacity) until a receive or a rescan dropped it."""
    stack = shared_stack
    reply = await put_json(stack, f"/{queue}", {"capacity": 1, "capacity_wait_seconds": 0})
    assert reply.status == 201, reply.body
    for i in range(10):
        poll = asyncio.create_task(stack.request("GET", f"/{queue}/messages?wait_time_seconds=10"))
        await asyncio.sleep(0.1)
        sent = await stack.send(queue, b"m%d" % i)
        got = await poll
        assert got.status == 200 and got.header("X-Message-Id") == sent
        ready = (await stats(stack, queue))["ready"]
        assert ready == 0, f"round {i}: a message a poll took is still counted ready ({ready})"


# -- the daemon forgets the waiters' signals and the redrive tasks it no longer needs -------------


async def test_no_signal_or_redrive_task_outlives_its_waiters(tmp_path, http, wait):
    """Defect: the broker kept a long-poll and a capacity signal for every queue ever used, even
    deleted ones, and every redrive task it ever ran: memory grew without bound."""
    async with mq_in_process(tmp_path / "root") as (broker, _, url):

        async def call(method: str, path: str, data=None, status: int | None = None):
            async with http.request(method, url + path, data=data) as resp:
                body = await resp.read()
                assert status is None or resp.status == status, f"{method} {path} -> {resp.status} {body[:300]!r}"
                return resp.status, (json.loads(body) if body and resp.content_type == "application/json" else body)

        async def exercise(queue: str) -> None:
            attrs = json.dumps({"capacity": 1, "capacity_wait_seconds": 5})
            await call("PUT", f"/{queue}", attrs, 201)
            await call("GET", f"/{queue}/messages?wait_time_seconds=1", status=204)  # a long poll that times out
            poll = asyncio.create_task(call("GET", f"/{queue}/messages?wait_time_seconds=10", status=200))
            await asyncio.sleep(0.1)
            await call("POST", f"/{queue}/messages", b"wakes the poll", 201)
            await poll
            await call("POST", f"/{queue}/messages", b"fills the queue", 201)
            blocked = asyncio.create_task(call("POST", f"/{queue}/messages", b"waits for room", 201))
            await asyncio.sleep(0.1)
            await call("GET", f"/{queue}/messages", status=200)  # makes room
            await blocked
            await call("PUT", f"/{queue}/attributes", json.dumps({"capacity_wait_seconds": 1}), 200)
            await call("POST", f"/{queue}/messages", b"refused", 429)  # waited for room in vain

        await asyncio.gather(*(exercise(f"kept-{i}") for i in range(10)))
        # A deleted queue's waiters answer at once, and nothing of it is kept.
        await call("PUT", "/gone-empty", status=201)
        await call("PUT", "/gone-full", json.dumps({"capacity": 1, "capacity_wait_seconds": 20}), 201)
        await call("POST", "/gone-full/messages", b"fills the queue", 201)
        waiting = [
            asyncio.create_task(call("GET", "/gone-empty/messages?max_messages=10&wait_time_seconds=20")),
            asyncio.create_task(call("POST", "/gone-full/messages", b"waits for room")),
        ]
        await wait(lambda: "gone-empty" in broker._arrivals and "gone-full" in broker._room, timeout=5)
        start = time.monotonic()
        await call("DELETE", "/gone-empty", status=200)
        await call("DELETE", "/gone-full", status=200)
        answers = await asyncio.gather(*waiting)
        assert time.monotonic() - start < 3
        assert [status for status, _ in answers] == [404, 404], answers
        assert broker._arrivals == {} and broker._room == {}

        # A redrive task is forgotten when it ends; its status stays readable from its file.
        await call("PUT", "/dlq", status=201)
        await call("PUT", "/back", status=201)
        for i in range(5):
            await call("POST", "/dlq/messages", b"dead %d" % i, 201)
        for _ in range(2):
            await call("POST", "/dlq/redrive", json.dumps({"destination": "back"}), 202)

            async def completed() -> bool:
                _, body = await call("GET", "/dlq/redrive", status=200)
                return body["task"]["state"] == "completed"

            await wait(completed, timeout=10)
            await wait(lambda: broker.redrives.tasks == {}, timeout=5)
        assert (await call("GET", "/back"))[1]["ready"] == 5


# -- queue settings, lease policy and attempt records each read once -----------------------------


async def test_settings_another_process_writes_and_retried_attempts_are_read_whole(shared_stack, queue, wait):
    """The daemon reads a queue's attributes and creation time in one read of ``.attributes``
    (Store.queue_settings), builds its lease policy with LeasePolicy.for_queue, and reads an attempt
    record's handles and first-call time in one read (Store.load_attempt_record)."""
    stack = shared_stack
    store = Store(stack.root)
    dlq = f"{queue[:70]}-dlq"
    await stack.create_queue(dlq)
    await stack.create_queue(queue)
    explicit, created_ms = store.queue_settings(QueueName(queue))
    assert explicit == {} and isinstance(created_ms, int)
    assert (await stats(stack, queue))["created_ms"] == created_ms
    # Another process sets a dead-letter policy: mq re-reads the settings (inotify marks them stale).
    store.set_attributes(QueueName(queue), {"dead_letter_queue": dlq, "max_receive_count": 1})

    async def policy_seen() -> dict | None:
        s = await stats(stack, queue)
        return s if s["attributes"]["max_receive_count"] == 1 else None

    now = await wait(policy_seen, timeout=5, message=lambda: stack.logs())
    assert now["attributes"]["dead_letter_queue"] == dlq and now["created_ms"] == created_ms
    sent = await stack.send(queue, b"fails once")
    [first] = await receive_json(stack, queue, "&visibility_timeout_seconds=0")
    assert first["message_id"] == sent

    async def dead_lettered() -> list | None:
        got = await receive_json(stack, dlq, "&visibility_timeout_seconds=30")
        return got or None

    [dead] = await wait(dead_lettered, timeout=5, message=lambda: stack.logs())
    assert dead["message_id"] == sent and base64.b64decode(dead["body_base64"]) == b"fails once"
    assert await receive_json(stack, queue) == []

    # A retried receive gets the same messages and keeps the first call's time in its record.
    for i in range(2):
        await stack.send(dlq, b"m%d" % i)
    got = await receive_json(stack, dlq, "&attempt_id=once-only")
    record = store.load_attempt_record(QueueName(dlq), "once-only")
    assert record is not None and record[0] == [m["receipt_handle"] for m in got]
    await asyncio.sleep(0.05)
    retried = await receive_json(stack, dlq, "&attempt_id=once-only")
    assert [m["message_id"] for m in retried] == [m["message_id"] for m in got] and len(got) == 2
    again = store.load_attempt_record(QueueName(dlq), "once-only")
    assert again is not None and again[0] == [m["receipt_handle"] for m in retried] and again[1] == record[1]
