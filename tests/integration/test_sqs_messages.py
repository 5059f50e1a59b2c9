"""SQS message semantics of mq, end to end: receipt handles, change of visibility, batches,
receive attempt ids, delays and message attributes (issue 3; docs/api.md).

Real daemons (mq, mq-mover, mq-reaper) as subprocesses, real HTTP, real files. Short leases
come from the request's ``visibility_timeout_seconds`` (or the queue's attribute), so most
tests share one stack per module.
"""

from __future__ import annotations

import base64
import io
import json
import time
import urllib.parse

import pytest
from http_checks import assert_error

from mqcore.names import IdGenerator
from mqcore.protocol import now_ms


@pytest.fixture
def stack(request, shared_stack, stack_factory):
    """The module's shared stack, or a fresh one when parametrized with options (indirect)."""
    if hasattr(request, "param"):
        return stack_factory(**request.param)
    return shared_stack


def query(**params) -> str:
    return "?" + urllib.parse.urlencode(params) if params else ""


async def receive(stack, queue: str, **params):
    """GET /queue/messages with query ``params`` (200/204 for the raw form, 200 for JSON)."""
    reply = await stack.request("GET", f"/{queue}/messages{query(**params)}")
    assert reply.status in (200, 204), f"receive -> {reply.status} {reply.body[:300]!r}\n{stack.logs()}"
    return reply


async def receive_many(stack, queue: str, **params) -> list[dict]:
    """The JSON form of a receive (``max_messages`` defaults to 10): the list of messages."""
    params.setdefault("max_messages", 10)
    reply = await receive(stack, queue, **params)
    assert reply.status == 200
    return reply.json["messages"]


async def post_json(stack, path: str, obj) -> object:
    data = io.BytesIO(json.dumps(obj).encode())  # aiohttp warns about large raw bytes bodies
    return await stack.request("POST", path, data=data, headers={"Content-Type": "application/json"})


async def delete_with_handle(stack, queue: str, message_id: str, handle: str):
    return await stack.request("DELETE", f"/{queue}/messages/{message_id}{query(receipt_handle=handle)}")


async def change_visibility(stack, queue: str, message_id: str, handle: str, seconds: int):
    return await post_json(
        stack,
        f"/{queue}/messages/{message_id}/visibility",
        {"receipt_handle": handle, "visibility_timeout_seconds": seconds},
    )


# -- receipt handles -------------------------------------------------------------


async def test_receive_returns_a_handle_and_the_system_attributes(stack, queue):
    await stack.create_queue(queue)
    before = now_ms()
    reply = await stack.request(
        "POST",
        f"/{queue}/messages",
        data=b"hello",
        headers={"Content-Type": "text/plain", "X-Message-Attributes": '{"tenant": "acme", "trace": "4bf9"}'},
    )
    assert reply.status == 201, reply.body
    message_id = reply.header("X-Message-Id")

    first = await receive(stack, queue, visibility_timeout_seconds=1)
    after_first = now_ms()
    assert (first.status, first.body, first.content_type) == (200, b"hello", "text/plain")
    assert first.header("X-Message-Id") == message_id
    assert first.header("X-Receive-Count") == "1"
    assert json.loads(first.header("X-Message-Attributes")) == {"tenant": "acme", "trace": "4bf9"}
    sent = int(first.header("X-Sent-Timestamp"))
    first_receive = int(first.header("X-First-Receive-Timestamp"))
    deadline = int(first.header("X-Visibility-Deadline"))
    assert before - 5 <= sent <= first_receive <= after_first
    assert deadline - first_receive == 1000, (deadline, first_receive)
    handle = first.header("X-Receipt-Handle")
    assert handle and message_id in handle

    # The lease runs out: the next receive is a new one, with a new handle; the first-receive time stays.
    second = await receive(stack, queue, wait_time_seconds=10)
    assert second.status == 200, stack.logs()
    assert second.header("X-Receive-Count") == "2"
    assert second.header("X-Receipt-Handle") not in (None, handle)
    assert int(second.header("X-First-Receive-Timestamp")) == first_receive
    assert int(second.header("X-Sent-Timestamp")) == sent
    assert (await delete_with_handle(stack, queue, message_id, second.header("X-Receipt-Handle"))).status == 200


