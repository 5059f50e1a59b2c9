"""A failed ``syncfs`` round (``mq --file-sync syncfs``), with errors the kernel itself reports.

docs/protocol.md 6.2's rules for a failed round: every send of the round fails (503, its files
unlinked, nothing renamed), and so does every later send begun (the count of failed rounds read,
before its first write) before the failed round ended, even if its own round's ``syncfs``
succeeds (the kernel reports a writeback error once: "fsyncgate"; the epoch rule of
``mqcore.protocol._fs.FsSyncer``). A round also fails when the error it reports was another
writer's: ``syncfs`` cannot say whose pages were lost.

How the errors are made real (shared/notes/fault-testing.md): mq's root is on an ext4 image
("inner") whose file sits on a second, small ext4 ("outer"); both loop-mounted. The inner image is
sparse: mkfs writes every block of its metadata (``lazy_itable_init=0``, no uninitialized block
groups), so only new *data* blocks of the inner filesystem are holes of its image file.
While a filler file takes every free block of the outer filesystem, the loop device's writes into
those holes fail with ENOSPC: the kernel fails the writeback of the message files' data, records the
error on the inner filesystem (errseq) and ``syncfs`` returns it, while metadata (inode table,
bitmaps, directories) still reaches the disk. Removing the filler clears the fault: later rounds
succeed. Freezing the outer filesystem (FIFREEZE) holds the inner's writeback, so a ``syncfs`` round
stays running until the thaw: that orders "a send begun while a round runs" without any timing.
libfiu was not used: it fails a libc call, not the kernel's write-back, and its POSIX preload
(Debian's fiu-utils 1.1) wraps ``fsync`` and ``fdatasync`` but not ``syncfs`` (no failure point
``posix/io/sync/syncfs``; no other call it wraps fails mq's round). FUSE was not: mq never uses
``syncfs`` on FUSE (``mqcore.fsinfo.MountInfo.local``), and this machine has no libfuse.

Every test ends with a power cut of the inner filesystem (tests/faults/test_power_cut.py's
shutdown ioctl, e2fsck, mount) and a new mq on what reached the disk: every 201 comes back with
its exact body, nothing that got a 503 ever does, and mq-reaper's sweep leaves nothing in
``new/``. (Before the cut mq leaves nothing there either; after it the refused sends' files can be
back, since their unlinks were never fsynced: docs/protocol.md section 12, as this test found.)

Needs root (loop mounts, FIFREEZE); without it the tests skip locally and FAIL under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import platform
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import fault_unavailable, wait_for
from tests.faults.test_power_cut import Disk, need_loop_disks, receive_all, run

pytestmark = pytest.mark.faults

#: The ioctls of ``fsfreeze -f`` / ``-u`` (``_IOWR('X', 119, int)``, ``_IOWR('X', 120, int)``).
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878
#: The system call numbers of ``syncfs`` and ``openat`` as /proc/PID/task/TID/syscall shows them (a thread in one).
SYSCALLS = {"x86_64": (306, 257), "aarch64": (267, 56)}
#: The flags of a message file's create (``O_CREAT | O_EXCL``), as ``openat``'s third argument holds them.
CREATE = os.O_CREAT | os.O_EXCL
#: mq without mq-mover and mq-reaper (nothing else writes to the root), every send through the saver threads
#: (never the lone send's inline file fsync), and every saver's files group-committed by ``syncfs``.
MQ_ARGS = ["--file-sync", "syncfs", "--inline-io", "never"]
#: mq-reaper after the power cut: its start-up sweep removes every file in new/ (0 is refused).
RECOVERY_REAPER = ["--new-grace", "0.001", "--rescan-interval", "1"]
#: Inner filesystem: every metadata block written by mkfs (no block group left uninitialized), so only data
#: blocks are holes of the image. No journal: while the outer filesystem is frozen, a journal commit held by
#: it would hold every metadata change of the inner one (J's create too); without one, ``syncfs`` writes the
#: bitmaps and group descriptors of everything allocated before a send's renames (test_power_cut.py's
#: ``NO_JOURNAL`` failures were of inodes in a group's "unused" area, which ``^uninit_bg`` does not have).
#: A frozen outer filesystem is thawed after this many seconds whatever the test does (a stuck test fails, never hangs).
THAW_SECONDS = 60.0
INNER_MKFS = ("-O", "^metadata_csum,^uninit_bg", "-E", "lazy_itable_init=0,nodiscard")


class NestedDisk:
    """An ext4 ("inner", without a journal) whose image file is on a small ext4 ("outer"); see the module docstring.

    ``inner`` is a :class:`tests.faults.test_power_cut.Disk` (``cut_power``, ``reboot``); the outer one
    can be filled (:meth:`fill`: writes to the inner's unwritten data blocks fail), emptied again
    (:meth:`free`), frozen and thawed (:meth:`freeze`: the inner's writeback waits).
    """

    def __init__(self, base: Path) -> None:
        (base / "outer").mkdir()
        # Room for the inner image's metadata (~6 MiB) and the copy Disk.reboot makes of it (48 MiB).
        self.outer = Disk(base / "outer", journal=False, size=80 << 20)
        self.outer.mount()
        self.inner = Disk(self.outer.mount_point, journal=False, size=48 << 20, mkfs_options=INNER_MKFS)
        self.inner.mount()
        # No access-time updates: the test's own listings of new/ must not wait for the frozen outer filesystem.
        run("mount", "-o", "remount,noatime", str(self.inner.mount_point))
        self.filler = self.outer.mount_point / "filler"
        self.watchdog: threading.Timer | None = None

    def fill(self) -> None:
        """Take every free block of the outer filesystem (the inner's new data blocks can no longer be written)."""
        # What the inner filesystem wrote so far is on the outer one, in blocks it already has. syncfs of the
        # two mounts only, never sync(2): that waits on every filesystem of the machine, and blocks while any
        # is frozen (the other test of this module freezes its outer filesystem).
        sync_mount(self.inner.mount_point)
        sync_mount(self.outer.mount_point)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            stat = os.statvfs(self.outer.mount_point)
            with contextlib.suppress(OSError):  # ENOSPC for the last blocks (the extent tree takes some)
                os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize)
            chunk = b"\0" * (1 << 16)
            with contextlib.suppress(OSError):
                while True:  # whatever fallocate left
                    os.pwrite(fd, chunk, os.fstat(fd).st_size)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert os.statvfs(self.outer.mount_point).f_bavail == 0, "the outer filesystem still has free blocks"

    def free(self) -> None:
        """Remove the filler: writes to the inner image succeed again."""
        self.filler.unlink()
        sync_mount(self.outer.mount_point)

    def freeze(self, frozen: bool) -> None:
        """Freeze (True) or thaw (False) the outer filesystem: while frozen the inner one's writeback waits.

        A frozen filesystem is thawed by a watchdog thread after ``THAW_SECONDS`` in any case: a test
        stuck in a system call that waits for it could not thaw it itself.
        """
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        if frozen:
            self.watchdog = threading.Timer(THAW_SECONDS, self.freeze, (False,))
            self.watchdog.daemon = True
            self.watchdog.start()
        fd = os.open(self.outer.mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, FIFREEZE if frozen else FITHAW, 0)
        finally:
            os.close(fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.freeze(False)
        self.inner.unmount()
        self.outer.unmount()


@pytest.fixture
def nested(tmp_path: Path) -> Iterator[NestedDisk]:
    """A :class:`NestedDisk` under ``tmp_path``; thawed and unmounted at teardown."""
    need_loop_disks()
    disk = NestedDisk(tmp_path)
    try:
        yield disk
    finally:
        disk.close()


def sync_mount(path: Path) -> None:
    """``syncfs(2)`` of the filesystem mounted at ``path``; raises OSError with the errno it reported."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        error = syncfs(fd)
    finally:
        os.close(fd)
    if error:
        raise OSError(error, os.strerror(error), str(path))


def syncfs(fd: int) -> int:
    """``syncfs(2)`` on ``fd``'s filesystem: 0, or the errno it reported."""
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.syncfs(fd) == 0 else ctypes.get_errno()


def assert_syncfs_503(reply, logs: str) -> None:
    """A send refused because a ``syncfs`` round failed: 503, Retry-After, a JSON body naming it."""
    assert reply.status == 503, f"{reply.status} {reply.body[:300]!r}\n{logs}"
    assert (reply.header("Retry-After") or "").isdigit(), f"503 without a Retry-After: {reply.headers}"
    body = reply.json
    assert body["error"] == "storage_unavailable", body
    assert "syncfs" in body["message"], body
    assert body["details"]["errno"] in ("ENOSPC", "EIO"), body


def body_of(tag: str) -> bytes:
    """A distinct body spanning several pages (a lost page cannot pass for another body)."""
    return f"{tag}:{os.urandom(8).hex()}:".encode() * 400


async def send(stack, queue: str, body: bytes):
    return await stack.request("POST", f"/{queue}/messages", data=body)


async def send_batch(stack, queue: str, bodies: list[bytes]):
    entries = [{"id": str(i), "body_base64": base64.b64encode(body).decode()} for i, body in enumerate(bodies)]
    return await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"entries": entries}))


