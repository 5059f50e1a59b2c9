"""mq-mover and mq-reaper, in process: ``serve()`` on a real root under ``tmp_path``.

Each test runs the real daemon coroutine on the test's event loop with an
``asyncio.Event`` as shutdown trigger (or drives a :class:`mover.Mover` /
:class:`reaper.Reaper` directly, passing the time where the code takes
``now``), prepares or changes files through the real
:class:`mqcore.protocol.Store`, and watches the directories. Nothing is
mocked. Messages "sent long ago" come from a Store whose id generator stamps
an old send time (:class:`OldIds`). The command-line tests run
``python -m daemons.mover`` as a subprocess (settings layers, SIGTERM, exit codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemons import mover, reaper
from daemons.mover import MoverSettings
from daemons.reaper import ReaperSettings
from mqcore.errors import ConfigError
from mqcore.model import ReceivedMessage
from mqcore.names import IdGenerator, MessageId, QueueName, parse_in_flight_name
from mqcore.protocol import Store, now_ms

REPO = Path(__file__).resolve().parents[2]
Q = QueueName("jobs")
#: Seconds a daemon may take to get ready or to do something it was asked to (generous: not a speed test).
TIMEOUT = 10.0

# -- helpers ------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty root; MQ_NO_INOTIFY from the outer environment is dropped."""
    monkeypatch.delenv("MQ_NO_INOTIFY", raising=False)
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Iterator[Store]:
    """The protocol on ``root``, with queue ``jobs`` created."""
    s = Store(root)
    s.create_queue(Q)
    yield s
    s.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Captured log records of the daemons (DEBUG and up)."""
    caplog.set_level(logging.DEBUG, logger="mq")
    return caplog


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every captured log message, formatted."""
    return [r.getMessage() for r in caplog.records]


