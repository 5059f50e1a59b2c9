"""Brokerless redrive: a redrive task run synchronously inside the caller's call.

The rules (start, status record, pacing, moves, stop and cancel) are
:mod:`mqcore.service.redrive`'s, shared with the daemon (``daemons/_redrive.py``);
this module drives the task's plan (:func:`~mqcore.service.redrive.redrive_task`)
synchronously: pauses are ``time.sleep``, moves take the oldest names of one
listing of the dead-letter queue at a time. The status lives in
``queues/DLQ/.redrive`` (docs/protocol.md 15.10), so daemons and other
brokerless processes see the task, refuse a second one while it runs, and can
cancel it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from mqcore.names import QueueName, check_queue_name
from mqcore.protocol import Store, now_ms
from mqcore.redrive import DEFAULT_REDRIVE_RATE
from mqcore.service import redrive as rules
from mqcore.service.plans import run_sync
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
        rate = REDRIVE_RATE.optional(max_messages_per_second, key="field") or DEFAULT_REDRIVE_RATE
        dest = check_queue_name(destination) if destination is not None else None
        rules.check_redrive_queues(self.store, source, dest)
        with self._lock:
            to_move = len(self.store.scan_ready(source))
            status = rules.begin_redrive(self.store, source, dest, rate, to_move, now_ms())
        logger.info("redrive started queue=%s destination=%s rate=%d task=%s", source, dest, rate, status["task_id"])
        return self._run(source, dest, status)

    def _run(self, source: QueueName, destination: QueueName | None, status: dict[str, Any]) -> dict[str, Any]:
        """Run the task (:func:`mqcore.service.redrive.redrive_task`) in this thread; its final status."""
        pending: list[str] = []  # the oldest ready names of the last listing, not yet tried

        def move_oldest(step: rules.MoveOldest) -> list[rules.RedriveMove]:
            nonlocal pending
            if not pending:
                pending = sorted(n for n in self.store.scan_ready(source) if n not in step.skipped)
            names, pending = pending[: step.wanted], pending[step.wanted :]
            return rules.move_names(self.store, source, names, destination) if names else []

        def handle(step: Any) -> Any:
            if isinstance(step, rules.Pause):
                time.sleep(step.seconds)
                return None
            if isinstance(step, rules.MoveOldest):
                return move_oldest(step)
            if isinstance(step, rules.AnyLeft):
                return any(n not in step.skipped for n in self.store.scan_ready(source))
            raise TypeError(f"no handler for {step!r}")

        plan = rules.redrive_task(self.store, status, time.monotonic)
        run_sync(plan, handle)  # Ctrl-C is thrown into the plan too: the task records "failed" at once
        return dict(status)

    def status(self, queue: str) -> dict[str, Any] | None:
        """``LocalClient.redrive_status``: the last task's status as clients see it, or None."""
        return rules.read_status(self.store, check_queue_name(queue), now_ms())

    def cancel(self, queue: str) -> dict[str, Any]:
        """``LocalClient.cancel_redrive``: write a cancel request for the running task; its status as cancelled."""
        return rules.request_cancel(self.store, check_queue_name(queue), now_ms())
