"""``GET /`` pages (1,000 names by default, ``after``/``limit``/``next_after``) and sees other processes' queues.

mq keeps the sorted list of queue names while ``queues/`` is unchanged (issue 12):
a queue created or deleted by another process, here a brokerless Store on the
same root, must still show in the next answer; clients page through every name.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mqcore.client import connect
from mqcore.names import QueueName
from mqcore.protocol import Store

PREFIX = "qlist-"
MANY = 1_005


@pytest.fixture
def stack(shared_stack: Any) -> Any:
    return shared_stack


async def _get(stack: Any, query: str) -> tuple[int, Any]:
    async with stack.session.get(f"{stack.url}/{query}") as resp:
        assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
        return resp.status, await resp.json()


async def test_pages_of_a_thousand_names_and_changes_by_other_processes(stack: Any) -> None:
    names = [f"{PREFIX}{i:05d}" for i in range(MANY)]
    other = Store(stack.root, fsync=False)  # another process's view of the same root
    for name in names:
        other.create_queue(QueueName(name))

    status, first = await _get(stack, f"?prefix={PREFIX}")
    assert status == 200 and first["queues"] == names[:1000] and first["next_after"] == names[999]
    assert await _get(stack, f"?prefix={PREFIX}") == (200, first)  # the same page again (mq keeps its bytes)
    status, rest = await _get(stack, f"?prefix={PREFIX}&after={first['next_after']}")
    assert status == 200 and rest == {"queues": names[1000:], "next_after": None}
    status, page = await _get(stack, f"?prefix={PREFIX}&after={names[1]}&limit=2")
    assert page == {"queues": names[2:4], "next_after": names[3]}
    status, everything = await _get(stack, "?limit=1000")
    assert len(everything["queues"]) == 1000 and everything["next_after"] is not None

    # The Python client (and so mqctl ls) pages through every name.
    client = connect(stack.url)
    try:
        assert await asyncio.to_thread(client.list_queues, PREFIX) == names
    finally:
        client.close()

    # Created and deleted behind mq's back: the next answer shows it, whatever mq cached.
    other.create_queue(QueueName(f"{PREFIX}late"))
    assert (await _get(stack, f"?prefix={PREFIX}l"))[1] == {"queues": [f"{PREFIX}late"], "next_after": None}
    other.delete_queue(QueueName(f"{PREFIX}late"))
    assert (await _get(stack, f"?prefix={PREFIX}l"))[1] == {"queues": [], "next_after": None}
    for name in names:
        other.delete_queue(QueueName(name))
    assert (await _get(stack, f"?prefix={PREFIX}"))[1] == {"queues": [], "next_after": None}


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=x", "limit"),
        ("?after=a%2Fb", "after"),
        ("?after=..", "after"),
    ],
)
async def test_bad_paging_parameters_are_refused(stack: Any, query: str, parameter: str) -> None:
    status, body = await _get(stack, query)
    assert status == 400 and body["error"] == "invalid_request" and body["details"]["parameter"] == parameter