async def wait_for(predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
    return value


@contextlib.asynccontextmanager
async def running(
    serve: Callable[..., Awaitable[None]], settings: Any, caplog: pytest.LogCaptureFixture, ready: str
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``serve(settings, shutdown_trigger=stop)`` until the block ends; wait for its readiness line.

    On exit the trigger is set and the daemon must return within ``TIMEOUT`` seconds.
    """
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, shutdown_trigger=stop))

    def is_ready() -> bool:
        if task.done():
            task.result()  # raise what killed it
            raise AssertionError("serve() returned before it was ready")
        return any(m.startswith(ready) for m in messages(caplog))

    try:
        await wait_for(is_ready, ready)
        yield task
        assert not task.done(), "serve() ended before it was asked to"
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


def lease_with_deadline(store: Store, deadline_ms: int, body: bytes = b"x") -> ReceivedMessage:
    """Send a message to ``jobs`` and receive it so that its in-flight deadline is ``deadline_ms``."""
    message_id = store.send(Q, body)
    received = store.at(deadline_ms).lease(Q, f"{message_id}.0", visibility_timeout_ms=0)
    assert received is not None and received.deadline_ms == deadline_ms
    return received


def ready_path(root: Path, msg: ReceivedMessage) -> Path:
    """Where ``msg`` appears once redelivered: ``queues/jobs/ID.RC``."""
    return root / "queues" / msg.queue / f"{msg.message_id}.{msg.receive_count}"


def in_flight_path(root: Path, msg: ReceivedMessage) -> Path:
    """Where ``msg`` sits while in flight: ``delay/DL.jobs.ID.RC``."""
    return root / "delay" / msg.in_flight_name


def mover_settings(root: Path, rescan_interval_seconds: float = 60.0) -> MoverSettings:
    return MoverSettings(root=str(root), rescan_interval_seconds=rescan_interval_seconds)


def reaper_settings(root: Path, *, new_grace_seconds: float = 300.0, rescan_interval_seconds: float = 60.0):
    return ReaperSettings(
        root=str(root), new_grace_seconds=new_grace_seconds, rescan_interval_seconds=rescan_interval_seconds
    )


def run_mover(root: Path, settings: MoverSettings, caplog: pytest.LogCaptureFixture):
    return running(mover.serve, settings, caplog, f"mq-mover ready root={root}")


def run_reaper(root: Path, settings: ReaperSettings, caplog: pytest.LogCaptureFixture):
    return running(reaper.serve, settings, caplog, f"mq-reaper ready root={root}")


# -- mq-mover -----------------------------------------------------------------


async def test_mover_redelivers_what_was_due_before_it_started(root: Path, store: Store, logs) -> None:
    overdue = lease_with_deadline(store, now_ms() - 5_000)
    later = lease_with_deadline(store, now_ms() + 60_000)
    assert in_flight_path(root, overdue).exists()

    async with run_mover(root, mover_settings(root), logs):
        await wait_for(ready_path(root, overdue).exists, "the overdue message back in its queue")
        assert not in_flight_path(root, overdue).exists()
        await asyncio.sleep(0.2)
        assert in_flight_path(root, later).exists(), "a message was redelivered before its deadline"
        assert not ready_path(root, later).exists()

    assert any(f"redelivered queue=jobs id={overdue.message_id} receive_count=1" in m for m in messages(logs))
    assert any("start-up scan in_flight=2 due=1 inotify=yes" in m for m in messages(logs))


async def test_mover_redelivers_new_lease_within_a_second_of_its_deadline(root: Path, store: Store, logs) -> None:
    # A far-off lease first: the mover then sleeps until the rescan (60 s), so the short
    # lease below must wake it early (via inotify), not be found by a timer.
    lease_with_deadline(store, now_ms() + 50_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=60), logs):
        msg = lease_with_deadline(store, now_ms() + 700)
        target = ready_path(root, msg)
        await wait_for(target.exists, "the redelivery", interval=0.002)
        arrived_ms = now_ms()

    assert arrived_ms >= msg.deadline_ms, f"redelivered {msg.deadline_ms - arrived_ms} ms before the deadline"
    assert arrived_ms <= msg.deadline_ms + 1_000, f"redelivered {arrived_ms - msg.deadline_ms} ms late"
    line = next(m for m in messages(logs) if f"redelivered queue=jobs id={msg.message_id}" in m)
    late_ms = int(re.search(r"late_ms=(-?\d+)", line).group(1))
    assert 0 <= late_ms < 1_000


async def test_mover_sends_orphans_to_remove(root: Path, store: Store, logs) -> None:
    msg = lease_with_deadline(store, now_ms() - 1)
    # The queue is deleted while the message is in flight (a receive racing DELETE /jobs).
    os.rename(root / "queues" / "jobs", root / "remove" / "jobs.0123.queue")

    async with run_mover(root, mover_settings(root), logs):
        removed = root / "remove" / f"jobs.{msg.message_id}"
        await wait_for(removed.exists, "the orphan in remove/")
        assert not in_flight_path(root, msg).exists()
        assert not (root / "queues" / "jobs").exists(), "the mover must not recreate a deleted queue"

    assert any(f"orphaned queue=jobs id={msg.message_id}" in m for m in messages(logs))


async def test_mover_ignores_in_flight_message_deleted_before_its_deadline(root: Path, store: Store, logs) -> None:
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=0.1), logs) as task:
        msg = lease_with_deadline(store, now_ms() + 200)
        await asyncio.sleep(0.05)
        assert store.delete(Q, msg.message_id) == "in_flight"
        await asyncio.sleep(0.5)
        assert not ready_path(root, msg).exists(), "a deleted message came back"
        assert (root / "remove" / f"jobs.{msg.message_id}").exists()
        assert not task.done()


async def test_mover_heap_stays_bounded_when_leases_are_deleted(
    root: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Messages received with a long visibility timeout and deleted at once must not
    # pile up in the mover's memory until their deadlines (hours with SQS-like timeouts).
    monkeypatch.setattr(mover, "COMPACT_SLACK", 10)
    m = mover.Mover(store, rescan_interval_seconds=60, watcher=mover.open_watcher())
    try:
        await m.start()
        assert m.watching
        for _ in range(60):
            msg = lease_with_deadline(store, now_ms() + 3_600_000)
            await wait_for(lambda: len(m) == 1, "the lease to be seen")
            store.delete(Q, msg.message_id)
            await wait_for(lambda: len(m) == 0, "the delete to be seen")
        assert len(m._heap) <= 2 * len(m) + 10
    finally:
        m.close()


@pytest.mark.parametrize("in_flight", [False, True], ids=["empty", "far-deadline"])
async def test_mover_does_not_busy_poll(root: Path, store: Store, logs, in_flight: bool) -> None:
    if in_flight:
        lease_with_deadline(store, now_ms() + 120_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=10), logs):
        await asyncio.sleep(0.2)
        cpu0 = time.process_time()
        await asyncio.sleep(2.0)
        cpu_seconds = time.process_time() - cpu0
    assert cpu_seconds < 0.2, f"the idle mover used {cpu_seconds:.3f} s of CPU in 2 s"


async def test_mover_without_inotify_relies_on_rescans(
    root: Path, store: Store, logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQ_NO_INOTIFY", "1")
    before = lease_with_deadline(store, now_ms() - 1_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=0.2), logs):
        assert any("inotify=no" in m for m in messages(logs))
        await wait_for(ready_path(root, before).exists, "redelivery of the message there at start-up")
        overdue = lease_with_deadline(store, now_ms() - 1_000)
        soon = lease_with_deadline(store, now_ms() + 400)
        await wait_for(ready_path(root, overdue).exists, "redelivery found by a rescan")
        await wait_for(ready_path(root, soon).exists, "redelivery after the deadline", interval=0.002)
        assert now_ms() >= soon.deadline_ms


# -- mq-mover: delayed sends, dead-letter queues, purge, retention --------------

DLQ = QueueName("dead")


class OldIds(IdGenerator):
    """Ids stamped with a fixed send time: messages "sent" at ``sent_ms`` (epoch ms)."""

    def __init__(self, sent_ms: int) -> None:
        super().__init__()
        self.sent_ms = sent_ms

    def next_id(self, now_ms: int | None = None) -> MessageId:
        return super().next_id(now_ms=self.sent_ms)


def old_store(root: Path, age_ms: int) -> Store:
    """A Store on ``root`` whose sends carry a send time ``age_ms`` in the past."""
    return Store(root, ids=OldIds(now_ms() - age_ms))


def ready_files(root: Path, queue: str) -> list[str]:
    """Message names in ``queues/<queue>/`` (names starting with "." are metadata)."""
    return sorted(n for n in os.listdir(root / "queues" / queue) if not n.startswith("."))


def removed(root: Path) -> list[str]:
    return sorted(os.listdir(root / "remove"))


@contextlib.asynccontextmanager
async def bare_mover(store: Store) -> AsyncIterator[mover.Mover]:
    """A Mover without inotify (driven by ``rescan()`` and ``redeliver_due(now=...)``)."""
    m = mover.Mover(store, rescan_interval_seconds=60, watcher=None)
    try:
        yield m
    finally:
        m.close()


async def move_due(m: mover.Mover, now: int) -> int:
    """List ``delay/`` and handle everything due at ``now``, as one pass of the daemon does."""
    await m.rescan()
    return await m.redeliver_due(now=now)


async def test_mover_makes_a_delayed_send_ready_within_100_ms_of_its_deadline(root: Path, store: Store, logs) -> None:
    # A far-off lease first: the mover sleeps until it (or the 60 s rescan), so the
    # delayed send must wake it through inotify on delay/.
    lease_with_deadline(store, now_ms() + 50_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=60), logs):
        message_id = store.send(Q, b"later", content_type="text/plain", delay_ms=400)
        [name] = [n for n in os.listdir(root / "delay") if f".{message_id}." in n]
        item = parse_in_flight_name(name)
        assert item is not None and item.receive_count == 0
        assert f"{message_id}.0" not in ready_files(root, Q), "a delayed message was ready at once"
        target = root / "queues" / Q / f"{message_id}.0"
        await wait_for(target.exists, "the delayed message to become ready", interval=0.002)
    # When it became ready is when the mover's rename happened: the kernel stamps the file's ctime
    # then, whatever this process's own polling was delayed by under load. ctime comes from the
    # kernel's coarse clock, up to one tick (4 ms at HZ=250, 10 ms at HZ=100) behind real time.
    renamed_ms = target.stat().st_ctime_ns // 1_000_000
    tick_ms = 10
    assert renamed_ms >= item.deadline_ms - tick_ms, f"ready {item.deadline_ms - renamed_ms} ms before its deadline"
    assert renamed_ms - item.deadline_ms < 100, f"ready {renamed_ms - item.deadline_ms} ms after its deadline"
    [late] = [m for m in messages(logs) if f"delayed message ready queue=jobs id={message_id} " in m]
    assert 0 <= int(late.rsplit("late_ms=", 1)[1]) < 100, late  # the mover's own clock: never early
    got = store.lease(Q, f"{message_id}.0", 1_000)
    assert got is not None and (got.body, got.content_type, got.receive_count) == (b"later", "text/plain", 1)
    assert any(f"delayed message ready queue=jobs id={message_id} receive_count=0" in m for m in messages(logs))


async def test_mover_dead_letters_with_body_content_type_and_attributes_intact(root: Path, store: Store, logs) -> None:
    store.create_queue(DLQ)
    store.set_attributes(Q, {"max_receive_count": 2, "dead_letter_queue": DLQ})
    attributes = {"trace-id": "abc-123", "origin": "unit test"}
    message_id = store.send(Q, b"\x00poison\xff", content_type="application/x-poison", attributes=attributes)
    t = now_ms()
    async with bare_mover(store) as m:
        first = store.at(t).lease(Q, f"{message_id}.0", 1_000)
        assert first is not None and first.receive_count == 1
        assert await move_due(m, t + 1_000) == 1
        assert ready_files(root, Q) == [f"{message_id}.1"], "received once (< max 2): redelivered to its queue"

        second = store.at(t + 2_000).lease(Q, f"{message_id}.1", 1_000)
        assert second is not None and second.receive_count == 2
        assert await move_due(m, t + 2_999) == 0, "moved before its deadline"
        assert await move_due(m, t + 3_000) == 1

    assert ready_files(root, Q) == []
    assert os.listdir(root / "delay") == []
    assert ready_files(root, DLQ) == [f"{message_id}.2"], "dead-lettered with the same id and receive count"
    dead = store.lease(DLQ, f"{message_id}.2", 1_000)
    assert dead is not None
    assert dead.body == b"\x00poison\xff"
    assert dead.content_type == "application/x-poison"
    assert dead.attributes == attributes
    assert dead.receive_count == 3
    assert dead.message_id == message_id and dead.sent_ms == first.sent_ms
    assert dead.source_queue == Q
    assert any(
        f"dead-lettered queue=jobs id={message_id} receive_count=2 dead_letter_queue=dead" in m for m in messages(logs)
    )


async def test_mover_redelivers_when_the_dead_letter_queue_is_missing_and_warns_once(
    root: Path, store: Store, logs
) -> None:
    store.create_queue(DLQ)
    store.set_attributes(Q, {"max_receive_count": 1, "dead_letter_queue": DLQ})
    store.delete_queue(DLQ)  # the redrive policy now names a queue that is gone
    t = now_ms()
    ids = [store.send(Q, f"m{i}".encode()) for i in range(3)]
    async with bare_mover(store) as m:
        for message_id in ids[:2]:
            assert store.at(t).lease(Q, f"{message_id}.0", 0) is not None
        assert await move_due(m, t) == 2
        assert ready_files(root, Q) == sorted([f"{ids[0]}.1", f"{ids[1]}.1", f"{ids[2]}.0"]), "nothing lost"
        assert store.at(t).lease(Q, f"{ids[2]}.0", 0) is not None
        assert await move_due(m, t + 1) == 1  # a later batch: the warning is not repeated

        store.create_queue(DLQ)  # the dead-letter queue is back: the next batch uses it
        assert store.at(t + 2).lease(Q, f"{ids[0]}.1", 0) is not None
        assert await move_due(m, t + 2) == 1
    assert ready_files(root, DLQ) == [f"{ids[0]}.2"]
    warnings = [m for m in messages(logs) if "dead-letter queue missing queue=jobs dead_letter_queue=dead" in m]
    assert len(warnings) == 1, warnings


async def test_mover_sends_purged_messages_to_remove(root: Path, store: Store, logs) -> None:
    t = now_ms()
    leased = store.send(Q, b"received before the purge")
    delayed = store.send(Q, b"delayed, sent before the purge", delay_ms=1_000)
    assert store.at(t).lease(Q, f"{leased}.0", 500) is not None
    # A purger that died after writing its marker, before moving these files (or a
    # purger on another host whose listing of delay/ missed them).
    Path(store.layout.purge_path(Q)).write_text(json.dumps({"purged_before_id": delayed, "purged_ms": t}))
    later = store.send(Q, b"sent after the purge")
    assert store.at(t).lease(Q, f"{later}.0", 500) is not None

    async with bare_mover(store) as m:
        assert await move_due(m, t + 2_000) == 3
    assert removed(root) == sorted([f"jobs.{leased}", f"jobs.{delayed}"])
    assert ready_files(root, Q) == [f"{later}.1"]
    assert os.listdir(root / "delay") == []
    log = messages(logs)
    assert any(f"purged queue=jobs id={leased} receive_count=1" in m for m in log)
    assert any(f"purged queue=jobs id={delayed} receive_count=0" in m for m in log)


async def test_mover_sends_messages_past_retention_to_remove(root: Path, store: Store, logs) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    old = old_store(root, 61_000)
    stale = old.send(Q, b"sent 61 s ago")
    stale_delayed = old.send(Q, b"sent 61 s ago with a delay", delay_ms=1)
    fresh = store.send(Q, b"sent now")
    t = now_ms()
    for message_id in (stale, fresh):
        assert store.at(t).lease(Q, f"{message_id}.0", 0) is not None

    async with bare_mover(store) as m:
        assert await move_due(m, t + 1) == 3
        assert removed(root) == sorted([f"jobs.{stale}", f"jobs.{stale_delayed}"])
        assert ready_files(root, Q) == [f"{fresh}.1"]
        log = messages(logs)
        assert any(f"expired queue=jobs id={stale} receive_count=1" in m for m in log)
        assert any(f"expired queue=jobs id={stale_delayed} receive_count=0" in m for m in log)

        # The same message, judged 60 s after its send: expired.
        lease = store.at(t).lease(Q, f"{fresh}.1", 0)
        assert lease is not None
        assert await move_due(m, lease.sent_ms + 60_000) == 1
    assert f"jobs.{fresh}" in removed(root)
    assert ready_files(root, Q) == []


# -- mq-reaper ----------------------------------------------------------------


def fill_remove(store: Store) -> tuple[list[str], str]:
    """Delete two of three messages of ``jobs`` and a whole queue ``gone`` with messages.

    Returns:
        The ids still ready in ``jobs``, and the name of the deleted queue's directory in ``remove/``.
    """
    ids = [store.send(Q, f"m{i}".encode()) for i in range(3)]
    store.delete(Q, ids[0])
    store.delete(Q, ids[1])
    gone = QueueName("gone")
    store.create_queue(gone)
    for i in range(5):
        store.send(gone, f"g{i}".encode())
    store.delete_queue(gone)
    dirs = [n for n in os.listdir(store.layout.remove) if n.endswith(".queue")]
    assert len(dirs) == 1
    assert len([n for n in os.listdir(os.path.join(store.layout.remove, dirs[0])) if not n.startswith(".")]) == 5
    return ids[2:], dirs[0]


async def test_reaper_removes_what_was_there_at_start(root: Path, store: Store, logs) -> None:
    kept, queue_dir = fill_remove(store)
    assert len(os.listdir(root / "remove")) == 3

    async with run_reaper(root, reaper_settings(root), logs):
        await wait_for(lambda: not os.listdir(root / "remove"), "remove/ to be empty")

    assert ready_files(root, Q) == [f"{kept[0]}.0"]
    assert any(f"removed deleted queue directory name={queue_dir}" in m for m in messages(logs))


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "rescan-only"])
async def test_reaper_removes_arrivals(
    root: Path, store: Store, logs, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:
        monkeypatch.setenv("MQ_NO_INOTIFY", "1")
    # With inotify the rescan is far off, so removal must come from the watch.
    settings = reaper_settings(root, rescan_interval_seconds=60 if inotify else 0.2)
    async with run_reaper(root, settings, logs):
        assert any(f"inotify={'yes' if inotify else 'no'}" in m for m in messages(logs))
        kept, _ = fill_remove(store)
        await wait_for(lambda: not os.listdir(root / "remove"), "remove/ to be empty")
        assert ready_files(root, Q) == [f"{kept[0]}.0"]


async def test_reaper_sweeps_stale_new_files_only(root: Path, store: Store, logs) -> None:
    stale = store.write_new(Q, b"writer died before 201")
    old = time.time() - 600
    os.utime(stale.path, (old, old))
    fresh = store.write_new(Q, b"still being written")

    async with run_reaper(root, reaper_settings(root, new_grace_seconds=300, rescan_interval_seconds=0.2), logs):
        # The start-up sweep happens before the readiness line.
        assert not os.path.exists(stale.path)
        assert os.path.exists(fresh.path)
        later = store.write_new(Q, b"another writer died")
        os.utime(later.path, (old, old))
        await wait_for(lambda: not os.path.exists(later.path), "the periodic sweep")
        await asyncio.sleep(0.5)  # a few more sweeps
        assert os.path.exists(fresh.path), "a file younger than the grace period was swept"

    assert any(
        f"dropped unacknowledged file from new/ name={os.path.basename(stale.path)}" in m for m in messages(logs)
    )
    assert not any(os.path.basename(fresh.path) in m for m in messages(logs))


# -- mq-reaper: expiry sweeps ---------------------------------------------------


@contextlib.asynccontextmanager
async def bare_reaper(store: Store, *, new_grace_seconds: float = 300.0) -> AsyncIterator[reaper.Reaper]:
    """A Reaper without inotify, driven by ``expire(now=...)``."""
    r = reaper.Reaper(store, new_grace_seconds=new_grace_seconds, rescan_interval_seconds=60, watcher=None)
    try:
        yield r
    finally:
        r.close()


async def test_reaper_expires_ready_in_flight_and_delayed_messages_past_retention(
    root: Path, store: Store, logs
) -> None:
    keep = QueueName("keep")  # default retention (4 days): its old messages stay
    store.create_queue(keep)
    store.set_attributes(Q, {"retention_seconds": 60})
    old = old_store(root, 120_000)
    stale_ready = old.send(Q, b"old, ready")
    stale_leased = old.send(Q, b"old, in flight")
    stale_delayed = old.send(Q, b"old, delayed", delay_ms=600_000)
    kept_old = old.send(keep, b"old, in a queue with a long retention")
    fresh_ready = store.send(Q, b"new, ready")
    fresh_leased = store.send(Q, b"new, in flight")
    for message_id in (stale_leased, fresh_leased):
        assert store.lease(Q, f"{message_id}.0", 600_000) is not None

    async with bare_reaper(store) as r:
        sweep = await r.expire()
        assert (sweep.queues, sweep.ready, sweep.in_flight, sweep.errors) == (2, 1, 2, 0)
        assert removed(root) == sorted(f"jobs.{i}" for i in (stale_ready, stale_leased, stale_delayed))
        assert ready_files(root, Q) == [f"{fresh_ready}.0"]
        assert ready_files(root, keep) == [f"{kept_old}.0"]
        assert [parse_in_flight_name(n).message_id for n in os.listdir(root / "delay")] == [fresh_leased]

        # Judged 61 s from now, the fresh messages have outlived the 60 s retention too.
        sweep = await r.expire(now=now_ms() + 61_000)
        assert (sweep.ready, sweep.in_flight) == (1, 1)
    assert ready_files(root, Q) == [] and os.listdir(root / "delay") == []
    assert ready_files(root, keep) == [f"{kept_old}.0"]
    assert any("expired ready messages queue=jobs removed=1" in m for m in messages(logs))
    assert any("expiry sweep queues=2 ready_removed=1 in_flight_removed=2" in m for m in messages(logs))


async def test_reaper_removes_purged_messages(root: Path, store: Store) -> None:
    ready_before = store.send(Q, b"ready before the purge")
    leased_before = store.send(Q, b"in flight before the purge")
    assert store.lease(Q, f"{leased_before}.0", 600_000) is not None
    Path(store.layout.purge_path(Q)).write_text(json.dumps({"purged_before_id": leased_before, "purged_ms": now_ms()}))
    after = store.send(Q, b"sent after the purge")

    async with bare_reaper(store) as r:
        sweep = await r.expire()
    assert (sweep.ready, sweep.in_flight) == (1, 1)
    assert removed(root) == sorted([f"jobs.{ready_before}", f"jobs.{leased_before}"])
    assert ready_files(root, Q) == [f"{after}.0"]


async def test_reaper_sweeps_attempt_records_older_than_5_minutes(root: Path, store: Store) -> None:
    t = now_ms()
    store.at(t - 301_000).save_attempt(Q, "old-attempt", ["1.jobs.x.1"])
    for name in os.listdir(root / "attempts"):  # also old by mtime, whichever the store goes by
        os.utime(root / "attempts" / name, ((t - 301_000) / 1000, (t - 301_000) / 1000))
    store.at(t).save_attempt(Q, "new-attempt", ["2.jobs.y.1"])
    assert len(os.listdir(root / "attempts")) == 2

    async with bare_reaper(store) as r:
        sweep = await r.expire(now=t)
    assert sweep.attempts == 1
    assert len(os.listdir(root / "attempts")) == 1
    assert store.at(t).load_attempt(Q, "new-attempt") == ["2.jobs.y.1"]
    assert store.at(t).load_attempt(Q, "old-attempt") is None


async def test_reaper_sweeps_abandoned_queue_creations_after_the_grace(root: Path, store: Store) -> None:
    queues = root / "queues"
    abandoned = queues / f".half.{'a' * 32}.creating"
    in_progress = queues / f".busy.{'b' * 32}.creating"
    for path in (abandoned, in_progress):
        path.mkdir()
        (path / ".attributes").write_text('{"attributes": {}}')
    old = time.time() - 600
    os.utime(abandoned / ".attributes", (old, old))
    os.utime(abandoned, (old, old))

    async with bare_reaper(store, new_grace_seconds=300) as r:
        sweep = await r.expire()
    assert sweep.staging == 1
    assert not abandoned.exists()
    assert in_progress.exists(), "a creation younger than the grace period was swept"
    assert store.list_queues() == [Q]
    assert (queues / Q).is_dir()


async def test_reaper_sweeps_at_start_up_and_every_expire_interval(root: Path, store: Store, logs) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    old = old_store(root, 120_000)
    before = old.send(Q, b"expired before the reaper started")
    fresh = store.send(Q, b"fresh")
    settings = dataclasses.replace(reaper_settings(root), expire_interval_seconds=0.2)
    async with run_reaper(root, settings, logs):
        await wait_for(lambda: f"{before}.0" not in ready_files(root, Q), "the start-up expiry sweep")
        later = old.send(Q, b"expired while the reaper runs")
        await wait_for(lambda: f"{later}.0" not in ready_files(root, Q), "a periodic expiry sweep")
        # Expired files are moved to remove/, then reaped like any delete.
        await wait_for(lambda: not removed(root), "remove/ to be empty")
        assert ready_files(root, Q) == [f"{fresh}.0"]
    log = messages(logs)
    assert any("expire_interval_seconds=0.2" in m for m in log)
    assert sum("expiry sweep queues=1 ready_removed=1 " in m for m in log) == 2, log


# -- settings and command line ------------------------------------------------


def test_settings_reject_bad_values(tmp_path: Path) -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError) as info:
            MoverSettings(root=str(tmp_path), rescan_interval_seconds=bad)
        assert info.value.details["key"] == "rescan-interval"
        with pytest.raises(ConfigError) as info:
            ReaperSettings(root=str(tmp_path), new_grace_seconds=bad)
        assert info.value.details["key"] == "new-grace"
        with pytest.raises(ConfigError) as info:
            ReaperSettings(root=str(tmp_path), expire_interval_seconds=bad)
        assert info.value.details["key"] == "expire-interval"
    with pytest.raises(ConfigError):
        MoverSettings(root="")
    with pytest.raises(ConfigError):
        ReaperSettings(root=str(tmp_path), log_level="LOUD")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any MQ_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env.update(extra)
    return env


async def run_until_ready_then_sigterm(
    module: str, args: list[str], env: dict[str, str], ready: str
) -> tuple[int, list[str]]:
    """Start ``python -m module args``, wait for ``ready`` on stderr, SIGTERM it.

    Returns:
        The exit status and every stderr line. If it exits before it is ready, the
        status is whatever it exited with.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while line := (await proc.stderr.readline()).decode():
                lines.append(line.rstrip("\n"))
                if ready in line:
                    proc.send_signal(signal.SIGTERM)
                    break
        _, rest = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    lines += rest.decode().splitlines()
    return proc.returncode, lines


@pytest.mark.parametrize(
    ("cli", "env", "toml", "expect"),
    [
        (["--rescan-interval", "0.5"], {"MQ_MOVER_RESCAN_INTERVAL": "0.7"}, 0.9, "rescan_interval=0.5(cli)"),
        ([], {"MQ_MOVER_RESCAN_INTERVAL": "0.7"}, 0.9, "rescan_interval=0.7(env)"),
        ([], {}, 0.9, "rescan_interval=0.9(config)"),
        ([], {}, None, "rescan_interval=10.0(default)"),
    ],
    ids=["cli", "env", "toml", "default"],
)
async def test_mover_settings_precedence(
    tmp_path: Path, cli: list[str], env: dict[str, str], toml: float | None, expect: str
) -> None:
    root = tmp_path / "root"
    config = tmp_path / "mq.toml"
    text = f'root = "{root}"\n[mq-mover]\n'
    if toml is not None:
        text += f"rescan-interval = {toml}\n"
    config.write_text(text)

    code, lines = await run_until_ready_then_sigterm(
        "daemons.mover", ["--config", str(config), *cli], clean_env(**env), "mq-mover ready"
    )

    log = "\n".join(lines)
    assert code == 0, log
    settings_line = next(line for line in lines if " settings " in line)
    assert expect in settings_line, log
    assert f"root={root}(config)" in settings_line, log
    value = expect.split("=")[1].split("(")[0]
    assert f"rescan_interval_seconds={value}" in log, log
    assert f"mq-mover ready root={root}" in log, log
    assert "received SIGTERM" in log, log


async def test_reaper_exits_0_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code, lines = await run_until_ready_then_sigterm(
        "daemons.reaper",
        ["--root", str(root), "--rescan-interval", "0.3"],
        clean_env(MQ_REAPER_NEW_GRACE="120", MQ_REAPER_EXPIRE_INTERVAL="30"),
        "mq-reaper ready",
    )
    log = "\n".join(lines)
    assert code == 0, log
    assert "new_grace=120.0(env)" in log and "rescan_interval=0.3(cli)" in log, log
    assert "expire_interval=30.0(env)" in log and "expire_interval_seconds=30.0" in log, log


def test_unknown_toml_key_exits_78(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    for name in [k for k in os.environ if k.startswith("MQ_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "mq.toml"
    config.write_text("[mq-mover]\nrescan-intervall = 3\n")
    assert mover.main(["--config", str(config), "--root", str(tmp_path / "root")]) == 78
    assert "unknown key 'rescan-intervall' in [mq-mover]" in capsys.readouterr().err
    config.write_text("[mq-reaper]\nroot-dir = 3\n")
    assert reaper.main(["--config", str(config)]) == 78


def test_bad_values_exit_78_and_bad_command_lines_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("MQ_")]:
        monkeypatch.delenv(name)
    root = str(tmp_path / "root")
    assert mover.main(["--root", root, "--no-such-option"]) == 64
    assert mover.main(["--root", root, "--rescan-interval", "soon"]) == 64
    monkeypatch.setenv("MQ_MOVER_RESCAN_INTERVAL", "soon")
    assert mover.main(["--root", root]) == 78
    config = tmp_path / "mq.toml"
    config.write_text('[mq-reaper]\nnew-grace = "long"\n')
    assert reaper.main(["--config", str(config), "--root", root]) == 78


async def test_out_of_range_value_exits_78_naming_the_layer(tmp_path: Path) -> None:
    code, lines = await run_until_ready_then_sigterm(
        "daemons.mover",
        ["--root", str(tmp_path / "root")],
        clean_env(MQ_MOVER_RESCAN_INTERVAL="0"),
        "mq-mover ready",
    )
    log = "\n".join(lines)
    assert code == 78, log
    assert "rescan-interval must be a finite number of seconds > 0, got 0.0 (from env MQ_MOVER_RESCAN_INTERVAL)" in log
