"""Limits against abuse on a real mq, with raw sockets on loopback and the limits set low:
too many connections, slow headers (slowloris), a body trickled 1 byte at a time, too many long
polls on one queue. Each is answered with a JSON error where an answer is possible, and mq keeps
serving (docs/security.md). Every wait is bounded by a few seconds."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Daemon, Daemons

#: Longest any single check may take, in seconds.
BOUND_SECONDS = 8.0


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """mq with an idle timeout of 1 s, a body timeout of 1 s and at most 2 long polls per queue."""
    started = Daemons()
    try:
        yield started.start(
            "mq", "--root", str(tmp_path_factory.mktemp("limits") / "root"), "--port", "0",
            "--idle-timeout", "1", "--body-timeout", "1", "--max-waiters", "2",
        )  # fmt: skip
    finally:
        started.stop_all()


def _connect(url: str) -> socket.socket:
    host, _, port = url.removeprefix("http://").rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=BOUND_SECONDS)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket timeout)."""
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _status_and_json(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _request(url: str, method: str, path: str, body: bytes = b"") -> int:
    sock = _connect(url)
    with sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        return int(_read_all(sock).split(b" ", 2)[1])


def test_connections_over_the_limit_get_503_json_and_are_closed(daemons: Daemons, tmp_path: Path) -> None:
    mq = daemons.start("mq", "--root", tmp_path / "root", "--port", "0", "--max-connections", "3")
    held = [_connect(mq.url) for _ in range(3)]
    try:
        for sock in held:  # each is served: the server has accepted all three
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        extra = _connect(mq.url)
        with extra:
            status, body = _status_and_json(_read_all(extra))
        assert status == 503
        assert body["error"] == "server_busy"
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + BOUND_SECONDS
    while True:  # the slots are free again once mq has seen the three close
        try:
            if _request(mq.url, "GET", "/") == 200:
                break
        except ConnectionResetError:  # refused before mq read the request: a reset, then try again
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused, line = time.monotonic() + BOUND_SECONDS, "connection refused: 3 open (--max-connections)"
    while line not in mq.log and time.monotonic() < refused:  # stderr is read by a thread
        time.sleep(0.05)
    assert line in mq.log
    sock = _connect(mq.url)
    with sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        metrics = _read_all(sock).decode()
    counted = re.search(r'^mq_refusals_total\{reason="connections"\} ([0-9.]+)$', metrics, re.M)
    assert counted and float(counted.group(1)) >= 1, metrics[-2000:]


def test_slow_headers_are_cut_off_after_the_idle_timeout(limited: Daemon) -> None:
    sock = _connect(limited.url)
    started = time.monotonic()
    with sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(int(BOUND_SECONDS / 0.25)):
            try:
                sock.sendall(b"X")  # one header byte at a time, never the end of the headers
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(0.25)
            try:
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
    assert closed, "mq kept a connection whose headers never ended"
    assert time.monotonic() - started < BOUND_SECONDS
    assert _request(limited.url, "GET", "/") == 200


def test_a_trickled_body_gets_408_json_and_nothing_is_stored(limited: Daemon) -> None:
    assert _request(limited.url, "PUT", "/trickle") == 201
    sock = _connect(limited.url)
    started = time.monotonic()
    with sock:
        sock.sendall(b"POST /trickle/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        sock.settimeout(0.2)
        received = b""
        while time.monotonic() - started < BOUND_SECONDS:
            try:
                sock.sendall(b"x")  # 5 bytes a second: the whole body would take 20 s
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            received += chunk
            if not chunk:
                break
    status, body = _status_and_json(received)
    assert status == 408
    assert body["error"] == "request_timeout"
    assert time.monotonic() - started < BOUND_SECONDS
    sock = _connect(limited.url)
    with sock:
        sock.sendall(b"GET /trickle HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, stats = _status_and_json(_read_all(sock))
    assert stats["ready"] == 0 and stats["in_flight"] == 0
    logged = time.monotonic() + BOUND_SECONDS
    while "body timeout" not in limited.log and time.monotonic() < logged:  # stderr is read by a thread
        time.sleep(0.05)
    assert "body timeout" in limited.log


async def test_long_polls_over_the_limit_get_503(limited: Daemon) -> None:
    url = limited.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.put(f"{url}/polled") as resp:
            assert resp.status == 201

        async def poll(wait: int) -> tuple[int, bytes]:
            async with http.get(f"{url}/polled/messages", params={"wait_time_seconds": str(wait)}) as resp:
                return resp.status, await resp.read()

        waiting = [asyncio.create_task(poll(20)) for _ in range(2)]
        deadline = time.monotonic() + BOUND_SECONDS
        while True:  # once both wait, a third is refused at once
            await asyncio.sleep(0.05)
            for i, task in enumerate(waiting):  # one that raced a probe may have been refused: wait again
                if task.done():
                    assert task.result()[0] == 503, task.result()
                    waiting[i] = asyncio.create_task(poll(20))
            status, body = await poll(1)
            if status == 503 and not any(task.done() for task in waiting):
                break
            assert status in (204, 503) and time.monotonic() < deadline, (status, body)
        assert json.loads(body)["error"] == "server_busy"
        async with http.post(f"{url}/polled/messages", data=b"wake") as resp:
            assert resp.status == 201
        done, _ = await asyncio.wait(waiting, timeout=BOUND_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        assert next(t.result() for t in done) == (200, b"wake")
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