async def test_stale_handle_is_rejected_and_the_newer_lease_is_untouched(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"work")
    old = (await receive(stack, queue, visibility_timeout_seconds=1)).header("X-Receipt-Handle")
    newer = await receive(stack, queue, wait_time_seconds=10, visibility_timeout_seconds=60)
    assert newer.status == 200 and newer.header("X-Receive-Count") == "2", stack.logs()
    new = newer.header("X-Receipt-Handle")
    in_flight_before = [n for n in stack.files("delay") if f".{message_id}." in n]
    assert in_flight_before == [new]

    body = assert_error(await delete_with_handle(stack, queue, message_id, old), 410, "stale_receipt_handle", "delete")
    assert body["details"]["receive_count"] == 2
    assert_error(await change_visibility(stack, queue, message_id, old, 0), 410, "stale_receipt_handle", "visibility")
    assert_error(await change_visibility(stack, queue, message_id, old, 600), 410, "stale_receipt_handle", "extend")

    # The newer lease is exactly as it was: same file, still invisible, still deletable with its handle.
    assert [n for n in stack.files("delay") if f".{message_id}." in n] == in_flight_before
    assert (await receive(stack, queue)).status == 204
    reply = await delete_with_handle(stack, queue, message_id, new)
    assert reply.status == 200 and reply.json == {"message_id": message_id, "deleted": True, "was": "in_flight"}
    assert_error(await delete_with_handle(stack, queue, message_id, new), 404, "message_not_found", "again")


async def test_handle_of_another_message_or_queue_or_malformed_is_400(stack, queue):
    await stack.create_queue(queue)
    first = await stack.send(queue, b"one")
    second = await stack.send(queue, b"two")
    handle = (await receive(stack, queue)).header("X-Receipt-Handle")
    assert first in handle
    other_queue = handle.replace(f".{queue}.", ".some-other-queue.")
    cases = [
        (second, handle, "handle of another message"),
        (first, other_queue, "handle of another queue"),
        (first, "not-a-handle", "malformed"),
        (first, handle.rsplit(".", 1)[0] + ".0", "receive count 0"),
    ]
    for message_id, bad, context in cases:
        assert_error(await delete_with_handle(stack, queue, message_id, bad), 400, "invalid_receipt_handle", context)
        assert_error(await change_visibility(stack, queue, message_id, bad, 5), 400, "invalid_receipt_handle", context)
    # Nothing was touched: the first is in flight, the second ready.
    assert [n for n in stack.files("delay") if f".{first}." in n] == [handle]
    assert f"{second}.0" in stack.files(f"queues/{queue}")


async def test_handle_still_deletes_after_expiry_if_nobody_received_it_since(stack, queue, wait):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"late ack")
    handle = (await receive(stack, queue, visibility_timeout_seconds=1)).header("X-Receipt-Handle")
    await wait(
        lambda: f"{message_id}.1" in stack.files(f"queues/{queue}"),
        message=lambda: f"not redelivered\n{stack.logs()}",
    )
    assert_error(await change_visibility(stack, queue, message_id, handle, 30), 400, "message_not_in_flight", "ready")
    reply = await delete_with_handle(stack, queue, message_id, handle)
    assert reply.status == 200 and reply.json["was"] == "ready", reply.body
    assert (await receive(stack, queue)).status == 204


# -- change of visibility ------------------------------------------------------------


async def test_a_lease_extended_past_the_queue_timeout_is_not_redelivered(stack, queue):
    reply = await stack.request("PUT", f"/{queue}", data=json.dumps({"visibility_timeout_seconds": 1}))
    assert reply.status == 201, reply.body
    message_id = await stack.send(queue, b"slow job")
    first = await receive(stack, queue)
    assert int(first.header("X-Visibility-Deadline")) - int(first.header("X-First-Receive-Timestamp")) == 1000
    t0 = now_ms()
    extended = await change_visibility(stack, queue, message_id, first.header("X-Receipt-Handle"), 3)
    assert extended.status == 200, extended.body
    assert extended.json["message_id"] == message_id
    assert t0 + 3000 <= extended.json["visibility_deadline_ms"] <= now_ms() + 3000
    # Well past the queue's 1 s timeout, the message is still invisible (a long poll sees nothing).
    started = time.monotonic()
    assert (await receive(stack, queue, wait_time_seconds=2)).status == 204
    assert time.monotonic() - started >= 1.9
    stats = (await stack.request("GET", f"/{queue}")).json
    assert (stats["ready"], stats["in_flight"]) == (0, 1)
    # Both the old and the answered handle work; the message comes back once the extension ends.
    again = await receive(stack, queue, wait_time_seconds=10)
    assert again.status == 200 and again.header("X-Receive-Count") == "2", stack.logs()
    assert now_ms() >= extended.json["visibility_deadline_ms"] - 50


