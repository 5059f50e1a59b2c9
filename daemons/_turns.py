"""Which indexed queues a change check on a shared filesystem looks at, tick by tick (issue 12/15, stops 20 and 27).

On a shared filesystem inotify sees nothing of other hosts, so ``QueueStates.check_tick``
(daemons/_queues.py) ``stat`` s queue directories every ``CHANGE_CHECK_SECONDS`` to find their
changes. A ``stat`` through GlusterFS's FUSE client with the kernel caches off is a lookup of every
path component on every brick: ~2 ms and about as much CPU in the client and bricks here, so checking
every indexed queue at every tick kept a core busy at 1,000 idle queues (stop 20), and six idle
queues on three hosts kept GlusterFS at 84 % of a core (stop 26; docs/performance.md). :class:`CheckTurns`
checks at every tick only the queues someone waits on or whose last check found a change; a queue
whose checks find nothing backs off, its gap doubling up to :data:`QUIET_CHECK_SECONDS`, at most
:data:`CHANGE_CHECK_BATCH` such checks a tick. A receive that finds a queue empty checks its stamp
itself (``daemons._queues.recheck``), so a consumer never waits for a quiet queue's turn.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable, Iterable

from mqcore.names import QueueName

#: The periodic rescan lists an unchanged queue once in this many rescans (its turn: crc32 of its name; 5 min at 10 s).
FULL_RESCAN_TURNS = 30
#: Most quiet queues one change check ``stat``s besides the queues checked at every tick (waited on, or found
#: changed at their last check): with many queues the gaps stretch to ``ceil(quiet queues / CHANGE_CHECK_BATCH)``
#: ticks (1,000 queues: 100 ticks, >= 5 s; 10,000: >= 50 s) instead of the stat rate growing with them.
CHANGE_CHECK_BATCH = 10
#: Longest gap (s) between two change checks of a queue nobody waits on whose checks keep finding nothing (its gap
#: doubles from one tick at each such check; a change brings it back to one tick). Each idle indexed queue costs
#: a ``stat`` per this many seconds per host (docs/cluster.md).
QUIET_CHECK_SECONDS = 8.0


class CheckTurns:
    """The queues due at each change check. Event-loop thread only.

    Due at every tick: the queues someone waits on (a long poll, or a send under a capacity: another
    host's send then reaches a waiting receive within about one tick plus the filesystem's own delay,
    however many queues are indexed) and those whose last check found their directory changed. Every
    other indexed queue is checked when its gap has passed, the most overdue first, at most
    :data:`CHANGE_CHECK_BATCH` a tick: its gap starts at one tick after a change and doubles at each
    check up to :data:`QUIET_CHECK_SECONDS`.

    Args:
        tick: Seconds between change checks (``CHANGE_CHECK_SECONDS``): the shortest gap.
    """

    def __init__(self, tick: float) -> None:
        self._tick = tick
        #: Queues whose last check found their directory changed: checked at the next tick.
        self._changed: set[QueueName] = set()
        #: Each known quiet queue's gap (s) and the loop time its next check is due; the heap of (due, queue).
        self._gap: dict[QueueName, float] = {}
        self._due: dict[QueueName, float] = {}
        self._heap: list[tuple[float, QueueName]] = []
        #: Loop time each queue's stamp was last checked (by a tick whose checks are done, or :meth:`checking`).
        self._checked: dict[QueueName, float] = {}
        #: The last tick's loop time and queues: their checks (and rescans) are done when the next tick picks.
        self._last: tuple[float, list[QueueName]] = (0.0, [])
        #: Loop time at which the indexed queues are next looked up (new ones join the turns).
        self._lookup_at = float("-inf")
        #: The periodic rescan's turn, 0 to FULL_RESCAN_TURNS - 1 (:meth:`next_relist`).
        self._relist_turn = 0

    def next_relist(self) -> Callable[[QueueName], bool]:
        """Whether a queue is listed, changed or not, at this periodic rescan: one rescan in
        :data:`FULL_RESCAN_TURNS` lists it (its turn: the crc32 of its name). Called once per rescan."""
        self._relist_turn = turn = (self._relist_turn + 1) % FULL_RESCAN_TURNS
        return lambda queue: zlib.crc32(queue.encode()) % FULL_RESCAN_TURNS == turn

    def _schedule(self, queue: QueueName, gap: float, now: float) -> None:
        self._gap[queue] = gap
        self._due[queue] = due = now + gap
        heapq.heappush(self._heap, (due, queue))

    def pick(self, now: float, waited: Iterable[QueueName], indexed: Callable[[], list[QueueName]]) -> list[QueueName]:
        """The queues to check at loop time ``now`` (s): ``waited`` first, then the changed ones, then the quiet
        ones whose gap has passed (at most :data:`CHANGE_CHECK_BATCH`); each of the latter gets its next gap.

        Args:
            now: The event loop's time, seconds.
            waited: Queues a request waits on.
            indexed: Returns every indexed queue (called at most every :data:`QUIET_CHECK_SECONDS`: a queue
                indexed since joins the turns, due at once; one no longer indexed leaves them).
        """
        at, last = self._last
        for queue in last:
            if queue in self._due:  # still indexed
                self._checked[queue] = at
        chosen = dict.fromkeys(waited)
        chosen.update(dict.fromkeys(self._changed))
        self._changed.clear()
        if now >= self._lookup_at:
            self._lookup_at = now + QUIET_CHECK_SECONDS
            queues = set(indexed())
            for queue in [q for q in self._due if q not in queues]:
                self.forget(queue)
            for queue in queues.difference(self._due):
                self._schedule(queue, 0.0, now)
        heap, taken = self._heap, 0
        while heap and heap[0][0] <= now and taken < CHANGE_CHECK_BATCH:
            due, queue = heapq.heappop(heap)
            if self._due.get(queue) != due:
                continue  # rescheduled or forgotten since
            if queue not in chosen:
                chosen[queue] = None
                taken += 1
            self._schedule(queue, min(max(2 * self._gap[queue], self._tick), QUIET_CHECK_SECONDS), now)
        self._last = (now, list(chosen))
        return self._last[1]

    def changed(self, queue: QueueName, now: float) -> None:
        """A check found ``queue``'s directory changed at loop time ``now``: check it at the next tick, and its
        gap starts again at one tick (it may change again: a busy queue is checked at every tick)."""
        self._changed.add(queue)
        if queue in self._due:
            self._schedule(queue, self._tick, now)

    def checked_within(self, queue: QueueName, now: float) -> bool:
        """Whether a check of ``queue``'s stamp started less than one tick before loop time ``now``: by
        :meth:`checking`, or by a tick whose checks are done (the next tick picked since: while a tick's
        ``stat`` or listing is under way, a receive checks the queue itself rather than miss what it finds)."""
        return now - self._checked.get(queue, float("-inf")) < self._tick

    def checking(self, queue: QueueName, now: float) -> None:
        """``queue``'s stamp is checked at loop time ``now`` outside the ticks (``daemons._queues.recheck``)."""
        self._checked[queue] = now

    def forget(self, queue: QueueName) -> None:
        """``queue`` is no longer indexed (its heap entry is skipped when it comes up)."""
        self._changed.discard(queue)
        self._gap.pop(queue, None)
        self._due.pop(queue, None)
        self._checked.pop(queue, None)
