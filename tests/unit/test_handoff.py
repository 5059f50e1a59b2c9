"""daemons._handoff.Handoff: the daemon's receive and delete threads (jobs in order, batches, one wake per batch)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from daemons._handoff import Handoff
from mqcore.errors import StorageUnavailable


@pytest.fixture
def gate():
    """An event the first job blocks on, so that the jobs handed over meanwhile form one batch."""
    return threading.Event()


async def test_jobs_run_in_order_and_the_ones_queued_together_share_one_batch(gate):
    batches: list[list[int]] = []
    ran: list[int] = []
    handoff = Handoff("test-handoff", after_batch=lambda: batches.append(list(ran)))
    try:
        first = handoff.run(gate.wait, 5)
        await asyncio.sleep(0.05)  # the thread is inside the first job
        rest = [handoff.run(ran.append, i) for i in range(10)]
        gate.set()
        assert await first is True
        assert await asyncio.gather(*rest) == [None] * 10
        assert ran == list(range(10))  # handed-over order
        assert batches[-1] == list(range(10))  # one batch, one after_batch for all ten
        assert len(batches) == 2
    finally:
        handoff.shutdown()


async def test_a_failed_batch_step_fails_the_jobs_that_succeeded_and_keeps_the_others_errors(gate):
    def fsync() -> None:
        raise StorageUnavailable("message could not be stored: fsync of remove/ failed: EIO", errno="EIO")

    def missing() -> None:
        raise LookupError("not there")

    handoff = Handoff("test-handoff", after_batch=fsync)
    try:
        first = handoff.run(gate.wait, 5)
        await asyncio.sleep(0.05)
        ok = handoff.run(lambda: "in_flight")
        gone = handoff.run(missing)
        gate.set()
        for future in (first, ok):
            with pytest.raises(StorageUnavailable, match="fsync of remove/"):
                await future
        with pytest.raises(LookupError, match="not there"):
            await gone
    finally:
        handoff.shutdown()


async def test_no_batch_step_when_every_job_failed():
    calls: list[int] = []
    handoff = Handoff("test-handoff", after_batch=lambda: calls.append(1))
    try:
        with pytest.raises(ZeroDivisionError):
            await handoff.run(lambda: 1 / 0)
        assert calls == []
    finally:
        handoff.shutdown()


async def test_it_is_an_executor_for_run_in_executor_and_finishes_queued_jobs_on_shutdown(gate):
    handoff = Handoff("test-handoff")
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(handoff, sum, [1, 2, 3]) == 6
    names: list[str] = []
    blocked = handoff.run(gate.wait, 5)
    queued = handoff.submit(lambda: names.append(threading.current_thread().name))
    gate.set()
    await blocked
    handoff.shutdown(wait=True)
    assert queued.result(timeout=5) is None
    assert names == ["test-handoff"]
    with pytest.raises(RuntimeError, match="after shutdown"):
        handoff.run(print)


async def test_a_step_runs_once_for_the_jobs_that_named_it_and_the_others_are_answered_before_it(gate):
    steps: list[int] = []
    step_started = threading.Event()
    release_step = threading.Event()

    def step() -> None:
        step_started.set()
        assert release_step.wait(5)
        steps.append(1)

    handoff = Handoff("test-handoff")
    try:
        blocked = handoff.run(gate.wait, 5)
        await asyncio.sleep(0.05)  # the thread is inside the first job: the next four form one batch
        deletes = [handoff.run_then(step, lambda i=i: i) for i in range(2)]
        receive = handoff.run(lambda: "leased")
        another = handoff.run_then(step, lambda: 2)
        gate.set()
        assert await blocked is True
        assert await asyncio.wait_for(receive, 4) == "leased"  # answered before the batch's step...
        # ...which then starts on the thread and is held (its start may come after the receive's delivery)
        assert await asyncio.to_thread(step_started.wait, 4)
        assert not any(future.done() for future in [*deletes, another])
        release_step.set()
        assert await asyncio.gather(*deletes, another) == [0, 1, 2]
        assert steps == [1]  # one call for the three jobs that named it
    finally:
        handoff.shutdown()


def test_no_thread_until_the_first_job():
    handoff = Handoff("test-handoff-idle")
    assert "test-handoff-idle" not in {thread.name for thread in threading.enumerate()}
    handoff.shutdown()


async def test_a_sleeping_thread_wakes_for_each_later_job_and_ends_on_shutdown():
    """The thread sleeps between batches (its bell) and is woken by the next job, many times over,
    from the loop and from another thread; a shutdown while it sleeps ends it."""
    handoff = Handoff("test-bell")
    seen: list[int] = []
    for i in range(50):
        assert await handoff.run(seen.append, i) is None
        await asyncio.sleep(0.001)  # long enough for the thread to go back to sleep, most of the time
    assert await asyncio.wrap_future(handoff.submit(seen.append, 50)) is None
    assert seen == list(range(51))
    thread = handoff._thread
    assert thread is not None and thread.is_alive()
    await asyncio.sleep(0.05)  # asleep on its bell
    handoff.shutdown(wait=True)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError):
        handoff.run(seen.append, 51)
