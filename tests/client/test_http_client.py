"""The HTTP clients (mqcore.client._http.Client and AsyncClient) against real daemons.

Every scenario runs twice, with the blocking :class:`Client` (called from a worker thread so
the event loop, and any in-test server, keeps running) and with :class:`AsyncClient`. The
daemons are real subprocesses (tests/conftest.py); the retry tests use a small real aiohttp
server in the test that answers errors first, and a real mq started late on a reserved port.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from mqcore.client._http import AsyncClient, Client
from mqcore.client.types import BatchEntry, Message, PeekedMessage
from mqcore.errors import (
    ConnectionFailed,
    InvalidAttribute,
    InvalidMessageId,
    InvalidQueueName,
    InvalidReceiptHandle,
    MessageNotFound,
    MessageNotInFlight,
    MessageTooLarge,
    MQError,
    QueueFull,
    QueueNotFound,
    RedriveNotRunning,
    StaleReceiptHandle,
    StorageUnavailable,
)

pytestmark = pytest.mark.timeout(120)


class Api:
    """One client, sync or async, seen through coroutines (the sync one runs in a worker thread)."""

    def __init__(self, client: Client | AsyncClient) -> None:
        self.client = client
        self.is_async = isinstance(client, AsyncClient)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)
        if self.is_async:
            return method  # type: ignore[no-any-return]

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    async def peek_all(self, queue: str, page_size: int) -> list[PeekedMessage]:
        """Everything ``iter_peek`` yields."""
        if isinstance(self.client, AsyncClient):
            return [m async for m in self.client.iter_peek(queue, page_size=page_size)]
        client = self.client
        return await asyncio.to_thread(lambda: list(client.iter_peek(queue, page_size=page_size)))

    async def aclose(self) -> None:
        if isinstance(self.client, AsyncClient):
            await self.client.close()
        else:
            self.client.close()


ClientFactory = Callable[..., Api]


@pytest.fixture(params=["sync", "async"])
async def make_client(request: pytest.FixtureRequest) -> AsyncIterator[ClientFactory]:
    """``make_client(url, **options)``: a Client or AsyncClient (the parameter), closed at teardown."""
    made: list[Api] = []

    def make(url: str, **options: Any) -> Api:
        cls = AsyncClient if request.param == "async" else Client
        api = Api(cls(url, **options))
        made.append(api)
        return api

    yield make
    for api in made:
        await api.aclose()


@pytest.fixture
def api(shared_stack: Any, make_client: ClientFactory) -> Api:
    """A client of the module's shared stack (default options)."""
    return make_client(shared_stack.url)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ScriptedServer:
    """A real aiohttp server on 127.0.0.1 answering from a script, recording each request.

    Args:
        answers: ``(status, json body, headers)`` for the first requests, in order; after them
            every request gets the last one.
    """

    def __init__(self, answers: list[tuple[int, Any, dict[str, str]]]) -> None:
        self.answers = answers
        self.requests: list[tuple[float, str, str]] = []  # (monotonic seconds, method, path_qs)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests.append((time.monotonic(), request.method, request.path_qs))
        status, body, headers = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return web.json_response(body, status=status, headers=headers)

    async def __aenter__(self) -> ScriptedServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def connected_client_ports(server_port: int) -> set[int]:
    """Local ports of every TCP connection (any state, TIME_WAIT included) to ``127.0.0.1:server_port``.

    Read from the kernel's table (/proc/net/tcp): a client that opened a new connection per
    request leaves one entry per request behind (TIME_WAIT), a pooled client one.
    """
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote = line.split()[1:3]
        if int(remote.split(":")[1], 16) == server_port:
            ports.add(int(local.split(":")[1], 16))
    return ports


# -- queues --------------------------------------------------------------------------------------


