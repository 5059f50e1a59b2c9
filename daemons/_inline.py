"""Lone operations on the loop thread: a send, receive or delete with nothing beside it skips the thread hand-off.

At one client every single send, receive and delete of ``mq`` used to cross to a
worker thread (a saver, the queue's fetcher, the remover) and back: a wake of a
parked thread, a wake of the loop (``call_soon_threadsafe``, an eventfd write
and an extra loop iteration), and the GIL passed twice. The Python floor
(``bench/python_floor.py``, docs/performance.md "The Python floor of bars 1-3")
measured that hand-off at 15-25 % of the rate of a lone request on this disk.
So a *lone* operation does its file work (create, write, fsync, close, rename,
fsync of the directory; or the lease's rename and read; or the delete's rename
and fsync of ``remove/``) on the loop thread itself, with the same calls, in the
same order, with the same errors, as the thread would have made.

"Lone" means: this is the only send, receive or delete of this process that has
reached its file work and not finished it, and so were the last
:data:`LONE_STREAK` ones (:class:`LoneOps`). Requests that arrive together are
all counted before any of them decides: mq's own connections (``daemons._wire``)
count each request they read (:meth:`LoneOps.arrived`) before its task first
runs, so the first one sees the others read in the same loop iteration; a
request not counted so (one served through aiohttp, a long poll woken later)
yields to the loop once instead, so the others read with it reach their
decision point too. Any of them then sees company and uses the threads exactly as
before (savers with their group commit, fetcher batches, the remover's batched
fsync of ``remove/``). So under concurrency nothing changes; at one client
nothing waits for a thread.

The price: while the loop does a lone operation's file work it serves nothing
else. A request that arrives meanwhile waits for the rest of that one operation
(at most its two fsyncs: the file's and its directory's; a delete has one),
then is read, sees the operation it waited behind gone and, if it too is alone,
goes inline itself, else to the threads. It never waits behind more than one
inline operation, since every operation that finds another one in flight uses
the threads.

Only on a local filesystem (:func:`inline_allowed`): on a network or FUSE
filesystem (GlusterFS, NFS, CIFS...) an fsync or a rename can take seconds or
hang with the server, and every connection of the daemon would hang with it.
``mq --inline-io never`` turns it off everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from mqcore.fsinfo import MountInfo

__all__ = ["INLINE_IO_MODES", "LoneOps", "inline_allowed"]

#: Values of ``--inline-io``: ``auto`` (lone operations inline on a local filesystem) or ``never``.
INLINE_IO_MODES = ("auto", "never")

#: Operations in a row that must find no other one in flight before the next may go inline. Under
#: concurrency most operations find one (and reset the count), so they go to the threads at once,
#: without :meth:`LoneOps.enter`'s yield: a yield there would hand the first operation of a group
#: over one loop iteration after the others, splitting the threads' batches (an extra fsync of
#: ``remove/`` for the deletes, an extra wake of a fetcher).
LONE_STREAK = 4


def inline_allowed(mode: str, mount: MountInfo | None) -> bool:
    """Whether lone operations may do their file work on the loop thread.

    Args:
        mode: ``--inline-io``: ``"auto"`` or ``"never"``.
        mount: The mount of the root (:func:`mqcore.fsinfo.mount_of`), or None if unknown.
    Returns:
        True only for ``auto`` on a local filesystem (:attr:`mqcore.fsinfo.MountInfo.local`).
    """
    return mode == "auto" and mount is not None and mount.local


class LoneOps:
    """Counts the sends, receives and deletes at their file work, and tells one that is alone (loop thread only).

    Usage, around an operation's file work::

        here = await lone.enter()
        try:
            ...  # here: the file work on the loop thread; else handed to the threads as before
        finally:
            lone.leave()

    An operation that always uses the threads (a batch, a FIFO queue's send) is counted with
    :meth:`hold` instead, so that a single send does not overtake it.

    Args:
        enabled: :func:`inline_allowed`'s answer; False: :meth:`enter` always answers False.
    """

    __slots__ = ("active", "burst", "enabled", "entered", "inline", "streak")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        #: Operations between :meth:`enter` and :meth:`leave`.
        self.active = 0
        #: Operations in a row that found no other one in flight (up to :data:`LONE_STREAK`).
        self.streak = 0
        #: Operations that asked (:meth:`enter`), and those told they are alone (mq logs both when it stops).
        self.entered = 0
        self.inline = 0
        #: Requests :meth:`arrived` in this loop iteration (0 again once their first steps have run).
        self.burst = 0

    def arrived(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count a request read now whose task was just created (call right after ``create_task``).

        The count is cleared by a callback queued behind the first such task, so it runs after
        every task created in the same loop iteration has taken its first step: a request
        that reaches :meth:`enter` in that step sees how many arrived with it, without a yield.
        """
        if not self.burst:
            loop.call_soon(self._burst_over)
        self.burst += 1

    def _burst_over(self) -> None:
        self.burst = 0

    async def enter(self) -> bool:
        """Count this operation; True if it is the only one (do its file work on the loop thread).

        False at once if another is in flight, or if one was during the last :data:`LONE_STREAK`
        operations, or if others :meth:`arrived` with this one. A request not counted by
        :meth:`arrived` (none this iteration) yields to the loop once before it decides instead, so
        that requests read in the same loop iteration as this one reach :meth:`enter` first and it
        sees them (a burst after a quiet spell: none of it goes inline). Cancelled meanwhile (the
        client went away), it is uncounted again and the cancellation goes on.
        """
        here = self.enter_now()
        return await self.settle() if here is None else here

    def enter_now(self) -> bool | None:
        """:meth:`enter` without a coroutine: True or False as :meth:`enter` answers, or None when only a
        yield to the loop can tell (then ``await`` :meth:`settle`, which answers it). Counts the operation
        either way (pair it with :meth:`leave`). The hot receive and delete call this (one coroutine less)."""
        self.active += 1
        self.entered += 1
        if self.active > 1:
            self.streak = 0
            return False
        if not self.enabled:
            return False
        if self.streak < LONE_STREAK:  # company lately: use the threads until it has been gone a while
            self.streak += 1
            return False
        if self.burst == 1:  # counted on its connection, alone in its loop iteration: no yield needed
            self.inline += 1
            return True
        if self.burst:  # others arrived with it
            self.streak = 0
            return False
        return None

    async def settle(self) -> bool:
        """The rest of :meth:`enter` after :meth:`enter_now` answered None: one yield, then alone or not.

        Raises:
            BaseException: A cancellation during the yield, after uncounting the operation.
        """
        try:
            await asyncio.sleep(0)
        except BaseException:
            self.active -= 1
            raise
        if self.burst > 1 or self.active > 1:
            self.streak = 0
            return False
        self.inline += 1
        return True

    def hold(self) -> None:
        """Count an operation that uses the threads whatever the others do (pair it with :meth:`leave`)."""
        self.active += 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """:meth:`hold` for the ``with`` block, :meth:`leave` at its end (an operation that always uses the threads)."""
        self.hold()
        try:
            yield
        finally:
            self.leave()

    def leave(self) -> None:
        """Uncount an operation that :meth:`enter` or :meth:`hold` counted (exactly once, in a ``finally``)."""
        self.active -= 1
