"""Messages and the message file format.

A message file is written once and never modified. It holds a one-line JSON
header followed by the body bytes exactly as sent::

    MQ1 {"body_bytes": 1024, "content_type": "application/json"}\\n<body>

``body_bytes`` lets a reader reject a torn file instead of delivering part of
a body. Unknown header keys are ignored by readers, so later versions can add
attributes without changing the file-name protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqcore._frozen import frozen_builder
from mqcore.names import MessageId, QueueName, sent_ms_of

MAGIC = b"MQ1 "
#: Content type reported for bodies sent without one.
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class CorruptMessage(ValueError):
    """A message file does not hold a complete header and body (a torn write)."""


def encode(body: bytes, *header: Any) -> bytes:
    """Return the file content for ``body`` (bytes): :func:`encode_header` followed by ``body``.

    ``header`` are :func:`encode_header`'s arguments after the body's length, positional
    (``content_type, attributes, queue, attribute_types, extra``).
    """
    return encode_header(len(body), *header) + body


#: The end of the usual header by (content type, queue): ``,"content_type":"T"`` if one is given, then
#: ``,"queue":"Q"}`` and the newline, as :func:`encode_header`'s general form writes them.
_QUEUE_TAILS: dict[tuple[str | None, str], bytes] = {}
#: Header ends kept (the cache is emptied when full).
_MAX_QUEUE_TAILS = 10_000
#: Longest content type whose header end is kept (a longer one takes the general form: the cache stays small).
_MAX_CACHED_TYPE_CHARS = 128


def encode_header(
    body_bytes: int,
    content_type: str | None = None,
    attributes: dict[str, str] | None = None,
    queue: str | None = None,
    attribute_types: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> bytes:
    """Return the start of a message file, up to and including the header's newline; the body follows it.

    A writer that has the body as its own buffer writes the two with one ``writev`` instead of
    copying a large body into one string first.

    Args:
        body_bytes: Length of the body that follows, in bytes.
        content_type: Its Content-Type, if given.
        attributes: User message attributes (name -> string), if any.
        queue: The queue it is sent to; kept so a redrive out of a dead-letter
            queue can send it back to its source.
        attribute_types: SQS DataType of the attributes that are not plain ``String``
            (name -> ``Number``, ``Binary``, ``String.x``...; a Binary value is stored in
            ``attributes`` as base64), if any: header key ``attribute_types``.
        extra: More header keys (a FIFO message's ``group_id`` and ``dedup_id``, docs/protocol.md 19).
    """
    # the usual send: the same bytes, preformatted
    if not (attributes or extra) and queue and len(content_type or "") <= _MAX_CACHED_TYPE_CHARS:
        key = (content_type or None, queue)
        tail = _QUEUE_TAILS.get(key)
        if tail is None:
            if len(_QUEUE_TAILS) >= _MAX_QUEUE_TAILS:
                _QUEUE_TAILS.clear()
            typed = b',"content_type":' + json.dumps(content_type).encode() if content_type else b""
            tail = _QUEUE_TAILS[key] = typed + b',"queue":' + json.dumps(queue).encode() + b"}\n"
        return b'%s{"body_bytes":%d%s' % (MAGIC, body_bytes, tail)
    header: dict[str, Any] = {"body_bytes": body_bytes}
    if content_type:
        header["content_type"] = content_type
    if attributes:
        header["attributes"] = attributes
        types = {k: v for k, v in (attribute_types or {}).items() if k in attributes and v != "String"}
        if types:
            header["attribute_types"] = types
    if queue:
        header["queue"] = queue
    if extra:
        header.update(extra)
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n"


#: The C scanner of a default :class:`json.JSONDecoder`: ``(text, index) -> (value, end)``.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, not declared


def _header_json(raw: bytes) -> Any:
    """``json.loads(raw)`` of a header line, through the C scanner alone when the line is plain UTF-8 JSON.

    Every receive decodes one header; ``json.loads`` first guesses the encoding and
    checks for whitespace around the value in Python. A header this package wrote is
    compact UTF-8, so the scanner reads it whole; anything else (whitespace, another
    encoding, an error) goes through ``json.loads``, with its result or its error.
    """
    try:
        text = raw.decode()
        value, end = _scan_json(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        return json.loads(raw)
    return value if end == len(text) else json.loads(raw)


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Split file content into ``(header, body)``.

    Raises:
        CorruptMessage: Bad magic, bad header, or a body shorter or longer than
            ``body_bytes`` says.
    """
    if not data.startswith(MAGIC):
        raise CorruptMessage("no MQ1 header")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptMessage("header is not terminated")
    try:
        header = _header_json(data[len(MAGIC) : end])
        if not isinstance(header, dict):
            raise TypeError("header is not a JSON object")
        size = header["body_bytes"]
        if type(size) is not int or size < 0:
            raise TypeError("body_bytes is not a non-negative integer")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptMessage(f"bad header: {exc}") from exc
    body = data[end + 1 :]
    if len(body) != size:
        raise CorruptMessage(f"body is {len(body)} bytes, header says {size}")
    return header, body


def _string_map(header: dict[str, Any], key: str) -> dict[str, str]:
    """The ``str -> str`` entries of ``header[key]`` ({} if absent or not an object)."""
    value = header.get(key)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def header_attributes(header: dict[str, Any]) -> dict[str, str]:
    """User attributes from a decoded header ({} if absent or malformed)."""
    return _string_map(header, "attributes")


def header_attribute_types(header: dict[str, Any]) -> dict[str, str]:
    """SQS DataTypes of the user attributes that are not plain ``String`` ({} if absent or malformed).

    Files written before typed attributes existed have none: every attribute is a ``String``.
    """
    return _string_map(header, "attribute_types")


def header_content_type(header: dict[str, Any]) -> str:
    """The Content-Type from a decoded header (:data:`DEFAULT_CONTENT_TYPE` if absent)."""
    return str(header.get("content_type") or DEFAULT_CONTENT_TYPE)


def header_source_queue(header: dict[str, Any]) -> str | None:
    """The queue the message was first sent to (the header's ``queue``), or None if unknown."""
    source = header.get("queue")
    return source if isinstance(source, str) else None


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message handed to a consumer by a receive.

    Attributes:
        queue: The queue it was received from.
        message_id: Its id (UUIDv7; also its position in the queue's order).
        body: The body bytes exactly as sent.
        content_type: The Content-Type given at send time, or ``application/octet-stream``.
        receive_count: How many times it has been received, this receive included (1 = first).
        deadline_ms: End of this receive's visibility timeout, epoch milliseconds.
        in_flight_name: Its file name in ``delay/`` made by this receive (also its receipt handle).
        attributes: User message attributes given at send time (name -> string).
        first_receive_ms: Approximate time of its first receive, epoch milliseconds
            (SQS: ApproximateFirstReceiveTimestamp).
        source_queue: The queue it was first sent to (differs from ``queue`` once dead-lettered), or None if unknown.
        attribute_types: SQS DataType of each attribute that is not a plain ``String`` (name -> type).
        group_id: Its MessageGroupId, on a FIFO queue (docs/protocol.md 19), else None.
        dedup_id: Its MessageDeduplicationId (given or content-based), on a FIFO queue, else None.
    """

    queue: QueueName
    message_id: MessageId
    body: bytes
    content_type: str
    receive_count: int
    deadline_ms: int
    in_flight_name: str
    attributes: dict[str, str] = field(default_factory=dict)
    first_receive_ms: int = 0
    source_queue: str | None = None
    attribute_types: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None
    dedup_id: str | None = None

    @property
    def receipt_handle(self) -> str:
        """The receipt handle of this receive (opaque to clients; the ``delay/`` name it made)."""
        return self.in_flight_name

    @property
    def sent_ms(self) -> int:
        """Send time in epoch milliseconds (from the id)."""
        return sent_ms_of(self.message_id)


#: ``ReceivedMessage(*fields)``, its fields positional in their order, 4x quicker than its frozen ``__init__``
#: (:func:`mqcore._frozen.frozen_builder`): every receive makes one per message.
received_message: Callable[..., ReceivedMessage] = frozen_builder(ReceivedMessage)
