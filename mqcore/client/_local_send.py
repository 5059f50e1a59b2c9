"""Brokerless sends: the checks of a send, capacity admission, and the send operations.

:class:`Sender` does what ``mq`` does for ``POST /{queue}/messages`` and
``POST /{queue}/messages/batch``, in the caller's process: the same checks in
the same order, the same capacity rule (a send to a full queue waits up to the
queue's ``capacity_wait_seconds`` for room, woken by inotify, then fails with
:class:`QueueFull`), and the same group commit of a batch. The sends are
operations (:mod:`mqcore.client._local_waiters`), run by ``LocalClient`` in
the calling thread and by ``AsyncLocalClient`` on its event loop.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mqcore.attributes import QueueAttributes, effective
from mqcore.client._local_waiters import Op, Undoable, Watches, poll_op
from mqcore.client.types import TEXT_CONTENT_TYPE, BatchEntry
from mqcore.errors import InvalidRequest, MessageTooLarge, MQError, QueueFull
from mqcore.limits import MAX_BATCH_MESSAGES
from mqcore.names import QueueName, check_queue_name, is_fifo_queue
from mqcore.protocol import SendEntry, Store
from mqcore.service import fifo
from mqcore.service.capacity import SendReservations, queue_full
from mqcore.service.plans import Blocking
from mqcore.service.requests import (
    DetailKey,
    Limit,
    check_content_type,
    check_message_size,
    entry_size,
    send_entry,
)

#: Most entries one chunk of ``send_batch`` may hold (the daemon's ``--max-batch-messages`` cap).
MAX_BATCH_SIZE = MAX_BATCH_MESSAGES
#: ``send_batch``'s ``batch_size``: entries per group commit.
BATCH_SIZE = Limit("batch_size", 1, MAX_BATCH_SIZE)


def _encode_body(body: object, content_type: str | None) -> tuple[bytes, str | None]:
    """Body bytes and content type: ``str`` is UTF-8 ``text/plain; charset=utf-8`` unless a type is given.

    Raises:
        InvalidRequest: A ``str`` with a lone surrogate (not encodable as UTF-8).
        TypeError: Neither bytes-like nor str.
    """
    if isinstance(body, str):
        try:
            data = body.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("body is not valid Unicode (lone surrogate)", field="body") from None
        return data, content_type or TEXT_CONTENT_TYPE
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One request's worth of a batch send, checked: each entry a SendEntry or its error."""

    entries: list[SendEntry | MQError]
    too_large: MessageTooLarge | None

    @property
    def immediate(self) -> list[int]:
        """Indexes of the valid entries without a delay (the ones capacity counts)."""
        return [i for i, e in enumerate(self.entries) if isinstance(e, SendEntry) and e.delay_ms == 0]


