"""The single send, receive and delete served without the router and middlewares (``daemons._fastpath``,
``daemons._wire``).

mq's broker served in this process as ``serve()`` serves it (``make_runner``, a real socket, real
files), so that a test can tell which of the server's three ways answered: mq's own connection
(``daemons._wire``), aiohttp's connection with the inline path, or the application (router,
middlewares, handlers). The answers of all three must be the same, errors included; the other
test modules check the behaviour over real daemons.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from http_checks import mq_in_process

from daemons._fastpath import FastPath
from daemons._wire import WireConnection

#: What is compared of two answers besides the status and the body.
HEADERS = ("Content-Type", "Content-Length", "Allow", "Retry-After", "WWW-Authenticate", "Connection", "Server")


async def call(url: str, method: str, path: str, data: bytes | None = None, headers: Any = None) -> tuple:
    """One request on a new connection (a connection takes the server's request handler when it opens)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.request(method, url + path, data=data, headers=headers) as resp,
    ):
        body = await resp.read()
        kept = {k: resp.headers[k] for k in HEADERS if k in resp.headers}
        parsed = json.loads(body) if body and resp.content_type == "application/json" else body
        return resp.status, parsed, kept, resp.headers


async def test_hot_routes_skip_the_application_and_answer_as_it_does(tmp_path) -> None:
    async with mq_in_process(tmp_path / "root") as (_, runner, url):
        server = runner.server
        assert server is not None
        fast = server.request_handler  # what each new connection of aiohttp's server calls (pinned here)
        assert isinstance(fast, FastPath)
        wire = runner.wire
        assert wire is not None
        app_handler = fast.fallback
        through_app: list[str] = []

        async def counted(request: web.BaseRequest) -> web.StreamResponse:
            through_app.append(f"{request.method} {request.raw_path}")
            return await app_handler(request)

        fast.fallback = counted
        assert (await call(url, "PUT", "/q", json.dumps({"max_message_bytes": 1024}).encode()))[0] == 201
        status, sent, _, headers = await call(url, "POST", "/q/messages", b"hello", {"Content-Type": "text/plain"})
        assert status == 201 and headers["X-Message-Id"] == sent["message_id"]
        status, body, _, headers = await call(url, "GET", "/q/messages")
        assert (status, body, headers["Content-Type"]) == (200, b"hello", "text/plain")
        status, deleted, _, _ = await call(url, "DELETE", f"/q/messages/{sent['message_id']}")
        assert (status, deleted["deleted"]) == (200, True)
        assert through_app == ["PUT /q"], "a single send, receive or delete went through the router"
        # Shapes the router answers itself: an escape, HEAD, a console path, a longer path.
        for method, path in (("GET", "/q%20x/messages"), ("HEAD", "/q/messages"), ("GET", "/ui/messages")):
            await call(url, method, path)
        assert through_app[1:] == ["GET /q%20x/messages", "HEAD /q/messages", "GET /ui/messages"]

        # The same requests, errors above all, answered by each path on fresh connections.
        message_id = sent["message_id"]
        cases: list[tuple[str, str, bytes | None, dict[str, str] | None]] = [
            ("POST", "/bad*name/messages", b"x", None),
            ("POST", "/missing/messages", b"x", None),
            ("POST", "/q/messages", b"x" * 2000, None),  # over the queue's max_message_bytes: 413
            ("POST", "/q/messages", b"x", {"X-Delay-Seconds": "9999"}),
            ("POST", "/q/messages", b"x", {"X-Message-Attributes": "{not json"}),
            ("GET", "/missing/messages", None, None),
            ("GET", "/q/messages", None, None),  # empty: 204
            ("GET", "/q/messages?max_messages=99", None, None),
            ("GET", "/q/messages?bogus=1", None, None),
            ("DELETE", "/q/messages/not-an-id", None, None),
            ("DELETE", f"/q/messages/{message_id}", None, None),  # deleted above: 404
            ("DELETE", f"/q/messages/{message_id}?receipt_handle=nonsense", None, None),
            ("DELETE", f"/q/messages/{message_id}?other=1", None, None),
            ("PUT", "/q/messages", b"", None),  # 405 from the router, with Allow
            ("DELETE", "/q/messages", None, None),  # 405 too: a DELETE needs an id
            ("POST", f"/q/messages/{message_id}", b"x", None),  # and a POST none
        ]
        for method, path, data, headers in cases:
            wire.enabled, server.request_handler = True, fast
            own = (await call(url, method, path, data, headers))[:3]
            wire.enabled = False
            inline = (await call(url, method, path, data, headers))[:3]
            server.request_handler = app_handler
            routed = (await call(url, method, path, data, headers))[:3]
            assert own == inline == routed, f"{method} {path}"
            assert inline[0] >= 204, f"{method} {path}: a case meant to change nothing answered {inline[0]}"
        wire.enabled, server.request_handler = True, fast

        # mq_http_request_duration_seconds counts the inline requests under their routes, as before.
        _, metrics, _, _ = await call(url, "GET", "/metrics")
        text = metrics.decode()
        for line in (
            'method="POST",route="/{queue}/messages",status="201"} 1.0',
            'method="GET",route="/{queue}/messages",status="200"} 1.0',
            'method="DELETE",route="/{queue}/messages/{message_id}",status="200"} 1.0',
            'method="POST",route="/{queue}/messages",status="413"} 3.0',  # once per path
        ):
            assert f"mq_http_request_duration_seconds_count{{{line}" in text, line


async def test_a_connection_is_mqs_own_until_a_request_it_does_not_parse(tmp_path) -> None:
    async with mq_in_process(tmp_path / "root") as (_, runner, url):
        server = runner.server
        assert server is not None
        connector = aiohttp.TCPConnector(limit=1)  # one kept-alive connection for every request below
        async with aiohttp.ClientSession(connector=connector) as http:
            assert (await http.put(url + "/q")).status == 201  # not a hot route: aiohttp's from the start
            assert [type(c).__name__ for c in server.connections] == ["JsonErrorsRequestHandler"]
        for _ in range(500):  # until the server has seen that connection close
            if not server.connections:
                break
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
            async with http.post(url + "/q/messages", data=b"x") as resp:
                assert resp.status == 201
            assert [type(c) for c in server.connections] == [WireConnection]
            async with http.get(url + "/q/messages") as resp:
                assert resp.status == 200
            assert [type(c) for c in server.connections] == [WireConnection]
            async with http.get(url + "/q") as resp:  # handed over to aiohttp, for good
                assert resp.status == 200
            assert [type(c).__name__ for c in server.connections] == ["JsonErrorsRequestHandler"]
            async with http.get(url + "/q/messages") as resp:
                assert resp.status == 204
