"""Sequential sends keep their order across the workers of ``mq --processes N`` (docs/api.md).

Ids from different processes are ordered only by their millisecond (docs/protocol.md section 3):
two sends in one millisecond through two workers get ids in no particular order. A client that
sends, gets its ``201`` and then sends again through another worker (another connection) within
that millisecond could see its second message received first.

The workers therefore share, in a small file of the supervisor's private directory mapped into
every worker, the millisecond of the newest id each one has acknowledged: one 8-byte slot per
worker, written only by its worker (no lock: one writer per slot, aligned 8-byte stores). Before
a send takes its id, the worker reads the *other* workers' slots; if this host's wall clock is still
in the newest millisecond one of them acknowledged, it waits (asyncio, no CPU) until that
millisecond is over. A send begun after another's ``201`` thus gets a later millisecond, or, when
the same worker serves both, a later id anyway: one process's ids strictly increase (its one
``IdGenerator``, docs/protocol.md section 3), so a worker never waits for its own acknowledgments
(only for those a restarted worker's earlier incarnation left in its slot).
(It used to: a client sending one message after another through one worker then waited out the
millisecond of its own previous ``201`` whenever that send had taken under a millisecond, 1-2 ms
with uvloop's whole-millisecond timers, which halved one client's rate with two processes;
docs/performance.md, stop 20.) The wait
is taken only by a send that starts within the same millisecond as another worker's
acknowledgment; with one process none of this runs.
"""

from __future__ import annotations

import asyncio
import math
import mmap
import os
import struct
import time
from collections.abc import Iterable

from mqcore.names import MessageId, sent_ms_of

#: Bytes of one worker's slot (a signed 64-bit count of epoch milliseconds).
SLOT_BYTES = 8


def create(path: str, workers: int) -> None:
    """Make the shared file for ``workers`` slots, all 0 (the supervisor, before it starts any worker)."""
    with open(path, "wb") as fh:
        fh.write(bytes(SLOT_BYTES * workers))


class AckedIds:
    """This worker's view of the shared slots.

    Args:
        path: The file :func:`create` made.
        workers: Slots in it.
        index: This worker's slot.
    """

    def __init__(self, path: str, workers: int, index: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SLOT_BYTES * workers)
        finally:
            os.close(fd)
        self._all = struct.Struct(f"={workers}q")
        self._index = index
        self._offset = SLOT_BYTES * index
        #: What this slot held when this process started: a restarted worker's earlier incarnation
        #: acknowledged it, with ids that this process's generator does not follow.
        self._inherited: int = self._all.unpack_from(self._map, 0)[index]
        self._mine = self._inherited

    def newest(self) -> int:
        """The newest millisecond any worker has acknowledged (0 if none yet)."""
        slots: tuple[int, ...] = self._all.unpack_from(self._map, 0)
        return max(slots)

    def newest_elsewhere(self) -> int:
        """The newest millisecond another process acknowledged: the other workers, or this worker's
        earlier incarnation if it was restarted (0 if none yet)."""
        slots: list[int] = list(self._all.unpack_from(self._map, 0))
        slots[self._index] = self._inherited
        return max(slots)

    def acknowledged(self, ids: Iterable[str]) -> None:
        """This worker is about to answer ``201`` for ``ids``: publish their newest millisecond."""
        latest = max((sent_ms_of(MessageId(i)) for i in ids), default=0)
        if latest > self._mine:
            self._mine = latest
            struct.pack_into("=q", self._map, self._offset, latest)

    async def before_ids(self) -> None:
        """Return once this host's wall clock has left the newest millisecond another worker acknowledged.

        This worker's own acknowledgments need no wait: its next id is larger than every id it
        gave before (docs/protocol.md section 3).
        """
        boundary_ns = (self.newest_elsewhere() + 1) * 1_000_000
        for _ in range(100):  # bounded: a clock stepped back is docs/protocol.md section 11's business
            wait_ns = boundary_ns - time.time_ns()
            if wait_ns <= 0:
                return
            await asyncio.sleep(math.ceil(wait_ns / 1_000_000) / 1000)  # uvloop's timers count whole milliseconds


#: This process's slots when it is a worker of ``mq --processes N`` (set at its start), else None.
ACKED: AckedIds | None = None


async def before_ids() -> None:
    """A send is about to take its ids: wait out the newest acknowledged millisecond (workers only)."""
    if ACKED is not None:
        await ACKED.before_ids()


def acknowledged(ids: Iterable[str]) -> None:
    """A send is about to answer ``201`` for ``ids`` (workers only)."""
    if ACKED is not None:
        ACKED.acknowledged(ids)
