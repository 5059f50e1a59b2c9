"""In-memory index of a queue's ready messages, so a receive never lists a directory.

The index is a cache, never the truth: the truth is the set of files in
``queues/<queue>/``. An entry can be stale (another process took the file),
which costs one failed ``open``/``rename`` and lasts until the next inotify
event or periodic rescan drops it; a missing entry is found by the next
inotify event or periodic rescan. Pure data structure, no I/O.

Memory (issue 12: at most 200 bytes of mq's RSS per ready message at
1,000,000): a message is kept as its id, a 128-bit int (the UUIDv7's hex
digits), which is both the key of one dict and the element of one heap; the
dict's value packs the receive count and the stamp of the message's last
:meth:`ReadyIndex.add` into one int (``stamp << RC_BITS | rc``), and the
names of one batch (a listing) share one stamp and so, mostly, one value
object. About 100 bytes per message at 1,000,000 (docs/performance.md).
"""

from __future__ import annotations

import heapq
import random
import re
from collections.abc import Callable, Iterable
from itertools import compress, filterfalse, repeat

from mqcore.names import MAX_PARTITIONS

#: Most (partition, partitions) views an index keeps; the least recently used one is dropped beyond.
MAX_PARTITION_VIEWS = 16
#: Names (and ids) :meth:`IndexSnapshot.compare` handles between two calls of its ``pause``: about 1 ms of CPU.
COMPARE_CHUNK = 1024
#: Bits of a packed value that hold the receive count (``ID.RC``: RC is at most 9 digits < 2**30).
RC_BITS = 30
_RC_MASK = (1 << RC_BITS) - 1
#: The last 8 hex digits of an id (the partition rule of :func:`mqcore.names.partition_of`) are its low 32 bits.
_PARTITION_MASK = 0xFFFFFFFF
#: A message id (:func:`mqcore.names.parse_ready_name`'s rule), the one pattern the others below are made of.
_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
#: A ready file name ``ID.RC``.
_READY_RE = re.compile(_ID + r"\.(?:0|[1-9][0-9]{0,8})")
#: Ready names of receive count 0 among names joined by newlines (the id is the group), and the others.
_READY0_LINES = re.compile(rf"^({_ID})\.0$", re.M)
_READY_RC_LINES = re.compile(rf"^{_ID}\.[1-9][0-9]{{0,8}}$", re.M)
_ID_RE = re.compile(_ID)


def is_ready_name(name: str) -> bool:
    """Whether ``name`` is a ready file name ``ID.RC`` (docs/protocol.md; one regex, no allocation)."""
    return _READY_RE.fullmatch(name) is not None


def _id_int(message_id: str) -> int:
    """The 128-bit int of a canonical message id (36 characters; other text: ValueError, or a meaningless int)."""
    return int(message_id.replace("-", ""), 16)


def _parse(name: str) -> tuple[int, int] | None:
    """``(id as int, receive count)`` of a ready name, or None for any other name."""
    if _READY_RE.fullmatch(name) is None:
        return None
    return _id_int(name[:36]), int(name[37:])


def _name(mid: int, rc: int) -> str:
    """The ready file name ``ID.RC`` of an id int and a receive count."""
    h = f"{mid:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}.{rc}"


