"""Results of worker threads handed back to the event loop: one wake of the loop for all that finished together.

Every thread of the ``mq`` daemon that works for the loop (the savers of
``daemons/_savers.py``, the fetchers of ``daemons/_handoff.py``) finishes
its jobs the same way: it appends ``(future, succeeded, result or
exception)`` to the loop's :class:`LoopDelivery`, which schedules one
``call_soon_threadsafe`` unless a delivery is already scheduled and has
not started yet. So the outcomes of every thread that finished before the
loop got round to them are set in one callback: one wake of the loop per
group commit or batch, not one per message, and none at all while the
loop is still busy with the previous ones.

A loop has one :class:`LoopDelivery` (:func:`delivery_for`), shared by all
threads, so a fetcher's batch and a saver's group commit that end at the
same time wake the loop once. The threads never take a lock here: the
hand-over uses only operations that are atomic under the GIL (``deque``
append and popleft, an attribute store), see ``_savers.py`` for why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

#: One outcome: (the future awaiting it, True if the job returned, its result or the exception it raised).
Outcome = tuple["asyncio.Future[Any]", bool, Any]


class LoopDelivery:
    """The outcomes that worker threads finished and the loop has not set yet, and the one wake that sets them.

    Args:
        loop: The event loop whose futures the outcomes resolve.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the registry of :func:`delivery_for` must not keep a finished loop alive.
        self._loop = weakref.ref(loop)
        self._done: collections.deque[Outcome] = collections.deque()
        #: A :meth:`_deliver` is scheduled and has not started draining ``_done`` yet.
        self._wake_pending = False

    def put(self, outcome: Outcome) -> None:
        """Hand one outcome to the loop (any thread); wakes the loop unless a wake is already on its way."""
        self._done.append(outcome)
        self._wake()

    def put_many(self, outcomes: Iterable[Outcome]) -> None:
        """Hand several outcomes to the loop (any thread), with at most one wake of the loop."""
        self._done.extend(outcomes)
        self._wake()

    def _wake(self) -> None:
        if self._wake_pending:  # read after the append: a _deliver that has not reset it yet will see ours
            return
        self._wake_pending = True
        loop = self._loop()
        if loop is None:  # the loop is gone: nobody awaits these any more
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed (mq stopped): nobody awaits these any more
            loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """On the loop: set every outcome handed over so far (a cancelled future is skipped)."""
        self._wake_pending = False  # before draining: an outcome appended after this wakes the loop again
        done = self._done
        while done:
            settle(done.popleft())


def settle(outcome: Outcome) -> None:
    """Set ``outcome`` on its future, on the future's loop thread (skipped if the future was cancelled).

    Args:
        outcome: (future, True and its result) or (future, False and the exception to raise).
    """
    future, ok, value = outcome
    if future.done():  # cancelled: the client went away (the work was done all the same)
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


_deliveries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopDelivery] = weakref.WeakKeyDictionary()


def delivery_for(loop: asyncio.AbstractEventLoop) -> LoopDelivery:
    """The :class:`LoopDelivery` of ``loop`` (created on first use; any thread may call)."""
    delivery = _deliveries.get(loop)
    if delivery is None:
        delivery = _deliveries.setdefault(loop, LoopDelivery(loop))
    return delivery
