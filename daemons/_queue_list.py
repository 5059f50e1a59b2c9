"""The ``mq`` daemon's sorted list of queue names, listed once and kept while ``queues/`` is unchanged.

``GET /`` and SQS ListQueues listed ``queues/`` on every request (one
``scandir``, a name check per entry, a sort): 2.4-9x slower at 1,000 queues
than at 10 (issue 12). :class:`QueueNames` keeps the sorted list with the
directory's change stamp (:func:`mqcore.fsinfo.dir_stamp`: one ``stat``) and
lists again only when the stamp changed, which any process or host creating
or deleting a queue causes (POSIX: a directory's mtime changes with each
entry added or removed, docs/protocol.md section 13). A stamp that is not
settled (:func:`mqcore.fsinfo.settled_dir_stamp`) could hide a later change,
so the list is not kept then (the one rule of every stamp-keyed cache in mq).

A page of ``GET /`` (at most 1,000 names, ~21 KB of JSON) is encoded once per
version of the list and answered as a copy of those bytes while the list is
unchanged (:meth:`QueueNames.page_json`): at 10,000 queues, encoding the page
was most of what a ``GET /`` cost beyond one with 10 queues (issue 12).
"""

from __future__ import annotations

import bisect
import json
import threading

from mqcore.fsinfo import settled_dir_stamp
from mqcore.names import QueueName
from mqcore.protocol import Store

#: Names after every valid queue name (queue names are ``[A-Za-z0-9_-]``, all below U+007F).
_AFTER_ALL = "\x7f"
#: Encoded pages kept per version of the list (distinct prefix, after, limit); the oldest is dropped beyond.
MAX_CACHED_PAGES = 64


class QueueNames:
    """Sorted queue names of a store, cached against the change stamp of its ``queues/`` directory.

    Thread-safe: called on the broker's saver threads.

    Args:
        store: The daemon's store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cached: tuple[tuple[int, int, int], list[QueueName]] | None = None
        #: The list the encoded pages were cut from (compared by identity), and the pages by (prefix, after, limit).
        self._pages_of: list[QueueName] | None = None
        self._pages: dict[tuple[str, str, int], bytes] = {}

    def names(self, prefix: str = "", after: str = "", limit: int | None = None) -> tuple[list[QueueName], bool]:
        """Queue names starting with ``prefix`` and sorting after ``after``, at most ``limit`` of them.

        One ``stat`` of ``queues/`` when the cached list is current; a listing
        (:meth:`mqcore.protocol.Store.list_queues`) when it is not.

        Args:
            prefix: Only names starting with it ("" = all).
            after: Only names greater than it (a page's last name; "" = from the first).
            limit: Most names answered (None = all).
        Returns:
            (the names, sorted; whether more names match after the last one answered).
        Raises:
            OSError: ``queues/`` could not be listed.
        """
        return self._page(self._current(), prefix, after, limit)

    def page_json(self, prefix: str, after: str, limit: int) -> bytes:
        """The JSON body of one ``GET /`` page: ``{"queues": [names], "next_after": name or null}``, UTF-8.

        The names are :meth:`names`' (``next_after`` is the page's last name
        when more match after it). The bytes are kept while the listed names
        are the same list (the cached one; a fresh listing starts anew), so a
        repeated page costs one ``stat`` and a dict lookup, not an encoding.

        Args:
            prefix: Only names starting with it ("" = all).
            after: Only names greater than it ("" = from the first).
            limit: Most names in the page (1 or more).
        Returns:
            The body, as ``json.dumps`` writes it (what ``web.json_response`` sent).
        Raises:
            OSError: ``queues/`` could not be listed.
        """
        every = self._current()
        key = (prefix, after, limit)
        with self._lock:
            if self._pages_of is every:
                body = self._pages.get(key)
                if body is not None:
                    return body
        names, more = self._page(every, prefix, after, limit)
        body = json.dumps({"queues": names, "next_after": names[-1] if more else None}).encode()
        with self._lock:
            if self._pages_of is not every:
                self._pages_of, self._pages = every, {}
            elif len(self._pages) >= MAX_CACHED_PAGES:
                del self._pages[next(iter(self._pages))]
            self._pages[key] = body
        return body

    @staticmethod
    def _page(every: list[QueueName], prefix: str, after: str, limit: int | None) -> tuple[list[QueueName], bool]:
        lo = bisect.bisect_left(every, prefix)
        if after:
            lo = max(lo, bisect.bisect_right(every, after))
        hi = bisect.bisect_left(every, prefix + _AFTER_ALL, lo)
        if limit is not None and hi - lo > limit:
            return every[lo : lo + limit], True
        return every[lo:hi], False

    def _current(self) -> list[QueueName]:
        path = self.store.layout.queues
        with self._lock:
            try:
                stamp, settled = settled_dir_stamp(path)
            except OSError:
                self._cached = None
                return self.store.list_queues()
            cached = self._cached
            if cached is not None and cached[0] == stamp:
                return cached[1]
            every = self.store.list_queues()
            # A change right after this listing may leave an unsettled stamp equal: list again then.
            self._cached = (stamp, every) if settled else None
            return every
