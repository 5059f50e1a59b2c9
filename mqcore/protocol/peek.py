"""Peek (docs/protocol.md 16.2): read a queue's messages without receiving them; nothing is renamed."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqcore import model
from mqcore.limits import DEFAULT_PEEK_LIMIT, MAX_PEEK_LIMIT
from mqcore.names import (
    MAX_PARTITIONS,
    MessageId,
    QueueName,
    parse_in_flight_name,
    parse_ready_name,
    partition_of,
    sent_ms_of,
)
from mqcore.protocol._fs import listdir, storage_error
from mqcore.protocol.queues import Queues

#: Where a message of a queue is: message id -> (path, receive count, ``delay/`` deadline or None when ready).
_Located = dict[str, tuple[str, int, int | None]]


@dataclass(frozen=True, slots=True)
class PeekedFile:
    """A message read by :meth:`Store.peek` without being received.

    Attributes:
        queue: The queue it belongs to.
        message_id: Its id.
        state: ``"ready"`` (in ``queues/Q/``), ``"in_flight"`` (in ``delay/``, received at
            least once) or ``"delayed"`` (in ``delay/``, never received: sent with a delay).
        receive_count: Receives so far (0 = never received).
        visibility_deadline_ms: When it becomes ready again (its ``delay/`` deadline), epoch ms;
            None when ready.
        body: The body bytes.
        content_type: As sent.
        attributes: User message attributes.
        source_queue: The queue it was first sent to (its header's ``queue``), or None.
        attribute_types: SQS DataType of attributes that are not plain ``String``.
        group_id: A FIFO queue's message: its group (SQS: MessageGroupId); None otherwise.
    """

    queue: QueueName
    message_id: MessageId
    state: str
    receive_count: int
    visibility_deadline_ms: int | None
    body: bytes
    content_type: str
    attributes: dict[str, str]
    source_queue: str | None
    attribute_types: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None

    @property
    def sent_ms(self) -> int:
        """Send time, epoch milliseconds (from the id)."""
        return sent_ms_of(self.message_id)


class Peeking(Queues):
    """Reading messages in place, by page or by id."""

    def peek(
        self,
        queue: QueueName,
        after: MessageId | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        partition: tuple[int, int] | None = None,
    ) -> tuple[list[PeekedFile], MessageId | None]:
        """Read a page of a queue's messages without receiving them (nothing is renamed or changed).

        Lists ``queues/Q/`` and ``delay/`` (the queue's ready, in-flight and
        delayed messages), orders them by id (send order) and reads the first
        ``limit`` with ids greater than ``after``. Purged and expired messages
        (by the store's clock) are left out. A snapshot, not a transaction: a message that moves
        between the listing and its read (received, redelivered) is looked up
        again in one fresh listing; only one that moved twice meanwhile, or was
        deleted, is left out. None appears twice in one page, and paging by id
        never returns a message twice.

        Args:
            queue: The queue.
            after: Only ids greater than this (the previous page's ``next_after``); None = from the start.
            limit: 1 to :data:`MAX_PEEK_LIMIT` messages.
            partition: ``(i, M)``: only messages of partition ``i`` of ``M``
                (:func:`mqcore.names.partition_of`); None = all.
        Returns:
            ``(messages, next_after)``: ``next_after`` is the id to pass as ``after``
            for the next page, None when there are no more messages.
        Raises:
            QueueNotFound: No such queue.
            ValueError: ``limit`` or ``partition`` out of range.
        """
        if not 1 <= limit <= MAX_PEEK_LIMIT:
            raise ValueError(f"limit must be 1-{MAX_PEEK_LIMIT}, got {limit}")
        if partition is not None and not 0 <= partition[0] < partition[1] <= MAX_PARTITIONS:
            raise ValueError(f"partition must be (i, M) with 0 <= i < M <= {MAX_PARTITIONS}, got {partition}")
        found = self._locate_live(queue)
        ids = sorted(
            MessageId(i)
            for i in found
            if (after is None or i > after) and (partition is None or partition_of(i, partition[1]) == partition[0])
        )
        page = ids[:limit]
        return self._read_located(queue, page, found), (page[-1] if len(ids) > limit else None)

    def peek_ids(self, queue: QueueName, message_ids: Iterable[str]) -> list[PeekedFile]:
        """Read the given messages of a queue without receiving them, wherever they are (ready, in flight, delayed).

        Ids that are not in the queue (deleted, never sent, purged, expired, or
        malformed) are left out. Used to rebuild a batch from its message ids
        (the Spark source after a restart). One listing of ``queues/Q/`` and of
        ``delay/``, whatever the number of ids.

        Returns:
            The messages found, in id order.
        Raises:
            QueueNotFound: No such queue.
        """
        found = self._locate_live(queue)
        return self._read_located(queue, sorted({i for i in message_ids if i in found}), found)

    def _locate_live(self, queue: QueueName) -> _Located:
        """:meth:`_locate`, without the messages that are purged or expired by the store's clock."""
        now = self.clock()
        policy = self.policy(queue)
        return {i: where for i, where in self._locate(queue).items() if not policy.is_gone(MessageId(i), now)}

    def _locate(self, queue: QueueName) -> _Located:
        """Message id -> (path, receive count, ``delay/`` deadline or None) of every message of ``queue``."""
        found: _Located = {}
        qdir = self.layout.queue_dir(queue)
        for name in self.scan_ready(queue):
            parsed = parse_ready_name(name)
            if parsed is not None:
                found[parsed[0]] = (os.path.join(qdir, name), parsed[1], None)
        for name in listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is not None and item.queue == queue and item.message_id not in found:
                found[item.message_id] = (self.layout.delay_path(name), item.receive_count, item.deadline_ms)
        return found

    def _read_located(self, queue: QueueName, ids: Sequence[str], found: _Located) -> list[PeekedFile]:
        """Read ``ids`` at their located paths; a file that moved meanwhile is located once more."""
        read: dict[str, PeekedFile] = {}
        moved: list[str] = []
        for message_id in ids:
            peeked = self._read_peeked(queue, message_id, *found[message_id])
            if peeked is None:
                moved.append(message_id)
            else:
                read[message_id] = peeked
        if moved:
            again = self._locate(queue)
            for message_id in moved:
                if message_id in again:
                    peeked = self._read_peeked(queue, message_id, *again[message_id])
                    if peeked is not None:
                        read[message_id] = peeked
        return [read[i] for i in ids if i in read]

    @staticmethod
    def _read_peeked(
        queue: QueueName, message_id: str, path: str, count: int, deadline: int | None
    ) -> PeekedFile | None:
        """One message file read for a peek; None if it is gone or unreadable as a message."""
        try:
            with open(path, "rb") as f:
                header, body = model.decode(f.read())
        except (FileNotFoundError, model.CorruptMessage):
            return None
        except OSError as exc:
            raise storage_error("read for peek", exc) from exc
        return PeekedFile(
            queue=queue,
            message_id=MessageId(message_id),
            state="ready" if deadline is None else ("in_flight" if count > 0 else "delayed"),
            receive_count=count,
            visibility_deadline_ms=deadline,
            body=body,
            content_type=model.header_content_type(header),
            attributes=model.header_attributes(header),
            attribute_types=model.header_attribute_types(header),
            source_queue=model.header_source_queue(header),
            group_id=_group_of(header),
        )


def _group_of(header: dict[str, Any]) -> str | None:
    """A FIFO message's group from its header (key ``group_id``, docs/protocol.md 19.2), or None."""
    group = header.get("group_id")
    return group if isinstance(group, str) else None
