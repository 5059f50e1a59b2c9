"""Brokerless redrive: a redrive task run synchronously inside the caller's call.

The rules (start, status record, pacing, moves, stop and cancel) are
:mod:`mqcore.service.redrive`'s, shared with the daemon (``daemons/_redrive.py``);
this module is their synchronous driver. The status lives in
``queues/DLQ/.redrive`` (docs/protocol.md 15.10), so daemons and other
brokerless processes see the task, refuse a second one while it runs, and can
cancel it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from mqcore.errors import MQError, QueueNotFound
from mqcore.names import QueueName, check_queue_name
from mqcore.protocol import Store, now_ms
from mqcore.redrive import DEFAULT_REDRIVE_RATE, REDRIVE_STATUS_INTERVAL_SECONDS
from mqcore.service import redrive as rules
from mqcore.service.requests import REDRIVE_RATE

logger = logging.getLogger(__name__)


class RedriveRunner:
    """Starts, runs, reports and cancels redrive tasks on a queue root (thread-safe).

    Args:
        store: The root's store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

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
            rate = REDRIVE_RATE.check(max_messages_per_second, key="field")
        dest = check_queue_name(destination) if destination is not None else None
        rules.check_redrive_queues(self.store, source, dest)
        with self._lock:
            to_move = len(self.store.scan_ready(source))
            status = rules.begin_redrive(self.store, source, dest, rate, to_move, now_ms())
        logger.info("redrive started queue=%s destination=%s rate=%d task=%s", source, dest, rate, status["task_id"])
        return self._run(source, dest, status)

    def _run(self, source: QueueName, destination: QueueName | None, status: dict[str, Any]) -> dict[str, Any]:
        """Run the task: oldest first, paced by :class:`~mqcore.service.redrive.RedrivePacer`, status every 0.5 s."""
        pacer = rules.RedrivePacer(status["max_messages_per_second"], time.monotonic())
        skipped: set[str] = set()
        pending: list[str] = []
        stop: rules.StopReason | None = None
        try:
            while True:
                if pacer.status_due(time.monotonic()):
                    stop = rules.stop_reason(self.store, source, status)
                    if stop is not None:
                        break
                    rules.write_status(self.store, source, status, now_ms())
                    pacer.wrote(time.monotonic())
                wait = pacer.wait_seconds(time.monotonic())
                if wait > 0:
                    time.sleep(min(wait, REDRIVE_STATUS_INTERVAL_SECONDS))
                    continue
                if not pending:
                    pending = sorted(n for n in self.store.scan_ready(source) if n not in skipped)
                    if not pending:
                        status["state"] = "completed"
                        break
                allowed = pacer.allowance(time.monotonic())
                names, pending = pending[:allowed], pending[allowed:]
                rules.tally(status, rules.move_names(self.store, source, names, destination), skipped)
                pacer.tried += len(names)
        except QueueNotFound:
            logger.info("redrive ended: queue=%s was deleted", source)
            raise
        except BaseException as exc:
            status.update(state="failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(MQError):
                rules.write_status(self.store, source, status, now_ms())
            raise
        if stop == "replaced":
            logger.info("redrive yielded queue=%s moved=%d (another task runs)", source, status["moved"])
            return dict(status)
        rules.finish(status)
        rules.write_status(self.store, source, status, now_ms())
        logger.info(
            "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
        )
        return dict(status)

    def status(self, queue: str) -> dict[str, Any] | None:
        """``LocalClient.redrive_status``: the last task's status as clients see it, or None."""
        return rules.read_status(self.store, check_queue_name(queue), now_ms())

    def cancel(self, queue: str) -> dict[str, Any]:
        """``LocalClient.cancel_redrive``: write a cancel request for the running task; its status as cancelled."""
        return rules.request_cancel(self.store, check_queue_name(queue), now_ms())
