"""In-memory index of a queue's ready messages, so a receive never lists a directory.

The index is a cache, never the truth: the truth is the set of files in
``queues/<queue>/``. An entry can be stale (another process took the file),
which costs one failed ``open``/``rename`` and lasts until the next inotify
event or periodic rescan drops it; a missing entry is found by the next
inotify event or periodic rescan. Pure data structure, no I/O.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable

from mqcore.names import partition_of

#: Most (partition, partitions) views an index keeps; the least recently used one is dropped beyond.
MAX_PARTITION_VIEWS = 16


class ReadyIndex:
    """Ready-message file names of one queue (``ID.RC``), oldest first.

    Names sort by message id, and ids sort by send time, so popping the
    smallest name is FIFO. Removal is lazy: :meth:`discard` forgets a name and
    the heap drops it when it reaches the top, or on compaction.

    Every :meth:`add` stamps its name with a counter, so that a rescan can
    tell the names it may drop (noted before its listing started:
    :meth:`mark`, :meth:`drop_unlisted`) from those noted while it listed.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._present: dict[str, int] = {}
        """Indexed name -> stamp of its last :meth:`add`."""
        self._by_id: dict[str, str] = {}
        self._heap: list[str] = []
        self._stamp = 0
        self._views: dict[tuple[int, int], list[str]] = {}
        """(partition, partitions) -> heap of the names in that partition (lazy, like ``_heap``)."""
        self.update(names)

    def __len__(self) -> int:
        return len(self._present)

    def __contains__(self, name: object) -> bool:
        return name in self._present

    def add(self, name: str) -> None:
        """Note a ready file (idempotent; noting a present name again renews its stamp)."""
        self._stamp += 1
        if name not in self._present:
            message_id = name.partition(".")[0]
            self._by_id[message_id] = name
            heapq.heappush(self._heap, name)
            for (partition, partitions), view in self._views.items():
                if partition_of(message_id, partitions) == partition:
                    heapq.heappush(view, name)
        self._present[name] = self._stamp

    def update(self, names: Iterable[str]) -> None:
        """Note several ready files (a rescan's result)."""
        for name in names:
            self.add(name)

    def discard(self, name: str) -> None:
        """Forget a file that left the queue (received, deleted, moved)."""
        if name in self._present:
            self._forget(name)
        if len(self._heap) > 2 * len(self._present) + 1024:
            self._heap = list(self._present)
            heapq.heapify(self._heap)

    def mark(self) -> int:
        """A point in the index's history, to take just before a listing starts (see :meth:`drop_unlisted`)."""
        return self._stamp

    def drop_unlisted(self, mark: int, listed: Iterable[str]) -> list[str]:
        """Forget the names noted up to ``mark`` that a listing started after ``mark`` did not find.

        Such a name left the directory behind this process's back (another
        host took it: inotify sees nothing over NFS). A name noted after
        ``mark`` stays even if the listing missed it: it may have arrived
        after the listing read that part of the directory. O(n).

        Returns:
            The names forgotten.
        """
        seen = listed if isinstance(listed, set | frozenset) else set(listed)
        gone = [name for name, stamp in self._present.items() if stamp <= mark and name not in seen]
        for name in gone:
            self.discard(name)
        return gone

    def pop_oldest(self) -> str | None:
        """Remove and return the oldest name, or None when empty. O(log n) amortised."""
        return self._pop_present(self._heap)

    def pop_oldest_in(self, partition: int, partitions: int) -> str | None:
        """Remove and return the oldest name whose message is in ``partition`` of ``partitions``, or None.

        SMQ's batches: :func:`mqcore.names.partition_of` decides. The first
        call for a ``(partition, partitions)`` pair builds its view in O(n);
        later ones are O(log n) amortised. At most
        :data:`MAX_PARTITION_VIEWS` views are kept.
        """
        key = (partition, partitions)
        view = self._views.pop(key, None)
        present = self._present
        if view is None or len(view) > 2 * len(present) + 1024:
            view = [n for n in present if partition_of(n.partition(".")[0], partitions) == partition]
            heapq.heapify(view)
        self._views[key] = view  # most recently used last
        while len(self._views) > MAX_PARTITION_VIEWS:
            del self._views[next(iter(self._views))]
        return self._pop_present(view)

    def _pop_present(self, heap: list[str]) -> str | None:
        """Pop ``heap`` down to its first name still present, forget that name and return it (None if none is)."""
        while heap:
            name = heapq.heappop(heap)
            if name in self._present:
                self._forget(name)
                return name
        return None

    def peek_oldest(self) -> str | None:
        """The oldest name without removing it, or None when empty. O(log n) amortised (drops stale tops)."""
        heap, present = self._heap, self._present
        while heap:
            if heap[0] in present:
                return heap[0]
            heapq.heappop(heap)
        return None

    def name_for(self, message_id: str) -> str | None:
        """The ready file name (``ID.RC``) of ``message_id``, if indexed."""
        return self._by_id.get(message_id)

    def _forget(self, name: str) -> None:
        del self._present[name]
        mid = name.partition(".")[0]
        if self._by_id.get(mid) == name:
            del self._by_id[mid]

    def pop_fuzzed(self, peers: int, rng: random.Random | None = None) -> str | None:
        """Remove and return a name chosen at random among the oldest ``peers + 1``.

        SoftLayer MQ's peer fuzz: several daemons sharing a root contend less
        when each picks among the first few messages instead of all taking the
        first. With ``peers == 0`` this is :meth:`pop_oldest` (strict FIFO).
        """
        if peers <= 0:
            return self.pop_oldest()
        taken: list[str] = []
        for _ in range(peers + 1):
            name = self.pop_oldest()
            if name is None:
                break
            taken.append(name)
        if not taken:
            return None
        chosen = (rng or random).choice(taken)
        for name in taken:
            if name is not chosen:
                self.add(name)
        return chosen
