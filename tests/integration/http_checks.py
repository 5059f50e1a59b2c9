"""Checks shared by the HTTP tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from daemons._fastpath import FastPathRunner
from daemons._listen import LimitedSite
from daemons.front import Broker, Settings, make_runner


def assert_error(reply: Any, status: int, code: str | set[str], context: str = "") -> dict[str, Any]:
    """``reply`` has ``status`` and a JSON body ``{"error": code, "message": <non-empty str>}``; return the body."""
    codes = {code} if isinstance(code, str) else code
    assert reply.status == status, f"{context}: expected {status} {codes}, got {reply.status} {reply.body[:300]!r}"
    try:
        body = reply.json
    except ValueError:
        pytest.fail(f"{context}: {reply.status} body is not JSON: {reply.body[:300]!r}")
    assert isinstance(body, dict), f"{context}: {body!r}"
    assert body.get("error") in codes, f"{context}: expected error in {codes}, got {body!r}"
    assert isinstance(body.get("message"), str) and body["message"], f"{context}: no message in {body!r}"
    assert (reply.content_type or "").startswith("application/json"), f"{context}: {reply.content_type}"
    return body


@contextlib.asynccontextmanager
async def mq_in_process(root: Any, **settings: Any) -> AsyncIterator[tuple[Broker, FastPathRunner, str]]:
    """mq's broker served in this process as ``serve()`` serves it (real socket, real files), so that a
    test can look at what the daemon keeps in memory; yields (broker, runner, base URL). ``settings``:
    more :class:`Settings` fields (e.g. ``metrics_max_queues=2``)."""
    broker = Broker(Settings(root=str(root), port=0, **settings))
    await broker.start()
    runner = make_runner(broker)
    await runner.setup()
    try:
        site = LimitedSite(runner, "127.0.0.1", 0, sock=None, max_connections=1024, connections=runner.wire)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield broker, runner, f"http://{host}:{port}"
    finally:
        await broker.begin_stop()
        await runner.cleanup()
        await broker.close()
