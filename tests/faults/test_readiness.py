"""``GET /readyz`` and the free-space floor on a real small filesystem (a tmpfs, root needed).

Below ``--min-free-bytes`` readiness is 503 naming ``free_space`` and sends get
``507 insufficient_storage`` + Retry-After while receives still work; with the
disk completely full the probe fails too; once space is freed both recover.
Without root or ``mount`` the tests skip locally and FAIL under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

MIB = 1024 * 1024


def fill(path: Path, size: int | None) -> None:
    """Write ``size`` bytes to ``path`` (None: until the filesystem is full).

    Unbuffered: a buffered file that hit ENOSPC keeps the unwritten rest and raises again when closed.
    """
    chunk = b"\0" * 65536
    with contextlib.suppress(OSError), path.open("wb", buffering=0) as fh:
        written = 0
        while size is None or written < size:
            fh.write(chunk[: 65536 if size is None else min(65536, size - written)])
            fh.flush()
            written += len(chunk)


async def test_readiness_turns_503_on_a_full_filesystem_and_back(tmp_path, mount_tmpfs, stack_factory, wait):
    mount = mount_tmpfs(tmp_path / "fs", "size=8m")
    root = mount / "root"
    stack = stack_factory(root=root, mover=False, reaper=False, mq_args=["--min-free-bytes", str(2 * MIB)])
    await stack.create_queue("q")
    kept = await stack.send("q", b"kept")

    ready = await stack.request("GET", "/readyz")
    assert ready.status == 200, ready.body
    assert ready.json["checks"]["free_space"]["min_free_bytes"] == 2 * MIB

    # Below the floor (the filler leaves about 1 MiB): not ready, sends refused, receives work.
    filler = mount / "filler"
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    fill(filler, free - MIB)

    async def not_ready():
        reply = await stack.request("GET", "/readyz")
        return reply if reply.status == 503 else None

    reply = await wait(not_ready, timeout=10)
    assert reply.json["error"] == "not_ready"
    assert reply.json["details"]["failed"] == ["free_space"], reply.json
    assert reply.header("Retry-After") == "5"

    async def refused():
        reply = await stack.request("POST", "/q/messages", data=b"x")
        return reply if reply.status != 201 else None

    reply = await wait(refused, timeout=10)
    assert reply.status == 507, reply.body
    assert reply.json["error"] == "insufficient_storage"
    assert reply.header("Retry-After") == "5"
    assert reply.json["details"]["min_free_bytes"] == 2 * MIB
    received = await stack.receive("q")
    assert received.status == 200 and received.header("X-Message-Id") == kept

    # Completely full: the probe cannot write either.
    fill(mount / "filler2", None)
    reply = await stack.request("GET", "/readyz")
    assert reply.status == 503
    assert set(reply.json["details"]["failed"]) == {"probe", "free_space"}, reply.json

    # Space freed: ready again, sends accepted.
    filler.unlink()
    (mount / "filler2").unlink()

    async def ready_again():
        reply = await stack.request("GET", "/readyz")
        return reply if reply.status == 200 else None

    await wait(ready_again, timeout=10)

    async def accepted():
        reply = await stack.request("POST", "/q/messages", data=b"y")
        assert reply.status in (201, 507), reply.body
        return reply.status == 201

    await wait(accepted, timeout=10)
