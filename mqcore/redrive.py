"""Redrive task status rules shared by every process that runs or reads a redrive (docs/api.md "Redrive").

A redrive task's status lives in ``queues/DLQ/.redrive`` (docs/protocol.md
15.10). The process running it (an ``mq`` daemon, or a brokerless client
inside its call) rewrites it every :data:`REDRIVE_STATUS_INTERVAL_SECONDS`;
every reader applies the same staleness rule, so "one running task per
queue" holds across daemons and brokerless processes. Pure functions, no I/O;
the task that writes the status (start, pacing, moves, stop, cancel) is
:mod:`mqcore.service.redrive`.
"""

from __future__ import annotations

from typing import Any

#: Redrive rate limits, in messages per second (SQS StartMessageMoveTask: 1-500; here up to 10,000).
DEFAULT_REDRIVE_RATE = 500
MAX_REDRIVE_RATE = 10_000
#: A redrive status "running" not rewritten for this long is reported as "failed" (its runner died), in ms.
REDRIVE_STALE_MS = 10_000
#: How often a running redrive rewrites its status (and looks for a cancel request), in seconds (< 1 s).
REDRIVE_STATUS_INTERVAL_SECONDS = 0.5


def redrive_running(status: dict[str, Any] | None, now: int) -> bool:
    """True if ``status`` says running and was rewritten within :data:`REDRIVE_STALE_MS` of ``now`` (epoch ms)."""
    if not status or status.get("state") != "running":
        return False
    updated = status.get("updated_ms")
    return isinstance(updated, int) and now - updated <= REDRIVE_STALE_MS


def present_redrive_status(status: dict[str, Any] | None, now: int) -> dict[str, Any] | None:
    """A redrive status as clients see it: "running" not rewritten for 10 s is reported "failed"."""
    if status is None:
        return None
    if status.get("state") == "running" and not redrive_running(status, now):
        return {**status, "state": "failed", "error": "the process running the redrive stopped updating it (it died?)"}
    return status
