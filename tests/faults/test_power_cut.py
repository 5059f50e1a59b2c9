"""A power cut under concurrent single and batch sends: every acknowledged message survives, intact.

The power cut of shared/notes/fault-testing.md ("Power loss", xfstests' "godown"): mq runs on a
loop-mounted ext4 image (with a journal, the reference platform of docs/protocol.md section 5; and
without one, as this machine's disk: not required, see ``NO_JOURNAL``), the test sends
single messages and batches of 10 from several connections, then calls ext4's shutdown ioctl with
the no-log-flush flag mid-load: from that instant the filesystem writes nothing more, so what is
not on the "disk" yet (page cache, dirty directory blocks) never gets there. mq is killed with
SIGKILL, the image is copied as the loop device left it (exactly what reached the disk), and a new
mq on the copy must give back every message that got a 201 (or a batch entry acknowledged) with its
exact body: lost = 0, nothing that was never sent, no torn or empty body. Both ways of making a
file's data durable before its rename (docs/protocol.md 6.2) run: ``--file-sync fsync`` (each file)
and ``--file-sync syncfs`` (one ``syncfs`` per group of files), a few cycles each.

Needs root (``mount -o loop``, the ioctl); without it the test skips locally and FAILS under
``CI=true``, like the other fault suites (tests/conftest.py ``fault_unavailable``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import os
import shutil
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import fault_unavailable
from tests.faults.test_crash_restart import DOWN

pytestmark = pytest.mark.faults

#: ext4's EXT4_IOC_SHUTDOWN (``_IOR('X', 125, __u32)``) and its EXT4_GOING_FLAGS_NOLOGFLUSH.
EXT4_IOC_SHUTDOWN = 0x8004587D
GOING_NOLOGFLUSH = 2
#: Power cuts per variant (each ~1-2 s).
CYCLES = 3


def run(*cmd: str, ok: tuple[int, ...] = (0,)) -> str:
    """Run a command as root and return its output; a failure is the environment failing (skip locally, fail in CI)."""
    try:
        result = subprocess.run(cmd, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        fault_unavailable(f"{cmd[0]} failed: {exc}")
    if result.returncode not in ok:
        fault_unavailable(f"{' '.join(cmd)} failed: {result.stderr.decode(errors='replace').strip()}")
    return (result.stdout + result.stderr).decode(errors="replace")


class Disk:
    """An ext4 image file mounted through a loop device at ``mount_point``; ``cut`` simulates a power cut.

    Args:
        base: A directory for the image (``disk.img``) and the mount point (``mnt``).
        journal: Whether the ext4 has a journal.
        size: The image's size in bytes (a sparse file).
        mkfs_options: More options for ``mkfs.ext4`` (e.g. ``-E lazy_itable_init=0``).
    """

    def __init__(self, base: Path, journal: bool, size: int = 96 << 20, mkfs_options: tuple[str, ...] = ()) -> None:
        self.image = base / "disk.img"
        self.mount_point = base / "mnt"
        self.mount_point.mkdir()
        with open(self.image, "wb") as f:
            f.truncate(size)
        journal_options = [] if journal else ["-O", "^has_journal"]
        run("mkfs.ext4", "-q", "-F", "-m", "0", *journal_options, *mkfs_options, str(self.image))
        self.mounted = False
        #: What the last e2fsck said (shown when a check fails).
        self.fsck = ""

    def mount(self) -> Path:
        run("mount", "-o", "loop", str(self.image), str(self.mount_point))
        self.mounted = True
        return self.mount_point

    def cut_power(self) -> None:
        """From now on nothing reaches the disk (ext4 shutdown, no log flush): what it holds is what survives."""
        fd = os.open(self.mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", GOING_NOLOGFLUSH))
        finally:
            os.close(fd)

    def reboot(self) -> Path:
        """Unmount (the daemons are dead), keep the image as it was at the cut, check it as a boot does, mount it.

        A journal-less ext4 cut mid-write is repaired by ``e2fsck`` at boot (``fsck -p``): a directory
        grown by a block whose content never reached the disk fails its checksum until then. With a
        journal, the mount replays it (e2fsck does too).
        """
        # What the loop device wrote is in the image file; copy it first, so that nothing the
        # unmount might still write (the block device's own dirty buffers) reaches the "disk".
        survived = self.image.with_suffix(".cut")
        shutil.copyfile(self.image, survived)
        self.unmount()
        os.replace(survived, self.image)
        self.fsck = run("e2fsck", "-f", "-y", str(self.image), ok=(0, 1))  # 1: errors corrected
        return self.mount()

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.mount_point)], capture_output=True, timeout=60, check=False)
            self.mounted = False


def need_loop_disks() -> None:
    """Skip (fail under CI=true) unless this process can make and mount loop ext4 images: root and the tools."""
    if os.geteuid() != 0:
        fault_unavailable("mounting a loop device needs root")
    for tool in ("mkfs.ext4", "e2fsck", "mount", "umount"):
        if shutil.which(tool) is None:
            fault_unavailable(f"{tool} not found")


@pytest.fixture
def power_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    """A loop-mounted ext4 (``request.param``: True = with a journal); unmounted at teardown."""
    need_loop_disks()
    disk = Disk(tmp_path, journal=request.param)
    disk.mount()
    try:
        yield disk
    finally:
        disk.unmount()


class Senders:
    """Single and batch senders on their own connections; what got acknowledged, and everything ever sent."""

    def __init__(self, stack, queue: str) -> None:
        self.stack = stack
        self.queue = queue
        self.acked: dict[str, bytes] = {}
        self.sent: set[bytes] = set()
        self.going = True

    def body(self) -> bytes:
        # Distinct, and long enough to span a page: a torn or zero-filled file cannot pass for another body.
        body = f"{uuid.uuid4()}:".encode() * 150
        self.sent.add(body)
        return body

    async def single(self) -> None:
        while self.going:
            body = self.body()
            try:
                reply = await self.stack.request("POST", f"/{self.queue}/messages", data=body)
            except DOWN:
                return
            if reply.status == 201:
                self.acked[reply.header("X-Message-Id")] = body
            else:  # the disk is gone: a send fails, never half-stored
                assert reply.status in (500, 503), f"send -> {reply.status} {reply.body[:200]!r}"

    async def batch(self) -> None:
        while self.going:
            bodies = [self.body() for _ in range(10)]
            entries = [{"id": str(i), "body_base64": base64.b64encode(b).decode()} for i, b in enumerate(bodies)]
            try:
                reply = await self.stack.request(
                    "POST", f"/{self.queue}/messages/batch", data=json.dumps({"entries": entries})
                )
            except DOWN:
                return
            if reply.status != 200:
                assert reply.status in (500, 503), f"batch send -> {reply.status} {reply.body[:200]!r}"
                continue
            for entry in reply.json["successful"]:
                self.acked[entry["message_id"]] = bodies[int(entry["id"])]


async def receive_all(stack, queue: str) -> dict[str, bytes]:
    """Every message of the queue, by id (batch receives until one comes back empty)."""
    got: dict[str, bytes] = {}
    while True:
        reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=600")
        assert reply.status == 200, f"receive -> {reply.status} {reply.body[:200]!r}\n{stack.logs()}"
        messages = reply.json["messages"]
        if not messages:
            return got
        for m in messages:
            assert m["message_id"] not in got, f"{m['message_id']} handed out twice inside its visibility timeout"
            got[m["message_id"]] = base64.b64decode(m["body_base64"])


#: ext4 without a journal (this project's test machine's disk) does not give docs/protocol.md section 5's
#: properties: an fsync there writes the file's or directory's own blocks and inode, not the group
#: descriptors and bitmaps of what it allocated, nor a new directory's blocks when its parent is
#: fsynced, so after a cut e2fsck finds inodes in a group's "unused" area and corrupt directories and
#: clears entries of acknowledged messages (seen with --file-sync fsync, main's form, 2 runs in 7).
#: Run, shown as XFAIL/XPASS, never required: mq's contract is a journaled filesystem (section 5).
NO_JOURNAL = pytest.param(
    False,
    id="ext4-nojournal",
    marks=pytest.mark.xfail(strict=False, reason="ext4 without a journal lacks protocol.md section 5's properties"),
)


@pytest.mark.parametrize("file_sync", ["fsync", "syncfs"])
@pytest.mark.parametrize("power_disk", [NO_JOURNAL, pytest.param(True, id="ext4-journal")], indirect=True)
async def test_power_cut_under_sends_keeps_every_acknowledged_message(power_disk, stack_factory, file_sync):
    mq_args = ["--file-sync", file_sync]
    root = power_disk.mount_point / "root"
    stack = stack_factory(root=root, mq_args=mq_args, mover=False, reaper=False)
    assert f"file sync {file_sync} (--file-sync {file_sync}, root on ext4)" in stack.mq.log
    for cycle in range(CYCLES):
        queue = f"power{cycle}"  # a queue per cycle: the last cycle's messages stay leased (no mq-mover)
        await stack.create_queue(queue)
        senders = Senders(stack, queue)
        tasks = [asyncio.ensure_future(senders.single()) for _ in range(6)]
        tasks += [asyncio.ensure_future(senders.batch()) for _ in range(3)]
        await asyncio.sleep(0.3 + 0.2 * cycle)  # the cut lands at a different point of the load each cycle
        power_disk.cut_power()
        await asyncio.sleep(0.2)  # answers of sends that completed before the cut still arrive
        senders.going = False
        assert stack.mq.kill() == -9
        for task in tasks:
            with contextlib.suppress(*DOWN):
                await task
        assert senders.acked, f"cycle {cycle}: no send was acknowledged before the cut\n{stack.logs()}"
        power_disk.reboot()
        stack = stack_factory(root=root, mq_args=mq_args, mover=False, reaper=False)

        got = await receive_all(stack, queue)
        lost = [message_id for message_id in senders.acked if message_id not in got]
        assert not lost, (
            f"cycle {cycle}: {len(lost)} of {len(senders.acked)} acknowledged messages lost: {lost[:3]}\n"
            f"e2fsck:\n{power_disk.fsck}"
        )
        for message_id, body in got.items():
            assert body in senders.sent, f"cycle {cycle}: {message_id} came back with a body never sent: {body[:80]!r}"
            expected = senders.acked.get(message_id)
            assert expected is None or body == expected, f"cycle {cycle}: {message_id} came back with another body"
