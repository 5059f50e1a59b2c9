"""Peek (read without receiving) and partitioned receives (SMQ's batches), over real HTTP (issue 4).

Real daemons on one shared stack per module; every test uses its own queues.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.parse

from http_checks import assert_error

from mqcore.names import partition_of


def query(**params) -> str:
    return "?" + urllib.parse.urlencode(params) if params else ""


async def send_all(stack, queue: str, count: int) -> list[str]:
    body = {"messages": [{"body": f"m{i}"} for i in range(count)]}
    ids: list[str] = []
    for start in range(0, count, 10):
        chunk = {"messages": body["messages"][start : start + 10]}
        reply = await stack.request(
            "POST",
            f"/{queue}/messages/batch",
            data=io.BytesIO(json.dumps(chunk).encode()),
            headers={"Content-Type": "application/json"},
        )
        assert reply.status == 200, reply.body
        assert not reply.json["failed"], reply.json
        ids += [entry["message_id"] for entry in reply.json["successful"]]
    return ids


async def peek_all(stack, queue: str, limit: int) -> list[dict]:
    seen: list[dict] = []
    after = None
    while True:
        params = {"limit": limit} | ({"after": after} if after else {})
        reply = await stack.request("GET", f"/{queue}/peek{query(**params)}")
        assert reply.status == 200, reply.body
        seen += reply.json["messages"]
        after = reply.json["next_after"]
        if after is None:
            return seen


async def test_peek_pages_every_state_without_receiving(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    ids = await send_all(stack, queue, 25)
    reply = await stack.request("GET", f"/{queue}/messages{query(max_messages=3, visibility_timeout_seconds=300)}")
    received = reply.json["messages"]
    delayed = await stack.request(
        "POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "600", "Content-Type": "text/plain"}
    )
    delayed_id = delayed.header("X-Message-Id")

    before = stack.files(f"queues/{queue}"), stack.files("delay")
    pages = await peek_all(stack, queue, limit=7)
    assert [m["message_id"] for m in pages] == [*ids, delayed_id]
    by_id = {m["message_id"]: m for m in pages}
    for message in received:
        seen = by_id[message["message_id"]]
        assert seen["state"] == "in_flight"
        assert seen["receive_count"] == 1
        assert seen["visible_at_ms"] == message["visibility_deadline_ms"]
    assert by_id[ids[3]]["state"] == "ready"
    assert by_id[ids[3]]["visible_at_ms"] is None
    assert base64.b64decode(by_id[ids[3]]["body_base64"]) == b"m3"
    assert by_id[ids[3]]["source_queue"] == queue
    assert by_id[delayed_id]["state"] == "delayed"
    assert by_id[delayed_id]["receive_count"] == 0
    assert by_id[delayed_id]["content_type"] == "text/plain"
    # Nothing moved: the same files, and the next receive gets the 4th message first.
    assert (stack.files(f"queues/{queue}"), stack.files("delay")) == before
    reply = await stack.request("GET", f"/{queue}/messages{query(max_messages=1)}")
    assert reply.json["messages"][0]["message_id"] == ids[3]
    assert reply.json["messages"][0]["receive_count"] == 1


async def test_peek_of_a_dead_letter_queue_names_the_source_queue(shared_stack, queue, wait):
    stack = shared_stack
    dlq = f"{queue[:70]}-dlq"
    await stack.create_queue(dlq)
    reply = await stack.request(
        "PUT",
        f"/{queue}",
        data=json.dumps({"dead_letter_queue": dlq, "max_receive_count": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 201, reply.body
    [message_id] = await send_all(stack, queue, 1)
    reply = await stack.request("GET", f"/{queue}/messages{query(max_messages=1, visibility_timeout_seconds=0)}")
    assert reply.json["messages"][0]["message_id"] == message_id

    async def dead_lettered():
        page = (await stack.request("GET", f"/{dlq}/peek")).json["messages"]
        return page or None

    [seen] = await wait(dead_lettered, timeout=10, message="the message was not dead-lettered")
    assert seen["message_id"] == message_id
    assert seen["source_queue"] == queue
    assert seen["state"] == "ready"
    assert seen["receive_count"] == 1


async def test_peek_errors(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    assert_error(await stack.request("GET", "/no-such-queue-peek/peek"), 404, "queue_not_found")
    assert_error(await stack.request("GET", f"/{queue}/peek?limit=0"), 400, "invalid_request")
    assert_error(await stack.request("GET", f"/{queue}/peek?limit=1001"), 400, "invalid_request")
    assert_error(await stack.request("GET", f"/{queue}/peek?after=nope"), 400, "invalid_request")
    assert_error(await stack.request("GET", f"/{queue}/peek?state=ready"), 400, "invalid_request")
    empty = await stack.request("GET", f"/{queue}/peek")
    assert empty.status == 200
    assert empty.json == {"messages": [], "next_after": None}


async def test_partitions_split_a_queue_into_disjoint_fifo_parts(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    ids = await send_all(stack, queue, 60)
    got: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for part in got:
        while True:
            reply = await stack.request(
                "GET", f"/{queue}/messages{query(max_messages=10, partition=part, partitions=3, wait_time_seconds=0)}"
            )
            assert reply.status == 200, reply.body
            batch = [m["message_id"] for m in reply.json["messages"]]
            if not batch:
                break
            got[part] += batch
    for part, received in got.items():
        assert received == [i for i in ids if partition_of(i, 3) == part]  # its share, in FIFO order
    # Together: every message exactly once.
    assert sorted(i for received in got.values() for i in received) == sorted(ids)


async def test_partitioned_single_receive_and_long_poll(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    ids = await send_all(stack, queue, 20)
    mine = [i for i in ids if partition_of(i, 2) == 1]
    reply = await stack.request("GET", f"/{queue}/messages{query(partition=1, partitions=2)}")
    assert reply.status == 200
    assert reply.header("X-Message-Id") == mine[0]


async def test_partition_parameters_are_checked(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    for params, parameter in [
        ({"partition": 0}, "partitions"),
        ({"partitions": 2}, "partition"),
        ({"partition": 2, "partitions": 2}, "partition"),
        ({"partition": 0, "partitions": 0}, "partitions"),
        ({"partition": 0, "partitions": 1001}, "partitions"),
    ]:
        reply = await stack.request("GET", f"/{queue}/messages{query(**params)}")
        body = assert_error(reply, 400, "invalid_request")
        assert body["details"]["parameter"] == parameter, params


async def test_peek_a_partition_and_peek_by_ids(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)
    ids = await send_all(stack, queue, 30)
    reply = await stack.request("GET", f"/{queue}/messages{query(max_messages=2, visibility_timeout_seconds=300)}")
    in_flight = [m["message_id"] for m in reply.json["messages"]]
    parts = []
    for part in range(3):
        reply = await stack.request("GET", f"/{queue}/peek{query(partition=part, partitions=3, limit=1000)}")
        assert reply.status == 200
        assert all(partition_of(m["message_id"], 3) == part for m in reply.json["messages"])
        parts += [m["message_id"] for m in reply.json["messages"]]
    assert sorted(parts) == ids  # every message in exactly one partition, in flight ones too

    wanted = [ids[5], in_flight[0], ids[20]]
    gone = ids[6]
    assert (await stack.delete(queue, gone)).status == 200
    reply = await stack.request(
        "POST",
        f"/{queue}/peek",
        data=json.dumps({"message_ids": [*wanted, gone]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 200, reply.body
    got = {m["message_id"]: m for m in reply.json["messages"]}
    assert sorted(got) == sorted(wanted)  # the deleted one is left out
    assert got[in_flight[0]]["state"] == "in_flight"
    assert base64.b64decode(got[ids[20]]["body_base64"]) == b"m20"


async def test_peek_by_ids_errors(shared_stack, queue):
    stack = shared_stack
    await stack.create_queue(queue)

    async def post(body):
        return await stack.request(
            "POST", f"/{queue}/peek", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )

    assert_error(await post({"message_ids": []}), 400, "invalid_request")
    assert_error(await post({"message_ids": ["nope"]}), 400, "invalid_request")
    assert_error(await post({"ids": []}), 400, "invalid_request")
    assert_error(await post([]), 400, "invalid_request")
    reply = await stack.request(
        "POST", "/no-such-queue-peek/peek", data=b'{"message_ids": []}', headers={"Content-Type": "application/json"}
    )
    assert reply.status in (400, 404)