def _parse_chunk(names: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
    """The ready names among ``names``: the ids (ints) of those of receive count 0, and ``(id, count)`` of the others.

    One regex pass over the names joined by newlines and one ``int`` per id, all in C (a rescan's
    comparison of 1,000,000 names was 2-3 s of Python, name by name: issue 12); a chunk that holds a
    name with a newline in it (a foreign file) is parsed name by name.
    """
    blob = "\n".join(names)
    if blob.count("\n") != len(names) - 1:
        parsed = [p for p in map(_parse, names) if p is not None]
        return [mid for mid, rc in parsed if not rc], [(mid, rc) for mid, rc in parsed if rc]
    ids = _READY0_LINES.findall(blob)
    mids = list(map(int, "\n".join(ids).replace("-", "").split("\n"), repeat(16))) if ids else []
    if len(ids) == len(names):  # all of count 0 (the usual case)
        return mids, []
    return mids, [p for p in map(_parse, _READY_RC_LINES.findall(blob)) if p is not None]


class Listing:
    """The ready names of one directory listing, parsed once (on a worker thread) for :class:`ReadyIndex`.

    Most ready names of a listing have receive count 0 (never received), so
    the ids and the few other counts are kept apart: an index built from a
    listing then fills its dict with one ``dict.fromkeys`` (issue 12).

    Args:
        names: File names of a queue directory; names that are not ready
            names (``ID.RC``) are skipped.
    """

    __slots__ = ("mids", "rcs")

    def __init__(self, names: Iterable[str]) -> None:
        fullmatch = _READY_RE.fullmatch
        ready = [n for n in names if fullmatch(n) is not None]
        #: The id of each ready name, as an int, in listing order.
        self.mids: list[int] = [int(n[:36].replace("-", ""), 16) for n in ready]
        #: Position in :attr:`mids` -> receive count, for the names whose count is not 0.
        self.rcs: dict[int, int] = {}
        # Ids hold no ".", so ".0\n" ends a name of count 0: one count over the joined names
        # tells whether all are 0 (a fresh queue), cheaper than a test per name.
        if ready and "\n".join(ready).count(".0\n") + ready[-1].endswith(".0") != len(ready):
            self.rcs = {i: int(n[37:]) for i, n in enumerate(ready) if not n.endswith(".0")}

    @property
    def keys(self) -> list[int]:
        """``(id int << RC_BITS) | rc`` per ready name, in listing order."""
        rcs = self.rcs
        if not rcs:
            return [mid << RC_BITS for mid in self.mids]
        return [mid << RC_BITS | rcs.get(i, 0) for i, mid in enumerate(self.mids)]

    def __len__(self) -> int:
        return len(self.mids)


class ReadyIndex:
    """Ready-message file names of one queue (``ID.RC``), oldest first.

    Names sort by message id, and ids sort by send time, so popping the
    smallest name is FIFO (two names of one id, a stale one and its
    successor, come out by receive count). Removal is lazy:
    :meth:`discard` forgets a name and the heap drops it when it reaches the
    top, or on compaction.

    Every :meth:`add` stamps its name with a counter, so that a rescan can
    tell the names it may drop (noted before its listing started:
    :meth:`mark`, :meth:`drop_unlisted`) from those noted while it listed.

    Only ready names are held: :meth:`add` raises ValueError for any other
    name; ``in``, :meth:`discard` and :meth:`name_for` treat one as absent.
    """

    def __init__(self, names: Iterable[str] | Listing = ()) -> None:
        self._present: dict[int, int] = {}
        """Id int -> ``stamp << RC_BITS | rc`` of one indexed name of that id."""
        self._more: dict[int, dict[int, int]] = {}
        """Id int -> {rc: stamp} of further names of an id in ``_present`` (rare: a stale name and its successor)."""
        self._count = 0
        self._heap: list[int] = []
        """Id ints, a heap; each id in ``_present`` is in it at least once (lazy: absent ids are skipped)."""
        self._stamp = 0
        self._views: dict[tuple[int, int], list[int]] = {}
        """(partition, partitions) -> heap of the ids in that partition (lazy, like ``_heap``)."""
        self.rebuilds = 0
        """How many times ``_heap`` was built anew from the present ids (see :meth:`ids_below`)."""
        self.update(names)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, name: object) -> bool:
        parsed = _parse(name) if isinstance(name, str) else None
        if parsed is None:
            return False
        mid, rc = parsed
        value = self._present.get(mid)
        return value is not None and (value & _RC_MASK == rc or rc in self._more.get(mid, ()))

    def _bulk(self, listing: Listing) -> None:
        """Fill an empty index from a listing: one stamp for all, one ``dict.fromkeys``, one heapify (O(n))."""
        self._stamp += 1
        shared = self._stamp << RC_BITS
        mids = listing.mids
        present = dict.fromkeys(mids, shared)
        if len(present) == len(mids):  # one name per id (the usual case)
            values: dict[int, int] = {}  # one value object per receive count
            for i, rc in listing.rcs.items():
                value = values.get(rc)
                if value is None:
                    value = values[rc] = shared | rc
                present[mids[i]] = value
        else:  # an id listed twice (a stale name and its successor): name by name
            present = {}
            self._present = present
            for key in listing.keys:
                mid, rc = key >> RC_BITS, key & _RC_MASK
                if mid in present:
                    self._note(mid, rc, shared | rc)
                else:
                    present[mid] = shared if rc == 0 else shared | rc
        self._present = present
        self._count += len(present)
        self._rebuild_heap()
        self._views.clear()  # rebuilt from ``_present`` at their next use

    def add(self, name: str) -> None:
        """Note a ready file (idempotent; noting a present name again renews its stamp).

        Raises:
            ValueError: ``name`` is not a ready name ``ID.RC``.
        """
        parsed = _parse(name)
        if parsed is None:
            raise ValueError(f"not a ready file name: {name!r}")
        self._stamp += 1
        self._note(parsed[0], parsed[1], self._stamp << RC_BITS | parsed[1])

    def _rebuild_heap(self) -> None:
        """Build ``_heap`` anew from the present ids (drops the lazily removed ones; counted in :attr:`rebuilds`)."""
        self._heap = list(self._present)
        heapq.heapify(self._heap)
        self.rebuilds += 1

    def _note(self, mid: int, rc: int, value: int) -> None:
        """Index (or renew) the name ``mid.rc`` with the packed ``value`` (its stamp and ``rc``)."""
        old = self._present.get(mid)
        if old is None:
            self._present[mid] = value
            self._count += 1
            heapq.heappush(self._heap, mid)
            low = mid & _PARTITION_MASK
            for (partition, partitions), view in self._views.items():
                if low % partitions == partition:
                    heapq.heappush(view, mid)
        elif old & _RC_MASK == rc:
            self._present[mid] = value
        else:
            more = self._more.setdefault(mid, {})
            if rc not in more:
                self._count += 1
            more[rc] = value >> RC_BITS

    def update(self, names: Iterable[str] | Listing) -> None:
        """Note several ready files (a rescan's result): one stamp for them all (they are noted at one moment).

        Raises:
            ValueError: One of ``names`` is not a ready name (those before it are noted).
        """
        if isinstance(names, Listing):
            if not self._count:
                self._bulk(names)
                return
            self._stamp += 1
            shared = self._stamp << RC_BITS
            for key in names.keys:
                rc = key & _RC_MASK
                self._note(key >> RC_BITS, rc, shared | rc)
            return
        self._stamp += 1
        shared = self._stamp << RC_BITS
        for name in names:
            parsed = _parse(name)
            if parsed is None:
                raise ValueError(f"not a ready file name: {name!r}")
            self._note(parsed[0], parsed[1], shared | parsed[1])

    def discard(self, name: str) -> bool:
        """Forget a file that left the queue (received, deleted, moved); any other name is ignored.

        Returns:
            True if ``name`` was indexed (``name in index`` before the call).
        """
        try:  # most names that leave were popped first (this daemon's own leases): no id of theirs is indexed
            if _id_int(name[:36]) not in self._present:
                return False  # nothing of that id indexed: nothing to forget, whatever the name is (no regex)
        except ValueError:
            return False  # not even hex where an id's digits stand: not a ready name
        parsed = _parse(name)  # the id is indexed: the name must be a ready name, checked as before
        gone = parsed is not None and self._forget(*parsed)
        if len(self._heap) > 2 * len(self._present) + 1024:
            self._rebuild_heap()
        return gone

    def _forget(self, mid: int, rc: int) -> bool:
        """Forget the name ``mid.rc`` if indexed; whether it was."""
        value = self._present.get(mid)
        if value is None:
            return False
        more = self._more.get(mid)
        if value & _RC_MASK == rc:
            if more:
                other, stamp = more.popitem()
                self._present[mid] = stamp << RC_BITS | other
            else:
                del self._present[mid]
        elif more and rc in more:
            del more[rc]
        else:
            return False
        if more is not None and not more:
            del self._more[mid]
        self._count -= 1
        return True

    def mark(self) -> int:
        """A point in the index's history, to take just before a listing starts (see :meth:`drop_unlisted`)."""
        return self._stamp

    def drop_unlisted(self, mark: int, listed: Iterable[str] | Listing) -> list[str]:
        """Forget the names noted up to ``mark`` that a listing started after ``mark`` did not find.

        Such a name left the directory behind this process's back (another
        host took it: inotify sees nothing over NFS). A name noted after
        ``mark`` stays even if the listing missed it: it may have arrived
        after the listing read that part of the directory. O(n).

        Returns:
            The names forgotten.
        """
        seen = set(listed.keys if isinstance(listed, Listing) else Listing(listed).keys)
        gone: list[tuple[int, int]] = []
        for mid, value in self._present.items():
            rc = value & _RC_MASK
            if value >> RC_BITS <= mark and (mid << RC_BITS | rc) not in seen:
                gone.append((mid, rc))
        for mid, more in self._more.items():
            gone.extend((mid, rc) for rc, stamp in more.items() if stamp <= mark and (mid << RC_BITS | rc) not in seen)
        for mid, rc in gone:
            self._forget(mid, rc)
        if len(self._heap) > 2 * len(self._present) + 1024:
            self._rebuild_heap()
        return [_name(mid, rc) for mid, rc in gone]

    def snapshot(self) -> IndexSnapshot:
        """The index as it is now, to compare with a listing off the event loop (see :class:`IndexSnapshot`).

        Copies the id table (a ``dict.copy``: milliseconds at 1,000,000 names, no
        name built); a :meth:`mark` is taken with it.
        """
        return IndexSnapshot(self._stamp, self._present.copy(), {mid: dict(m) for mid, m in self._more.items()})

    def apply_rescan(self, diff: RescanDiff) -> list[str]:
        """Bring the index in line with a listing compared by :meth:`IndexSnapshot.compare` (event loop).

        The same outcome as :meth:`drop_unlisted` with the snapshot's mark and then
        :meth:`update` with the listing, but in time proportional to the
        differences, not to the queue: a name of the snapshot the listing did
        not find is forgotten unless it was noted again after the snapshot; a
        listed name the snapshot did not hold is noted (one stamp for them all).
        The names listed and already held keep their stamps (no later rescan
        tells them apart: each takes a new mark).

        Returns:
            The names forgotten.
        """
        gone: list[tuple[int, int]] = []
        present, more = self._present, self._more
        mark = diff.mark
        for mid, rc in diff.unlisted:
            value = present.get(mid)
            if value is None:
                continue
            stamp = value >> RC_BITS if value & _RC_MASK == rc else more.get(mid, {}).get(rc, mark + 1)
            if stamp <= mark:
                gone.append((mid, rc))
        for mid, rc in gone:
            self._forget(mid, rc)
        if len(self._heap) > 2 * len(present) + 1024:
            self._rebuild_heap()
        if diff.new:
            self._stamp += 1
            shared = self._stamp << RC_BITS
            for mid, rc in diff.new:
                self._note(mid, rc, shared | rc)
        return [_name(mid, rc) for mid, rc in gone]

    def pop_oldest(self) -> str | None:
        """Remove and return the oldest name, or None when empty. O(log n) amortised."""
        return self._pop_present(self._heap)

    def pop_oldest_in(self, partition: int, partitions: int) -> str | None:
        """Remove and return the oldest name whose message is in ``partition`` of ``partitions``, or None.

        SMQ's batches: :func:`mqcore.names.partition_of` decides (the id's
        last 8 hex digits, its low 32 bits, modulo ``partitions``). The first
        call for a ``(partition, partitions)`` pair builds its view in O(n);
        later ones are O(log n) amortised. At most
        :data:`MAX_PARTITION_VIEWS` views are kept.

        Raises:
            ValueError: ``partitions`` is not 1 to :data:`mqcore.names.MAX_PARTITIONS`.
        """
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be 1-{MAX_PARTITIONS}, got {partitions}")
        key = (partition, partitions)
        view = self._views.pop(key, None)
        present = self._present
        if view is None or len(view) > 2 * len(present) + 1024:
            view = [mid for mid in present if (mid & _PARTITION_MASK) % partitions == partition]
            heapq.heapify(view)
        self._views[key] = view  # most recently used last
        while len(self._views) > MAX_PARTITION_VIEWS:
            del self._views[next(iter(self._views))]
        return self._pop_present(view)

    def _lowest_rc(self, mid: int, value: int) -> int:
        rc = value & _RC_MASK
        more = self._more.get(mid)
        return min(rc, *more) if more else rc

    def _pop_present(self, heap: list[int]) -> str | None:
        """Pop ``heap`` to its first id still present, forget that id's oldest name and return it (None if none is)."""
        present = self._present
        while heap:
            mid = heapq.heappop(heap)
            value = present.get(mid)
            if value is not None:
                rc = self._lowest_rc(mid, value)
                self._forget(mid, rc)
                if mid in present:
                    heapq.heappush(heap, mid)  # its other name stays reachable from this heap
                return _name(mid, rc)
        return None

    def peek_oldest(self) -> str | None:
        """The oldest name without removing it, or None when empty. O(log n) amortised (drops stale tops)."""
        heap, present = self._heap, self._present
        while heap:
            value = present.get(heap[0])
            if value is not None:
                return _name(heap[0], self._lowest_rc(heap[0], value))
            heapq.heappop(heap)
        return None

    def oldest_sent_ms(self) -> int | None:
        """Send time (epoch ms, the id's first 48 bits) of :meth:`peek_oldest`'s message, or None when empty.

        No name is built or parsed: ``GET /metrics`` asks this of every indexed queue.
        """
        heap, present = self._heap, self._present
        while heap:
            if present.get(heap[0]) is not None:
                return heap[0] >> 80
            heapq.heappop(heap)
        return None

    def name_for(self, message_id: str) -> str | None:
        """The ready file name (``ID.RC``) of ``message_id``, if indexed."""
        if _ID_RE.fullmatch(message_id) is None:
            return None
        mid = _id_int(message_id)
        value = self._present.get(mid)
        return None if value is None else _name(mid, value & _RC_MASK)

    def ids_below(self, message_id: str) -> list[tuple[str, str | None]]:
        """The ids in the pop order's heap below ``message_id``, oldest first, each with its ready name if indexed.

        A pop in id order (:meth:`pop_oldest`) takes every id below the one it returns off the
        heap, and removal is lazy, so right after a receive popped past an id, the heap's ids
        below it are those indexed since: still ready (with their name), or indexed and gone
        again (name None: a rename into the queue and out of it, both read since). A FIFO
        receive asks this after its group check (docs/protocol.md 19.3, step 4). A rebuild of the
        heap (:attr:`rebuilds`) forgets the ids gone again: a caller that needs them compares
        :attr:`rebuilds` before and after. O(k) for k ids below.

        Args:
            message_id: A message id (UUIDv7 text).
        Raises:
            ValueError: ``message_id`` is not a message id.
        """
        if _ID_RE.fullmatch(message_id) is None:
            raise ValueError(f"not a message id: {message_id!r}")
        limit, heap, present = _id_int(message_id), self._heap, self._present
        found: set[int] = set()
        stack = [0] if heap else []
        while stack:  # a heap's children are never smaller: descend only below the limit
            i = stack.pop()
            if i < len(heap) and heap[i] < limit:
                found.add(heap[i])
                stack += (2 * i + 1, 2 * i + 2)
        out: list[tuple[str, str | None]] = []
        for mid in sorted(found):
            value = present.get(mid)
            name = _name(mid, self._lowest_rc(mid, value) if value is not None else 0)
            out.append((name[:36], name if value is not None else None))
        return out

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