async def test_change_visibility_keeps_both_handles_valid(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"x")
    handle = (await receive(stack, queue)).header("X-Receipt-Handle")
    first = await change_visibility(stack, queue, message_id, handle, 100)
    assert first.status == 200, first.body
    current = first.json["receipt_handle"]
    second = await change_visibility(stack, queue, message_id, current, 200)
    assert second.status == 200, second.body
    third = await change_visibility(stack, queue, message_id, handle, 300)  # the original handle still works
    assert third.status == 200, third.body
    assert third.json["visibility_deadline_ms"] > second.json["visibility_deadline_ms"]
    assert [n for n in stack.files("delay") if f".{message_id}." in n] == [third.json["receipt_handle"]]
    assert (await delete_with_handle(stack, queue, message_id, handle)).status == 200


async def test_change_visibility_to_zero_releases_at_once(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"give back")
    handle = (await receive(stack, queue, visibility_timeout_seconds=3600)).header("X-Receipt-Handle")
    released = await change_visibility(stack, queue, message_id, handle, 0)
    assert released.status == 200, released.body
    assert abs(released.json["visibility_deadline_ms"] - now_ms()) < 5000
    again = await receive(stack, queue)
    assert again.status == 200 and again.header("X-Message-Id") == message_id
    assert again.header("X-Receive-Count") == "2"
    assert_error(await delete_with_handle(stack, queue, message_id, handle), 410, "stale_receipt_handle", "old")
    assert (await delete_with_handle(stack, queue, message_id, again.header("X-Receipt-Handle"))).status == 200


