"""Batch sends and batch deletes through a real mq: the usual entries (an id and a body or a handle,
checked on a shorter path since issue 12's stop 17) and every other shape give the answers a client
parses, byte for byte what ``json.dumps`` of the same object gives, and what was sent is received."""

from __future__ import annotations

import base64
import json

from mqcore.names import check_message_id


async def test_a_batch_send_answers_json_dumps_bytes_and_each_body_arrives_as_sent(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    bodies = [bytes([i]) * (i * 37) for i in range(8)]  # the first one empty
    entries = [{"id": f"e_{i}-x", "body_base64": base64.b64encode(b).decode()} for i, b in enumerate(bodies)]
    entries.append({"body_base64": base64.b64encode(b"no id").decode(), "id": "last"})  # keys in another order
    reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"entries": entries}))
    assert reply.status == 200, reply.body
    assert reply.content_type == "application/json; charset=utf-8"  # as web.json_response gave it
    answer = reply.json
    assert reply.body == json.dumps(answer).encode()
    assert answer["failed"] == []
    assert [e["id"] for e in answer["successful"]] == [e["id"] for e in entries]
    for e in answer["successful"]:
        check_message_id(e["message_id"])

    got: dict[str, bytes] = {}
    while len(got) < len(entries):
        received = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=60")
        assert received.status == 200, received.body
        for m in received.json["messages"]:
            got[m["message_id"]] = base64.b64decode(m["body_base64"])
        assert received.json["messages"], f"only {len(got)} of {len(entries)} received"
    sent = {e["message_id"]: b for e, b in zip(answer["successful"], [*bodies, b"no id"], strict=True)}
    assert got == sent


async def test_a_batch_send_fails_bad_entries_alone_with_json_dumps_bytes(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    entries = [
        {"id": "ok", "body_base64": "aGk="},
        {"id": "not-base64", "body_base64": "aGk"},  # no padding
        {"id": "not-a-string", "body_base64": 12},
        {"id": "non-ascii", "body_base64": "aGé="},
        {"id": "both", "body": "x", "body_base64": "aGk="},
        {"id": "unknown-key", "body_base64": "aGk=", "colour": "red"},
        {"id": "typed", "body": "hi", "content_type": "text/plain", "attributes": {"a": "b"}},
    ]
    reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"entries": entries}))
    assert reply.status == 200, reply.body
    answer = reply.json
    assert reply.body == json.dumps(answer).encode()
    assert [e["id"] for e in answer["successful"]] == ["ok", "typed"]
    failed = {e["id"]: e for e in answer["failed"]}
    assert set(failed) == {"not-base64", "not-a-string", "non-ascii", "both", "unknown-key"}
    for name in ("not-base64", "not-a-string", "non-ascii"):
        assert failed[name]["error"] == "invalid_request" and failed[name]["sender_fault"] is True
        assert "body_base64 must be a base64 string" in failed[name]["message"]
    assert "exactly one of body and body_base64" in failed["both"]["message"]
    assert "unknown key" in failed["unknown-key"]["message"]

    received = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=60")
    messages = {base64.b64decode(m["body_base64"]): m for m in received.json["messages"]}
    assert set(messages) == {b"hi"}
    [typed] = [m for m in received.json["messages"] if m["content_type"] == "text/plain"]
    assert typed["attributes"] == {"a": "b"}


async def test_a_batch_delete_takes_usual_and_other_entries_and_fails_bad_ones_alone(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    entries = [{"id": str(i), "body": f"m{i}"} for i in range(4)]
    sent = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"entries": entries}))
    assert sent.status == 200 and len(sent.json["successful"]) == 4, sent.body
    received = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=60")
    messages = received.json["messages"]
    assert len(messages) == 4
    deletes = [
        {"id": "a", "receipt_handle": messages[0]["receipt_handle"]},
        {"receipt_handle": messages[1]["receipt_handle"], "id": "b"},
        {"id": "c", "message_id": messages[2]["message_id"]},
        {"id": "bad", "receipt_handle": "not a handle"},
        {"id": "extra", "receipt_handle": messages[3]["receipt_handle"], "colour": "red"},
        {"id": "again", "receipt_handle": messages[0]["receipt_handle"]},
    ]
    reply = await stack.request("POST", f"/{queue}/messages/delete", data=json.dumps({"entries": deletes}))
    assert reply.status == 200, reply.body
    answer = reply.json
    assert reply.body == json.dumps(answer).encode()
    assert [e["id"] for e in answer["successful"]] == ["a", "b", "c"]
    failed = {e["id"]: e for e in answer["failed"]}
    assert set(failed) == {"bad", "extra", "again"}
    assert failed["bad"]["error"] == "invalid_receipt_handle"
    assert "unknown key" in failed["extra"]["message"]
    assert failed["again"]["error"] in ("message_not_found", "stale_receipt_handle")
    stats = await stack.request("GET", f"/{queue}")
    assert stats.json["ready"] == 0 and stats.json["in_flight"] == 1, stats.body  # only messages[3] is left
