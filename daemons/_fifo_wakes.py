"""Wake-ups of a FIFO queue's long polls that no rename into the queue announces (docs/protocol.md 19.3).

A long poll waits for its queue's arrival signal, which new and redelivered messages fire
(inotify, the daemon's own sends). Two things free a FIFO queue's messages without any of that:

- **the queue's delay** passing (a FIFO message waits in ``queues/Q/`` until its send time plus
  the queue's ``delay_seconds``): one timer per queue, at the earliest due time a receive saw;
- **a delete that frees a message group**, made by another daemon or a brokerless client (this
  daemon's own deletes fire the signal themselves): while a receive found only messages of
  groups in flight, ``delay/``'s change stamp (one ``stat``, on a thread) is compared once a
  second with the one the receive took before it listed the leases, and the signal fired when
  it moved (a lease left ``delay/``, or another came: the polls look again). Nothing runs for
  queues whose polls are not blocked by a group, or once nobody waits.

Loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mqcore.fsinfo import dir_stamp
from mqcore.names import QueueName
from mqcore.protocol import now_ms
from mqcore.service.receive import LeaseOutcome

#: How often ``delay/`` is checked for a freed group while a FIFO long poll is blocked by one, in seconds.
GROUP_CHECK_SECONDS = 1.0

Stamp = tuple[int, int, int]


def _stamp(path: str) -> Stamp | None:
    """``delay/``'s change stamp (:func:`mqcore.fsinfo.dir_stamp`); None if it cannot be read."""
    try:
        return dir_stamp(path)
    except OSError:
        return None


class FifoWakes:
    """The timers that fire a FIFO queue's arrival signal when a delay ends or a group may be free.

    Args:
        delay_dir: The root's ``delay/`` directory.
        fire: Fires the arrival signal of a queue (wakes its long polls; nothing if none waits).
        waiting: True while long polls of a queue wait (its signal is held).
    """

    def __init__(self, delay_dir: str, fire: Callable[[QueueName], None], waiting: Callable[[QueueName], bool]) -> None:
        self._delay_dir = delay_dir
        self._fire = fire
        self._waiting = waiting
        self._due: dict[QueueName, tuple[int, asyncio.TimerHandle]] = {}
        self._checks: dict[QueueName, asyncio.Task[None]] = {}

    def note(self, queue: QueueName, outcome: LeaseOutcome) -> None:
        """What one receive round of FIFO ``queue`` held back: arm the timers that wake its polls."""
        if outcome.next_due_ms is not None:
            self._wake_at(queue, outcome.next_due_ms)
        if outcome.group_blocked and queue not in self._checks:
            task = asyncio.get_running_loop().create_task(self._watch(queue, outcome.delay_stamp))
            self._checks[queue] = task

    def _wake_at(self, queue: QueueName, due_ms: int) -> None:
        current = self._due.get(queue)
        if current is not None:
            if current[0] <= due_ms:
                return
            current[1].cancel()
        delay = max(0.0, (due_ms - now_ms() + 1) / 1000)
        self._due[queue] = (due_ms, asyncio.get_running_loop().call_later(delay, self._on_due, queue, due_ms))

    def _on_due(self, queue: QueueName, due_ms: int) -> None:
        current = self._due.get(queue)
        if current is not None and current[0] == due_ms:
            del self._due[queue]
        self._fire(queue)

    async def _watch(self, queue: QueueName, before: Stamp | None) -> None:
        """Fire ``queue``'s signal once ``delay/`` changed from ``before``; end when nobody waits."""
        try:
            while True:
                await asyncio.sleep(GROUP_CHECK_SECONDS)
                if not self._waiting(queue):
                    return  # the next blocked receive arms it again
                now = await asyncio.to_thread(_stamp, self._delay_dir)
                if now is None or now != before:
                    self._fire(queue)  # the polls look again (and arm a new watch if still blocked)
                    return
        finally:
            if self._checks.get(queue) is asyncio.current_task():
                del self._checks[queue]

    async def close(self) -> None:
        """Cancel every timer and check."""
        for _, handle in self._due.values():
            handle.cancel()
        self._due.clear()
        tasks = list(self._checks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
