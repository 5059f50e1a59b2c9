"""Which indexed queues a change check on a shared filesystem looks at, tick by tick (issue 12/15, stop 20).

On a shared filesystem inotify sees nothing of other hosts, so ``QueueStates.check_tick``
(daemons/_queues.py) ``stat`` s queue directories every ``CHANGE_CHECK_SECONDS`` to find their
changes. Checking every indexed queue at every tick does not scale: a ``stat`` through GlusterFS's
FUSE client took ~2 ms here, with about as much CPU in the client and bricks, so 1,000 idle queues
kept about a core busy and the ticks came seconds apart (docs/performance.md, "Many queues on a
shared filesystem"). :class:`CheckTurns` picks a bounded set per tick instead.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

from mqcore.names import QueueName

#: The periodic rescan lists an unchanged queue once in this many rescans (its turn: crc32 of its name; 5 min at 10 s).
FULL_RESCAN_TURNS = 30
#: Most queue directories one change check ``stat``s besides the queues checked at every tick (waited on, or
#: changed lately): the others take turns, so an idle queue nobody waits on is checked at least every
#: ``ceil(idle queues / CHANGE_CHECK_BATCH)`` ticks (1,000 queues: 100 ticks, >= 5 s; 10,000: >= 50 s).
CHANGE_CHECK_BATCH = 10
#: A queue whose directory changed less than this many seconds ago is checked at every tick (it may change again).
CHANGE_HOT_SECONDS = 10.0


class CheckTurns:
    """The queues due at each change check. Event-loop thread only.

    Due at every tick: the queues someone waits on (a long poll, or a send under a capacity: another
    host's send then reaches a waiting receive within about one tick plus the filesystem's own delay,
    however many queues are indexed) and those a check found changed, or a receive found empty
    (:meth:`asked`), in the last :data:`CHANGE_HOT_SECONDS`. The others take turns: the next
    :data:`CHANGE_CHECK_BATCH` of a round over every indexed queue (listed when the last round ended).
    """

    def __init__(self) -> None:
        #: Loop time at which a check last found each queue's directory changed.
        self._hot: dict[QueueName, float] = {}
        #: The indexed queues as of the start of the current round, and the next one's position in it.
        self._round: list[QueueName] = []
        self._round_at = 0
        #: The periodic rescan's turn, 0 to FULL_RESCAN_TURNS - 1 (:meth:`next_relist`).
        self._relist_turn = 0

    def next_relist(self) -> Callable[[QueueName], bool]:
        """Whether a queue is listed, changed or not, at this periodic rescan: one rescan in
        :data:`FULL_RESCAN_TURNS` lists it (its turn: the crc32 of its name). Called once per rescan."""
        self._relist_turn = turn = (self._relist_turn + 1) % FULL_RESCAN_TURNS
        return lambda queue: zlib.crc32(queue.encode()) % FULL_RESCAN_TURNS == turn

    def pick(self, now: float, waited: Iterable[QueueName], indexed: Callable[[], list[QueueName]]) -> list[QueueName]:
        """The queues to check at loop time ``now`` (s): ``waited`` first, then the busy ones, then the next turns.

        Args:
            now: The event loop's time, seconds.
            waited: Queues a request waits on.
            indexed: Returns every indexed queue (called when a round ends).
        """
        chosen = dict.fromkeys(waited)
        for queue, at in list(self._hot.items()):
            if now - at > CHANGE_HOT_SECONDS:
                del self._hot[queue]
            else:
                chosen[queue] = None
        if self._round_at >= len(self._round):
            self._round, self._round_at = indexed(), 0
        end = self._round_at + CHANGE_CHECK_BATCH
        chosen.update(dict.fromkeys(self._round[self._round_at : end]))
        self._round_at = end
        return list(chosen)

    def changed(self, queue: QueueName, now: float) -> None:
        """A check found ``queue``'s directory changed at loop time ``now``: check it at every tick for a while."""
        self._hot[queue] = now

    def asked(self, queue: QueueName, now: float) -> None:
        """A receive found ``queue`` empty at loop time ``now``: check it at every tick for a while, as a changed one.

        A short-polling consumer then sees another host's send within about one tick of its next poll (not a
        whole round of turns: 50 s at 10,000 queues) while it keeps polling at least every
        :data:`CHANGE_HOT_SECONDS`.
        """
        self._hot[queue] = now

    def forget(self, queue: QueueName) -> None:
        """``queue`` is no longer indexed."""
        self._hot.pop(queue, None)
