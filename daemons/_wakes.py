"""A wake-up event whose timed wait ends without cancelling the waiting task (issue 12, stop 24).

A long poll waits on its queue's arrival signal (daemons/_queues.py, ``Signal``) for up to 20 s.
With ``asyncio.timeout`` around ``Event.wait``, the end of every wait that nobody woke cancelled the
request's task: a ``CancelledError`` thrown into the coroutine chain of the connection (wire, route,
broker, wait), unwound through each frame's ``with`` blocks, turned into ``TimeoutError`` and caught.
At 1,000 idle long pollers that is 50 times a second (docs/performance.md, "Long pollers' idle CPU
(issue 12, stop 24)"). :meth:`Wake.wait_for` instead waits on one future that either the event's
:meth:`Wake.set` or a loop timer resolves, so the coroutine resumes once, normally, with True or False.
"""

from __future__ import annotations

import asyncio


def _expire(waiter: asyncio.Future[bool]) -> None:
    """A timed wait's timer fired: end it unwoken (unless set or cancelled first)."""
    if not waiter.done():
        waiter.set_result(False)


class Wake(asyncio.Event):
    """An :class:`asyncio.Event` with a cheap timed wait (:meth:`wait_for`). Event-loop thread only.

    ``wait()``, ``set()``, ``clear()`` and ``is_set()`` behave as the base class's (so any code taking an
    ``asyncio.Event`` accepts one); :meth:`set` also ends every pending :meth:`wait_for` with True.
    """

    def __init__(self) -> None:
        super().__init__()
        #: The futures of pending timed waits, in the order they began (a dict: O(1) removal, ordered wake-ups).
        self._timed: dict[asyncio.Future[bool], None] = {}

    def set(self) -> None:
        """Set the event: wake every ``wait()`` and end every pending :meth:`wait_for` with True."""
        super().set()
        timed, self._timed = self._timed, {}
        for waiter in timed:
            if not waiter.done():
                waiter.set_result(True)

    async def wait_for(self, timeout_seconds: float) -> bool:
        """Wait until the event is set or ``timeout_seconds`` (s; <= 0: no wait) have passed.

        The same answer as ``daemons._runtime.wait_for_wake(self, timeout_seconds)``, without cancelling the
        task at the timeout: one future, resolved by :meth:`set` or by a ``call_later`` timer (cancelled when
        the wait ends otherwise). A cancellation of the waiting task is raised as usual.

        Returns:
            True if the event is set.
        Raises:
            asyncio.CancelledError: The waiting task was cancelled.
        """
        if self.is_set() or timeout_seconds <= 0:
            return self.is_set()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._timed[waiter] = None
        timer = loop.call_later(timeout_seconds, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._timed.pop(waiter, None)