async def test_change_visibility_bad_requests_are_400(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"x")
    handle = (await receive(stack, queue)).header("X-Receipt-Handle")
    path = f"/{queue}/messages/{message_id}/visibility"
    bad = [
        (b"not json", "invalid_request"),
        (b"", "invalid_request"),
        (b"[]", "invalid_request"),
        (json.dumps({"receipt_handle": handle}).encode(), "invalid_request"),
        (json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": 43_201}).encode(), "invalid_request"),
        (json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": -1}).encode(), "invalid_request"),
        (json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": "5"}).encode(), "invalid_request"),
        (json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": 5, "x": 1}).encode(), "invalid_request"),
        (json.dumps({"visibility_timeout_seconds": 5}).encode(), "invalid_receipt_handle"),
    ]
    for data, code in bad:
        assert_error(await stack.request("POST", path, data=data), 400, code, repr(data))
    unknown = IdGenerator().next_id()
    assert_error(
        await change_visibility(stack, queue, unknown, handle.replace(message_id, unknown), 5),
        404,
        "message_not_found",
        "unknown message",
    )
    assert (await delete_with_handle(stack, queue, message_id, handle)).status == 200


async def test_receive_query_values_are_checked(stack, queue):
    await stack.create_queue(queue)
    bad = [
        "max_messages=0",
        "max_messages=11",
        "max_messages=abc",
        "max_messages=-1",
        "max_messages=1.5",
        "max_messages=%201",
        "wait_time_seconds=21",
        "visibility_timeout_seconds=43201",
        "attempt_id=",
        "attempt_id=" + "a" * 129,
        "attempt_id=has%20space",
        "wait=5",
        "max_messages=1&max_messages=2",
    ]
    for q in bad:
        reply = await stack.request("GET", f"/{queue}/messages?{q}")
        body = assert_error(reply, 400, "invalid_request", q)
        assert body["details"]["parameter"] in q, body
    assert (await receive(stack, queue, max_messages=10, wait_time_seconds=0)).json == {"messages": []}


# -- batches ------------------------------------------------------------------------


async def test_batch_send_receive_visibility_and_delete(stack, queue):
    await stack.create_queue(queue)
    entries = [{"id": f"m{i}", "body": f"message {i}"} for i in range(8)]
    entries.append({"id": "bin", "body_base64": base64.b64encode(bytes(range(256))).decode()})
    entries.append({"body": "typed", "content_type": "application/json", "attributes": {"k": "v"}})
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": entries})
    assert reply.status == 200, reply.body
    assert reply.json["failed"] == []
    sent = reply.json["successful"]
    assert [s["id"] for s in sent] == [*(f"m{i}" for i in range(8)), "bin", "9"]  # default id: the index
    ids = [s["message_id"] for s in sent]
    assert ids == sorted(ids) and len(set(ids)) == 10

    got = await receive_many(stack, queue, max_messages=10, visibility_timeout_seconds=60)
    assert [m["message_id"] for m in got] == ids  # FIFO, all ten in one receive
    bodies = [base64.b64decode(m["body_base64"]) for m in got]
    assert bodies == [*(f"message {i}".encode() for i in range(8)), bytes(range(256)), b"typed"]
    assert got[-1]["content_type"] == "application/json" and got[-1]["attributes"] == {"k": "v"}
    assert got[0]["content_type"] == "application/octet-stream" and got[0]["attributes"] == {}
    for m in got:
        assert m["receive_count"] == 1
        assert m["visibility_deadline_ms"] - m["first_receive_timestamp_ms"] == 60_000
        assert m["sent_timestamp_ms"] <= m["first_receive_timestamp_ms"]

    handles = [m["receipt_handle"] for m in got]
    changes = [
        {"id": "a", "receipt_handle": handles[0], "visibility_timeout_seconds": 120},
        {"id": "b", "receipt_handle": handles[1], "visibility_timeout_seconds": 0},
        {"id": "c", "receipt_handle": "garbage", "visibility_timeout_seconds": 5},
        {"id": "d", "receipt_handle": handles[2], "visibility_timeout_seconds": 99_999},
    ]
    reply = await post_json(stack, f"/{queue}/messages/visibility", {"entries": changes})
    assert reply.status == 200, reply.body
    assert {s["id"] for s in reply.json["successful"]} == {"a", "b"}
    failed = {f["id"]: f for f in reply.json["failed"]}
    assert failed["c"]["error"] == "invalid_receipt_handle" and failed["c"]["sender_fault"] is True
    assert failed["d"]["error"] == "invalid_request" and failed["d"]["sender_fault"] is True
    extended = next(s for s in reply.json["successful"] if s["id"] == "a")
    assert extended["visibility_deadline_ms"] >= now_ms() + 100_000

    released = await receive_many(stack, queue, max_messages=10)
    assert [m["message_id"] for m in released] == [ids[1]]  # only the one set to 0 came back
    handles[1] = released[0]["receipt_handle"]

    deletes = [{"id": f"e{i}", "receipt_handle": h} for i, h in enumerate(handles[:9])]
    deletes.append({"id": "by-id", "message_id": ids[9]})
    reply = await post_json(stack, f"/{queue}/messages/delete", {"entries": deletes})
    assert reply.status == 200, reply.body
    assert reply.json["failed"] == []
    assert len(reply.json["successful"]) == 10
    stats = (await stack.request("GET", f"/{queue}")).json
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0)
    assert not [n for n in stack.files("delay") if f".{queue}." in n]


async def test_batch_delete_reports_each_failure(stack, queue):
    await stack.create_queue(queue)
    for body in (b"a", b"b"):
        await stack.send(queue, body)
    got = await receive_many(stack, queue, max_messages=2)
    gone = IdGenerator().next_id()
    entries = [
        {"id": "ok", "receipt_handle": got[0]["receipt_handle"]},
        {"id": "stale", "receipt_handle": got[0]["receipt_handle"]},  # deleted by the entry before? maybe; see below
        {"id": "unknown", "message_id": gone},
        {"id": "bad-id", "message_id": "nope"},
        {"id": "both", "message_id": got[1]["message_id"], "receipt_handle": got[1]["receipt_handle"]},
        {"id": "neither"},
        {"id": "extra", "receipt_handle": got[1]["receipt_handle"], "color": "red"},
    ]
    reply = await post_json(stack, f"/{queue}/messages/delete", {"entries": entries})
    assert reply.status == 200, reply.body
    ok = {s["id"] for s in reply.json["successful"]}
    failed = {f["id"]: f for f in reply.json["failed"]}
    # The two entries with the same handle run concurrently: exactly one of them deletes.
    assert len(ok & {"ok", "stale"}) == 1 and failed[({"ok", "stale"} - ok).pop()]["error"] == "message_not_found"
    assert failed["unknown"]["error"] == "message_not_found"
    assert failed["bad-id"]["error"] == "invalid_message_id"
    assert failed["both"]["error"] == failed["neither"]["error"] == failed["extra"]["error"] == "invalid_request"
    assert all(f["sender_fault"] is True and f["message"] for f in failed.values())
    assert set(ok) | set(failed) == {e["id"] for e in entries}
    # The second message was not deleted by the malformed entries.
    assert [n for n in stack.files("delay") if f".{got[1]['message_id']}." in n]


async def test_batch_send_entries_fail_one_by_one(stack, queue):
    await stack.create_queue(queue)
    entries = [
        {"id": "good", "body": "fine"},
        {"id": "b64", "body_base64": "not base64!"},
        {"id": "two-bodies", "body": "a", "body_base64": "YQ=="},
        {"id": "no-body"},
        {"id": "number-body", "body": 5},
        {"id": "attr", "body": "x", "attributes": {"AWS.reserved": "v"}},
        {"id": "attr-value", "body": "x", "attributes": {"n": 1}},
        {"id": "delay", "body": "x", "delay_seconds": 901},
        {"id": "type", "body": "x", "content_type": "text/plain\r\nX-Evil: 1"},
        {"id": "unknown-key", "body": "x", "priority": 1},
    ]
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": entries})
    assert reply.status == 200, reply.body
    assert [s["id"] for s in reply.json["successful"]] == ["good"]
    failed = {f["id"]: f for f in reply.json["failed"]}
    assert set(failed) == {e["id"] for e in entries} - {"good"}
    assert failed["attr"]["error"] == failed["attr-value"]["error"] == "invalid_attribute"
    assert {f["error"] for k, f in failed.items() if not k.startswith("attr")} == {"invalid_request"}
    assert all(f["sender_fault"] is True for f in failed.values())
    got = await receive_many(stack, queue)
    assert [base64.b64decode(m["body_base64"]) for m in got] == [b"fine"]


async def test_batch_whole_request_errors(stack, queue):
    await stack.create_queue(queue)
    path = f"/{queue}/messages/batch"
    cases = [
        (b"{not json", "invalid_request"),
        (b"", "invalid_request"),
        (b'["a"]', "invalid_request"),
        (json.dumps({"messages": []}).encode(), "invalid_request"),
        (json.dumps({"messages": [{"body": str(i)} for i in range(11)]}).encode(), "invalid_request"),
        (json.dumps({"messages": [{"id": "a", "body": "1"}, {"id": "a", "body": "2"}]}).encode(), "invalid_request"),
        (json.dumps({"messages": [{"id": "has space", "body": "1"}]}).encode(), "invalid_request"),
        (json.dumps({"messages": [{"id": "x" * 81, "body": "1"}]}).encode(), "invalid_request"),
        (json.dumps({"messages": ["body"]}).encode(), "invalid_request"),
        (json.dumps({"messages": [{"body": "1"}], "extra": 1}).encode(), "invalid_request"),
        (json.dumps({"entries": []}).encode(), "invalid_request"),
        (json.dumps({"entries": [{"body": "1"}], "messages": [{"body": "2"}]}).encode(), "invalid_request"),
    ]
    for data, code in cases:
        assert_error(await stack.request("POST", path, data=data), 400, code, repr(data[:80]))
    # The sum of the bodies is limited like one message (SQS: 256 KiB per batch as per message).
    big = base64.b64encode(b"z" * 600_000).decode()
    reply = await post_json(stack, path, {"messages": [{"body_base64": big}, {"body_base64": big}]})
    assert_error(reply, 413, "message_too_large", "two bodies of 600 kB")
    for other in (f"/{queue}/messages/delete", f"/{queue}/messages/visibility"):
        entries = [{"id": str(i), "message_id": IdGenerator().next_id()} for i in range(11)]
        assert_error(await post_json(stack, other, {"entries": entries}), 400, "invalid_request", other)
        assert_error(await post_json(stack, other, {"entries": [{"message_id": "x"}]}), 400, "invalid_request", other)
    assert not [n for n in stack.files(f"queues/{queue}") if not n.startswith(".")]
    assert_error(
        await post_json(stack, "/no-such-queue-x/messages/batch", {"messages": [{"body": "1"}]}), 404, "queue_not_found"
    )


@pytest.mark.parametrize("stack", [{"mq_args": ["--max-batch-messages", "25"], "reaper": False}], indirect=True)
async def test_max_batch_messages_option(stack, queue):
    await stack.create_queue(queue)
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": [{"body": str(i)} for i in range(25)]})
    assert reply.status == 200 and len(reply.json["successful"]) == 25, reply.body
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": [{"body": str(i)} for i in range(26)]})
    assert_error(reply, 400, "invalid_request", "26 entries")
    assert len([n for n in stack.files(f"queues/{queue}") if not n.startswith(".")]) == 25


# -- receive request attempt id -------------------------------------------------------


async def test_attempt_id_returns_the_same_messages_with_fresh_handles(stack, queue):
    await stack.create_queue(queue)
    ids = [await stack.send(queue, b"m%d" % i) for i in range(4)]
    first = await receive_many(stack, queue, max_messages=3, attempt_id="worker-7/batch:42")
    assert [m["message_id"] for m in first] == ids[:3]

    retry = await receive_many(stack, queue, max_messages=3, attempt_id="worker-7/batch:42")
    assert [m["message_id"] for m in retry] == ids[:3]
    assert [base64.b64decode(m["body_base64"]) for m in retry] == [b"m0", b"m1", b"m2"]
    assert all(m["receive_count"] == 2 for m in retry)
    assert not {m["receipt_handle"] for m in retry} & {m["receipt_handle"] for m in first}
    # The first answer's handles are stale now; the retry's are the live ones.
    old = first[0]
    assert_error(
        await delete_with_handle(stack, queue, old["message_id"], old["receipt_handle"]), 410, "stale_receipt_handle"
    )
    assert (await delete_with_handle(stack, queue, retry[0]["message_id"], retry[0]["receipt_handle"])).status == 200

    # A deleted message is left out of the next retry; the others come again.
    again = await receive_many(stack, queue, max_messages=3, attempt_id="worker-7/batch:42")
    assert [m["message_id"] for m in again] == ids[1:3]
    # Another attempt id receives new messages; no attempt id too.
    other = await receive_many(stack, queue, max_messages=3, attempt_id="worker-7/batch:43")
    assert [m["message_id"] for m in other] == [ids[3]]
    assert await receive_many(stack, queue, max_messages=3) == []
    # The raw form honours the attempt id too.
    raw = await receive(stack, queue, attempt_id="worker-7/batch:43")
    assert raw.status == 200 and raw.header("X-Message-Id") == ids[3] and raw.header("X-Receive-Count") == "2"


async def test_attempt_id_that_got_nothing_is_a_new_receive(stack, queue):
    await stack.create_queue(queue)
    assert await receive_many(stack, queue, attempt_id="empty-first") == []
    message_id = await stack.send(queue, b"later")
    got = await receive_many(stack, queue, attempt_id="empty-first")
    assert [m["message_id"] for m in got] == [message_id]


# -- delay ----------------------------------------------------------------------------


async def test_delayed_send_is_invisible_until_due(stack, queue):
    await stack.create_queue(queue)
    start = time.monotonic()
    reply = await stack.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "1"})
    assert reply.status == 201, reply.body
    message_id = reply.header("X-Message-Id")
    assert [n for n in stack.files("delay") if f".{message_id}." in n]  # held in delay/, receive count 0
    assert (await receive(stack, queue)).status == 204
    stats = (await stack.request("GET", f"/{queue}")).json
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 1)
    got = await receive(stack, queue, wait_time_seconds=10)
    elapsed = time.monotonic() - start
    assert got.status == 200 and got.header("X-Message-Id") == message_id, stack.logs()
    assert got.header("X-Receive-Count") == "1"
    assert 0.9 <= elapsed < 5, elapsed


