"""Redrive tasks of the ``mq`` daemon: moving a dead-letter queue's messages back (SQS StartMessageMoveTask).

:class:`RedriveRunner` starts, reads and cancels the tasks and runs the one
task per dead-letter queue this daemon owns: oldest first, rate-limited, its
status rewritten into ``queues/DLQ/.redrive`` every 0.5 s (where every daemon
reads it: one running task per queue across daemons, a status not rewritten
for 10 s is reported "failed"). The moves themselves, which take the queue's
fetcher lock and edit its ready index, are the broker's
(:meth:`daemons._broker.Broker.redrive_step`); the runner reaches the broker
only through :class:`RedriveHost`, so this module does not import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from daemons import _runtime
from mqcore.errors import InvalidRequest, MQError, QueueNotFound, RedriveInProgress, RedriveNotRunning
from mqcore.index import ReadyIndex
from mqcore.names import QueueName
from mqcore.protocol import Store, now_ms
from mqcore.redrive import REDRIVE_STATUS_INTERVAL_SECONDS, present_redrive_status, redrive_running

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

T = TypeVar("T")

#: Most messages a redrive moves in one fetcher round trip.
REDRIVE_CHUNK = 100


@dataclass
class _Redrive:
    """A redrive task this daemon runs (one per dead-letter queue at most)."""

    status: dict[str, Any]
    task: asyncio.Task[None] | None = None
    cancel: bool = False
    replaced: bool = False
    """Another task's status replaced this one's: stop without writing (the other task goes on)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RedriveQueueState(Protocol):
    """What the runner reads of a queue's state: its ready index (``daemons._broker._QueueState``)."""

    index: ReadyIndex


class RedriveHost(Protocol):
    """What the runner needs from the broker that owns it (:class:`daemons._broker.Broker`)."""

    store: Store
    savers: ThreadPoolExecutor

    async def queue_state(self, queue: QueueName) -> RedriveQueueState: ...

    async def queue_exists(self, queue: QueueName) -> bool: ...

    async def redrive_step(
        self, source: QueueName, destination: QueueName | None, wanted: int, skipped: set[str]
    ) -> tuple[int, int, int] | None: ...

    async def redrive_done(self, source: QueueName, skipped: set[str]) -> bool: ...