async def reboot_and_check(nested: NestedDisk, stack, stack_factory, queue: str, acked: dict[str, bytes], refused):
    """Cut the power of the inner filesystem, start mq and mq-reaper on what reached it, check what comes back.

    Every acknowledged message (``acked``: id -> body) comes back with its body; no body of ``refused``
    ever does; mq-reaper's sweep empties ``new/``. The refused sends' files may be back in ``new/``
    after the cut (their unlink is not made durable: docs/protocol.md section 12, failed ``syncfs``).
    """
    nested.inner.cut_power()
    assert stack.mq.kill() == -9
    nested.inner.reboot()
    stack = stack_factory(root=stack.root, mq_args=MQ_ARGS, mover=False, reaper_args=RECOVERY_REAPER)
    await wait_for(lambda: not stack.files("new"), message=lambda: f"not swept from new/: {stack.files('new')}")
    got = await receive_all(stack, queue)
    assert got == acked, (
        f"after the power cut: {len(got)} messages, {len(acked)} acknowledged; "
        f"lost {sorted(set(acked) - set(got))[:3]}, never acknowledged {sorted(set(got) - set(acked))[:3]}\n"
        f"e2fsck:\n{nested.inner.fsck}"
    )
    assert not set(refused) & set(got.values()), "a message refused with 503 came back"


