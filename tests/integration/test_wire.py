"""mq's own HTTP/1.1 connections (``daemons._wire``) over raw sockets on a real mq.

The single send, receive and delete are parsed and answered by mq's protocol; anything else on a
connection hands that connection to aiohttp, which answers it as before. What a client sees must
not tell the two apart: keep-alive, HTTP/1.0, ``Connection: close``, pipelining, requests split
anywhere, bodies in pieces, the limits (413, 408, idle timeout), tokens, metrics, long polls of a
client gone. Every wait is bounded by the socket timeout.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqcore.auth import hash_token
from tests.conftest import Daemon, Daemons

#: Longest any single read may take, in seconds.
BOUND_SECONDS = 8.0
TOKENS = {"admin": "admin-token-0123456789", "producer": "producer-token-abc"}


@pytest.fixture(scope="module")
def mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """mq with a body timeout and an idle timeout of 2 s, queues q (1 KiB max) and big (default)."""
    started = Daemons()
    try:
        daemon = started.start(
            "mq", "--root", str(tmp_path_factory.mktemp("wire") / "root"), "--port", "0",
            "--idle-timeout", "2", "--body-timeout", "2",
        )  # fmt: skip
        with Conn(daemon) as conn:
            assert conn.request("PUT", "/q", b'{"max_message_bytes": 1024}')[0] == 201
            assert conn.request("PUT", "/big")[0] == 201
        yield daemon
    finally:
        started.stop_all()


class Conn:
    """One raw connection to mq; answers read one by one (Content-Length framed)."""

    def __init__(self, daemon: Daemon) -> None:
        assert daemon.url is not None
        host, _, port = daemon.url.removeprefix("http://").rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=BOUND_SECONDS)
        self.pending = b""

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(
        self, method: str, path: str, body: bytes = b"", headers: str = "", version: str = "1.1"
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one request (Content-Length framed) and read its answer."""
        length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT") else ""
        self.send(f"{method} {path} HTTP/{version}\r\nHost: mq\r\n{length}{headers}\r\n".encode() + body)
        return self.answer(bodyless=method == "HEAD")

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.pending += chunk
        return bool(chunk)

    def answer(self, bodyless: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next answer: status, headers (lower-case names), body (none for a HEAD's: ``bodyless``)."""
        while b"\r\n\r\n" not in self.pending:
            assert self._fill(), f"connection closed before an answer: {self.pending!r}"
        head, _, rest = self.pending.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
        length = 0 if bodyless else int(headers.get("content-length", "0"))
        while len(rest) < length:
            assert self._fill(), "connection closed inside a body"
            rest = self.pending.partition(b"\r\n\r\n")[2]
        self.pending = rest[length:]
        return status, headers, rest[:length]

    def closed(self) -> bool:
        """True when the server closed the connection (nothing more to read)."""
        return not self.pending and not self._fill()


def _sent(answer: tuple[int, dict[str, str], bytes]) -> str:
    status, headers, body = answer
    assert status == 201, answer
    assert json.loads(body) == {"message_id": headers["x-message-id"]}
    return headers["x-message-id"]


def test_send_receive_delete_on_one_kept_alive_connection(mq: Daemon) -> None:
    with Conn(mq) as conn:
        message_id = _sent(conn.request("POST", "/q/messages", b"hello", "Content-Type: text/plain\r\n"))
        status, headers, body = conn.request("GET", "/q/messages")
        assert (status, body, headers["content-type"], headers["x-message-id"]) == (
            200,
            b"hello",
            "text/plain",
            message_id,
        )
        assert headers["server"].startswith("Python/") and "connection" not in headers
        assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"])
        handle = headers["x-receipt-handle"]
        status, headers, body = conn.request("DELETE", f"/q/messages/{message_id}?receipt_handle={handle}")
        assert (status, json.loads(body)) == (200, {"message_id": message_id, "deleted": True, "was": "in_flight"})
        assert headers["content-type"] == "application/json; charset=utf-8"
        assert conn.request("GET", "/q/messages")[0] == 204


def test_http_10_and_connection_close(mq: Daemon) -> None:
    with Conn(mq) as conn:
        status, headers, _ = conn.request("GET", "/q/messages", version="1.0")
        assert status == 204 and "connection" not in headers
        assert conn.closed(), "an HTTP/1.0 request without keep-alive closes the connection"
    with Conn(mq) as conn:
        for _ in range(2):
            status, headers, _ = conn.request("GET", "/q/messages", headers="Connection: keep-alive\r\n", version="1.0")
            assert (status, headers["connection"]) == (204, "keep-alive")
    with Conn(mq) as conn:
        status, headers, _ = conn.request("GET", "/q/messages", headers="Connection: close\r\n")
        assert (status, headers["connection"]) == (204, "close")
        assert conn.closed()


def test_pipelined_requests_are_answered_in_order(mq: Daemon) -> None:
    with Conn(mq) as conn:
        posts = b"".join(
            b"POST /q/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: 2\r\n\r\n%02d" % i for i in range(3)
        )
        conn.send(posts + b"GET /q/messages HTTP/1.1\r\nHost: mq\r\n\r\n")
        ids = [_sent(conn.answer()) for _ in range(3)]
        status, headers, body = conn.answer()
        assert (status, body, headers["x-message-id"]) == (200, b"00", ids[0])
        for message_id in ids:
            assert conn.request("DELETE", f"/q/messages/{message_id}")[0] == 200


def test_capacity_counts_sends_answered_on_mq_own_connections(mq: Daemon) -> None:
    """A send's ready name and its capacity reservation are settled right after its 201 is written, in the
    same loop step: the next request on any connection sees the queue full, and room again after a delete."""
    with Conn(mq) as admin:  # a PUT: this connection is aiohttp's from now on, the others stay mq's
        assert admin.request("PUT", "/capped", b'{"capacity": 2, "capacity_wait_seconds": 0}')[0] == 201
    with Conn(mq) as conn, Conn(mq) as other:
        first = _sent(conn.request("POST", "/capped/messages", b"a"))
        _sent(other.request("POST", "/capped/messages", b"b"))
        status, headers, body = conn.request("POST", "/capped/messages", b"c")
        assert (status, json.loads(body)["error"]) == (429, "queue_full"), body
        assert headers["retry-after"] == "1"
        assert other.request("POST", "/capped/messages", b"c")[0] == 429
        status, headers, body = conn.request("GET", "/capped/messages")
        assert (status, body, headers["x-message-id"]) == (200, b"a", first)
        handle = headers["x-receipt-handle"]
        assert other.request("DELETE", f"/capped/messages/{first}?receipt_handle={handle}")[0] == 200
        _sent(conn.request("POST", "/capped/messages", b"c"))


def test_a_send_on_mq_own_connection_wakes_a_long_poll(mq: Daemon) -> None:
    """The send's bookkeeping after its 201 wakes a receive waiting on another connection."""
    with Conn(mq) as admin:
        assert admin.request("PUT", "/woken")[0] == 201
    with Conn(mq) as poller, Conn(mq) as sender:
        # 20 s: longer than the socket's read bound, so an answer read at all is a wake by the send
        poller.send(b"GET /woken/messages?wait_time_seconds=20 HTTP/1.1\r\nHost: mq\r\n\r\n")
        time.sleep(0.3)  # the poll is waiting (an earlier send would be found at once: the same answer)
        message_id = _sent(sender.request("POST", "/woken/messages", b"wake up"))
        status, headers, body = poller.answer()
        assert (status, body, headers["x-message-id"]) == (200, b"wake up", message_id)
        handle = headers["x-receipt-handle"]
        assert sender.request("DELETE", f"/woken/messages/{message_id}?receipt_handle={handle}")[0] == 200


def test_a_request_split_byte_by_byte_and_a_body_in_many_pieces(mq: Daemon) -> None:
    with Conn(mq) as conn:
        for byte in b"POST /q/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: 3\r\n\r\nabc":
            conn.send(bytes([byte]))
        message_id = _sent(conn.answer())
        body = bytes(range(256)) * 1024  # 256 KiB in 4 KiB writes
        conn.send(b"POST /big/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 4096):
            conn.send(body[i : i + 4096])
        big_id = _sent(conn.answer())
        status, headers, received = conn.request("GET", "/big/messages")
        assert (status, headers["x-message-id"], received == body) == (200, big_id, True)
        assert conn.request("DELETE", f"/big/messages/{big_id}")[0] == 200
        assert conn.request("DELETE", f"/q/messages/{message_id}")[0] == 200


def test_large_bodies_pipelined_in_one_write_are_stored_apart(mq: Daemon) -> None:
    # Heads and bodies in one stream: each body's bytes land in its own message, none short, none mixed,
    # whether a read ends inside a head, inside a body or between two requests.
    bodies = [bytes([i]) * size + b"end%d" % i for i, size in enumerate((200_000, 70_000, 65_536, 3, 131_072))]
    with Conn(mq) as conn:
        conn.send(
            b"".join(
                b"POST /big/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                for body in bodies
            )
        )
        ids = [_sent(conn.answer()) for _ in bodies]
        for message_id, body in zip(ids, bodies, strict=True):
            status, headers, received = conn.request("GET", "/big/messages")
            assert (status, headers["x-message-id"], len(received)) == (200, message_id, len(body))
            assert received == body
            assert conn.request("DELETE", f"/big/messages/{message_id}")[0] == 200
        # One size again and again, one at a time, each body in several reads.
        same = [bytes([65 + i]) * 65_536 for i in range(6)]
        ids = [_sent(conn.request("POST", "/big/messages", body)) for body in same]
        for message_id, body in zip(ids, same, strict=True):
            status, headers, received = conn.request("GET", "/big/messages")
            assert (status, headers["x-message-id"], received == body) == (200, message_id, True)
            assert conn.request("DELETE", f"/big/messages/{message_id}")[0] == 200


def test_a_client_gone_mid_body_leaves_no_message(mq: Daemon) -> None:
    with Conn(mq) as conn:
        assert conn.request("PUT", "/cut")[0] == 201
    for sent in (10, 16_000, 100_000):  # bytes of the body sent before the client goes
        with Conn(mq) as gone:
            gone.send(b"POST /cut/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: 300000\r\n\r\n" + b"x" * sent)
            time.sleep(0.2)
    with Conn(mq) as conn:
        message_id = _sent(conn.request("POST", "/cut/messages", b"whole"))
        status, headers, received = conn.request("GET", "/cut/messages")
        assert (status, headers["x-message-id"], received) == (200, message_id, b"whole")
        assert conn.request("DELETE", f"/cut/messages/{message_id}")[0] == 200
        assert conn.request("GET", "/cut/messages")[0] == 204
        assert conn.request("DELETE", "/cut")[0] in (200, 204)


def test_a_body_over_the_limit_is_413_and_the_connection_goes_on(mq: Daemon) -> None:
    with Conn(mq) as conn:
        status, _, body = conn.request("POST", "/q/messages", b"x" * 2000)
        assert (status, json.loads(body)["error"]) == (413, "message_too_large")
        # Over --max-body: refused from Content-Length; the body still coming is read and dropped.
        conn.send(b"POST /q/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        status, _, body = conn.answer()
        assert (status, json.loads(body)["error"]) == (413, "message_too_large")
        conn.send(b"y" * (2 << 20))
        assert conn.request("GET", "/q/messages")[0] == 204


def test_a_trickled_body_gets_408_and_the_connection_is_closed(mq: Daemon) -> None:
    with Conn(mq) as conn:
        conn.send(b"POST /q/messages HTTP/1.1\r\nHost: mq\r\nContent-Length: 100\r\n\r\nab")
        status, headers, body = conn.answer()
        assert (status, json.loads(body)["error"], headers["connection"]) == (408, "request_timeout", "close")
        assert conn.closed()


def test_an_idle_connection_is_closed(mq: Daemon) -> None:
    with Conn(mq) as conn:
        assert conn.request("GET", "/q/messages")[0] == 204
        conn.send(b"GET /q/mess")  # an incomplete header counts as idle
        assert conn.closed()


def test_other_requests_hand_the_connection_to_aiohttp(mq: Daemon) -> None:
    with Conn(mq) as conn:
        message_id = _sent(conn.request("POST", "/q/messages", b"one"))
        # A route of the application on the same connection, after a hot request: aiohttp answers it...
        status, _, body = conn.request("GET", "/q")
        assert (status, json.loads(body)["queue"]) == (200, "q")
        # ...and every request after it (the hot routes too), a chunked body included.
        conn.send(b"POST /q/messages HTTP/1.1\r\nHost: mq\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n")
        chunked_id = _sent(conn.answer())
        status, _, body = conn.request("HEAD", "/q/messages")
        assert status == 405
        for expected in (message_id, chunked_id):
            status, headers, _ = conn.request("GET", "/q/messages")
            assert (status, headers["x-message-id"]) == (200, expected)
            assert conn.request("DELETE", f"/q/messages/{expected}")[0] == 200
    with Conn(mq) as conn:  # the parser's refusals stay aiohttp's JSON errors
        conn.send(b"GET /q/messages HTTP/1.1\r\n\r\n")  # no Host
        status, _, body = conn.answer()
        assert (status, json.loads(body)["error"]) == (400, "invalid_request")


def test_a_long_poll_of_a_client_gone_leases_nothing(mq: Daemon) -> None:
    with Conn(mq) as gone:
        gone.send(b"GET /q/messages?wait_time_seconds=5 HTTP/1.1\r\nHost: mq\r\n\r\n")
        time.sleep(0.5)
    with Conn(mq) as conn:
        message_id = _sent(conn.request("POST", "/q/messages", b"later"))
        status, headers, _ = conn.request("GET", "/q/messages")
        assert (status, headers.get("x-message-id")) == (200, message_id)
        assert conn.request("DELETE", f"/q/messages/{message_id}")[0] == 200
        _, _, metrics = conn.request("GET", "/metrics")
    text = metrics.decode()
    assert 'mq_http_request_duration_seconds_count{method="GET",route="/{queue}/messages",status="499"}' in text
    assert 'mq_http_request_duration_seconds_count{method="POST",route="/{queue}/messages",status="413"}' in text
    assert 'route="/{queue}/messages/{message_id}",status="200"}' in text


def test_tokens_are_checked_on_the_hot_routes(tmp_path: Path, daemons: Daemons) -> None:
    fast = {"n": 1024, "r": 8, "p": 1}
    auth = tmp_path / "auth.toml"
    auth.write_text(
        "".join(
            f'[[tokens]]\nname = "{name}"\nhash = "{hash_token(token, **fast)}"\n'
            f'queues = ["*"]\nactions = {json.dumps(["send", "receive", "admin"] if name == "admin" else ["send"])}\n\n'
            for name, token in TOKENS.items()
        )
    )
    daemon = daemons.start("mq", "--root", str(tmp_path / "root"), "--port", "0", "--auth-file", str(auth))
    admin = f"Authorization: Bearer {TOKENS['admin']}\r\n"
    producer = f"Authorization: Bearer {TOKENS['producer']}\r\n"
    with Conn(daemon) as conn:
        assert conn.request("PUT", "/t", headers=admin)[0] == 201
        status, headers, body = conn.request("POST", "/t/messages", b"x")
        assert (status, json.loads(body)["error"], "www-authenticate" in headers) == (401, "unauthorized", True)
        status, _, _ = conn.request("POST", "/t/messages", b"x", "Authorization: Bearer nope\r\n")
        assert status == 401
        message_id = _sent(conn.request("POST", "/t/messages", b"x", producer))
        status, headers, body = conn.request("GET", "/t/messages", headers=producer)
        assert (status, json.loads(body)["error"]) == (403, "forbidden")
        assert 'error="insufficient_scope"' in headers["www-authenticate"]
        assert conn.request("DELETE", f"/t/messages/{message_id}", headers=admin)[0] == 200
    with Conn(daemon) as conn:  # a new connection: mq's own (the PUT above handed its connection to aiohttp)
        batch = b'{"entries": [{"body": "x"}]}'
        status, headers, body = conn.request("POST", "/t/messages/batch", batch)
        assert (status, json.loads(body)["error"], "www-authenticate" in headers) == (401, "unauthorized", True)
        assert conn.request("POST", "/t/messages/batch", batch, "Authorization: Bearer nope\r\n")[0] == 401
        status, _, body = conn.request("POST", "/t/messages/batch", batch, producer)
        assert (status, [e["id"] for e in json.loads(body)["successful"]]) == (200, ["0"])