async def test_queue_delay_applies_unless_the_send_sets_its_own(stack, queue):
    reply = await stack.request("PUT", f"/{queue}", data=json.dumps({"delay_seconds": 600}))
    assert reply.status == 201, reply.body
    delayed = await stack.send(queue, b"queue delay")
    reply = await stack.request("POST", f"/{queue}/messages", data=b"now", headers={"X-Delay-Seconds": "0"})
    immediate = reply.header("X-Message-Id")
    reply = await post_json(
        stack, f"/{queue}/messages/batch", {"messages": [{"body": "b-delayed"}, {"body": "b-now", "delay_seconds": 0}]}
    )
    batch_delayed, batch_now = (s["message_id"] for s in reply.json["successful"])
    got = await receive_many(stack, queue)
    assert [m["message_id"] for m in got] == [immediate, batch_now]
    stats = (await stack.request("GET", f"/{queue}")).json
    assert stats["delayed"] == 2
    assert {delayed, batch_delayed} <= {n.split(".")[2] for n in stack.files("delay") if f".{queue}." in n}
    # A delayed message can be deleted by id.
    assert (await stack.delete(queue, delayed)).status == 200


async def test_bad_delay_header_is_400(stack, queue):
    await stack.create_queue(queue)
    for value in ("901", "-1", "abc", "1.5", ""):
        reply = await stack.request("POST", f"/{queue}/messages", data=b"x", headers={"X-Delay-Seconds": value})
        assert_error(reply, 400, "invalid_request", f"X-Delay-Seconds: {value!r}")
    assert not [n for n in stack.files(f"queues/{queue}") if not n.startswith(".")]
    assert not [n for n in stack.files("new") if n.startswith(f"{queue}.")]


