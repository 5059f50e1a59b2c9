"""Data shapes shared by every client (HTTP and brokerless): what a receive and a peek return (public).

Plain frozen dataclasses, no I/O: the HTTP client builds them from JSON
answers, the brokerless client from :class:`mqcore.model.ReceivedMessage`.
The keyword options of the methods are in :mod:`mqcore.client.options`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mqcore.client._renamed import renamed_attribute

#: Content-Type the client gives a body sent as ``str``.
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
#: Content-Type of :meth:`send_json` bodies (SMQ's payloads).
JSON_CONTENT_TYPE = "application/json"

#: Where a peeked message is: ready, received and in flight, or sent with a delay not yet over.
MessageState = Literal["ready", "in_flight", "delayed"]


def json_body(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, the body of ``send_json`` (TypeError if not serialisable)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _Body:
    """Decoding helpers for classes with ``body: bytes``."""

    body: bytes

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text.

        Raises:
            UnicodeDecodeError: The body is not valid in ``encoding``.
        """
        return self.body.decode(encoding)

    def json(self) -> Any:
        """The body decoded as JSON (what :meth:`Client.send_json` sent).

        Raises:
            ValueError: The body is not JSON (``json.JSONDecodeError``, or not UTF-8).
        """
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Message(_Body):
    """A received message: the body and everything needed to delete or release it."""

    queue: str
    """The queue it was received from."""
    message_id: str
    """Its id (a lowercase UUIDv7; ids sort in send order)."""
    receipt_handle: str
    """Handle of this receive (opaque). Pass it to ``delete`` or ``change_visibility``; a later receive of the same
    message makes it stale."""
    body: bytes
    """The body bytes exactly as sent."""
    content_type: str
    """As sent (default ``application/octet-stream``)."""
    attributes: Mapping[str, str] = field(default_factory=dict)
    """User message attributes (name -> string). SQS: MessageAttributes."""
    sent_ms: int = 0
    """Send time, epoch milliseconds. SQS: SentTimestamp."""
    receive_count: int = 1
    """Receives so far, this one included (1 on the first). SQS: ApproximateReceiveCount."""
    first_receive_ms: int = 0
    """Time of the first receive, epoch milliseconds. SQS: ApproximateFirstReceiveTimestamp."""
    visibility_deadline_ms: int = 0
    """End of this receive's visibility timeout, epoch milliseconds."""
    group_id: str | None = None
    """On a FIFO queue, its message group. SQS: MessageGroupId. None elsewhere."""
    deduplication_id: str | None = None
    """On a FIFO queue, its deduplication id (given, or the body's SHA-256). SQS: MessageDeduplicationId."""
    sequence_number: str | None = None
    """On a FIFO queue, its place in the queue's order (a 128-bit decimal). SQS: SequenceNumber."""


@dataclass(frozen=True, slots=True)
class PeekedMessage(_Body):
    """A message seen by ``peek``: read without being received (no lease, no receive count change)."""

    queue: str
    """The queue it belongs to."""
    message_id: str
    """Its id."""
    state: MessageState
    """``ready``, ``in_flight`` (received, visibility timeout running) or ``delayed`` (sent with a delay that has
    not ended)."""
    body: bytes
    """The body bytes exactly as sent."""
    content_type: str
    """As sent."""
    attributes: Mapping[str, str] = field(default_factory=dict)
    """User message attributes."""
    sent_ms: int = 0
    """Send time, epoch milliseconds."""
    receive_count: int = 0
    """Receives so far (0 = never received)."""
    visibility_deadline_ms: int | None = None
    """When an ``in_flight`` or ``delayed`` message becomes ready again, epoch milliseconds; None for ``ready``.
    Its former name ``visible_at_ms`` still reads in 0.1 with a DeprecationWarning and goes in 0.2."""
    source_queue: str | None = None
    """The queue it was first sent to (differs from ``queue`` once dead-lettered), or None if unknown."""
    group_id: str | None = None
    """On a FIFO queue, its message group. SQS: MessageGroupId. None elsewhere."""

    visible_at_ms = renamed_attribute("visible_at_ms", "visibility_deadline_ms", removed_in="0.2")


@dataclass(frozen=True, slots=True)
class PeekPage:
    """One page of a peek, oldest message first.

    Attributes:
        messages: Up to ``limit`` messages with ids greater than the ``after`` asked for.
        next_after: Pass as ``after`` to get the next page; None when this was the last page.
    """

    messages: list[PeekedMessage]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One message of a batch send (``send_batch``) or a ``send``: its body and its send options.

    Attributes:
        body: ``bytes`` as is; ``str`` is sent as UTF-8 with content type
            ``text/plain; charset=utf-8`` unless ``content_type`` says otherwise.
        content_type: Its Content-Type (None = the default for the body's type).
        attributes: User message attributes (at most 10; SQS's name rules).
        delay_seconds: 0-900; None = the queue's ``delay_seconds``. SQS: DelaySeconds.
        group_id: The message group, required on a FIFO queue (a name ending ``.fifo``), refused
            elsewhere. SQS: MessageGroupId.
        deduplication_id: On a FIFO queue: a send with the id of one sent in the last 5 minutes is
            not stored again (its id is returned); None = the body's SHA-256 if the queue has
            ``content_based_deduplication``. SQS: MessageDeduplicationId.

    Each field but ``body`` is the :class:`~mqcore.client.options.SendOptions` key of that name.
    """

    body: bytes | str
    content_type: str | None = None
    attributes: Mapping[str, str] | None = None
    delay_seconds: int | None = None
    group_id: str | None = None
    deduplication_id: str | None = None
