"""Pure decisions of the protocol, taking the time as an argument: a queue's lease policy, which leases are due."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mqcore.attributes import QueueAttributes
from mqcore.names import InFlightName, MessageId, QueueName, sent_ms_of


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """What a receive (or a redelivery) must check before handing a message out.

    Attributes:
        max_receive_count: A message already received this many times goes to
            ``dead_letter_queue`` instead (None = no limit).
        dead_letter_queue: Where such messages go (None = no dead-letter queue).
        retention_ms: Messages older than this (from their send time) are
            removed, in ms (None = kept for ever).
        purged_before: Messages with ids up to this one were purged (None = never purged).
        queue_delay_ms: The queue's ``delay_seconds`` in ms. Only a FIFO queue's receive applies it
            (section 19.3: a message is not delivered before its send time plus it); a standard
            queue's delay is applied at send.
    """

    max_receive_count: int | None = None
    dead_letter_queue: QueueName | None = None
    retention_ms: int | None = None
    purged_before: MessageId | None = None
    queue_delay_ms: int = 0

    @classmethod
    def for_queue(cls, attrs: QueueAttributes, purged_before: MessageId | None) -> LeasePolicy:
        """The policy of a queue with effective attributes ``attrs`` and purge marker ``purged_before``."""
        return cls(
            max_receive_count=attrs.max_receive_count,
            dead_letter_queue=attrs.dead_letter_queue,
            retention_ms=attrs.retention_seconds * 1000,
            purged_before=purged_before,
            queue_delay_ms=attrs.delay_seconds * 1000,
        )

    def is_purged(self, message_id: MessageId) -> bool:
        """True if ``message_id`` is at or before the queue's purge marker."""
        return self.purged_before is not None and message_id <= self.purged_before

    def is_gone(self, message_id: MessageId, now: int) -> bool:
        """True if ``message_id`` was purged or has outlived the retention period at ``now`` (epoch ms)."""
        if self.is_purged(message_id):
            return True
        return self.retention_ms is not None and sent_ms_of(message_id) + self.retention_ms <= now

    def dead_letter_for(self, receive_count: int) -> QueueName | None:
        """The dead-letter queue a message received ``receive_count`` times must move to, or None."""
        if self.dead_letter_queue is None or self.max_receive_count is None:
            return None
        return self.dead_letter_queue if receive_count >= self.max_receive_count else None


def iter_due(items: Iterable[InFlightName], now: int) -> Iterator[InFlightName]:
    """The in-flight items whose deadline (epoch ms) is at or before ``now``."""
    return (i for i in items if i.deadline_ms <= now)
