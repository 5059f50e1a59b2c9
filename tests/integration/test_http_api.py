"""The HTTP API of mq, end to end: real daemons, real HTTP, real files (team contract, "HTTP API").

Each test checks what a user of the API would check: status codes, headers, bodies, and
that bad input never touches the disk outside the root.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from http_checks import assert_error

from mqcore.names import IdGenerator

ONE_SECOND_VISIBILITY = pytest.mark.parametrize("stack", [{"visibility_timeout": 1}], indirect=True)
#: A stack of its own (default options), for tests that look at the whole root.
FRESH_STACK = pytest.mark.parametrize("stack", [{}], indirect=True)


#: Options of a stack shared by the tests that ask for them (each uses its own queue).
SMALL_MESSAGES = pytest.mark.parametrize("stack", [{"max_message_size": 1000, "shared": True}], indirect=True)


@pytest.fixture
def stack(request, shared_stack, stack_factory, module_stacks, http):
    """The module's shared stack, or a fresh one when parametrized with options (indirect), or one
    shared by the tests with the same options when they include ``"shared": True``."""
    if hasattr(request, "param"):
        options = dict(request.param)
        if options.pop("shared", False):
            return module_stacks.get(options, http)
        return stack_factory(**options)
    return shared_stack


def tree(path: Path) -> list[str]:
    """Every path under ``path`` (relative, sorted)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- round trips ---------------------------------------------------------------


async def test_binary_body_round_trip(stack, queue):
    await stack.create_queue(queue)
    body = bytes(range(256)) * 4
    message_id = await stack.send(queue, body)
    reply = await stack.receive(queue)
    assert reply.status == 200
    assert reply.body == body
    assert reply.header("X-Message-Id") == message_id


async def test_200_kib_body_round_trip(stack, queue):
    await stack.create_queue(queue)
    body = os.urandom(200 * 1024)
    message_id = await stack.send(queue, body)
    reply = await stack.receive(queue)
    assert reply.status == 200
    assert reply.header("X-Message-Id") == message_id
    assert len(reply.body) == len(body)
    assert reply.body == body


async def test_chunked_body_of_several_pieces_round_trips(stack, queue):
    """A body sent with Transfer-Encoding: chunked, in pieces of any size (an empty one too), is stored whole."""
    await stack.create_queue(queue)
    pieces = [os.urandom(70_000), b"", b"x", os.urandom(300_000)]

    async def body():
        for piece in pieces:
            yield piece

    reply = await stack.request("POST", f"/{queue}/messages", data=body())
    assert reply.status == 201, reply.body
    received = await stack.receive(queue)
    assert received.header("X-Message-Id") == reply.header("X-Message-Id")
    assert received.body == b"".join(pieces)


async def test_empty_body_round_trip(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"")
    reply = await stack.receive(queue)
    assert (reply.status, reply.body, reply.header("X-Message-Id")) == (200, b"", message_id)


@pytest.mark.parametrize(
    "content_type", ["application/json", "text/plain; charset=utf-8", "application/vnd.example+json; version=2"]
)
async def test_content_type_round_trip(stack, queue, content_type):
    await stack.create_queue(queue)
    await stack.send(queue, b'{"a": 1}', content_type=content_type)
    reply = await stack.receive(queue)
    assert reply.status == 200
    assert reply.content_type == content_type


async def test_content_type_defaults_to_octet_stream(stack, queue):
    await stack.create_queue(queue)
    await stack.send(queue, b"no type")  # sent without any Content-Type header
    reply = await stack.receive(queue)
    assert reply.content_type == "application/octet-stream"


async def test_send_returns_id_in_header_and_json(stack, queue):
    await stack.create_queue(queue)
    reply = await stack.request("POST", f"/{queue}/messages", data=b"x")
    assert reply.status == 201, reply.body
    message_id = reply.header("X-Message-Id")
    assert reply.json == {"message_id": message_id}
    assert len(message_id) == 36 and message_id == message_id.lower()