async def test_queue_lifecycle(api: Api, queue: str) -> None:
    assert await api.create_queue(queue) is True
    assert await api.create_queue(queue) is False
    assert queue in await api.list_queues(prefix=queue[:10])
    assert await api.list_queues(prefix="no-queue-starts-like-this") == []

    stats = await api.queue_stats(queue)
    assert stats["queue"] == queue
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0)
    assert stats["attributes"]["visibility_timeout_seconds"] == 30

    changed = await api.set_attributes(queue, {"visibility_timeout_seconds": 90, "delay_seconds": 5})
    assert (changed["visibility_timeout_seconds"], changed["delay_seconds"]) == (90, 5)
    assert (await api.get_attributes(queue))["visibility_timeout_seconds"] == 90
    reset = await api.set_attributes(queue, {"delay_seconds": None})
    assert (reset["delay_seconds"], reset["visibility_timeout_seconds"]) == (0, 90)

    await api.send(queue, b"one")
    await api.send(queue, b"two")
    assert await api.purge(queue) == 2
    assert (await api.queue_stats(queue))["ready"] == 0

    await api.delete_queue(queue)
    assert queue not in await api.list_queues()
    with pytest.raises(QueueNotFound) as info:
        await api.queue_stats(queue)
    assert info.value.code == "queue_not_found"
    assert info.value.details == {"queue": queue}


async def test_create_queue_with_attributes(api: Api, queue: str) -> None:
    assert await api.create_queue(queue, {"visibility_timeout_seconds": 45, "receive_wait_seconds": 1})
    attributes = await api.get_attributes(queue)
    assert (attributes["visibility_timeout_seconds"], attributes["receive_wait_seconds"]) == (45, 1)
    with pytest.raises(InvalidAttribute) as info:
        await api.create_queue(queue + "x", {"visibility_timeout_seconds": -1})
    assert info.value.details["name"] == "visibility_timeout_seconds"
    assert queue + "x" not in await api.list_queues(prefix=queue)


# -- messages ------------------------------------------------------------------------------------