class Sender:
    """Checks, capacity admission and group commits of brokerless sends (thread-safe).

    A ``send_batch`` chunk is checked as one HTTP batch request: an entry with
    a bad body, content type, attributes or delay fails alone. A chunk whose
    valid entries together exceed the queue's ``max_message_bytes`` is split
    in halves and sent again (as :class:`mqcore.client.Client` does), so each
    entry that fits alone is sent; one too large alone gets
    :class:`MessageTooLarge`. On a queue with a capacity, as many entries
    without a delay as fit are sent (after waiting up to
    ``capacity_wait_seconds`` for any room) and the others get
    :class:`QueueFull`.

    Args:
        store: The root's store.
        defaults: The attributes of a queue that sets none.
        watches: The client's watches (a capacity wait sleeps on them).
    """

    def __init__(self, store: Store, defaults: QueueAttributes, watches: Watches) -> None:
        self.store = store
        self.defaults = defaults
        self.watches = watches
        self._reservations = SendReservations()
        self._capacity_lock = threading.Lock()

    def attributes(self, queue: QueueName) -> QueueAttributes:
        """Effective attributes of ``queue`` (QueueNotFound)."""
        return effective(self.store.get_attributes(queue), self.defaults)

    # -- capacity (mqcore.service.capacity) --------------------------------------------------

    def _queue_full(self, queue: QueueName) -> QueueFull:
        try:
            attrs = self.attributes(queue)
        except MQError:
            attrs = self.defaults
        return queue_full(queue, attrs)

    def _reserve(self, queue: QueueName, wanted: int) -> tuple[int, QueueAttributes]:
        """Admit up to ``wanted`` sends under the queue's capacity now (no waiting).

        Room = capacity - ready files - this client's sends in progress
        (:func:`mqcore.service.capacity.admit`; other processes' sends are seen once published).

        Returns:
            (how many were admitted, to be given back with :meth:`_release`; the attributes read).
        """
        attrs = self.attributes(queue)
        with self._capacity_lock:  # no release between the listing and the count (a published send counts once)
            ready = len(self.store.scan_ready(queue)) if attrs.capacity is not None else 0
            return self._reservations.reserve(queue, attrs.capacity, ready, wanted), attrs

    def _release(self, queue: QueueName, admitted: int) -> None:
        if admitted:
            with self._capacity_lock:
                self._reservations.release(queue, admitted)

    def _admit_op(self, queue: QueueName, wanted: int) -> Op[int]:
        """Admit up to ``wanted`` sends; wait up to capacity_wait_seconds for any room (0 = the queue stayed full)."""
        first: tuple[int, QueueAttributes] = yield Undoable(
            lambda: self._reserve(queue, wanted), lambda r: self._release(queue, r[0])
        )
        taken, attrs = first
        if taken or attrs.capacity_wait_seconds <= 0:
            return taken
        look: Undoable[tuple[int, int | None]] = Undoable(
            lambda: (self._reserve(queue, wanted)[0], None), lambda r: self._release(queue, r[0])
        )
        return (yield from poll_op(self.watches, queue, "room", attrs.capacity_wait_seconds, look))

    # -- one message ----------------------------------------------------------------------

    def _prepare_send(self, queue: str, message: BatchEntry) -> tuple[QueueName, SendEntry]:
        """Check a single send: name, queue, then the message (:func:`mqcore.service.requests.send_entry`), size."""
        name = check_queue_name(queue)
        attrs = self.attributes(name)
        entry = self._entry(name, message, attrs, "parameter")
        check_message_size(entry_size(entry), attrs)
        return name, entry

    def send_op(self, queue: str, message: BatchEntry) -> Op[str]:
        """``LocalClient.send`` as an operation: check, wait for room (no delay only), store; the message id."""
        name, entry = yield Blocking(lambda: self._prepare_send(queue, message))
        admitted = 0
        try:
            if entry.delay_ms == 0:
                admitted = yield from self._admit_op(name, 1)
                if not admitted:
                    full: QueueFull = yield Blocking(lambda: self._queue_full(name))
                    raise full
            message_id: str = yield Blocking(
                lambda: (
                    fifo.send_entry(self.store, name, entry)  # docs/protocol.md 19
                    if is_fifo_queue(name)
                    else self.store.send(name, entry.body, entry.content_type, entry.attributes, entry.delay_ms)
                )
            )
            return message_id
        finally:
            self._release(name, admitted)

    # -- batches -----------------------------------------------------------------------------

    @staticmethod
    def _entry(
        queue: QueueName, message: bytes | str | BatchEntry, attrs: QueueAttributes, delay_key: DetailKey = "field"
    ) -> SendEntry:
        """One message checked as the HTTP API checks it (content type, attributes, delay, FIFO ids)."""
        if not isinstance(message, BatchEntry):
            message = BatchEntry(message)
        data, ctype = _encode_body(message.body, check_content_type(message.content_type))
        entry = send_entry(data, ctype, message.attributes, message.delay_seconds, attrs, delay_key=delay_key)
        if message.group_id is None and message.deduplication_id is None:
            return entry
        group, dedup = fifo.fifo_fields(queue, message.group_id, message.deduplication_id)  # FIFO queues
        return dataclasses.replace(entry, group_id=group, dedup_id=dedup)

    def _prepare_chunk(self, queue: QueueName, chunk: Sequence[bytes | str | BatchEntry]) -> _Chunk:
        """Check one request's entries as ``POST /{queue}/messages/batch`` does (QueueNotFound for the whole)."""
        attrs = self.attributes(queue)
        entries: list[SendEntry | MQError] = []
        for entry in chunk:
            try:
                entries.append(self._entry(queue, entry, attrs))
            except MQError as exc:
                entries.append(exc)
        valid = [e for e in entries if isinstance(e, SendEntry)]
        try:
            check_message_size(sum(entry_size(e) for e in valid), attrs)
        except MessageTooLarge as exc:
            return _Chunk(entries, exc)
        return _Chunk(entries, None)

    def _store_chunk(self, queue: QueueName, chunk: _Chunk, admitted: int) -> list[str | MQError]:
        """Write and publish the admitted entries of ``chunk`` with one group commit; a result per entry."""
        refused = set(chunk.immediate[admitted:])
        chosen = [(i, e) for i, e in enumerate(chunk.entries) if isinstance(e, SendEntry) and i not in refused]
        send = fifo.send_entries if is_fifo_queue(queue) else Store.send_batch  # FIFO: docs/protocol.md 19
        stored = send(self.store, queue, [e for _, e in chosen]) if chosen else []
        by_entry: dict[int, str | MQError] = dict(zip([i for i, _ in chosen], stored, strict=True))
        full = self._queue_full(queue) if refused else None
        out: list[str | MQError] = []
        for i, entry in enumerate(chunk.entries):
            if isinstance(entry, MQError):
                out.append(entry)
            elif i in refused:
                assert full is not None
                out.append(full)
            else:
                out.append(by_entry[i])
        return out

    def _send_items_op(self, queue: QueueName, items: Sequence[bytes | str | BatchEntry]) -> Op[list[str | MQError]]:
        """Send one chunk; a chunk too large as a whole is split in halves until each entry is alone (as Client)."""
        chunk: _Chunk = yield Blocking(lambda: self._prepare_chunk(queue, items))
        if chunk.too_large is not None:
            if len(items) == 1:
                return [chunk.too_large]
            half = len(items) // 2
            first = yield from self._send_items_op(queue, items[:half])
            second = yield from self._send_items_op(queue, items[half:])
            return first + second
        immediate = len(chunk.immediate)
        admitted = 0
        try:
            if immediate:
                admitted = yield from self._admit_op(queue, immediate)
            results: list[str | MQError] = yield Blocking(lambda: self._store_chunk(queue, chunk, admitted))
            return results
        finally:
            self._release(queue, admitted)

    def send_batch_op(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], batch_size: int
    ) -> Op[list[str | MQError]]:
        """``LocalClient.send_batch`` as an operation: chunks of ``batch_size``; a result per entry."""
        name = check_queue_name(queue)
        size = BATCH_SIZE.check(batch_size)
        items = list(entries)
        results: list[str | MQError] = []
        for start in range(0, len(items), size):
            results.extend((yield from self._send_items_op(name, items[start : start + size])))
        return results