@ONE_SECOND_VISIBILITY
async def test_received_message_headers(stack, queue, wait):
    await stack.create_queue(queue)
    before_ms = time.time_ns() // 1_000_000
    message_id = await stack.send(queue, b"hello")
    after_ms = time.time_ns() // 1_000_000
    first = await stack.receive(queue)
    assert first.status == 200
    assert first.header("X-Message-Id") == message_id
    assert first.header("X-Receive-Count") == "1"
    sent = first.header("X-Sent-Timestamp")
    assert sent is not None and sent.isdigit() and len(sent) == 13, sent
    # Epoch milliseconds of the send; allow 5 s of slack either way (never a speed assertion).
    assert before_ms - 5000 <= int(sent) <= after_ms + 5000, (before_ms, sent, after_ms)

    second = await wait(
        lambda: _receive_200(stack, queue),
        timeout=15,
        message=lambda: f"not redelivered after the 1 s visibility timeout\n{stack.logs()}",
    )
    assert second.header("X-Message-Id") == message_id
    assert second.header("X-Receive-Count") == "2"
    assert second.header("X-Sent-Timestamp") == sent
    assert second.body == b"hello"


async def _receive_200(stack, queue):
    reply = await stack.receive(queue)
    return reply if reply.status == 200 else None


# -- queues --------------------------------------------------------------------


async def test_put_queue_is_idempotent(stack, queue):
    first = await stack.request("PUT", f"/{queue}")
    second = await stack.request("PUT", f"/{queue}")
    assert (first.status, second.status) == (201, 201)
    assert (stack.root / "queues" / queue).is_dir()


async def test_get_queue_200_and_404(stack, queue):
    assert_error(await stack.request("GET", f"/{queue}"), 404, "queue_not_found", "GET missing queue")
    await stack.create_queue(queue)
    reply = await stack.request("GET", f"/{queue}")
    assert reply.status == 200
    assert reply.json["queue"] == queue
    assert reply.json["ready"] == 0
    await stack.send(queue, b"one")
    reply = await stack.request("GET", f"/{queue}")
    assert reply.json["ready"] == 1  # approximate by contract, but exact for one idle daemon


async def test_delete_queue_removes_it_and_its_messages(stack, queue, wait):
    await stack.create_queue(queue)
    for i in range(5):
        await stack.send(queue, b"m%d" % i)
    await stack.receive(queue)  # one in flight too
    reply = await stack.request("DELETE", f"/{queue}")
    assert reply.status == 200, reply.body
    assert_error(await stack.request("GET", f"/{queue}"), 404, "queue_not_found", "GET deleted queue")
    assert_error(await stack.request("GET", f"/{queue}/messages"), 404, "queue_not_found", "receive deleted queue")
    assert_error(await stack.request("DELETE", f"/{queue}"), 404, "queue_not_found", "DELETE deleted queue")
    await stack.create_queue(queue)
    assert (await stack.receive(queue)).status == 204
    assert (await stack.request("GET", f"/{queue}")).json["ready"] == 0
    # Nothing of the old queue is left behind: mq-reaper empties remove/, delay/ holds none of it.
    await wait(
        lambda: not [n for n in stack.files("remove") if n.startswith(f"{queue}.")],
        message=lambda: f"remove/ = {stack.files('remove')}\n{stack.logs()}",
    )
    assert not [n for n in stack.files("delay") if f".{queue}." in n]


async def test_receive_from_empty_queue_is_204(stack, queue):
    await stack.create_queue(queue)
    reply = await stack.request("GET", f"/{queue}/messages")
    assert reply.status == 204
    assert reply.body == b""


@FRESH_STACK
async def test_send_to_missing_queue_is_404_and_leaves_no_file(stack, queue):
    for _ in range(3):
        reply = await stack.request("POST", f"/{queue}/messages", data=b"lost?")
        assert_error(reply, 404, "queue_not_found", "POST to missing queue")
    assert stack.files("new") == []
    assert stack.files("queues") == []
    assert stack.files("delay") == []
    assert stack.files("remove") == []


