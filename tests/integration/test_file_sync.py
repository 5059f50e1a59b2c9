"""``mq --file-sync``: how a send's message files are made durable, as /metrics shows it (docs/api.md "File sync").

``fsync``: one fsync per message file. ``syncfs``: the savers' files are covered by ``syncfs`` rounds
(the ``syncfs`` kind of the fsync histogram), with no file fsync, and each round covers many files when
sends overlap. ``auto``: a lone send's file is fsynced. Every acknowledged message is received
with its body, whichever form stored it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import threading
from pathlib import Path

import pytest

from daemons._savers import FOREIGN_DIRTY_HOLD_SECONDS, FOREIGN_DIRTY_LIMIT, SYNCFS_BODY_LIMIT
from mqcore.fsinfo import read_dirty
from tests.integration.test_metrics import scrape, value

#: Concurrent single sends and batches of 10, and the messages they store.
SINGLES, BATCHES = 64, 8
MESSAGES = SINGLES + 10 * BATCHES


async def send_all(stack, queue: str) -> dict[str, bytes]:
    """SINGLES single sends and BATCHES batches of 10, all at once; every message id -> its body."""

    async def single(i: int) -> list[tuple[str, bytes]]:
        body = f"single {i}".encode()
        reply = await stack.request("POST", f"/{queue}/messages", data=body)
        assert reply.status == 201, reply.body
        return [(reply.header("X-Message-Id"), body)]

    async def batch(b: int) -> list[tuple[str, bytes]]:
        bodies = [f"batch {b} entry {i}" for i in range(10)]
        entries = [{"id": str(i), "body": body} for i, body in enumerate(bodies)]
        reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"messages": entries}))
        assert reply.status == 200 and not reply.json["failed"], reply.body
        return [(e["message_id"], bodies[int(e["id"])].encode()) for e in reply.json["successful"]]

    done = await asyncio.gather(*(single(i) for i in range(SINGLES)), *(batch(b) for b in range(BATCHES)))
    return dict(pair for pairs in done for pair in pairs)


@pytest.mark.parametrize("mode", ["fsync", "syncfs", "auto"])
async def test_file_sync_modes_store_every_message_and_show_their_fsyncs(stack_factory, http, queue, mode):
    # --inline-io never: every send goes through the savers, so the counts below are only theirs.
    stack = stack_factory(mq_args=["--file-sync", mode, "--inline-io", "never", "--workers", "4"])
    assert f"(--file-sync {mode}, root on " in stack.mq.log
    await stack.create_queue(queue)
    start = value(await scrape(http, stack.url + "/metrics"), "mq_storage_fsync_duration_seconds_count", kind="file")
    sent = await send_all(stack, queue)
    assert len(sent) == MESSAGES
    samples = await scrape(http, stack.url + "/metrics")
    files = value(samples, "mq_storage_fsync_duration_seconds_count", kind="file") - start  # not the queue's file
    rounds = value(samples, "mq_storage_fsync_duration_seconds_count", kind="syncfs")
    if mode == "fsync":
        assert files >= MESSAGES and rounds == 0
    elif mode == "syncfs":
        assert files == 0 and 1 <= rounds < MESSAGES  # a round covers several files when sends overlap
    # auto: file fsyncs while at most --workers sends are in flight, rounds beyond (how many of each
    # depends on how the requests arrive); the lone send below is the certain case.

    # A lone send alone: file fsyncs with auto (nothing overlaps), a round with syncfs.
    before = files
    reply = await stack.request("POST", f"/{queue}/messages", data=b"alone")
    assert reply.status == 201
    sent[reply.header("X-Message-Id")] = b"alone"
    after = (
        value(await scrape(http, stack.url + "/metrics"), "mq_storage_fsync_duration_seconds_count", kind="file")
        - start
    )
    assert after == (before if mode == "syncfs" else before + 1)

    assert await receive_all(stack, queue) == sent


async def receive_all(stack, queue: str) -> dict[str, bytes]:
    """Receive every message of ``queue`` (each once: a long visibility timeout); message id -> body."""
    got: dict[str, bytes] = {}
    while True:
        reply = await stack.request("GET", f"/{queue}/messages?max_messages=10&visibility_timeout_seconds=600")
        assert reply.status == 200, reply.body
        if not reply.json["messages"]:
            return got
        for m in reply.json["messages"]:
            got[m["message_id"]] = base64.b64decode(m["body_base64"])


async def fsync_counts(http, stack) -> tuple[float, float]:
    """(file fsyncs, syncfs rounds) mq counted so far (``mq_storage_fsync_duration_seconds``)."""
    samples = await scrape(http, stack.url + "/metrics")
    name = "mq_storage_fsync_duration_seconds_count"
    return value(samples, name, kind="file"), value(samples, name, kind="syncfs")


class ForeignWriter:
    """Another program's writes: ``size`` bytes in a file, never fsynced, kept dirty until :meth:`write_back`.

    A thread rewrites the file a MiB at a time (every 2 ms) while it runs, so that the data is dirty
    again soon after some other process's ``sync`` or ``syncfs`` wrote it. The file is deleted on exit.
    """

    CHUNK = 1 << 20

    def __init__(self, path: Path, size: int = 256 << 20) -> None:
        self.path = path
        self.size = size
        self.fd = -1
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._rewrite, daemon=True)

    def __enter__(self) -> ForeignWriter:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        chunk = os.urandom(self.CHUNK)
        for offset in range(0, self.size, self.CHUNK):
            os.pwrite(self.fd, chunk, offset)
        self.thread.start()
        return self

    def _rewrite(self) -> None:
        chunk = os.urandom(self.CHUNK)
        offsets = itertools.cycle(range(0, self.size, self.CHUNK))
        while not self.stop.wait(0.002):
            os.pwrite(self.fd, chunk, next(offsets))

    def write_back(self) -> None:
        """Stop rewriting and make the file's data durable: nothing of it is dirty any more."""
        self.stop.set()
        self.thread.join()
        os.fsync(self.fd)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        os.close(self.fd)
        self.path.unlink()


