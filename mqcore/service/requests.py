"""Request rules: the ranges and checks of every operation's arguments (docs/api.md), written once.

The HTTP routes (``daemons/_http.py``, values from query text or JSON) and the
brokerless client (``mqcore.client._local``, Python values) check their
arguments here, so both refuse the same input with the same
:class:`~mqcore.errors.InvalidRequest` (message and ``details``). The SQS wire
layer (``daemons/_sqs.py``) reads the same :class:`Limit` objects and only
words its errors SQS's way. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from mqcore.attributes import (
    MAX_ATTEMPT_ID_CHARS,
    MAX_CONTENT_TYPE_CHARS,
    MAX_DELAY_SECONDS,
    MAX_RECEIVE_MESSAGES,
    MAX_VISIBILITY_TIMEOUT_SECONDS,
    MAX_WAIT_SECONDS,
    QueueAttributes,
    attributes_size,
    check_message_attributes,
    is_attempt_id,
    is_content_type,
)
from mqcore.errors import InvalidRequest, MessageTooLarge, echo
from mqcore.names import (
    MAX_PARTITIONS,
    MessageId,
    QueueName,
    check_message_id,
    check_partition,
    is_queue_prefix,
)
from mqcore.protocol import MAX_PEEK_LIMIT, SendEntry
from mqcore.redrive import MAX_REDRIVE_RATE

#: Which ``details`` key names a bad argument: ``parameter`` (query parameter, call argument) or
#: ``field`` (a JSON body's field), as the HTTP API's error bodies do.
DetailKey = Literal["parameter", "field"]

_DIGITS_RE = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class Limit:
    """An integer argument's name and inclusive range, the one place the range is written.

    Attributes:
        name: The argument's name in the mq API (docs/glossary.md), e.g. ``wait_time_seconds``.
        low: Smallest value allowed.
        high: Largest value allowed.
    """

    name: str
    low: int
    high: int

    def contains(self, value: object) -> bool:
        """True if ``value`` is an ``int`` (not a bool) within ``low..high``."""
        return type(value) is int and self.low <= value <= self.high

    def check(self, value: object, *, key: DetailKey = "parameter", where: str = "") -> int:
        """``value`` if :meth:`contains` holds.

        Args:
            value: A Python or JSON value.
            key: ``details`` key naming the argument (``parameter`` or ``field``).
            where: Prefix of the name in the message and details (e.g. ``entries[3].``).
        Raises:
            InvalidRequest: Not an int, or out of range (400; ``details[key]`` = ``where + name``).
        """
        if type(value) is not int or not self.low <= value <= self.high:
            label = f"{where}{self.name}"
            raise InvalidRequest(
                f"{label} must be an integer {self.low}-{self.high}, got {echo(value)}", **{key: label}
            )
        return value

    def optional(self, value: object, *, key: DetailKey = "parameter", where: str = "") -> int | None:
        """:meth:`check` for an optional argument: None stays None."""
        return None if value is None else self.check(value, key=key, where=where)

    def from_text(self, text: str | None, *, name: str | None = None) -> int | None:
        """A query parameter's (or header's) text as a decimal integer in range; None if absent.

        Args:
            text: The text as sent, or None when absent.
            name: The name to report (e.g. ``X-Delay-Seconds``); default :attr:`name`.
        Raises:
            InvalidRequest: Not 1-10 digits only, or out of range (400, ``details.parameter``).
        """
        if text is None:
            return None
        label = name or self.name
        if not _DIGITS_RE.fullmatch(text) or not self.low <= int(text) <= self.high:
            raise InvalidRequest(
                f"{label} must be an integer {self.low}-{self.high}, got {echo(text)}", parameter=label
            )
        return int(text)


#: SQS MaxNumberOfMessages: 1-10 messages per receive.
MAX_MESSAGES = Limit("max_messages", 1, MAX_RECEIVE_MESSAGES)
#: SQS WaitTimeSeconds: 0-20 s of long polling.
WAIT_TIME_SECONDS = Limit("wait_time_seconds", 0, MAX_WAIT_SECONDS)
#: SQS VisibilityTimeout: 0-43,200 s (12 hours).
VISIBILITY_TIMEOUT_SECONDS = Limit("visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS)
#: SQS DelaySeconds: 0-900 s.
DELAY_SECONDS = Limit("delay_seconds", 0, MAX_DELAY_SECONDS)
#: A redrive's rate (SQS MaxNumberOfMessagesPerSecond is 1-500; mq allows up to 10,000).
REDRIVE_RATE = Limit("max_messages_per_second", 1, MAX_REDRIVE_RATE)
#: Messages a peek page holds (mq; SQS has no peek).
PEEK_LIMIT = Limit("limit", 1, MAX_PEEK_LIMIT)
#: The number of partitions of a partitioned receive or peek (SMQ's batches).
PARTITIONS = Limit("partitions", 1, MAX_PARTITIONS)
#: A partition's number; :func:`check_partition_args` also checks it is below ``partitions``.
PARTITION = Limit("partition", 0, MAX_PARTITIONS - 1)


def check_prefix(prefix: object) -> str:
    """A ListQueues prefix: 0-80 characters of ``[A-Za-z0-9_-]`` (SQS QueueNamePrefix).

    Raises:
        InvalidRequest: Anything else (``details.parameter`` = ``prefix``).
    """
    if not is_queue_prefix(prefix):
        raise InvalidRequest(
            "prefix must be 0-80 characters of A-Z, a-z, 0-9, '-' and '_' (a queue name prefix)", parameter="prefix"
        )
    assert isinstance(prefix, str)
    return prefix


def check_attempt_id(attempt_id: object) -> str | None:
    """SQS ReceiveRequestAttemptId: 1-128 printable ASCII characters without spaces; None stays None.

    Raises:
        InvalidRequest: Anything else (``details.parameter`` = ``attempt_id``).
    """
    if attempt_id is None:
        return None
    if not is_attempt_id(attempt_id):
        raise InvalidRequest(
            f"attempt_id must be 1-{MAX_ATTEMPT_ID_CHARS} printable ASCII characters without spaces",
            parameter="attempt_id",
        )
    assert isinstance(attempt_id, str)
    return attempt_id


def check_content_type(content_type: object, *, where: str = "") -> str | None:
    """A stored Content-Type: 1-1024 printable ASCII characters; None stays None.

    Raises:
        InvalidRequest: Anything else (``details.field`` = ``where + "content_type"``).
    """
    if content_type is None:
        return None
    if not is_content_type(content_type):
        raise InvalidRequest(
            f"{where}content_type must be 1-{MAX_CONTENT_TYPE_CHARS} printable ASCII characters",
            field=f"{where}content_type",
        )
    assert isinstance(content_type, str)
    return content_type


def check_after(after: str | None) -> MessageId | None:
    """A peek's ``after``: a message id, or None.

    Raises:
        InvalidRequest: Not a message id (``details.parameter`` = ``after``).
    """
    if after is None:
        return None
    try:
        return check_message_id(after)
    except InvalidRequest as exc:
        raise InvalidRequest(f"after must be a message id: {exc.message}", parameter="after") from None


def check_partition_args(partition: object, partitions: object) -> tuple[int, int] | None:
    """``(partition, partitions)`` given as Python values (both or neither), or None.

    Raises:
        InvalidRequest: Not ints, only one given, or out of range (``details.parameter``).
    """
    return check_partition(PARTITION.optional(partition), PARTITIONS.optional(partitions))


def check_message_size(size_bytes: int, attrs: QueueAttributes) -> None:
    """Refuse a message (or a batch: the sum) whose body plus attributes exceed ``max_message_bytes``.

    Args:
        size_bytes: Body bytes plus :func:`mqcore.attributes.attributes_size` of its attributes.
        attrs: The queue's effective attributes.
    Raises:
        MessageTooLarge: Over the queue's ``max_message_bytes`` (SQS MaximumMessageSize; 413).
    """
    if size_bytes > attrs.max_message_bytes:
        raise MessageTooLarge(size_bytes, attrs.max_message_bytes)


def entry_size(entry: SendEntry) -> int:
    """What a message counts against ``max_message_bytes``: its body plus its attributes, in bytes."""
    attributes = entry.attributes
    return len(entry.body) + attributes_size(attributes) if attributes else len(entry.body)


def send_entry(
    body: bytes,
    content_type: object,
    attributes: object,
    delay_seconds: object,
    attrs: QueueAttributes,
    *,
    where: str = "",
    delay_key: DetailKey = "field",
) -> SendEntry:
    """One message to send, checked (content type, attributes, delay), with the queue's default delay.

    The size rule is separate (:func:`check_message_size`): a batch checks the sum.

    Args:
        body: The body bytes.
        content_type: Stored Content-Type, or None.
        attributes: User message attributes (a mapping name -> string), or None.
        delay_seconds: 0-900, or None for the queue's ``delay_seconds``.
        attrs: The queue's effective attributes.
        where: Prefix of names in errors (``entries[2].``).
        delay_key: ``details`` key naming a bad delay.
    Raises:
        InvalidRequest: Bad content type or delay.
        InvalidAttribute: Bad message attributes (SQS's rules).
    """
    ctype = check_content_type(content_type, where=where)
    checked = check_message_attributes(dict(attributes) if isinstance(attributes, Mapping) else attributes)
    delay = DELAY_SECONDS.optional(delay_seconds, key=delay_key, where=where)
    delay = attrs.delay_seconds if delay is None else delay
    return SendEntry(body, ctype, checked or None, delay * 1000)


@dataclass(slots=True)  # not frozen: built on every receive, and a frozen __init__ costs ~1 us
class ReceiveArgs:
    """A receive's arguments, each checked; None = the queue's default (resolved by :meth:`resolve`).

    Attributes:
        max_messages: 1-10 (SQS MaxNumberOfMessages).
        wait_time_seconds: 0-20, or None (SQS WaitTimeSeconds).
        visibility_timeout_seconds: 0-43,200, or None (SQS VisibilityTimeout).
        attempt_id: SQS ReceiveRequestAttemptId, or None.
        partition: ``(i, M)``: only partition ``i`` of ``M`` (SMQ's batches), or None.
    """

    max_messages: int = 1
    wait_time_seconds: int | None = None
    visibility_timeout_seconds: int | None = None
    attempt_id: str | None = None
    partition: tuple[int, int] | None = None

    def resolve(self, queue: QueueName, attrs: QueueAttributes) -> ReceiveRequest:
        """The receive with the queue's defaults filled in (``receive_wait_seconds``, ``visibility_timeout_seconds``).

        Args:
            queue: The queue (checked).
            attrs: Its effective attributes.
        """
        visibility = attrs.visibility_timeout_seconds
        if self.visibility_timeout_seconds is not None:
            visibility = self.visibility_timeout_seconds
        wait = attrs.receive_wait_seconds if self.wait_time_seconds is None else self.wait_time_seconds
        return ReceiveRequest(queue, self.max_messages, visibility * 1000, wait, self.attempt_id, self.partition)


@dataclass(slots=True)  # not frozen: built on every receive, and a frozen __init__ costs ~1 us
class ReceiveRequest:
    """A receive ready to run: checked, every default resolved.

    Attributes:
        queue: The queue.
        max_messages: 1-10.
        visibility_timeout_ms: The lease's length, ms.
        wait_time_seconds: How long to wait for a message when none is ready, s (0 = no wait).
        attempt_id: SQS ReceiveRequestAttemptId, or None.
        partition: ``(i, M)`` or None.
    """

    queue: QueueName
    max_messages: int
    visibility_timeout_ms: int
    wait_time_seconds: int
    attempt_id: str | None
    partition: tuple[int, int] | None


def check_receive(
    max_messages: object = 1,
    wait_time_seconds: object = None,
    visibility_timeout_seconds: object = None,
    attempt_id: object = None,
    partition: object = None,
    partitions: object = None,
) -> ReceiveArgs:
    """A receive's Python arguments checked in the HTTP API's order (SQS ReceiveMessage's ranges).

    Raises:
        InvalidRequest: An argument out of range, not an int, or only one of partition/partitions
            (``details.parameter`` names it).
    """
    return ReceiveArgs(
        MAX_MESSAGES.check(max_messages),
        WAIT_TIME_SECONDS.optional(wait_time_seconds),
        VISIBILITY_TIMEOUT_SECONDS.optional(visibility_timeout_seconds),
        check_attempt_id(attempt_id),
        check_partition_args(partition, partitions),
    )


def receive_args_from_query(params: dict[str, str]) -> tuple[ReceiveArgs, bool]:
    """A receive's query parameters (``GET /<queue>/messages``) checked.

    Args:
        params: Query parameters, each once (``max_messages``, ``wait_time_seconds``,
            ``visibility_timeout_seconds``, ``attempt_id``, ``partition``, ``partitions``).
    Returns:
        (the arguments, whether ``max_messages`` was given: the JSON form of the answer).
    Raises:
        InvalidRequest: As :func:`check_receive`.
    """
    max_messages = MAX_MESSAGES.from_text(params.get("max_messages"))
    args = ReceiveArgs(
        max_messages or 1,
        WAIT_TIME_SECONDS.from_text(params.get("wait_time_seconds")),
        VISIBILITY_TIMEOUT_SECONDS.from_text(params.get("visibility_timeout_seconds")),
        check_attempt_id(params.get("attempt_id")),
        partition_from_query(params),
    )
    return args, max_messages is not None


def partition_from_query(params: dict[str, str]) -> tuple[int, int] | None:
    """``(partition, partitions)`` from query text, or None when neither is given.

    Raises:
        InvalidRequest: Only one of them, or out of range (``details.parameter``).
    """
    partitions = _ANY_PARTITIONS.from_text(params.get("partitions"))
    partition = _ANY_PARTITION.from_text(params.get("partition"))
    return check_partition(partition, partitions)


# Query text is first read as any digits; check_partition then words the range error.
_ANY_PARTITIONS = Limit("partitions", 0, 10**9)
_ANY_PARTITION = Limit("partition", 0, 10**9)
