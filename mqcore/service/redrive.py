"""Redrive tasks (SQS StartMessageMoveTask / CancelMessageMoveTask / ListMessageMoveTasks), written once.

A redrive moves the ready messages of a dead-letter queue back (to each
message's original queue, or to a given destination), oldest first, at most
``max_messages_per_second``. Its status is ``queues/DLQ/.redrive``, rewritten
by the process running it every 0.5 s; a cancel is a separate request file
(``.redrive-cancel``) the runner looks for before each status write. The pure
status rules (staleness, presentation) are :mod:`mqcore.redrive`; this module
adds the task's life over the Store: start (:func:`begin_redrive`), pacing
(:class:`RedrivePacer`), moves (:func:`move_names`), stop checks
(:func:`stop_reason`), status writes and cancel (:func:`request_cancel`).

The task itself is the plan :func:`redrive_task` (:mod:`mqcore.service.plans`):
the daemon (``daemons/_redrive.py``) runs it as an asyncio task with the
moves on the queue's fetcher thread; the brokerless client runs it inside its
call. Each driver answers three operations its own way: :class:`Pause`,
:class:`MoveOldest` and :class:`AnyLeft`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mqcore.errors import InvalidRequest, MQError, QueueNotFound, RedriveInProgress, RedriveNotRunning
from mqcore.names import QueueName, is_fifo_queue
from mqcore.protocol import Store, now_ms
from mqcore.redrive import REDRIVE_STATUS_INTERVAL_SECONDS, present_redrive_status, redrive_running
from mqcore.service.plans import Blocking, Plan

logger = logging.getLogger("mq.service")

__all__ = [
    "REDRIVE_CHUNK",
    "AnyLeft",
    "MoveOldest",
    "Pause",
    "RedriveMove",
    "RedrivePacer",
    "begin_redrive",
    "check_redrive_queues",
    "finish",
    "move_names",
    "new_status",
    "read_status",
    "redrive_task",
    "request_cancel",
    "stop_reason",
    "tally",
    "write_status",
]

#: Most messages a redrive moves in one step (one fetcher round trip in the daemon).
REDRIVE_CHUNK = 100

StopReason = Literal["cancelled", "replaced"]


def _missing(queue: QueueName, what: str = "queue") -> QueueNotFound:
    return QueueNotFound(f"{what} {queue!r} does not exist", queue=queue)


def check_redrive_queues(store: Store, source: QueueName, destination: QueueName | None) -> None:
    """The queues of a redrive exist and differ (blocking: one stat each).

    Raises:
        QueueNotFound: ``source`` or ``destination`` does not exist.
        InvalidRequest: ``destination`` is ``source``, or of the other kind (FIFO or standard: SQS
            moves messages only between queues of one type, as a dead-letter queue is of its
            sources' type) (``details.field`` = ``destination``).
    """
    if not store.queue_exists(source):
        raise _missing(source)
    if destination is not None:
        if destination == source:
            raise InvalidRequest("destination must differ from the dead-letter queue", field="destination")
        if is_fifo_queue(destination) != is_fifo_queue(source):
            kind = "a FIFO queue" if is_fifo_queue(source) else "a standard queue"
            raise InvalidRequest(
                f"the destination of a redrive out of {kind} must be {kind} too (SQS: same type of queue)",
                field="destination",
            )
        if not store.queue_exists(destination):
            raise _missing(destination, "destination queue")


def new_status(
    source: QueueName, destination: QueueName | None, rate: int, to_move: int, now: int, task_id: str | None = None
) -> dict[str, Any]:
    """The first status of a redrive task (state "running"; the JSON of docs/api.md "Redrive").

    Args:
        source: The dead-letter queue.
        destination: Where messages go; None = each message's original queue.
        rate: Most messages moved per second.
        to_move: Ready messages in ``source`` at the start.
        now: Epoch ms (``started_ms``, ``updated_ms``).
        task_id: The task's id; default a fresh random one.
    """
    return {
        "task_id": task_id or uuid.uuid4().hex,
        "source": source,
        "destination": destination,
        "max_messages_per_second": rate,
        "state": "running",
        "moved": 0,
        "skipped": 0,
        "to_move": to_move,
        "started_ms": now,
        "updated_ms": now,
    }


def begin_redrive(
    store: Store, source: QueueName, destination: QueueName | None, rate: int, to_move: int, now: int
) -> dict[str, Any]:
    """Start a redrive out of ``source``: refuse if one runs anywhere, else write its first status.

    Blocking. The caller serializes starts within its process (a lock around
    this call); across processes two starts at the same moment may both
    write, and :func:`stop_reason` then lets exactly one go on.

    Returns:
        The new status (:func:`new_status`), as written.
    Raises:
        RedriveInProgress: The status file says "running" and was rewritten within 10 s (409).
        StorageUnavailable: The status could not be written.
    """
    if redrive_running(store.read_redrive_status(source), now):
        raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
    status = new_status(source, destination, rate, to_move, now)
    store.write_redrive_status(source, status)
    return status


def write_status(store: Store, source: QueueName, status: dict[str, Any], now: int) -> None:
    """Stamp ``status["updated_ms"] = now`` and write a copy of it (blocking; StorageUnavailable)."""
    status["updated_ms"] = now
    store.write_redrive_status(source, dict(status))


def stop_reason(store: Store, source: QueueName, status: dict[str, Any]) -> StopReason | None:
    """Why the task of ``status`` must stop now, or None to go on (blocking: two small reads).

    "cancelled": a cancel request names the task (its ``requested_ms`` becomes
    ``status["cancel_requested_ms"]``), or the status file says cancelled.
    "replaced": the status file names another task: two redrives were started
    at once through two processes; this one stops without writing its status
    so the other, whose status is in the file, goes on (of two, at least one
    always sees its own status).
    """
    request = store.redrive_cancel_request(source)
    if request is not None and request.get("task_id") == status["task_id"]:
        if "requested_ms" in request:
            status["cancel_requested_ms"] = request["requested_ms"]
        return "cancelled"
    current = store.read_redrive_status(source)
    if current is None or current.get("task_id") != status["task_id"]:
        return "replaced"
    if current.get("state") == "cancelled":
        if "cancel_requested_ms" in current:
            status["cancel_requested_ms"] = current["cancel_requested_ms"]
        return "cancelled"
    return None


def finish(status: dict[str, Any]) -> None:
    """The final state of a task that stopped without error: a task stopped while "running" was cancelled."""
    if status["state"] == "running":
        status["state"] = "cancelled"


def read_status(store: Store, source: QueueName, now: int) -> dict[str, Any] | None:
    """The status of the last redrive out of ``source`` as clients see it, or None (blocking).

    A "running" status not rewritten for 10 s is reported "failed" (:func:`mqcore.redrive.present_redrive_status`).

    Raises:
        QueueNotFound: No such queue.
    """
    if not store.queue_exists(source):
        raise _missing(source)
    return present_redrive_status(store.read_redrive_status(source), now)


def request_cancel(store: Store, source: QueueName, now: int) -> dict[str, Any]:
    """Ask the running redrive out of ``source`` (in any process) to stop (blocking; SQS CancelMessageMoveTask).

    Writes the cancel request file naming the task, never the status file:
    the runner rewrites that every 0.5 s and would overwrite a cancel written
    between its read and its write. The runner sees the request within a
    second and records its final counts and state "cancelled".

    Returns:
        The status as the cancel leaves it: state "cancelled", ``updated_ms`` and ``cancel_requested_ms`` = ``now``.
    Raises:
        QueueNotFound: No such queue.
        RedriveNotRunning: No redrive out of ``source`` is running (404).
        StorageUnavailable: The request could not be written (503).
    """
    status = read_status(store, source, now)
    if status is None or not redrive_running(status, now):
        raise RedriveNotRunning(f"no redrive out of {source!r} is running", queue=source)
    store.at(now).request_redrive_cancel(source, status.get("task_id"))  # type: ignore[arg-type]
    return {**status, "state": "cancelled", "updated_ms": now, "cancel_requested_ms": now}


@dataclass(frozen=True, slots=True)
class RedriveMove:
    """What happened to one ready name of a redrive.

    Attributes:
        name: The ready name ``ID.RC`` in the dead-letter queue.
        moved_to: ``(queue, its new ready name there)`` if moved, else None.
        stays: Not moved and still in the dead-letter queue (no known or existing destination): skipped.
    """

    name: str
    moved_to: tuple[QueueName, str] | None
    stays: bool


def move_names(store: Store, source: QueueName, names: list[str], destination: QueueName | None) -> list[RedriveMove]:
    """Move each ready name of ``source`` to ``destination`` (None: its original queue); blocking.

    Each moved message gets a new id and a receive count of 0
    (:meth:`mqcore.protocol.Store.redrive_one`). A name gone meanwhile is
    neither moved nor skipped.
    """
    qdir = store.layout.queue_dir(source)
    out = []
    for name in names:
        moved = store.redrive_one(source, name, destination)
        out.append(RedriveMove(name, moved, moved is None and os.path.lexists(os.path.join(qdir, name))))
    return out


def tally(status: dict[str, Any], moves: list[RedriveMove], skipped: set[str]) -> None:
    """Count ``moves`` into ``status`` (``moved``, ``skipped``) and add the skipped names to ``skipped``."""
    for move in moves:
        if move.moved_to is not None:
            status["moved"] += 1
        elif move.stays:
            status["skipped"] += 1
            skipped.add(move.name)


class RedrivePacer:
    """The pace of a redrive: at most ``rate`` messages per second since the start, status every 0.5 s.

    Times are seconds of one monotonic clock the driver reads (``time.monotonic``, the loop's clock).

    Args:
        rate: Most messages per second (``max_messages_per_second``).
        started: The task's start.
    """

    def __init__(self, rate: int, started: float) -> None:
        self.rate = rate
        self.started = started
        self.last_write = started
        self.tried = 0
        """Names tried so far (moved, skipped or gone)."""

    def status_due(self, now: float) -> bool:
        """True when the status was last written :data:`REDRIVE_STATUS_INTERVAL_SECONDS` ago or more."""
        return now - self.last_write >= REDRIVE_STATUS_INTERVAL_SECONDS

    def wrote(self, now: float) -> None:
        """The status was written at ``now``."""
        self.last_write = now

    def wait_seconds(self, now: float) -> float:
        """How long to wait before the next move (<= 0: move now)."""
        return self.started + self.tried / self.rate - now

    def allowance(self, now: float, chunk: int = REDRIVE_CHUNK) -> int:
        """How many names the next step may try now: what the rate allows so far, 1 to ``chunk``."""
        return max(1, min(int((now - self.started) * self.rate) + 1 - self.tried, chunk))


@dataclass(frozen=True, slots=True)
class Pause:
    """Operation of :func:`redrive_task`: wait ``seconds`` (a cancel made in this process may end it early)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class MoveOldest:
    """Operation of :func:`redrive_task`: move up to ``wanted`` of the oldest ready names of ``source`` not in
    ``skipped`` (:func:`move_names`, where the driver moves); send back the moves ([] when none was left)."""

    source: QueueName
    destination: QueueName | None
    wanted: int
    skipped: set[str]


@dataclass(frozen=True, slots=True)
class AnyLeft:
    """Operation of :func:`redrive_task`: does a fresh listing of ``source`` find ready names not in ``skipped``?
    Send back the bool."""

    source: QueueName
    skipped: set[str]


def redrive_task(
    store: Store,
    status: dict[str, Any],
    clock: Callable[[], float],
    cancelled: Callable[[], bool] = lambda: False,
    wall_ms: Callable[[], int] = now_ms,
) -> Plan[StopReason | None]:
    """The plan of a redrive task (for :mod:`mqcore.service.plans`): oldest first, paced, status every 0.5 s.

    Ends "completed" when no ready message is left (skipped ones stay),
    "cancelled" when a cancel request names it (or ``cancelled()`` says one
    was made in this process), and returns "replaced" without writing when
    the status file names another task. On an error the status says "failed"
    (with the error; "mq stopped" when the driver was cancelled) and the
    error is raised again; a deleted queue (QueueNotFound) is only logged
    and raised.

    Args:
        store: The store.
        status: The task's status (:func:`begin_redrive`), updated in place.
        clock: Monotonic seconds (the driver's clock).
        cancelled: True once a cancel was made through this process.
        wall_ms: Epoch ms for ``updated_ms``.
    Returns:
        "replaced", "cancelled" or None (completed).
    """
    source: QueueName = status["source"]
    skipped: set[str] = set()
    pacer = RedrivePacer(status["max_messages_per_second"], clock())
    reason: StopReason | None = None
    try:
        while True:
            if pacer.status_due(clock()):
                reason = "cancelled" if cancelled() else (yield Blocking(lambda: stop_reason(store, source, status)))
                if reason is not None:
                    break
                yield Blocking(lambda: write_status(store, source, status, wall_ms()))
                pacer.wrote(clock())
            if cancelled():
                reason = "cancelled"
                break
            wait = pacer.wait_seconds(clock())
            if wait > 0:
                yield Pause(min(wait, REDRIVE_STATUS_INTERVAL_SECONDS))
                continue
            moves: list[RedriveMove] = yield MoveOldest(
                source, status["destination"], pacer.allowance(clock()), skipped
            )
            if moves:
                tally(status, moves, skipped)
                pacer.tried += len(moves)
            elif not (yield AnyLeft(source, skipped)):
                status["state"] = "completed"
                break
        if reason == "replaced":
            # Two redrives were started at once: the status file holds the other one, which goes
            # on. Writing ours now would make it stop too.
            logger.info("redrive yielded queue=%s moved=%d (another task runs)", source, status["moved"])
            return reason
        finish(status)
        yield Blocking(lambda: write_status(store, source, status, wall_ms()))
        logger.info(
            "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
        )
        return reason
    except QueueNotFound:
        logger.info("redrive ended: queue=%s was deleted", source)
        raise
    except BaseException as exc:
        stopped = not isinstance(exc, Exception)
        error = "mq stopped (or the queue was deleted) while the redrive ran" if stopped else str(exc)
        status.update(state="failed", error=error or type(exc).__name__)
        with contextlib.suppress(MQError, RuntimeError):
            yield Blocking(lambda: write_status(store, source, status, wall_ms()))
        raise
