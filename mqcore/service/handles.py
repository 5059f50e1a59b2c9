"""Receipt handles: the check where a handle enters, and the memory of where each lease is now.

A receipt handle is parsed once, where it enters (an HTTP route, the SQS
layer, a client call), by :func:`check_handle` (= ``ReceiptHandle.parse``:
malformed, or of another queue or message, is ``InvalidReceiptHandle``, 400);
past the edge code passes the :class:`~mqcore.names.ReceiptHandle`.

A change of visibility renames the lease's ``delay/`` file, so a handle no
longer names its file; the Store finds it again by the lease key (one listing
of ``delay/``). :class:`LeaseMemory` remembers the current name of this
process's leases, so the usual delete or change of visibility is a single
rename with no listing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from mqcore.model import ReceivedMessage
from mqcore.names import QueueName, ReceiptHandle

__all__ = ["MAX_REMEMBERED_LEASES", "LeaseMemory", "check_handle"]

#: How many leases (and receipt handles) a process remembers the current ``delay/`` name of.
MAX_REMEMBERED_LEASES = 100_000


def check_handle(text: object, queue: QueueName, message_id: str | None = None) -> ReceiptHandle:
    """Parse a receipt handle sent for ``queue`` (and for ``message_id`` if the request names one).

    Raises:
        InvalidReceiptHandle: Not a handle a receive returns, or of another queue or message
            (HTTP 400 ``invalid_receipt_handle``; SQS ``ReceiptHandleIsInvalid``).
    """
    return ReceiptHandle.parse(text, queue, message_id)


class _Lease:
    """One lease's current ``delay/`` name, shared by every key that reaches it.

    ``first`` is the receipt handle it was remembered under (the receive's, or the first one a
    visibility change named), so that forgetting the message also forgets that key.
    """

    __slots__ = ("current", "first")

    def __init__(self, handle: str) -> None:
        self.current = self.first = handle


class LeaseMemory:
    """Where this process's leases are now: receipt handle -> current ``delay/`` name, and (queue, id) -> same.

    Bounded (least recently used first out); a miss only costs the Store a
    listing of ``delay/``. Safe across threads.

    Args:
        limit: Most handles (and most messages) remembered.
    """

    def __init__(self, limit: int = MAX_REMEMBERED_LEASES) -> None:
        self.limit = limit
        self._by_handle: OrderedDict[str, _Lease] = OrderedDict()
        self._by_message: OrderedDict[tuple[str, str], _Lease] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_handle)

    def _put(self, handle: str, queue: str, message_id: str, lease: _Lease) -> None:
        self._by_handle[handle] = lease
        self._by_handle.move_to_end(handle)
        key = (queue, message_id)
        self._by_message[key] = lease
        self._by_message.move_to_end(key)
        for table in (self._by_handle, self._by_message):
            while len(table) > self.limit:
                table.popitem(last=False)

    def received(self, *messages: ReceivedMessage) -> None:
        """Receives leased ``messages``: each handle names its file (one lock for them all).

        :meth:`_put` for each, in one loop: a receive's handle is new (a fresh lease token), so it is
        added last without a move; the (queue, id) key of a message received again moves last.
        """
        with self._lock:
            by_handle, by_message = self._by_handle, self._by_message
            for message in messages:
                handle = message.in_flight_name  # = message.receipt_handle
                lease = by_handle[handle] = _Lease(handle)
                key = (message.queue, message.message_id)
                if key in by_message:
                    by_message.move_to_end(key)
                by_message[key] = lease
            for table in (by_handle, by_message):
                while len(table) > self.limit:
                    table.popitem(last=False)

    def current(self, handle: ReceiptHandle | str) -> str | None:
        """The remembered current ``delay/`` name of ``handle``'s lease, or None."""
        with self._lock:
            lease = self._by_handle.get(str(handle))
            return lease.current if lease is not None else None

    def currents(self, handles: Iterable[ReceiptHandle]) -> list[str | None]:
        """:meth:`current` of each of ``handles``, in order (one lock for them all)."""
        with self._lock:
            return [lease.current if (lease := self._by_handle.get(h.text)) is not None else None for h in handles]

    def hints(self, handles: Iterable[str]) -> dict[str, str]:
        """handle -> current ``delay/`` name, for the ``handles`` remembered."""
        with self._lock:
            return {h: lease.current for h in handles if (lease := self._by_handle.get(h)) is not None}

    def moved(self, handle: ReceiptHandle, current: str) -> None:
        """A change of visibility renamed ``handle``'s lease to ``current`` (which is also a valid handle now)."""
        with self._lock:
            lease = self._by_handle.get(handle.text)
            if lease is None:
                lease = _Lease(handle.text)
                self._put(handle.text, handle.queue, handle.message_id, lease)
            lease.current = current
            self._put(current, handle.queue, handle.message_id, lease)

    def released(self, *handles: ReceiptHandle) -> None:
        """``handles``' leases ended here (deleted, or made visible again): forget them (one lock for them all)."""
        with self._lock:
            for handle in handles:
                lease = self._by_handle.pop(handle.text, None)
                if lease is not None:
                    self._drop_keys(lease)
                self._by_message.pop((handle.queue, handle.message_id), None)

    def pop_message(self, queue: QueueName, message_id: str) -> str | None:
        """Forget the lease of ``message_id`` (it is being deleted by id); its current name, or None.

        Its handle keys go too (:meth:`_drop_keys`, as in :meth:`released`): the receive's handle and the
        current name (a handle named by a visibility change between two others stays until the bound
        evicts it). Before, a delete by id left every handle behind, so that under deletes by id the
        handle table stayed full at :data:`MAX_REMEMBERED_LEASES`.
        """
        with self._lock:
            lease = self._by_message.pop((queue, message_id), None)
            if lease is None:
                return None
            self._drop_keys(lease)
            return lease.current

    def _drop_keys(self, lease: _Lease) -> None:
        """Forget ``lease``'s handle keys: its first handle and its current name (under the lock)."""
        self._by_handle.pop(lease.current, None)
        self._by_handle.pop(lease.first, None)