# -- message attributes ----------------------------------------------------------------


async def test_message_attributes_round_trip_in_both_forms(stack, queue):
    await stack.create_queue(queue)
    attrs = {"tenant": "acme", "trace.id": "4bf92f35", "unicode": "caf\u00e9 \u2713", "empty": ""}
    header = json.dumps(attrs, ensure_ascii=True)
    reply = await stack.request("POST", f"/{queue}/messages", data=b"a", headers={"X-Message-Attributes": header})
    assert reply.status == 201, reply.body
    with_attrs = reply.header("X-Message-Id")
    without = await stack.send(queue, b"no attributes")
    raw = await receive(stack, queue)
    assert raw.header("X-Message-Id") == with_attrs
    assert json.loads(raw.header("X-Message-Attributes")) == attrs
    plain = await receive(stack, queue)
    assert plain.body == b"no attributes" and plain.header("X-Message-Attributes") is None
    for message_id, reply in ((with_attrs, raw), (without, plain)):
        released = await change_visibility(stack, queue, message_id, reply.header("X-Receipt-Handle"), 0)
        assert released.status == 200, released.body
    got = await receive_many(stack, queue)
    assert [(m["message_id"], m["attributes"], m["receive_count"]) for m in got] == [
        (with_attrs, attrs, 2),
        (without, {}, 2),
    ]