async def test_failed_round_fails_every_send_of_it_and_later_sends_succeed(nested, stack_factory):
    """The outer filesystem is full: every send's data write-back fails in the kernel, every send gets 503."""
    root = nested.inner.mount_point / "root"
    stack = stack_factory(root=root, mq_args=MQ_ARGS, mover=False, reaper=False)
    assert "file sync syncfs (--file-sync syncfs, root on ext4)" in stack.mq.log
    queue = "fsfail"
    await stack.create_queue(queue)
    acked: dict[str, bytes] = {}
    for i in range(4):
        body = body_of(f"before{i}")
        acked[await stack.send(queue, body)] = body

    nested.fill()
    refused = [body_of(f"full{i}") for i in range(12)]
    batches = [[body_of(f"full-batch{b}.{i}") for i in range(5)] for b in range(2)]
    replies = await asyncio.gather(*(send(stack, queue, body) for body in refused))
    batch_replies = await asyncio.gather(*(send_batch(stack, queue, bodies) for bodies in batches))
    for reply in replies:
        assert_syncfs_503(reply, stack.logs())
    for reply in batch_replies:  # a batch's entries fail one by one (200), each as a single send's 503
        assert reply.status == 200 and not reply.json["successful"], f"{reply.status} {reply.body[:300]!r}"
        assert len(reply.json["failed"]) == 5, reply.json
        for entry in reply.json["failed"]:
            assert entry["error"] == "storage_unavailable" and entry["sender_fault"] is False, entry
            assert "syncfs" in entry["message"] and entry["details"]["errno"] in ("ENOSPC", "EIO"), entry
    refused += [body for bodies in batches for body in bodies]
    assert stack.files("new") == [], f"a failed round left files in new/: {stack.files('new')}"
    assert len(stack.files(f"queues/{queue}")) == len(acked), "a failed round renamed a file into the queue"

    nested.free()
    later = [body_of(f"after{i}") for i in range(12)]
    batch = [body_of(f"after-batch.{i}") for i in range(5)]
    replies = await asyncio.gather(*(send(stack, queue, body) for body in later), send_batch(stack, queue, batch))
    for reply, body in zip(replies, later, strict=False):
        assert reply.status == 201, f"a send after the disk recovered -> {reply.status} {reply.body[:300]!r}"
        acked[reply.header("X-Message-Id")] = body
    assert replies[-1].status == 200 and not replies[-1].json["failed"], replies[-1].body[:300]
    for entry in replies[-1].json["successful"]:
        acked[entry["message_id"]] = batch[int(entry["id"])]
    await reboot_and_check(nested, stack, stack_factory, queue, acked, refused)