class RedriveRunner:
    """The redrive tasks this daemon runs (one per dead-letter queue at most), and their status files.

    Every method runs on the event loop; status files are read and written on
    the broker's saver threads.

    Args:
        host: The broker: queue states, the moves under the fetcher lock, the store, the saver threads.
    """

    def __init__(self, host: RedriveHost) -> None:
        self.host = host
        self.tasks: dict[QueueName, _Redrive] = {}
        """The running task per dead-letter queue (a task removes itself when it ends)."""
        self._lock = asyncio.Lock()

    async def _in(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.host.savers, fn, *args)

    async def start(self, source: QueueName, destination: QueueName | None, rate: int) -> dict[str, Any]:
        """Start moving the ready messages of dead-letter queue ``source`` back (SQS StartMessageMoveTask).

        Args:
            source: The dead-letter queue.
            destination: Where to move them; None = each message's original queue.
            rate: Most messages moved per second (1-10,000).
        Returns:
            The task's first status (also written to ``queues/source/.redrive``).
        Raises:
            QueueNotFound: ``source`` or ``destination`` does not exist.
            InvalidRequest: ``destination`` is ``source``.
            RedriveInProgress: A redrive out of ``source`` is running (here or in another daemon).
        """
        state = await self.host.queue_state(source)
        if destination is not None:
            if destination == source:
                raise InvalidRequest("destination must differ from the dead-letter queue", field="destination")
            if not await self.host.queue_exists(destination):
                raise QueueNotFound(f"destination queue {destination!r} does not exist", queue=destination)
        async with self._lock:
            local = self.tasks.get(source)
            if local is not None and local.task is not None and not local.task.done():
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            current = await self._in(self.host.store.read_redrive_status, source)
            now = now_ms()
            if redrive_running(current, now):
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            status: dict[str, Any] = {
                "task_id": uuid.uuid4().hex,
                "source": source,
                "destination": destination,
                "max_messages_per_second": rate,
                "state": "running",
                "moved": 0,
                "skipped": 0,
                "to_move": len(state.index),
                "started_ms": now,
                "updated_ms": now,
            }
            await self._in(self.host.store.write_redrive_status, source, status)
            redrive = _Redrive(status)
            redrive.task = asyncio.get_running_loop().create_task(self._run(source, redrive))
            redrive.task.add_done_callback(functools.partial(self._ended, source, redrive))
            self.tasks[source] = redrive
        logger.info(
            "redrive started queue=%s destination=%s rate=%d task=%s", source, destination, rate, status["task_id"]
        )
        return dict(status)

    async def read(self, source: QueueName) -> dict[str, Any] | None:
        """The status of the last redrive out of ``source`` as clients see it, or None (QueueNotFound)."""

        def read() -> dict[str, Any] | None:
            if not self.host.store.queue_exists(source):
                raise QueueNotFound(f"queue {source!r} does not exist", queue=source)
            return self.host.store.read_redrive_status(source)

        return present_redrive_status(await self._in(read), now_ms())

    async def cancel(self, source: QueueName) -> dict[str, Any]:
        """Ask the running redrive out of ``source`` to stop (SQS CancelMessageMoveTask).

        Writes a cancel request naming the task (``queues/source/.redrive-cancel``,
        Store.request_redrive_cancel), not the status file: the task rewrites
        that file every 0.5 s, and a cancel written into it between the task's
        read and its write would be lost. The daemon running the task (this one
        or another) finds the request at its next status write (within a
        second) and records its final counts, state "cancelled" and
        ``cancel_requested_ms``; until then the status file still says "running".

        Returns:
            The task's status as the cancel leaves it: state "cancelled", ``cancel_requested_ms`` (epoch ms).
        Raises:
            QueueNotFound: No such queue.
            RedriveNotRunning: No redrive out of ``source`` is running (404).
            StorageUnavailable: The request could not be written (503).
        """
        status = await self.read(source)
        now = now_ms()
        if status is None or not redrive_running(status, now):
            raise RedriveNotRunning(f"no redrive out of {source!r} is running", queue=source)
        await self._in(self.host.store.request_redrive_cancel, source, status.get("task_id"), now)
        status = {**status, "state": "cancelled", "updated_ms": now, "cancel_requested_ms": now}
        local = self.tasks.get(source)
        if local is not None and local.status.get("task_id") == status.get("task_id"):
            local.status["cancel_requested_ms"] = now
            local.cancel = True
            local.wake.set()
        logger.info("redrive cancel requested queue=%s task=%s", source, status.get("task_id"))
        return status

    def _ended(self, source: QueueName, redrive: _Redrive, task: asyncio.Task[None]) -> None:
        """Forget a finished task (its status is in its file): ``tasks`` holds running tasks only."""
        if self.tasks.get(source) is redrive:
            del self.tasks[source]

    def stop(self, source: QueueName) -> None:
        """End the task out of ``source`` now (its queue was deleted)."""
        redrive = self.tasks.get(source)
        if redrive is not None and redrive.task is not None:
            redrive.task.cancel()

    async def stop_all(self) -> None:
        """End every task this daemon runs (mq stops); each records state "failed" so a client can start it again."""
        tasks = [r.task for r in self.tasks.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, source: QueueName, redrive: _Redrive) -> None:
        """The redrive task: oldest first, at most ``max_messages_per_second``, status every 0.5 s.

        Ends "completed" when the queue has no ready message left (messages
        without a known or existing destination are skipped and stay),
        "cancelled" when a cancel request naming it is seen at a status write
        (or one is made through this daemon), "failed" on an error or when mq stops.
        """
        loop = asyncio.get_running_loop()
        status = redrive.status
        rate: int = status["max_messages_per_second"]
        destination = status["destination"]
        skipped: set[str] = set()
        started = last_write = loop.time()
        tried = 0
        try:
            while True:
                if loop.time() - last_write >= REDRIVE_STATUS_INTERVAL_SECONDS:
                    if await self._cancelled(source, redrive):
                        break
                    await self._write(source, status)
                    last_write = loop.time()
                if redrive.cancel:
                    break
                due = started + tried / rate
                wait = due - loop.time()
                if wait > 0:
                    redrive.wake.clear()
                    await _runtime.wait_for_wake(redrive.wake, min(wait, REDRIVE_STATUS_INTERVAL_SECONDS))
                    continue
                allowance = int((loop.time() - started) * rate) + 1 - tried
                step = await self.host.redrive_step(source, destination, max(1, min(allowance, REDRIVE_CHUNK)), skipped)
                if step is None:
                    if await self.host.redrive_done(source, skipped):
                        status["state"] = "completed"
                        break
                    continue
                tried += step[0]
                status["moved"] += step[1]
                status["skipped"] += step[2]
            if redrive.replaced:
                # Two redrives were started at once through two daemons: the status file holds
                # the other one, which goes on. Writing ours now would make it stop too.
                logger.info("redrive yielded queue=%s moved=%d (another task runs)", source, status["moved"])
                return
            if status["state"] == "running":
                status["state"] = "cancelled"
            await self._write(source, status)
            logger.info(
                "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
            )
        except asyncio.CancelledError:
            status.update(state="failed", error="mq stopped (or the queue was deleted) while the redrive ran")
            with contextlib.suppress(MQError, RuntimeError):
                await self._write(source, status)
            raise
        except QueueNotFound:
            logger.info("redrive ended: queue=%s was deleted", source)
        except Exception as exc:
            logger.exception("redrive failed queue=%s", source)
            status.update(state="failed", error=str(exc))
            with contextlib.suppress(MQError):
                await self._write(source, status)

    async def _cancelled(self, source: QueueName, redrive: _Redrive) -> bool:
        """True if this task must stop: a cancel request names it, or the status says cancelled or names another task.

        A status naming another task means two redrives were started at once
        through two daemons; this one then stops without writing its status
        (``replaced``), so the other, whose status is in the file, goes on:
        of two tasks at least one always sees its own status and continues.

        Called before each status write. The cancel request is a file of its
        own (``.redrive-cancel``, written by ``DELETE /<queue>/redrive`` on
        any daemon); its ``requested_ms`` becomes the status's ``cancel_requested_ms``.
        """
        if redrive.cancel:
            return True

        def read() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
            store = self.host.store
            return store.read_redrive_status(source), store.redrive_cancel_request(source)

        current, request = await self._in(read)
        if request is not None and request.get("task_id") == redrive.status["task_id"]:
            redrive.cancel = True
            if "requested_ms" in request:
                redrive.status["cancel_requested_ms"] = request["requested_ms"]
            return True
        if current is None or current.get("task_id") != redrive.status["task_id"]:
            redrive.cancel = redrive.replaced = True
            return True
        if current.get("state") == "cancelled":
            redrive.cancel = True
            if "cancel_requested_ms" in current:
                redrive.status["cancel_requested_ms"] = current["cancel_requested_ms"]
            return True
        return False

    async def _write(self, source: QueueName, status: dict[str, Any]) -> None:
        status["updated_ms"] = now_ms()
        await self._in(self.host.store.write_redrive_status, source, dict(status))