class RescanDiff:
    """What a listing holds that an :class:`IndexSnapshot` did not, and the reverse (:meth:`ReadyIndex.apply_rescan`).

    Attributes:
        mark: The snapshot's :meth:`ReadyIndex.mark`.
        new: ``(id int, receive count)`` of each listed ready name the snapshot did not hold.
        unlisted: ``(id int, receive count)`` of each name of the snapshot the listing did not find.
    """

    __slots__ = ("mark", "new", "unlisted")

    def __init__(self, mark: int, new: list[tuple[int, int]], unlisted: list[tuple[int, int]]) -> None:
        self.mark = mark
        self.new = new
        self.unlisted = unlisted


class IndexSnapshot:
    """A copy of a :class:`ReadyIndex`'s ids taken on the event loop, compared with a listing on a worker thread.

    A periodic rescan of a queue of 1,000,000 ready messages used to compare
    the listing with the live index on the event loop (``drop_unlisted``, then
    ``update`` of every listed name: over a second of CPU in which nothing
    else was served; issue 12, docs/performance.md "Draining 1,000,000
    messages"). The comparison needs only this copy, so it runs beside the
    loop; the loop then applies the differences (:meth:`ReadyIndex.apply_rescan`).

    Args:
        mark: The index's :meth:`ReadyIndex.mark` when the copy was taken.
        present: Copy of the index's id table (id int -> packed stamp and receive count).
        more: Copy of its further names per id (id int -> {receive count: stamp}).
    """

    __slots__ = ("mark", "more", "present")

    def __init__(self, mark: int, present: dict[int, int], more: dict[int, dict[int, int]]) -> None:
        self.mark = mark
        self.present = present
        self.more = more

    def compare(
        self, names: list[str], pause: Callable[[], object] | None = None, chunk: int = COMPARE_CHUNK
    ) -> RescanDiff:
        """The ready names among ``names`` (a directory listing) that this snapshot does not hold, and the
        reverse (any thread; no I/O). O(n).

        Args:
            names: The file names of the queue's directory; names that are not ready names are skipped.
            pause: Called between chunks of ``chunk`` names (and of the snapshot's ids). The daemon
                passes a sleep of 2 ms: a thread that holds the GIL long makes every other thread that
                comes back from a system call (the fetchers' leases, the remover's renames) wait up to
                the interpreter's switch interval (5 ms) for it, each time: the drain ran at a tenth of
                its rate for the rescan's seconds (issue 12, docs/performance.md "Draining 1,000,000
                messages"). Each chunk is parsed and compared by C loops (a regex over the names joined,
                ``int``, set operations), not name by name in Python: about 0.2 s of CPU at 1,000,000
                names instead of 2-3 s (docs/performance.md "The drain after a restart").
            chunk: Names (and snapshot ids) between two pauses.
        """
        present, more = self.present, self.more
        if len(names) <= chunk and len(present) <= chunk:
            pause = None  # a small queue (most of them) is compared without a pause
        listed0: set[int] = set()  # ids listed with receive count 0 (nearly all)
        listed_rc: set[tuple[int, int]] = set()
        new: list[tuple[int, int]] = []
        no_more: dict[int, int] = {}
        for start in range(0, len(names), chunk):
            if pause is not None:
                pause()
            mids, others = _parse_chunk(names[start : start + chunk])
            listed0.update(mids)
            new.extend((mid, 0) for mid in filterfalse(present.__contains__, mids))  # absent from the snapshot
            for mid, rc in others:  # listed with a count > 0 (redelivered): rare
                listed_rc.add((mid, rc))
                value = present.get(mid)
                if value is None or (value & _RC_MASK != rc and rc not in more.get(mid, no_more)):
                    new.append((mid, rc))
        keys, values = list(present), list(present.values())
        unlisted0: list[int] = []  # ids of the snapshot not listed with count 0
        nonzero: list[int] = []  # ids of the snapshot held with a count > 0 (few)
        for start in range(0, len(keys), chunk):
            if pause is not None:
                pause()
            end = start + chunk
            unlisted0.extend(filterfalse(listed0.__contains__, keys[start:end]))
            nonzero.extend(compress(keys[start:end], map(_RC_MASK.__and__, values[start:end])))
        held_rc = set(nonzero)
        unlisted = [(mid, 0) for mid in unlisted0 if mid not in held_rc]
        for mid in nonzero:
            rc = present[mid] & _RC_MASK
            if (mid, rc) not in listed_rc:
                unlisted.append((mid, rc))
            if mid in listed0 and 0 not in more.get(mid, no_more):  # listed with count 0, held with another
                new.append((mid, 0))
        for mid, extra in more.items():
            unlisted.extend((mid, rc) for rc in extra if ((mid, rc) not in listed_rc if rc else mid not in listed0))
        return RescanDiff(self.mark, new, unlisted)
