"""Brokerless redrive: the redrive task of ``daemons/_redrive.py``, run synchronously in the caller's call.

The status lives in ``queues/DLQ/.redrive`` (docs/protocol.md 15.10) and
follows the rules of :mod:`mqcore.redrive`, so daemons and other brokerless
processes see the task, refuse a second one while it runs, and can cancel it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from typing import Any, Literal

from mqcore.client._local_send import check_int
from mqcore.errors import InvalidRequest, MQError, QueueNotFound, RedriveInProgress, RedriveNotRunning
from mqcore.names import QueueName, check_queue_name
from mqcore.protocol import Store, now_ms
from mqcore.redrive import (
    DEFAULT_REDRIVE_RATE,
    MAX_REDRIVE_RATE,
    REDRIVE_STATUS_INTERVAL_SECONDS,
    present_redrive_status,
    redrive_running,
)

logger = logging.getLogger(__name__)

_Stop = Literal["cancelled", "replaced"]


class RedriveRunner:
    """Starts, runs, reports and cancels redrive tasks on a queue root (thread-safe).

    Args:
        store: The root's store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

    def _require(self, queue: QueueName, what: str = "queue") -> None:
        if not self.store.queue_exists(queue):
            raise QueueNotFound(f"{what} {queue!r} does not exist", queue=queue)

    def start(self, queue: str, destination: str | None, max_messages_per_second: int | None) -> dict[str, Any]:
        """``LocalClient.start_redrive``: check, write a "running" status, run the task to its end.

        Returns:
            The final status.
        Raises:
            As ``LocalClient.start_redrive``.
        """
        source = check_queue_name(queue)
        rate = DEFAULT_REDRIVE_RATE
        if max_messages_per_second is not None:
            rate = check_int(max_messages_per_second, "max_messages_per_second", 1, MAX_REDRIVE_RATE, key="field")
        dest = check_queue_name(destination) if destination is not None else None
        self._require(source)
        if dest is not None:
            if dest == source:
                raise InvalidRequest("destination must differ from the dead-letter queue", field="destination")
            self._require(dest, "destination queue")
        with self._lock:
            now = now_ms()
            if redrive_running(self.store.read_redrive_status(source), now):
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            status: dict[str, Any] = {
                "task_id": uuid.uuid4().hex,
                "source": source,
                "destination": dest,
                "max_messages_per_second": rate,
                "state": "running",
                "moved": 0,
                "skipped": 0,
                "to_move": len(self.store.scan_ready(source)),
                "started_ms": now,
                "updated_ms": now,
            }
            self.store.write_redrive_status(source, status)
        logger.info("redrive started queue=%s destination=%s rate=%d task=%s", source, dest, rate, status["task_id"])
        return self._run(source, dest, status)

    def _write_status(self, source: QueueName, status: dict[str, Any]) -> None:
        status["updated_ms"] = now_ms()
        self.store.write_redrive_status(source, dict(status))

    def _stop(self, source: QueueName, status: dict[str, Any]) -> _Stop | None:
        """Why this task must stop (a cancel request names it, or the status file names another task), or None."""
        request = self.store.redrive_cancel_request(source)
        if request is not None and request.get("task_id") == status["task_id"]:
            if "requested_ms" in request:
                status["cancel_requested_ms"] = request["requested_ms"]
            return "cancelled"
        current = self.store.read_redrive_status(source)
        if current is None or current.get("task_id") != status["task_id"]:
            return "replaced"  # two redrives were started at once: the one in the file goes on
        if current.get("state") == "cancelled":
            if "cancel_requested_ms" in current:
                status["cancel_requested_ms"] = current["cancel_requested_ms"]
            return "cancelled"
        return None

    def _run(self, source: QueueName, destination: QueueName | None, status: dict[str, Any]) -> dict[str, Any]:
        """The redrive task of daemons/_redrive.py, synchronous: oldest first, rate-limited, status every 0.5 s."""
        rate: int = status["max_messages_per_second"]
        qdir = self.store.layout.queue_dir(source)
        skipped: set[str] = set()
        started = last_write = time.monotonic()
        tried = 0
        stop: _Stop | None = None
        try:
            while stop is None:
                names = sorted(n for n in self.store.scan_ready(source) if n not in skipped)
                if not names:
                    status["state"] = "completed"
                    break
                for name in names:
                    if time.monotonic() - last_write >= REDRIVE_STATUS_INTERVAL_SECONDS:
                        stop = self._stop(source, status)
                        if stop is not None:
                            break
                        self._write_status(source, status)
                        last_write = time.monotonic()
                    wait = started + tried / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    tried += 1
                    if self.store.redrive_one(source, name, destination) is not None:
                        status["moved"] += 1
                    elif os.path.lexists(os.path.join(qdir, name)):
                        skipped.add(name)
                        status["skipped"] += 1
        except QueueNotFound:
            logger.info("redrive ended: queue=%s was deleted", source)
            raise
        except BaseException as exc:
            status.update(state="failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(MQError):
                self._write_status(source, status)
            raise
        if stop == "replaced":
            logger.info("redrive yielded queue=%s moved=%d (another task runs)", source, status["moved"])
            return dict(status)
        if status["state"] == "running":
            status["state"] = "cancelled"
        self._write_status(source, status)
        logger.info(
            "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
        )
        return dict(status)

    def status(self, queue: str) -> dict[str, Any] | None:
        """``LocalClient.redrive_status``: the last task's status as clients see it, or None."""
        name = check_queue_name(queue)
        self._require(name)
        return present_redrive_status(self.store.read_redrive_status(name), now_ms())

    def cancel(self, queue: str) -> dict[str, Any]:
        """``LocalClient.cancel_redrive``: write a cancel request for the running task; its status as cancelled."""
        name = check_queue_name(queue)
        status = self.status(name)
        now = now_ms()
        if status is None or not redrive_running(status, now):
            raise RedriveNotRunning(f"no redrive out of {name!r} is running", queue=name)
        self.store.request_redrive_cancel(name, status.get("task_id"), now)  # type: ignore[arg-type]
        return {**status, "state": "cancelled", "updated_ms": now, "cancel_requested_ms": now}