async def little_dirty_data(timeout: float = 60.0) -> None:
    """Wait until the machine's dirty data has stayed under FOREIGN_DIRTY_LIMIT / 4 for FOREIGN_DIRTY_HOLD_SECONDS.

    ``auto`` goes back to ``syncfs`` rounds once the dirty data not its own has stayed under half the limit
    that long (daemons/_savers.py; a quarter here leaves a margin), read from the same ``/proc/meminfo``.
    The counts are the whole machine's: another program writing at the same time (a benchmark beside the
    tests) keeps them high, so this writes everything back (``sync``) and reads again until the quiet
    spell has lasted. Raises AssertionError naming the dirty bytes if the machine never gets there within
    ``timeout`` seconds: the test's premise, not mq, failed then.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    dirty = read_dirty()
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.to_thread(os.sync)
        quiet_until = asyncio.get_running_loop().time() + FOREIGN_DIRTY_HOLD_SECONDS + 0.1
        while (dirty := read_dirty()) is not None and dirty < FOREIGN_DIRTY_LIMIT // 4:
            if asyncio.get_running_loop().time() >= quiet_until:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"other programs kept {dirty} bytes of dirty data on this machine for {timeout:g} s")


async def test_auto_uses_file_fsyncs_while_the_machine_holds_other_writers_dirty_data(
    stack_factory, http, queue, tmp_path
):
    # A syncfs waits for every dirty page of the filesystem: with another program's 256 MiB of unwritten data
    # on the root's filesystem, auto sends under load fsync their files instead; once that data is written
    # back, syncfs rounds again. Every message is received either way.
    stack = stack_factory(mq_args=["--file-sync", "auto", "--inline-io", "never", "--workers", "4"])
    await stack.create_queue(queue)

    async def fsyncs() -> tuple[float, float]:
        return await fsync_counts(http, stack)

    with ForeignWriter(tmp_path / "foreign.bin") as writer:
        dirty = read_dirty()
        assert dirty is not None and dirty > FOREIGN_DIRTY_LIMIT, dirty  # the test's premise
        files, rounds = await fsyncs()
        sent = await send_all(stack, queue)
        files_after, rounds_after = await fsyncs()
        assert files_after - files >= MESSAGES and rounds_after == rounds == 0
        assert "MiB of dirty data not mq's; file fsyncs until under 16 MiB" in stack.mq.log

        writer.write_back()
        for _ in range(10):  # under load: how many sends overlap depends on how the requests arrive
            await little_dirty_data()  # the premise again: other programs' writes may have re-dirtied the machine
            sent.update(await send_all(stack, queue))
            if (await fsyncs())[1] > 0:
                break
        assert (await fsyncs())[1] > 0
        assert "syncfs rounds again" in stack.mq.log
    assert await receive_all(stack, queue) == sent


async def test_auto_fsyncs_the_files_of_large_bodies_even_under_load(stack_factory, http, queue):
    # auto: at the same concurrency at which small sends share syncfs rounds, sends of bodies of
    # SYNCFS_BODY_LIMIT bytes or more fsync each file (a round of them would carry MiBs: their own
    # fsyncs overlap better). Every message is received with its body.
    stack = stack_factory(mq_args=["--file-sync", "auto", "--inline-io", "never", "--workers", "2"])
    await stack.create_queue(queue)

    async def fsyncs() -> tuple[float, float]:
        return await fsync_counts(http, stack)

    async def wave(size: int, n: int = 16) -> dict[str, bytes]:
        bodies = [os.urandom(size) for _ in range(n)]
        replies = await asyncio.gather(*(stack.request("POST", f"/{queue}/messages", data=b) for b in bodies))
        assert [reply.status for reply in replies] == [201] * n
        return {reply.header("X-Message-Id"): body for reply, body in zip(replies, bodies, strict=True)}

    sent: dict[str, bytes] = {}
    # Small bodies first, until they share a round (how many sends overlap depends on the arrivals; a machine
    # holding much of other programs' dirty data keeps auto on file fsyncs for every size: FOREIGN_DIRTY_LIMIT).
    for _ in range(10):
        sent.update(await wave(1024))
        if (await fsyncs())[1] > 0:
            break
    files, rounds = await fsyncs()
    large: dict[str, bytes] = {}
    for _ in range(2):
        large.update(await wave(SYNCFS_BODY_LIMIT))
    files_after, rounds_after = await fsyncs()
    assert rounds_after == rounds and files_after - files >= len(large) == 32
    sent.update(large)
    assert await receive_all(stack, queue) == sent
