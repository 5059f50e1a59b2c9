"""``mqcore.client.connect``: a URL gives the HTTP client, an existing root folder the brokerless one."""

from __future__ import annotations

import re

import pytest

from mqcore.client import AsyncClient, AsyncLocalClient, Client, LocalClient, connect, connect_async


def test_connect_picks_the_client_from_the_target(tmp_path):
    with connect("http://127.0.0.1:9") as client:
        assert isinstance(client, Client)
    with connect(tmp_path) as local, connect(f"file://{tmp_path}") as by_url:
        assert isinstance(local, LocalClient) and isinstance(by_url, LocalClient)
        local.create_queue("jobs")
        assert by_url.list_queues() == ["jobs"]


async def test_connect_async_picks_the_client_from_the_target(tmp_path):
    client = connect_async("http://127.0.0.1:9")
    assert isinstance(client, AsyncClient)
    await client.close()
    local = connect_async(str(tmp_path))
    assert isinstance(local, AsyncLocalClient)
    await local.close()


def test_connect_refuses_host_port_without_a_scheme_and_missing_roots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape("http://127.0.0.1:8080")):
        connect("127.0.0.1:8080")
    with pytest.raises(FileNotFoundError, match="no such mq root"):
        connect(tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []  # nothing was created