async def test_bad_message_attributes_are_400(stack, queue):
    await stack.create_queue(queue)
    bad = [
        "not json",
        '["a"]',
        json.dumps({f"a{i}": "v" for i in range(11)}),
        json.dumps({"AWS.thing": "v"}),
        json.dumps({"amazon.thing": "v"}),
        json.dumps({".lead": "v"}),
        json.dumps({"trail.": "v"}),
        json.dumps({"dou..ble": "v"}),
        json.dumps({"sp ace": "v"}),
        json.dumps({"n": 1}),
        json.dumps({"n": None}),
    ]
    for value in bad:
        reply = await stack.request("POST", f"/{queue}/messages", data=b"x", headers={"X-Message-Attributes": value})
        assert_error(reply, 400, "invalid_attribute", value)
    assert not [n for n in stack.files(f"queues/{queue}") if not n.startswith(".")]


async def test_attributes_count_towards_the_size_limit(stack, queue):
    reply = await stack.request("PUT", f"/{queue}", data=json.dumps({"max_message_bytes": 100}))
    assert reply.status == 201, reply.body
    attrs = json.dumps({"key": "v" * 17})  # 3 + 17 = 20 bytes
    ok = await stack.request("POST", f"/{queue}/messages", data=b"x" * 80, headers={"X-Message-Attributes": attrs})
    assert ok.status == 201, ok.body
    over = await stack.request("POST", f"/{queue}/messages", data=b"x" * 81, headers={"X-Message-Attributes": attrs})
    body = assert_error(over, 413, "message_too_large", "81 + 20 bytes")
    assert body["details"]["max_bytes"] == 100
    assert_error(await stack.request("POST", f"/{queue}/messages", data=b"y" * 101), 413, "message_too_large", "101")
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": [{"body": "z" * 60}, {"body": "z" * 41}]})
    assert_error(reply, 413, "message_too_large", "batch of 101 bytes")
    reply = await post_json(stack, f"/{queue}/messages/batch", {"messages": [{"body": "z" * 60}, {"body": "z" * 40}]})
    assert reply.status == 200 and len(reply.json["successful"]) == 2, reply.body
