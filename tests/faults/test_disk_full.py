"""A full disk: mq answers 503 + Retry-After, keeps every acknowledged message, recovers.

The root is a size-limited tmpfs (a real ENOSPC, fault-testing.md), mounted by the test
(root needed). Without root or ``mount`` the tests skip locally and FAIL under ``CI=true``
(STYLE.md, Tests: fault suites sit behind a marker; dramatiq ``check_redis``).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

#: (tmpfs mount options, body size in bytes): out of blocks, and out of inodes with blocks to spare.
FILESYSTEMS = [
    pytest.param(("size=1m", 16 * 1024), id="blocks"),
    pytest.param(("size=16m,nr_inodes=48", 1024), id="inodes"),
]


@pytest.fixture
def small_fs(request: pytest.FixtureRequest, tmp_path: Path, mount_tmpfs) -> tuple[Path, int]:
    """A small tmpfs mounted at ``tmp_path / "root"``; returns (mount point, body size in bytes)."""
    options, body_size = request.param
    return mount_tmpfs(tmp_path / "root", options), body_size


def assert_503(reply, logs: str) -> None:
    assert reply.status == 503, f"{reply.status} {reply.body[:200]!r}\n{logs}"
    retry_after = reply.header("Retry-After")
    assert retry_after is not None and retry_after.isdigit(), f"503 without a Retry-After in seconds: {reply.headers}"
    body = reply.json
    assert body["error"] == "storage_unavailable", body
    assert isinstance(body.get("message"), str) and body["message"], body


@pytest.mark.parametrize("small_fs", FILESYSTEMS, indirect=True)
async def test_disk_full_503_keeps_acknowledged_messages_and_recovers(small_fs, stack_factory, queue, wait):
    root, body_size = small_fs
    stack = stack_factory(root=root)
    await stack.create_queue(queue)

    acked: dict[str, bytes] = {}
    full = None
    for i in range(2000):
        body = i.to_bytes(4, "big") + os.urandom(body_size - 4)
        reply = await stack.request("POST", f"/{queue}/messages", data=body)
        if reply.status == 201:
            acked[reply.header("X-Message-Id")] = body
            continue
        full = reply
        break
    assert full is not None, f"the {small_fs} tmpfs never filled up after {len(acked)} messages"
    assert_503(full, stack.logs())
    assert len(acked) >= 5, f"only {len(acked)} messages fit: the test filesystem is too small to mean anything"

    # Still full: concurrent sends are refused the same way, none half-stored.
    replies = await asyncio.gather(
        *(stack.request("POST", f"/{queue}/messages", data=os.urandom(body_size)) for _ in range(8))
    )
    for reply in replies:
        if reply.status == 201:  # a small gap may have opened (e.g. a directory block); keep the message
            pytest.fail("a send succeeded on a full filesystem with nothing freed")
        assert_503(reply, stack.logs())
    assert stack.files("new") == [], f"partial files left in new/: {stack.files('new')}"
    assert (await stack.request("GET", f"/{queue}")).status == 200

    # Every acknowledged message is there, intact (receiving needs renames only, no space).
    received = {}
    while True:
        reply = await stack.receive(queue)
        if reply.status == 204:
            break
        message_id = reply.header("X-Message-Id")
        assert message_id in acked, f"received {message_id}, which never got a 201"
        assert reply.body == acked[message_id], f"{message_id} is not intact"
        received[message_id] = reply.body
        assert (await stack.delete(queue, message_id)).status == 200
    assert received.keys() == acked.keys(), f"{len(acked.keys() - received.keys())} acknowledged messages lost"

    # Space comes back once mq-reaper unlinked the deleted messages; then sends succeed again.
    await wait(lambda: not stack.files("remove"), timeout=20, message=lambda: f"remove/ not reaped\n{stack.logs()}")
    body = os.urandom(body_size)

    async def sent():
        reply = await stack.request("POST", f"/{queue}/messages", data=body)
        assert reply.status in (201, 503), reply.status
        return reply.header("X-Message-Id") if reply.status == 201 else None

    message_id = await wait(sent, timeout=20, interval=0.2, message=lambda: f"sends still refused\n{stack.logs()}")
    reply = await stack.receive(queue)
    assert (reply.status, reply.header("X-Message-Id"), reply.body) == (200, message_id, body)
    assert stack.files("new") == []


@pytest.mark.parametrize("small_fs", [FILESYSTEMS[0]], indirect=True)
async def test_create_queue_on_full_disk_is_201_with_its_directory_or_503(small_fs, stack_factory, queue):
    """PUT on a full disk never claims success without the directory; 503 keeps the JSON shape."""
    root, body_size = small_fs
    stack = stack_factory(root=root)
    await stack.create_queue(queue)
    start = time.monotonic()
    while time.monotonic() - start < 30:
        reply = await stack.request("POST", f"/{queue}/messages", data=os.urandom(body_size))
        if reply.status == 503:
            break
    # Fill the last blocks with small messages too.
    for _ in range(500):
        if (await stack.request("POST", f"/{queue}/messages", data=b"x" * 64)).status == 503:
            break
    for i in range(5):
        reply = await stack.request("PUT", f"/{queue}-more-{i}")
        if reply.status == 201:
            assert (root / "queues" / f"{queue}-more-{i}").is_dir()
        else:
            assert_503(reply, stack.logs())