async def test_send_started_before_a_failed_round_ended_fails_though_its_own_round_succeeds(nested, stack_factory):
    """The epoch rule, with the kernel's own once-only error report.

    A writeback error is left on the inner filesystem by another writer (the test: a file written
    while the outer filesystem is full, then ``syncfs`` on the test's own descriptor, which reports
    it to the test, not to mq's). With the outer filesystem free again but frozen, send K's round
    (call it N) blocks in ``syncfs``, its write-back held. Send J then takes its id and reads the
    count of failed rounds, and its create in ``new/`` waits: the directory's block is being
    written by round N. At the thaw, round N's write-back succeeds but its ``syncfs`` reports the
    recorded error: N fails (K: 503). J's file is written, and its round N+1 writes it back without
    error: its ``syncfs`` returns 0 (the error was reported once, to N). J must still get 503: it
    began before N ended, and mq reads the count before a send's first write because it cannot
    tell which of the pages a failed write-back lost were a send's (docs/protocol.md 6.2).

    The test must not list ``new/`` while the outer filesystem is frozen (J's create holds the
    directory's lock, waiting for its block): it follows mq's threads in /proc instead.
    """
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        fault_unavailable(f"system call numbers on {platform.machine()} are not known to this test")
    root = nested.inner.mount_point / "root"
    stack = stack_factory(root=root, mq_args=MQ_ARGS, mover=False, reaper=False)
    queue = "fsfail"
    await stack.create_queue(queue)
    acked: dict[str, bytes] = {}
    body = body_of("before")
    acked[await stack.send(queue, body)] = body

    # A writeback error on the inner filesystem that mq's syncfs descriptor has not seen yet.
    own = os.open(nested.inner.mount_point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        nested.fill()
        (nested.inner.mount_point / "other-writer").write_bytes(os.urandom(1 << 20))
        assert syncfs(own) in (errno.ENOSPC, errno.EIO), "the write-back to the full outer filesystem did not fail"
        (nested.inner.mount_point / "other-writer").unlink()
    finally:
        os.close(own)
    nested.free()

    def in_syscall(number: int, flags: int = 0) -> bool:
        """Whether a thread of mq is in system call ``number`` (with all of ``flags`` in its third argument)."""
        for tid in os.listdir(f"/proc/{stack.mq.pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{stack.mq.pid}/task/{tid}/syscall") as f:
                fields = f.read().split()
            if fields and fields[0] == str(number) and int(fields[3], 16) & flags == flags:
                return True
        return False

    def bytes_written() -> int:
        """Bytes written by mq's ``write`` calls so far (/proc/PID/io ``wchar``): J's body too, once written."""
        with open(f"/proc/{stack.mq.pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))

    syncfs_nr, openat_nr = numbers
    nested.freeze(True)
    try:
        k_body, j_body = body_of("k"), body_of("j")
        k = asyncio.ensure_future(send(stack, queue, k_body))
        await wait_for(lambda: in_syscall(syncfs_nr), message="no mq thread is in syncfs (round N)")
        written = bytes_written()
        j = asyncio.ensure_future(send(stack, queue, j_body))
        # J has taken its id and read the count: its create waits (new/'s block is being written by round N),
        # or (should the block not be in N's write-back) it has written its body and waits for round N+1.
        await wait_for(
            lambda: in_syscall(openat_nr, CREATE) or bytes_written() - written >= len(j_body),
            message="J's create in new/ is not under way",
        )
        assert not k.done() and not j.done(), "a send was answered while its syncfs round was held"
        assert in_syscall(syncfs_nr), "round N ended while the outer filesystem was frozen"
    finally:
        nested.freeze(False)
    k_reply, j_reply = await k, await j
    assert_syncfs_503(k_reply, stack.logs())
    assert_syncfs_503(j_reply, stack.logs())  # its own round succeeded: the epoch rule
    assert "reported to a round that ended after this send began" in j_reply.json["message"], j_reply.json
    assert "after this send began" not in k_reply.json["message"], k_reply.json  # its own round failed
    assert stack.files("new") == [], f"the failed sends left files in new/: {stack.files('new')}"

    body = body_of("after")
    acked[await stack.send(queue, body)] = body  # the error was reported: the next round succeeds
    await reboot_and_check(nested, stack, stack_factory, queue, acked, [k_body, j_body])