async def test_send_receive_ack_keeps_bodies_and_types(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    raw = bytes(range(256))
    id_bytes = await api.send(queue, raw, attributes={"tenant": "acme", "note": "é"})
    id_text = await api.send(queue, "héllo")
    id_json = await api.send_json(queue, {"n": 1, "s": "ü", "l": [1, 2]})
    id_typed = await api.send(queue, "<a/>", content_type="application/xml")

    messages = await api.receive(queue, max_messages=10)
    assert [m.message_id for m in messages] == [id_bytes, id_text, id_json, id_typed]
    first, text, as_json, typed = messages
    assert isinstance(first, Message) and first.queue == queue
    assert first.body == raw and isinstance(first.body, bytes)
    assert first.content_type == "application/octet-stream"
    assert first.attributes == {"tenant": "acme", "note": "é"}
    assert first.receive_count == 1
    assert first.sent_ms <= first.first_receive_ms < first.visibility_deadline_ms
    assert text.body == "héllo".encode() and text.text() == "héllo"
    assert text.content_type == "text/plain; charset=utf-8"
    assert as_json.json() == {"n": 1, "s": "ü", "l": [1, 2]}
    assert as_json.content_type == "application/json"
    assert typed.content_type == "application/xml"

    for message in messages:
        await api.ack(message)
    stats = await api.queue_stats(queue)
    assert (stats["ready"], stats["in_flight"]) == (0, 0)
    assert await api.receive(queue, wait_time_seconds=0) == []


async def test_delay_and_delete_by_id(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    message_id = await api.send(queue, b"later", delay_seconds=600)
    assert (await api.queue_stats(queue))["delayed"] == 1
    assert await api.receive(queue, wait_time_seconds=0) == []
    await api.delete_by_id(queue, message_id)
    assert (await api.queue_stats(queue))["delayed"] == 0
    with pytest.raises(MessageNotFound):
        await api.delete_by_id(queue, message_id)


async def test_stale_receipt_handle_after_a_new_receive(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    await api.send(queue, b"job")
    (first,) = await api.receive(queue)
    await api.nack(first)  # visibility 0: ready again at once
    (second,) = await api.receive(queue, wait_time_seconds=5)
    assert second.message_id == first.message_id
    assert second.receive_count == 2
    assert second.receipt_handle != first.receipt_handle

    with pytest.raises(StaleReceiptHandle):
        await api.delete(queue, first.receipt_handle)
    with pytest.raises(StaleReceiptHandle):
        await api.change_visibility(queue, first.receipt_handle, 60)
    assert (await api.queue_stats(queue))["in_flight"] == 1  # the newer receive was left alone

    await api.ack(second)
    with pytest.raises(MessageNotFound):
        await api.delete(queue, second.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        await api.delete(queue, "not a handle")


async def test_change_visibility(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    await api.send(queue, b"slow job")
    (message,) = await api.receive(queue, visibility_timeout_seconds=30)
    before_ms = time.time_ns() // 1_000_000
    deadline_ms = await api.change_visibility(queue, message.receipt_handle, 600)
    assert deadline_ms >= before_ms + 600_000
    assert await api.receive(queue, wait_time_seconds=0) == []  # still in flight

    await api.change_visibility(queue, message.receipt_handle, 0)
    with pytest.raises(MessageNotInFlight):
        await api.change_visibility(queue, message.receipt_handle, 10)
    (again,) = await api.receive(queue, wait_time_seconds=5)
    assert again.message_id == message.message_id

    await api.nack(again, delay_seconds=600)
    assert (await api.queue_stats(queue))["in_flight"] == 1
    assert await api.receive(queue, wait_time_seconds=0) == []


# -- batches -------------------------------------------------------------------------------------


async def test_batches_of_any_length_keep_entry_order(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    entries: list[bytes | str | BatchEntry] = []
    for i in range(23):
        if i % 3 == 0:
            entries.append(f"text {i}")
        elif i % 3 == 1:
            entries.append(f"bytes {i}".encode())
        else:
            entries.append(BatchEntry(f"entry {i}".encode(), content_type="application/x-n", attributes={"i": str(i)}))
    entries[7] = BatchEntry(b"bad", attributes={"AWS.reserved": "x"})  # fails alone
    results = await api.send_batch(queue, entries, batch_size=10)
    assert len(results) == 23
    assert isinstance(results[7], InvalidAttribute)
    assert all(isinstance(r, str) for i, r in enumerate(results) if i != 7)

    received: list[Message] = []
    while batch := await api.receive(queue, max_messages=10, wait_time_seconds=0):
        received += batch
    assert [m.message_id for m in received] == [r for r in results if isinstance(r, str)]
    assert received[0].text() == "text 0" and received[0].content_type == "text/plain; charset=utf-8"
    assert received[1].body == b"bytes 1" and received[1].content_type == "application/octet-stream"
    assert received[2].content_type == "application/x-n" and received[2].attributes == {"i": "2"}

    handles = [m.receipt_handle for m in received]
    deadlines = await api.change_visibility_batch(queue, [(h, 300) for h in handles] + [("bogus", 5)])
    assert len(deadlines) == 23
    assert all(isinstance(d, int) for d in deadlines[:22])
    assert isinstance(deadlines[22], InvalidReceiptHandle)

    outcome = await api.delete_batch(queue, [*handles[:11], "bogus", *handles[11:]])
    assert outcome[:11] == [None] * 11 and outcome[12:] == [None] * 11
    assert isinstance(outcome[11], InvalidReceiptHandle)
    again = await api.delete_batch(queue, handles[:2])
    assert all(isinstance(e, MessageNotFound) for e in again)
    assert (await api.queue_stats(queue))["in_flight"] == 0
    assert await api.send_batch(queue, []) == []


async def test_send_batch_splits_a_request_that_is_too_large_as_a_whole(api: Api, queue: str) -> None:
    await api.create_queue(queue, {"max_message_bytes": 1000})
    bodies = [bytes([i]) * 600 for i in range(5)]
    results = await api.send_batch(queue, [*bodies[:3], b"x" * 1001, *bodies[3:]])
    assert isinstance(results[3], MessageTooLarge)
    assert results[3].details["max_bytes"] == 1000
    sent = [r for r in results if isinstance(r, str)]
    assert len(sent) == 5
    received: list[Message] = []
    while batch := await api.receive(queue, max_messages=10, wait_time_seconds=0):
        received += batch
    assert [m.message_id for m in received] == sent
    assert [m.body for m in received] == bodies


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "../x", "a/b", "q?x=1", "q#f", "x" * 81, "ü"])
async def test_invalid_queue_name_sends_no_request(make_client: ClientFactory, name: str) -> None:
    async with ScriptedServer([(200, {}, {})]) as server:
        client = make_client(server.url, max_retries=0)
        for call in (
            client.send(name, b"x"),
            client.receive(name),
            client.create_queue(name),
            client.delete_queue(name),
            client.delete(name, "handle"),
            client.send_batch(name, [b"x"]),
            client.peek(name),
        ):
            with pytest.raises(InvalidQueueName):
                await call
        with pytest.raises(InvalidMessageId):
            await client.delete_by_id("q", "../../q")
        assert server.requests == []


async def test_typed_errors(api: Api, queue: str) -> None:
    with pytest.raises(QueueNotFound) as info:
        await api.send(queue, b"x")
    assert isinstance(info.value, LookupError)
    with pytest.raises(QueueNotFound):
        await api.receive(queue)
    await api.create_queue(queue, {"max_message_bytes": 100})
    with pytest.raises(MessageTooLarge) as too_large:
        await api.send(queue, b"x" * 101)
    assert too_large.value.details == {"size_bytes": 101, "max_bytes": 100}
    with pytest.raises(InvalidAttribute):
        await api.send(queue, b"x", attributes={"": "empty name"})
    with pytest.raises(RedriveNotRunning):
        await api.cancel_redrive(queue)
    assert await api.redrive_status(queue) is None


# -- long polling --------------------------------------------------------------------------------


async def test_long_poll_returns_a_message_sent_during_the_wait(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    waiting = asyncio.ensure_future(api.receive(queue, wait_time_seconds=15))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    message_id = await api.send(queue, b"wake up")
    (message,) = await waiting
    assert message.message_id == message_id


async def test_long_poll_outlasts_the_client_timeout(shared_stack: Any, make_client: ClientFactory, queue: str) -> None:
    client = make_client(shared_stack.url, timeout_seconds=1.0, max_retries=0)
    await client.create_queue(queue)
    assert await client.receive(queue, wait_time_seconds=2) == []


# -- connections and retries ---------------------------------------------------------------------


async def test_many_calls_share_one_connection(shared_stack: Any, make_client: ClientFactory, queue: str) -> None:
    port = int(shared_stack.url.rsplit(":", 1)[1])
    before = connected_client_ports(port)
    client = make_client(shared_stack.url)
    await client.create_queue(queue)
    for i in range(30):
        await client.send(queue, f"m{i}".encode())
    assert len(await client.receive(queue, max_messages=10)) == 10
    new_ports = connected_client_ports(port) - before
    # <= 1, not == 1: the kernel may give the pooled connection a port an older TIME_WAIT entry had.
    assert len(new_ports) <= 1, f"32 calls used {len(new_ports)} connections: {sorted(new_ports)}"


async def test_connection_refused_is_retried_until_the_server_listens(
    daemons: Any, make_client: ClientFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mqcore.client._http")
    port = free_port()
    client = make_client(f"http://127.0.0.1:{port}", max_retries=200, backoff_seconds=0.05, max_backoff_seconds=0.2)
    call = asyncio.ensure_future(client.list_queues())
    await asyncio.sleep(0.3)
    assert not call.done()
    await asyncio.to_thread(daemons.start, "mq", "--root", tmp_path / "root", "--port", str(port))
    assert await asyncio.wait_for(call, 30) == []
    assert "after connection_failed" in caplog.text


async def test_without_retries_connection_refused_raises_connection_failed(make_client: ClientFactory) -> None:
    client = make_client(f"http://127.0.0.1:{free_port()}", max_retries=0)
    with pytest.raises(ConnectionFailed) as info:
        await client.list_queues()
    assert info.value.retriable


@pytest.mark.parametrize(
    ("status", "body", "headers", "error"),
    [
        (503, {"error": "storage_unavailable", "message": "disk full"}, {"Retry-After": "1"}, StorageUnavailable),
        (
            429,
            {"error": "queue_full", "message": "full", "details": {"retry_after_seconds": 1}},
            {},
            QueueFull,
        ),
    ],
    ids=["503-retry-after-header", "429-details-retry-after-seconds"],
)
async def test_retriable_error_is_retried_after_retry_after(
    make_client: ClientFactory, status: int, body: Any, headers: dict[str, str], error: type[MQError]
) -> None:
    answers = [(status, body, headers), (200, {"queues": ["jobs"]}, {})]
    async with ScriptedServer(answers) as server:
        client = make_client(server.url, max_retries=2, backoff_seconds=0.001, max_backoff_seconds=0.01)
        assert await client.list_queues() == ["jobs"]
    assert len(server.requests) == 2
    (first_s, _, _), (second_s, _, _) = server.requests
    assert second_s - first_s >= 1.0, "the retry came before the server's Retry-After of 1 s"


async def test_retries_exhausted_raise_the_last_error(make_client: ClientFactory) -> None:
    unavailable = (503, {"error": "storage_unavailable", "message": "disk full"}, {"Retry-After": "0"})
    async with ScriptedServer([unavailable]) as server:
        client = make_client(server.url, max_retries=2, backoff_seconds=0.001, max_backoff_seconds=0.01)
        with pytest.raises(StorageUnavailable) as info:
            await client.send("jobs", b"x")
        assert info.value.message == "disk full"
        assert len(server.requests) == 3  # the request and max_retries more


async def test_errors_that_are_not_retriable_are_raised_at_once(make_client: ClientFactory) -> None:
    missing = (404, {"error": "queue_not_found", "message": "no queue", "details": {"queue": "jobs"}}, {})
    async with ScriptedServer([missing]) as server:
        client = make_client(server.url, max_retries=5)
        with pytest.raises(QueueNotFound):
            await client.queue_stats("jobs")
        assert len(server.requests) == 1


async def test_answers_that_are_not_mq_errors(make_client: ClientFactory) -> None:
    async with ScriptedServer([(502, {"oops": True}, {}), (418, "teapot", {})]) as server:
        client = make_client(server.url, max_retries=0)
        with pytest.raises(MQError) as bad_gateway:
            await client.list_queues()
        assert (bad_gateway.value.code, bad_gateway.value.details["status"]) == ("internal_error", 502)
        with pytest.raises(MQError) as teapot:
            await client.list_queues()
        assert (teapot.value.code, teapot.value.details["status"]) == ("http_error", 418)


async def test_requests_on_the_wire(make_client: ClientFactory) -> None:
    """The query a receive sends (always the JSON form) and how a message id is put in a path."""
    async with ScriptedServer([(200, {"messages": []}, {}), (200, {"message_id": "x"}, {})]) as server:
        client = make_client(server.url, max_retries=0)
        await client.receive(
            "jobs",
            max_messages=3,
            wait_time_seconds=1,
            visibility_timeout_seconds=9,
            attempt_id="a-1",
            partition=2,
            partitions=5,
        )
        await client.delete_by_id("jobs", "01a1fe4f-1bbf-7000-ac36-adce7281dd16")
    (_, method, path), (_, delete_method, delete_path) = server.requests
    assert method == "GET"
    assert path == (
        "/jobs/messages?max_messages=3&wait_time_seconds=1&visibility_timeout_seconds=9"
        "&attempt_id=a-1&partition=2&partitions=5"
    )
    assert (delete_method, delete_path) == ("DELETE", "/jobs/messages/01a1fe4f-1bbf-7000-ac36-adce7281dd16")


# -- redrive -------------------------------------------------------------------------------------


async def test_redrive(api: Api, queue: str, wait: Any) -> None:
    source, dlq = queue[:70] + "-src", queue[:70] + "-dlq"
    await api.create_queue(dlq)
    await api.create_queue(source)
    sent = await api.send_batch(dlq, [b"a", b"b", b"c"])
    task = await api.start_redrive(dlq, destination=source, max_messages_per_second=100)
    assert task["source"] == dlq and task["destination"] == source

    async def completed() -> bool:
        status = await api.redrive_status(dlq)
        return status is not None and status["state"] == "completed"

    await wait(completed, timeout=20)
    status = await api.redrive_status(dlq)
    assert status is not None and status["moved"] == 3
    moved = await api.receive(source, max_messages=10)
    assert sorted(m.body for m in moved) == [b"a", b"b", b"c"]
    assert all(m.message_id not in sent for m in moved)  # a redrive gives new ids


# -- peek and partitions (server additions of issue 4) -------------------------------------------


async def test_peek_reads_without_receiving(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    ids = [await api.send(queue, f"m{i}", attributes={"i": str(i)}) for i in range(5)]
    delayed_id = await api.send(queue, b"later", delay_seconds=600)
    (received,) = await api.receive(queue)

    page = await api.peek(queue, limit=2)
    assert [m.message_id for m in page.messages] == ids[:2]
    assert page.next_after == ids[1]
    first = page.messages[0]
    assert (first.state, first.receive_count, first.queue) == ("in_flight", 1, queue)
    assert first.visibility_deadline_ms == received.visibility_deadline_ms
    assert page.messages[1].state == "ready" and page.messages[1].visibility_deadline_ms is None
    assert page.messages[1].text() == "m1" and page.messages[1].attributes == {"i": "1"}

    rest = await api.peek(queue, after=page.next_after, limit=10)
    assert [m.message_id for m in rest.messages] == [*ids[2:], delayed_id]
    assert rest.next_after is None
    assert rest.messages[-1].state == "delayed" and rest.messages[-1].body == b"later"

    everything = await api.peek_all(queue, page_size=2)
    assert [m.message_id for m in everything] == [*ids, delayed_id]
    stats = await api.queue_stats(queue)
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (4, 1, 1)  # nothing changed
    (next_message,) = await api.receive(queue)
    assert (next_message.message_id, next_message.receive_count) == (ids[1], 1)


async def test_peek_answers_carry_both_deadline_keys(shared_stack: Any, api: Api, queue: str) -> None:
    await api.create_queue(queue)
    sent = await api.send(queue, b"x")
    (received,) = await api.receive(queue, visibility_timeout_seconds=600)
    async with httpx.AsyncClient(base_url=shared_stack.url) as raw:
        (item,) = [m for m in (await raw.get(f"/{queue}/peek")).json()["messages"] if m["message_id"] == sent]
    assert item["visibility_deadline_ms"] == item["visible_at_ms"] == received.visibility_deadline_ms


async def test_peek_reads_the_new_deadline_key_or_an_older_servers_one(make_client: ClientFactory) -> None:
    item = {
        "message_id": "01a1fe4f-1bbf-7000-ac36-adce7281dd16",
        "state": "in_flight",
        "body_base64": "eA==",
        "content_type": "application/octet-stream",
        "attributes": {},
        "sent_timestamp_ms": 1,
        "receive_count": 1,
        "source_queue": "jobs.fifo",
    }
    answers = [
        (200, {"messages": [{**item, "visibility_deadline_ms": 2000, "visible_at_ms": 2000, "group_id": "g"}]}, {}),
        (200, {"messages": [{**item, "visible_at_ms": 1000}]}, {}),  # a server of before 0.1's rename
    ]
    async with ScriptedServer(answers) as server:
        client = make_client(server.url, max_retries=0)
        (now,) = (await client.peek("jobs.fifo")).messages
        (before,) = (await client.peek("jobs.fifo")).messages
    assert (now.visibility_deadline_ms, now.group_id) == (2000, "g")
    assert (before.visibility_deadline_ms, before.group_id) == (1000, None)


async def test_receive_from_one_partition(api: Api, queue: str) -> None:
    await api.create_queue(queue)
    results = await api.send_batch(queue, [f"m{i}" for i in range(30)])
    ids = [r for r in results if isinstance(r, str)]

    def partition_of(message_id: str) -> int:
        return int(message_id[-8:], 16) % 3

    for partition in range(3):
        received: list[Message] = []
        while batch := await api.receive(
            queue, max_messages=10, wait_time_seconds=0, partition=partition, partitions=3
        ):
            received += batch
        assert [m.message_id for m in received] == [i for i in ids if partition_of(i) == partition]
    assert (await api.queue_stats(queue))["ready"] == 0
