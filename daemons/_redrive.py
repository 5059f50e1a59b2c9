"""Redrive tasks of the ``mq`` daemon: moving a dead-letter queue's messages back (SQS StartMessageMoveTask).

:class:`RedriveRunner` starts, reads and cancels the tasks and runs the one
task per dead-letter queue this daemon owns: oldest first, rate-limited, its
status rewritten into ``queues/DLQ/.redrive`` every 0.5 s (where every daemon
reads it: one running task per queue across daemons, a status not rewritten
for 10 s is reported "failed"). The rules (start, status record, pacing,
moves, stop and cancel) are :mod:`mqcore.service.redrive`'s, shared with the
brokerless client; this module adds the asyncio task, the saver threads, and
the moves on the queue's fetcher thread under its lock, editing its ready
index (:meth:`RedriveRunner.step`). The runner reaches the broker only
through :class:`RedriveHost`, so this module does not import it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from daemons import _runtime
from daemons._queues import QueueStates
from mqcore.errors import QueueNotFound, RedriveInProgress
from mqcore.names import QueueName
from mqcore.protocol import Store, now_ms
from mqcore.service import redrive as rules
from mqcore.service.plans import run_async

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

T = TypeVar("T")


@dataclass
class _Redrive:
    """A redrive task this daemon runs (one per dead-letter queue at most)."""

    status: dict[str, Any]
    task: asyncio.Task[None] | None = None
    cancel: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RedriveHost(Protocol):
    """What the runner needs from the broker that owns it (:class:`daemons._broker.Broker`)."""

    store: Store
    queues: QueueStates

    @property
    def savers(self) -> Executor:
        """The saver threads (status files)."""


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
        state = await self.host.queues.queue_state(source)
        await self._in(rules.check_redrive_queues, self.host.store, source, destination)
        async with self._lock:
            local = self.tasks.get(source)
            if local is not None and local.task is not None and not local.task.done():
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            status = await self._in(
                rules.begin_redrive, self.host.store, source, destination, rate, len(state.index), now_ms()
            )
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
        return await self._in(rules.read_status, self.host.store, source, now_ms())

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
        now = now_ms()
        status = await self._in(rules.request_cancel, self.host.store, source, now)
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
        """The redrive task: :func:`mqcore.service.redrive.redrive_task` driven on the event loop.

        Status reads and writes run on the saver threads, the moves on the
        queue's fetcher thread (:meth:`step`); a pause ends early when a
        cancel is made through this daemon. A deleted queue ends it quietly;
        any other error is logged (the plan recorded state "failed").
        """
        loop = asyncio.get_running_loop()
        plan = rules.redrive_task(self.host.store, redrive.status, loop.time, lambda: redrive.cancel)

        async def handle(op: rules.Pause | rules.MoveOldest | rules.AnyLeft) -> object:
            if isinstance(op, rules.Pause):
                redrive.wake.clear()
                return await _runtime.wait_for_wake(redrive.wake, op.seconds)
            if isinstance(op, rules.MoveOldest):
                return await self.step(op)
            return not await self.done(op.source, op.skipped)

        try:
            await run_async(plan, self._blocking, handle)
        except QueueNotFound:
            pass
        except Exception:
            logger.exception("redrive failed queue=%s", source)

    async def _blocking(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.host.savers, fn)

    # -- the moves, on the queue's fetcher thread under its lock ----------------------

    async def step(self, op: rules.MoveOldest) -> list[rules.RedriveMove]:
        """Move up to ``op.wanted`` of the oldest ready messages not in ``op.skipped`` ([]: the index has none)."""
        source, skipped = op.source, op.skipped
        queues = self.host.queues
        fetcher = queues.fetcher_for(source)
        async with fetcher.lock:
            state = await queues.queue_state(source)
            names: list[str] = []
            held: list[str] = []
            while len(names) < op.wanted:
                name = state.index.pop_oldest()
                if name is None:
                    break
                (held if name in skipped else names).append(name)
            state.index.update(held)
            if not names:
                return []
            loop = asyncio.get_running_loop()
            moves = await loop.run_in_executor(
                fetcher.thread, rules.move_names, self.host.store, source, names, op.destination
            )
        for move in moves:
            if move.moved_to is not None:
                queues.note_ready(*move.moved_to)
            elif move.stays:
                state.index.add(move.name)
        queues.fire(queues.room, source)
        return moves

    async def done(self, source: QueueName, skipped: set[str]) -> bool:
        """True if a fresh listing finds no ready message left (other than skipped ones)."""
        queues = self.host.queues
        loop = asyncio.get_running_loop()
        names = await loop.run_in_executor(queues.fetcher_for(source).thread, self.host.store.scan_ready, source)
        left = [n for n in names if n not in skipped]
        if not left:
            return True
        state = await queues.queue_state(source)
        state.index.update(left)
        return False
