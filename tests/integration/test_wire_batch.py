"""The batch send (``POST /{queue}/messages/batch``) on mq's own connections (``daemons._wire``).

mq's broker served in this process as ``serve()`` serves it (``make_runner``, a real socket, real
files), so that a test can send the same raw bytes once to mq's own connection and once to an
aiohttp connection (the application: router, middlewares, ``daemons._batches.send_batch``) and
compare the two answers byte for byte: status line, every header in its order, body. Only the
``Date`` value and the message ids (new per send) are masked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import Any

from http_checks import mq_in_process

from daemons._wire import Wire, WireConnection

#: What differs between two sends of the same batch: the Date header's value, the new message ids.
MASKS = (
    (re.compile(rb"\r\nDate: [^\r]*\r\n"), rb"\r\nDate: *\r\n"),
    (re.compile(rb'"message_id": "[^"]*"'), rb'"message_id": "*"'),
)


async def raw(url: str, *requests: bytes) -> bytes:
    """``requests`` in one write on a new connection; their answers (Content-Length framed)."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answers = b""
    try:
        writer.write(b"".join(requests))
        for _ in requests:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
            answers += head + await asyncio.wait_for(reader.readexactly(int(length[1]) if length else 0), 10)
        return answers
    finally:
        writer.close()


def post(
    path: str, body: bytes, version: str = "1.1", extra: str = "Connection: close\r\n", method: str = "POST"
) -> bytes:
    return f"{method} {path} HTTP/{version}\r\nHost: mq\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def masked(answer: bytes) -> bytes:
    for pattern, mask in MASKS:
        answer = pattern.sub(mask, answer)
    return answer


async def compare(wire: Wire, url: str, cases: list[list[bytes]]) -> None:
    """Each case's requests sent on mq's own connection, then on aiohttp's: the same answers, byte for byte."""
    for requests in cases:
        wire.enabled = True
        own = await raw(url, *requests)
        wire.enabled = False
        routed = await raw(url, *requests)
        assert masked(own) == masked(routed), requests[0][:80]
        assert own.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), own
    wire.enabled = True


async def counted(url: str, last: str) -> dict[str, float]:
    """``mq_http_request_duration_seconds_count`` of ``POST /{queue}/messages/<last>`` by status: each status
    must count as often on mq's connections as on aiohttp's (the application's middleware)."""
    text = (await raw(url, b"GET /metrics HTTP/1.1\r\nHost: mq\r\n\r\n")).decode()
    pattern = rf'_count\{{method="POST",route="/\{{queue\}}/messages/{last}",status="(\d+)"\}} ([0-9.]+)'
    return {status: float(n) for status, n in re.findall(pattern, text)}


def entries(*items: dict[str, Any], key: str = "entries") -> bytes:
    return json.dumps({key: list(items)}).encode()


async def test_a_batch_send_is_answered_byte_for_byte_as_the_application_does(tmp_path) -> None:
    async with mq_in_process(tmp_path / "root") as (broker, runner, url):
        wire = runner.wire
        assert wire is not None
        assert (await raw(url, post("/q", b'{"max_message_bytes": 1024}', method="PUT"))).startswith(b"HTTP/1.1 201 ")
        assert (await raw(url, post("/fifo.fifo", b"", method="PUT"))).startswith(b"HTTP/1.1 201 ")
        b64 = base64.b64encode(b"\x00\xff binary").decode()
        limit = broker.settings.batch_request_limit_bytes
        cases = [
            [post("/q/messages/batch", entries({"body": "one"}, {"id": "b", "body_base64": b64, "delay_seconds": 3}))],
            [post("/q/messages/batch", entries({"body": "old spelling"}, key="messages"))],
            [post("/q/messages/batch", entries({"body": "x", "content_type": "text/plain", "attributes": {"a": "1"}}))],
            [post("/q/messages/batch", entries({"id": "ok", "body": "x"}, {"id": "bad", "body_base64": "%%"}))],
            [post("/q/messages/batch", entries({"id": "a", "body": "x"}, {"id": "a", "body": "y"}))],  # ids twice
            [post("/q/messages/batch", entries({"body": "x", "unknown": 1}))],
            [post("/q/messages/batch", entries(*({"body": str(i)} for i in range(11))))],  # over 10 entries
            [post("/q/messages/batch", entries({"body": "x" * 600}, {"body": "y" * 600}))],  # 413: over 1 KiB in all
            [post("/q/messages/batch", b'{"entries": []}')],
            [post("/q/messages/batch", b"{not json")],
            [post("/q/messages/batch", b"null")],
            [post("/q/messages/batch", b"")],
            [post("/q/messages/batch?x=1", entries({"body": "x"}))],
            [post("/missing/messages/batch", entries({"body": "x"}))],
            [post("/bad*name/messages/batch", entries({"body": "x"}))],
            [post("/fifo.fifo/messages/batch", entries({"body": "x"}))],  # a FIFO queue needs a group id
            [post("/fifo.fifo/messages/batch", entries({"body": "x", "group_id": "g", "deduplication_id": "d"}))],
            [post("/q/messages/batch", entries({"body": "http/1.0"}), "1.0", "")],
            [
                post("/q/messages/batch", entries({"body": "kept"}), "1.0", "Connection: keep-alive\r\n"),
                post("/q/messages/batch", entries({"body": "then closed"}), "1.0", ""),
            ],
            [
                post("/q/messages/batch", entries({"body": "one"}), extra=""),  # pipelined
                post("/q/messages/batch", entries({"body": "two"})),
            ],
            # 413 from Content-Length alone (no body sent): over the most a batch send may take.
            [
                f"POST /q/messages/batch HTTP/1.1\r\nHost: mq\r\nContent-Length: {limit + 1}\r\n"
                "Connection: close\r\n\r\n".encode()
            ],
        ]
        await compare(wire, url, cases)

        # The messages sent both ways are there, in order, bodies intact.
        received: list[bytes] = []
        while True:
            answer = await raw(url, b"GET /q/messages?max_messages=10 HTTP/1.1\r\nHost: mq\r\n\r\n")
            messages = json.loads(answer.partition(b"\r\n\r\n")[2])["messages"]
            if not messages:
                break
            received += [base64.b64decode(m["body_base64"]) for m in messages]
        assert received[:4] == [b"one", b"one", b"old spelling", b"old spelling"]

        # Counted under the batch route, as the application's middleware counts it: each status as often
        # on mq's connections as on aiohttp's.
        counts = await counted(url, "batch")
        assert sum(counts.values()) == 2 * sum(len(request) for request in cases), counts
        assert {"200", "400", "404", "413"} <= set(counts) and all(n % 2 == 0 for n in counts.values()), counts


