"""The ready names this daemon's own sends publish into watched queues, so that each is indexed once and no
inotify read is needed on the send's path.

A send renames ``new/Q.ID`` into ``queues/Q/ID.0``; inotify then queues an arrival for that name, and the
send's answer (on the event loop) tells :class:`daemons._queues.QueueStates` the same name through
``note_ready``. Either may come first: the loop reads events in windows (``WATCH_WINDOW_SECONDS``), and a
window can end between the rename and the answer. Indexing the name from both would bring back a name that
a receive leased in between (a stale entry counted as ready until a rescan); so before stop 18
``note_ready`` read the inotify descriptor itself and took the names from the events: one ``read`` per
send and the loop's GIL handed to the saver threads at each (18 % of the loop during batch sends,
docs/performance.md). Here the savers mark each name *pending* before its rename, and whichever of the
two the loop meets first indexes it and marks it *seen* (event first) or *noted* (answer first); the
second one drops the mark and changes nothing. The events are still read, but only in the windows.

Only the loop thread moves a name from pending on; a saver thread adds pending names (before their
renames) and removes those whose rename failed (no event comes for them). Single ``dict`` operations,
atomic under the GIL: no lock. A name whose answer never comes (its directory fsync failed: the send
failed, the file may stay) keeps its mark until :data:`OWN_NAMES_MAX` marks make the loop drop the oldest
half; a name the loop does not know (dropped, or published by another path: a change of visibility, a
redrive, a FIFO send) makes ``note_ready`` read the events as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

#: Marks kept before the loop drops the oldest half (names whose send failed after its rename, or whose
#: queue stopped being watched; ~100 bytes each).
OWN_NAMES_MAX = 65_536
#: A name's marks: its rename is done or coming, neither its event nor its answer reached the loop yet;
#: its event was applied (indexed); its answer was (indexed by ``note_ready``).
PENDING, SEEN, NOTED = 0, 1, 2


class _Index(Protocol):
    def add(self, name: str) -> None: ...


class OwnNames:
    """Marks of the ready names this daemon's savers publish (see the module's docstring)."""

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def expect(self, names: Iterable[str]) -> None:
        """Mark ``names`` pending: their renames into a watched queue follow (any thread, before the renames)."""
        marks = self._marks
        for name in names:
            marks[name] = PENDING

    def drop(self, names: Iterable[str]) -> None:
        """Forget ``names`` (any thread): their renames failed, or the loop indexes them another way."""
        marks = self._marks
        for name in names:
            marks.pop(name, None)

    def arrived(self, name: str) -> bool:
        """An inotify arrival of ``name`` (loop thread): True if the caller must index it, False if it is done.

        False only for a name :meth:`noted` indexed already (the mark is dropped); a name of ours
        still pending is marked seen and indexed by the caller; any other name is not ours.
        """
        if self.settled(name):
            return False
        if name in self._marks:
            self._marks[name] = SEEN
        return True

    def settled(self, name: str) -> bool:
        """An inotify arrival of ``name`` (loop thread): True if it is done, as :meth:`arrived`'s False
        (a name :meth:`noted` indexed already: the mark is dropped). False for any other name, its mark
        left as it was (the caller then goes through :meth:`arrived`). The common case at one client:
        each of the daemon's own sends meets its event here, after its answer, in the next window."""
        if self._marks.get(name) == NOTED:
            del self._marks[name]
            return True
        return False

    def noted(self, names: tuple[str, ...], index: _Index) -> bool:
        """The send that published ``names`` was answered (loop thread): index those whose event has not come.

        Args:
            names: The ready names the send made (its renames and their directory fsync are done).
            index: The queue's ready index.
        Returns:
            False if any name was not marked (the caller reads the events to find it, as before).
        """
        marks = self._marks
        known = True
        for name in names:
            mark = marks.pop(name, None)
            if mark == PENDING:
                index.add(name)
                marks[name] = NOTED  # its event, still to be read, changes nothing
            elif mark is None:
                known = False
        if len(marks) > OWN_NAMES_MAX:
            self._trim()
        return known

    def _trim(self) -> None:
        """Drop the oldest half of the marks (loop thread). A dropped noted name's late event indexes it
        again: only if inotify is OWN_NAMES_MAX names behind, which the windows never are."""
        marks = self._marks
        oldest = list(marks)[: len(marks) // 2]  # one C-level copy: savers may add meanwhile
        for name in oldest:
            marks.pop(name, None)

    def __len__(self) -> int:
        return len(self._marks)