# -- bad input -----------------------------------------------------------------

BAD_QUEUE_NAMES = [
    pytest.param("a" * 81, id="81-chars"),
    pytest.param("a.b", id="dot"),
    pytest.param("a%20b", id="space"),
    pytest.param("caf%C3%A9", id="unicode"),
    pytest.param("%E2%9C%93", id="checkmark"),
    pytest.param("a%2Fb", id="encoded-slash"),
    pytest.param("a:b", id="colon"),
    pytest.param("a~b", id="tilde"),
]


@pytest.mark.parametrize("name", BAD_QUEUE_NAMES)
async def test_invalid_queue_names_are_400(stack, name):
    valid_id = IdGenerator().next_id()
    queues_before = stack.files("queues")
    requests = [
        ("GET", f"/{name}"),
        ("PUT", f"/{name}"),
        ("DELETE", f"/{name}"),
        ("POST", f"/{name}/messages"),
        ("GET", f"/{name}/messages"),
        ("DELETE", f"/{name}/messages/{valid_id}"),
    ]
    for method, path in requests:
        reply = await stack.request(method, path, data=b"x" if method == "POST" else None)
        assert_error(reply, 400, "invalid_queue_name", f"{method} {path}")
    assert stack.files("queues") == queues_before
    assert stack.files("new") == []


async def test_80_char_queue_name_is_valid(stack):
    name = "Q_-9" * 20
    await stack.create_queue(name)
    await stack.send(name, b"long name")
    assert (await stack.receive(name)).body == b"long name"


TRAVERSALS = [
    "/..",
    "/%2e%2e",
    "/%2E%2E",
    "/.",
    "/..%2f..%2fsentinel",
    "/..%2f..%2fetc/messages",
    "/%2e%2e/messages",
    "/%2e%2e%2f%2e%2e%2fsentinel/messages",
    "/..%5c..%5csentinel/messages",
    "/../../sentinel/messages",
    "/q/messages/..%2f..%2f..%2fsentinel",
    "/q/messages/%2e%2e",
    "//sentinel/messages",
]