async def test_a_batch_send_keeps_the_connection_mqs_own(tmp_path) -> None:
    async with mq_in_process(tmp_path / "root") as (_, runner, url):
        server = runner.server
        assert server is not None
        assert (await raw(url, post("/q", b"", method="PUT"))).startswith(b"HTTP/1.1 201 ")
        host, _, port = url.removeprefix("http://").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for n in range(4):
                if n < 3:
                    writer.write(post("/q/messages/batch", entries({"body": str(n)}, {"body": "x"}), extra=""))
                else:  # and a batch delete (entries that fail: no such messages)
                    gone = [{"id": str(i), "message_id": "0190aaaa-bbbb-7ccc-8ddd-0123456789ab"} for i in range(2)]
                    writer.write(post("/q/messages/delete", entries(*gone), extra=""))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
                length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
                body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
                done = [e["id"] for e in body["successful"] + body["failed"]]
                assert done == ["0", "1"] and len(body["failed"]) == (2 if n == 3 else 0), body
                assert [type(c) for c in server.connections] == [WireConnection]
        finally:
            writer.close()


async def test_a_batch_delete_is_answered_byte_for_byte_as_the_application_does(tmp_path) -> None:
    async with mq_in_process(tmp_path / "root") as (_, runner, url):
        wire = runner.wire
        assert wire is not None
        assert (await raw(url, post("/d", b"", method="PUT"))).startswith(b"HTTP/1.1 201 ")

        async def leased() -> list[dict[str, Any]]:
            """Two messages sent and received: their message ids and receipt handles."""
            assert (await raw(url, post("/d/messages/batch", entries({"body": "1"}, {"body": "2"})))).startswith(
                b"HTTP/1.1 200 "
            )
            answer = await raw(url, b"GET /d/messages?max_messages=10 HTTP/1.1\r\nHost: mq\r\n\r\n")
            messages: list[dict[str, Any]] = json.loads(answer.partition(b"\r\n\r\n")[2])["messages"]
            assert len(messages) == 2
            return messages

        for enabled in (True, False):  # the usual delete: a handle and an id, both deleted
            wire.enabled = True
            one, two = await leased()
            wire.enabled = enabled
            both = entries(
                {"id": "h", "receipt_handle": one["receipt_handle"]}, {"id": "i", "message_id": two["message_id"]}
            )
            answer = await raw(url, post("/d/messages/delete", both))
            assert masked(answer).endswith(b'\r\n\r\n{"successful": [{"id": "h"}, {"id": "i"}], "failed": []}'), answer
            answer = await raw(url, post("/d/messages/delete", both))  # again: both entries fail, not found
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["successful"] == []
        handle = one["receipt_handle"]
        cases = [
            [post("/d/messages/delete", entries({"id": "a", "receipt_handle": handle}))],  # deleted: failed entry
            [post("/d/messages/delete", entries({"id": "a", "receipt_handle": "nonsense"}))],
            [post("/d/messages/delete", entries({"id": "a", "message_id": "not-an-id"}))],
            [
                post(
                    "/d/messages/delete",
                    entries({"id": "a", "message_id": two["message_id"], "receipt_handle": handle}),
                )
            ],
            [post("/d/messages/delete", entries({"id": "a"}))],
            [post("/d/messages/delete", entries({"receipt_handle": handle}))],  # no entry id
            [post("/d/messages/delete", entries(*({"id": str(i), "receipt_handle": handle} for i in range(11))))],
            [post("/d/messages/delete", b'{"entries": []}')],
            [post("/d/messages/delete", b"[1")],
            [post("/d/messages/delete", b"")],
            [post("/d/messages/delete?x=1", entries({"id": "a", "receipt_handle": handle}))],
            [post("/missing/messages/delete", entries({"id": "a", "receipt_handle": handle}))],
            [post("/bad*name/messages/delete", entries({"id": "a", "receipt_handle": handle}))],
            [post("/d/messages/delete", entries({"id": "a", "receipt_handle": handle}), "1.0", "")],
            [b"POST /d/messages/delete HTTP/1.1\r\nHost: mq\r\nContent-Length: 65537\r\nConnection: close\r\n\r\n"],
        ]
        await compare(wire, url, cases)
        counts = await counted(url, "delete")
        assert sum(counts.values()) == 4 + 2 * len(cases), counts
        assert {"200", "400", "404", "413"} <= set(counts) and all(n % 2 == 0 for n in counts.values()), counts
