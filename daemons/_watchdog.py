"""The systemd watchdog and status line of every daemon (``WatchdogSec=`` in the units; sd_watchdog_enabled(3)).

:func:`run` is a task of the daemon's event loop: every half of
``WATCHDOG_USEC`` it sends ``WATCHDOG=1`` with a ``STATUS=`` line (what
``systemctl status`` shows). The ping comes from the loop itself, so a loop
blocked for longer than ``WatchdogSec=`` stops the pings and systemd kills
and restarts the daemon (``Restart=on-failure``). Without ``WATCHDOG_USEC``
(or with ``WATCHDOG_PID`` naming another process) only the status line is
sent, every :data:`STATUS_INTERVAL_SECONDS`; without ``NOTIFY_SOCKET`` the
task returns at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from daemons import _runtime

logger = logging.getLogger("mq.runtime")

#: Seconds between STATUS= lines when systemd asked for no watchdog.
STATUS_INTERVAL_SECONDS = 10.0


def interval_seconds() -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds if the watchdog is meant for this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2 / 1e6


class Rate:
    """Per-second rate of a growing counter between two calls of :meth:`update`."""

    def __init__(self) -> None:
        self._count: int | None = None
        self._at = time.monotonic()

    def update(self, count: int) -> float:
        """The rate of ``count`` since the previous call (0.0 on the first)."""
        now = time.monotonic()
        rate = 0.0 if self._count is None or now <= self._at else (count - self._count) / (now - self._at)
        self._count, self._at = count, now
        return rate


async def run(status: Callable[[], str]) -> None:
    """Ping the watchdog and send ``STATUS=<status()>`` until cancelled (nothing without ``NOTIFY_SOCKET``)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    watchdog = interval_seconds()
    interval = watchdog if watchdog is not None else STATUS_INTERVAL_SECONDS
    while True:
        try:
            line = f"STATUS={status()}"
        except Exception:  # the ping matters more than the status text
            logger.exception("watchdog status line failed")
            line = "STATUS=running"
        _runtime.sd_notify(f"WATCHDOG=1\n{line}" if watchdog is not None else line)
        await asyncio.sleep(interval)
