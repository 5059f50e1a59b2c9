"""daemons._inline.LoneOps and Savers.send_here: who may work on the loop thread, and that it is the same work."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemons._inline import LONE_STREAK, LoneOps
from daemons._savers import Savers
from mqcore.errors import QueueNotFound
from mqcore.names import QueueName
from mqcore.protocol import SendEntry, Store


def saver_threads_named() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("mq-saver-")}


async def lone_op(lone: LoneOps, work: asyncio.Event | None = None) -> bool:
    """One operation as the daemon runs it: enter, its file work (waits on ``work`` if pooled), leave."""
    here = await lone.enter()
    try:
        if not here and work is not None:
            await work.wait()
        return here
    finally:
        lone.leave()


async def test_one_client_goes_inline_after_a_short_quiet_spell_and_a_burst_never_does():
    lone = LoneOps(enabled=True)
    sequential = [await lone_op(lone) for _ in range(LONE_STREAK + 5)]
    assert sequential == [False] * LONE_STREAK + [True] * 5
    # A burst read in one loop iteration: the first one yields, sees the others, and nobody goes inline.
    done = asyncio.Event()
    burst = [asyncio.create_task(lone_op(lone, done)) for _ in range(8)]
    await asyncio.sleep(0.01)
    done.set()
    assert await asyncio.gather(*burst) == [False] * 8
    assert lone.active == 0
    # After company, the threads again until the quiet spell is long enough.
    assert [await lone_op(lone) for _ in range(LONE_STREAK + 1)] == [False] * LONE_STREAK + [True]


async def test_requests_counted_by_their_connection_decide_without_a_yield():
    lone = LoneOps(enabled=True)
    loop = asyncio.get_running_loop()
    for _ in range(LONE_STREAK):
        await lone_op(lone)

    def read(count: int, done: asyncio.Event | None = None) -> list[asyncio.Task[bool]]:
        """``count`` requests read in one loop iteration, as daemons._wire counts them."""
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(lone_op(lone, done)))
            lone.arrived(loop)
        return tasks

    # Alone in its iteration: inline, and decided in the task's first step (done before the next iteration).
    (one,) = read(1)
    await asyncio.sleep(0)
    assert one.done() and one.result() and lone.burst == 0
    # Read together: the first one sees the others, nobody goes inline, the count is cleared after their first steps.
    done = asyncio.Event()
    burst = read(5, done)
    await asyncio.sleep(0)
    assert lone.burst == 0 and lone.active == 5
    done.set()
    assert await asyncio.gather(*burst) == [False] * 5
    assert [await lone_op(lone) for _ in range(LONE_STREAK + 1)] == [False] * LONE_STREAK + [True]


async def test_an_operation_held_on_the_threads_keeps_the_others_there_and_disabled_never_goes_inline():
    lone = LoneOps(enabled=True)
    for _ in range(LONE_STREAK):
        await lone_op(lone)
    lone.hold()  # a batch in a saver: a single send must not go ahead of it
    assert not await lone_op(lone)
    lone.leave()
    assert [await lone_op(lone) for _ in range(LONE_STREAK + 1)][-1]
    off = LoneOps(enabled=False)
    assert not any([await lone_op(off) for _ in range(10)])
    assert (off.active, off.inline, off.entered) == (0, 0, 10)


async def test_a_cancelled_operation_is_uncounted():
    lone = LoneOps(enabled=True)
    for _ in range(LONE_STREAK):
        await lone_op(lone)
    task = asyncio.create_task(lone.enter())  # alone: it yields once before it decides
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and lone.active == 0


@pytest.fixture
def savers(tmp_path: Path) -> Iterator[Savers]:
    """A pool of two savers over a store with queue ``q``, shut down after the test."""
    store = Store(str(tmp_path / "root"))
    store.create_queue(QueueName("q"))
    pool = Savers(store, workers=2)
    yield pool
    pool.shutdown(wait=True)
    store.close()


async def test_send_here_writes_on_the_calling_thread_with_the_savers_steps(savers, tmp_path):
    before = saver_threads_named()
    ids = []
    for i in range(5):
        future = savers.send_here("q", [SendEntry(body=b"m%d" % i)])
        assert future.done()  # nobody else leads the directory's fsync: this thread did
        (message_id,) = future.result()
        ids.append(message_id)
    assert saver_threads_named() == before  # no saver started
    names = sorted(n for n in os.listdir(tmp_path / "root" / "queues" / "q") if not n.startswith("."))
    assert [n.partition(".")[0] for n in names] == ids == sorted(ids)
    assert os.listdir(tmp_path / "root" / "new") == []
    (missing,) = await savers.send_here("nope", [SendEntry(body=b"x")])
    assert isinstance(missing, QueueNotFound)  # as from a saver: nothing written
    pooled = await savers.send("q", [SendEntry(body=b"after")])  # the pool still works beside it
    assert pooled[0] > ids[-1]


class RecordedNames:
    """A ``ReadyNames`` that records what the savers tell it."""

    def __init__(self) -> None:
        self.expected: list[tuple[str, list[str]]] = []
        self.dropped: list[str] = []

    def expect_ready(self, queue: QueueName, names: list[str]) -> None:
        self.expected.append((queue, list(names)))

    def drop_ready(self, names: list[str]) -> None:
        self.dropped.extend(names)


async def test_a_lone_send_tells_its_ready_name_and_a_delayed_one_goes_to_delay(savers, tmp_path):
    names = RecordedNames()
    savers.ready_names = names
    (ready_id,) = await savers.send_here("q", [SendEntry(body=b"now", content_type="text/plain")])
    assert names.expected == [("q", [f"{ready_id}.0"])]
    with open(tmp_path / "root" / "queues" / "q" / f"{ready_id}.0", "rb") as fh:
        assert fh.read().endswith(b"now")
    (delayed_id,) = await savers.send_here("q", [SendEntry(body=b"later", delay_ms=60_000)])
    assert names.expected == [("q", [f"{ready_id}.0"])]  # a delayed message is not made ready
    (delayed,) = os.listdir(tmp_path / "root" / "delay")
    assert f".q.{delayed_id}." in delayed
    assert os.listdir(tmp_path / "root" / "new") == []
    assert names.dropped == []


async def test_a_lone_send_to_a_queue_removed_meanwhile_is_not_found_and_leaves_no_file(savers, tmp_path):
    names = RecordedNames()
    savers.ready_names = names
    shutil.rmtree(tmp_path / "root" / "queues" / "q")  # gone after the daemon saw it: the rename finds out
    (missing,) = await savers.send_here("q", [SendEntry(body=b"x")])
    assert isinstance(missing, QueueNotFound)
    assert os.listdir(tmp_path / "root" / "new") == []  # the written file was unlinked
    assert [name for _, told in names.expected for name in told] == names.dropped  # told, then taken back