@FRESH_STACK
async def test_path_traversal_never_leaves_the_root(stack, tmp_path):
    """Every traversal attempt gets a 4xx JSON error and changes nothing outside (or inside) the root."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep").write_bytes(b"keep")
    await stack.create_queue("q")
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    for path in TRAVERSALS:
        for method in ("GET", "PUT", "DELETE", "POST"):
            reply = await stack.request(method, path, data=b"escape" if method == "POST" else None)
            assert 400 <= reply.status < 500, f"{method} {path} -> {reply.status} {reply.body[:200]!r}"
            assert_error(
                reply,
                reply.status,
                {"invalid_queue_name", "invalid_message_id", "not_found", "method_not_allowed", "queue_not_found"},
                f"{method} {path}",
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before
    assert tree(sentinel) == ["keep"]
    assert (sentinel / "keep").read_bytes() == b"keep"
    assert stack.files("queues") == ["q"]
    assert stack.files("queues/q") == []
    assert stack.files("new") == []
    assert stack.files("delay") == []
    assert sorted(os.listdir(stack.root)) == ["attempts", "delay", "new", "queues", "remove"]


MALFORMED_IDS = [
    pytest.param("not-an-id", id="word"),
    pytest.param("12345", id="digits"),
    pytest.param(None, id="uppercase"),
    pytest.param("3b241101-e2bb-4255-8caf-4136c566a962", id="uuid4"),
    pytest.param("0190b4e8-6c1b-7c3e-8d1f-0a1b2c3d4e5f0", id="too-long"),
    pytest.param("0190b4e8-6c1b-7c3e-8d1f-0a1b2c3d4e5", id="too-short"),
    pytest.param("0190b4e8-6c1b-7c3e-8d1f-0a1b2c3d4e5g", id="non-hex"),
    pytest.param("0190b4e86c1b7c3e8d1f0a1b2c3d4e5f", id="no-dashes"),
    pytest.param("0190b4e8-6c1b-7c3e-8d1f-0a1b2c3d4e5f.0", id="ready-file-name"),
    pytest.param("..", id="dotdot"),
    pytest.param("%2e%2e", id="encoded-dotdot"),
]


@pytest.mark.parametrize("message_id", MALFORMED_IDS)
async def test_malformed_message_id_is_400(stack, queue, message_id):
    await stack.create_queue(queue)
    if message_id is None:
        message_id = IdGenerator().next_id().upper()
    real = await stack.send(queue, b"stays")
    reply = await stack.delete(queue, message_id)
    if message_id in ("..", "%2e%2e"):
        # A dot segment may be normalised away by the HTTP layer (-> another route): any 4xx JSON error.
        assert 400 <= reply.status < 500, reply.status
        assert_error(reply, reply.status, {"invalid_message_id", "not_found", "method_not_allowed"}, message_id)
    else:
        assert_error(reply, 400, "invalid_message_id", f"DELETE id {message_id!r}")
    assert stack.files(f"queues/{queue}") == [f"{real}.0"]
    assert not [n for n in stack.files("remove") if n.startswith(f"{queue}.")]


async def test_unknown_message_id_is_404(stack, queue):
    await stack.create_queue(queue)
    await stack.send(queue, b"other")
    unknown = IdGenerator().next_id()
    assert_error(await stack.delete(queue, unknown), 404, "message_not_found", "DELETE unknown id")


async def test_delete_message_of_missing_queue_is_404(stack, queue):
    assert_error(await stack.delete(queue, IdGenerator().next_id()), 404, "queue_not_found", "missing queue")


async def test_delete_twice_second_is_404(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"once")
    assert (await stack.delete(queue, message_id)).status == 200
    assert_error(await stack.delete(queue, message_id), 404, "message_not_found", "second DELETE")


@SMALL_MESSAGES
async def test_body_size_limit(stack, queue):
    await stack.create_queue(queue)
    for size in (1001, 4096, 900_000):
        reply = await stack.request("POST", f"/{queue}/messages", data=b"x" * size)
        assert_error(reply, 413, "message_too_large", f"{size} bytes")
    assert stack.files("new") == []
    assert stack.files(f"queues/{queue}") == []
    exact = bytes(range(256)) * 3 + b"y" * 232
    assert len(exact) == 1000
    await stack.send(queue, exact)
    reply = await stack.receive(queue)
    assert reply.body == exact


@SMALL_MESSAGES
async def test_body_size_limit_chunked(stack, queue):
    """Without Content-Length (chunked transfer) the limit holds too."""
    await stack.create_queue(queue)

    async def chunks(total: int):
        for _ in range(total // 100):
            yield b"z" * 100

    reply = await stack.request("POST", f"/{queue}/messages", data=chunks(1100))
    assert_error(reply, 413, "message_too_large", "chunked 1100 bytes")
    reply = await stack.request("POST", f"/{queue}/messages", data=chunks(1000))
    assert reply.status == 201, reply.body
    assert (await stack.receive(queue)).body == b"z" * 1000
    assert stack.files("new") == []


@pytest.mark.parametrize("path", ["/a/b/c", "/q/messages/x/y", "/q/other", "/q/messages/"])
async def test_unknown_route_is_404_json(stack, path):
    await stack.create_queue("q")
    reply = await stack.request("GET", path)
    assert_error(reply, 404, "not_found", f"GET {path}")


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/q"), ("PATCH", "/q"), ("PUT", "/q/messages"), ("PATCH", "/q/messages"), ("GET", "/q/messages/ID")],
)
async def test_wrong_method_is_405_json(stack, method, path, queue):
    await stack.create_queue(queue)
    path = path.replace("/q", f"/{queue}")
    path = path.replace("ID", IdGenerator().next_id())
    reply = await stack.request(method, path, data=b"x" if method in ("POST", "PUT", "PATCH") else None)
    assert_error(reply, 405, "method_not_allowed", f"{method} {path}")
