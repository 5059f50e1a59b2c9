"""daemons._savers.Savers: the daemon's one pool of saver threads (sends with group commit, every other file call)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from daemons._savers import SYNCFS_RUNNABLE, Savers, syncfs_allowed
from mqcore.errors import QueueNotFound
from mqcore.fsinfo import MountInfo, mount_of
from mqcore.protocol import SendEntry, Store


def saver_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("mq-saver-")}


def file_sync_of(savers: Savers, mode: str) -> None:
    """``--file-sync mode`` for ``savers``; ``syncfs`` must take effect (tmp_path is on a local filesystem)."""
    assert savers.use_file_sync(mode, mount_of(savers.store.layout.root)) == (mode == "syncfs")


@pytest.mark.parametrize("mode", ["fsync", "syncfs"])
async def test_sends_and_calls_share_the_threads_which_start_only_as_work_needs_them(tmp_path, mode):
    store = Store(str(tmp_path / "root"))
    store.create_queue("q")
    before = saver_threads()
    savers = Savers(store, workers=3)
    file_sync_of(savers, mode)
    try:
        assert saver_threads() == before  # no thread before the first job
        assert await savers.run(sum, [1, 2, 3]) == 6
        entries = [SendEntry(body=f"m{i}".encode()) for i in range(20)]
        results = await savers.send("q", entries)
        ids = [result for result in results if isinstance(result, str)]
        assert len(ids) == 20 and ids == sorted(ids)  # a batch keeps its entry order
        names = sorted(os.listdir(tmp_path / "root" / "queues" / "q"))
        assert [name.partition(".")[0] for name in names if not name.startswith(".")] == ids
        assert len(saver_threads() - before) <= 3  # never more than workers
        missing = await savers.send("nope", [SendEntry(body=b"x")])
        assert isinstance(missing[0], QueueNotFound)
        with pytest.raises(ZeroDivisionError):
            await savers.run(lambda: 1 / 0)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(savers, max, 4, 9) == 9  # an Executor for run_in_executor callers
    finally:
        savers.shutdown(wait=True)
    assert saver_threads() == before
    with pytest.raises(RuntimeError, match="after shutdown"):
        savers.submit(print)


@pytest.mark.parametrize("mode", ["fsync", "syncfs"])
async def test_batches_sent_while_every_saver_is_busy_are_stored_whole_and_in_order(tmp_path, mode):
    """Concurrent batches on two savers (most written by one saver each): every entry stored, each batch in order."""
    store = Store(str(tmp_path / "root"))
    store.create_queue("q")
    savers = Savers(store, workers=2)
    file_sync_of(savers, mode)
    try:
        batches = [[SendEntry(body=f"b{b}m{i}".encode()) for i in range(10)] for b in range(6)]
        sends = [savers.send("q", entries) for entries in batches]
        refused = [savers.send("nope", [SendEntry(body=b"x")] * 3) for _ in range(3)]  # while busy too
        results = await asyncio.gather(*sends)
        missing = await asyncio.gather(*refused)
    finally:
        savers.shutdown(wait=True)
    for ids in results:
        assert all(isinstance(result, str) for result in ids) and ids == sorted(ids)
    names = os.listdir(tmp_path / "root" / "queues" / "q")
    on_disk = {name.partition(".")[0] for name in names if not name.startswith(".")}
    assert on_disk == {result for ids in results for result in ids} and len(on_disk) == 60
    bodies = {peeked.message_id: peeked.body for peeked in store.peek_ids("q", on_disk)}
    for entries, ids in zip(batches, results, strict=True):  # each id's file holds its own entry's body
        assert [bodies[message_id] for message_id in ids] == [entry.body for entry in entries]
    assert all(isinstance(result, QueueNotFound) for refused in missing for result in refused)


async def test_with_syncfs_rounds_only_a_few_savers_take_work_and_every_send_is_stored(tmp_path):
    """300 sends handed over at once with ``syncfs`` rounds: woken savers stay few (SYNCFS_RUNNABLE taking work,
    beside the leaders of the ``syncfs`` and the directory's rounds), and every send is stored."""
    store = Store(str(tmp_path / "root"))
    store.create_queue("q")
    before = saver_threads()
    savers = Savers(store, workers=8)
    file_sync_of(savers, "syncfs")
    try:
        sends = [savers.send("q", [SendEntry(body=f"m{i}".encode())]) for i in range(300)]
        results = await asyncio.gather(*sends)
        started = len(saver_threads() - before)
    finally:
        savers.shutdown(wait=True)
    ids = [result for one in results for result in one]
    assert all(isinstance(result, str) for result in ids) and len(set(ids)) == 300
    names = os.listdir(tmp_path / "root" / "queues" / "q")
    assert {name.partition(".")[0] for name in names if not name.startswith(".")} == set(ids)
    assert started <= SYNCFS_RUNNABLE + 3 < 8  # not one thread per queued send (+ the leaders, + one in between)


def test_syncfs_only_on_a_local_filesystem_and_never_when_told():
    ext4 = MountInfo("/dev/vda", "/", "ext4")
    assert syncfs_allowed("auto", ext4) and syncfs_allowed("syncfs", ext4)
    assert not syncfs_allowed("fsync", ext4)
    for remote in ("fuse.glusterfs", "nfs4", "cifs", "ceph", "somethingfs"):
        assert not syncfs_allowed("syncfs", MountInfo("host:/vol", "/mnt", remote))
    assert not syncfs_allowed("syncfs", None)  # unknown
