"""Queue attributes and message attributes: their names, ranges, defaults and checks.

Queue attributes live in ``queues/<queue>/.attributes`` (``docs/protocol.md``,
"Queue attributes"). The file holds only the keys set explicitly; every other
key takes the default of whoever reads it (the front end's defaults come from
its own options, e.g. ``--visibility-timeout``). Ranges follow Amazon SQS
where SQS has the same setting, and are cited per field.

Pure code: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from mqcore.errors import InvalidAttribute, InvalidRequest, cap, echo
from mqcore.names import QueueName, check_queue_name, is_fifo_queue

#: Largest visibility timeout, in seconds (SQS: VisibilityTimeout 0-43200).
MAX_VISIBILITY_TIMEOUT_SECONDS = 43_200
#: Largest delay of a message, in seconds (SQS: DelaySeconds 0-900).
MAX_DELAY_SECONDS = 900
#: Longest long-polling wait, in seconds (SQS: WaitTimeSeconds 0-20).
MAX_WAIT_SECONDS = 20
#: Retention bounds, in seconds (SQS: MessageRetentionPeriod 60-1,209,600; default 345,600 = 4 days).
MIN_RETENTION_SECONDS = 60
MAX_RETENTION_SECONDS = 1_209_600
DEFAULT_RETENTION_SECONDS = 345_600
#: Largest message body, in bytes (SQS: 1 MiB).
MAX_MESSAGE_BYTES = 1_048_576
#: Default maximum receive count when only a dead-letter queue is given (SMQ retries 5 times).
DEFAULT_MAX_RECEIVE_COUNT = 5
#: Largest maximum receive count (SQS: maxReceiveCount 1-1000).
MAX_RECEIVE_COUNT_LIMIT = 1000
#: Most messages one receive returns (SQS: MaxNumberOfMessages 1-10).
MAX_RECEIVE_MESSAGES = 10
#: Longest receive request attempt id, in characters (SQS: ReceiveRequestAttemptId 1-128).
MAX_ATTEMPT_ID_CHARS = 128
#: Longest Content-Type of a message, in characters.
MAX_CONTENT_TYPE_CHARS = 1024

_ATTEMPT_ID_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_ATTEMPT_ID_CHARS}}}")
_CONTENT_TYPE_RE = re.compile(rf"[\x20-\x7e]{{1,{MAX_CONTENT_TYPE_CHARS}}}")


def is_attempt_id(value: object) -> bool:
    """True for a valid receive request attempt id: 1-128 printable ASCII characters, no space (SQS's rule)."""
    return isinstance(value, str) and _ATTEMPT_ID_RE.fullmatch(value) is not None


def is_content_type(value: object) -> bool:
    """True for a Content-Type mq stores: 1-1,024 printable ASCII characters."""
    return isinstance(value, str) and _CONTENT_TYPE_RE.fullmatch(value) is not None


#: Largest capacity, in ready messages.
MAX_CAPACITY = 1_000_000_000
#: Most user attributes on one message (SQS: 10).
MAX_MESSAGE_ATTRIBUTES = 10
#: Longest message attribute name, in characters (SQS: 256).
MAX_ATTRIBUTE_NAME_CHARS = 256

#: Largest set of user attributes of one message, as compact ASCII JSON, in bytes. They travel
#: in the X-Message-Attributes header of single sends and receives, and HTTP parsers (aiohttp's
#: client and server among them) refuse header fields over 8,190 bytes.
MAX_ATTRIBUTES_JSON_BYTES = 8_000

_ATTRIBUTE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
#: Characters SQS allows in bodies and attribute values: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF.
_SQS_TEXT_RE = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


def is_sqs_text(value: object) -> bool:
    """True for a string of only the characters SQS allows in bodies and attribute values (#x9 #xA #xD ...)."""
    return isinstance(value, str) and _SQS_TEXT_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class QueueAttributes:
    """The effective attributes of a queue (every field has a value).

    JSON keys are the field names; units are in the names.
    """

    visibility_timeout_seconds: int = 30
    """Default visibility timeout of a receive, in seconds (SQS: VisibilityTimeout 0-43200, default 30)."""
    delay_seconds: int = 0
    """Default delay of a sent message, in seconds (SQS: DelaySeconds 0-900)."""
    receive_wait_seconds: int = 0
    """Default long-polling wait of a receive, in seconds (SQS: ReceiveMessageWaitTimeSeconds 0-20)."""
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    """Age, from its send time, at which a message is removed, in seconds (SQS: MessageRetentionPeriod
    60-1,209,600, default 4 days). A dead-lettered message keeps its original send time, as in SQS."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """Largest body accepted, in bytes (SQS: MaximumMessageSize, up to 1 MiB); the daemon's
    ``--max-message-size`` caps it."""
    max_receive_count: int | None = None
    """Receives after which a message moves to ``dead_letter_queue`` (SQS: RedrivePolicy maxReceiveCount 1-1000)."""
    dead_letter_queue: QueueName | None = None
    """Queue that receives messages received more than ``max_receive_count`` times (SQS: deadLetterTargetArn)."""
    capacity: int | None = None
    """Most ready messages the queue holds (None = unbounded); a send to a full queue waits
    (VSQS's bounded queue). Counts ready messages only, as RabbitMQ's max-length."""
    capacity_wait_seconds: int = 20
    """How long a send to a full queue waits for room before failing with ``queue_full``, in seconds (0-20)."""
    content_based_deduplication: bool = False
    """FIFO queues only (a name ending ``.fifo``): a message sent without a deduplication id gets the
    SHA-256 of its body as one (SQS: ContentBasedDeduplication; docs/protocol.md 19)."""
    deduplication_scope: str = "queue"
    """FIFO queues only: ``queue`` (a deduplication id counts across the queue) or ``message_group``
    (within its message group only) (SQS: DeduplicationScope messageQueue / messageGroup)."""
    fifo_throughput_limit: str = "per_queue"
    """FIFO queues only: ``per_queue`` or ``per_message_group_id`` (needs ``deduplication_scope``
    ``message_group``). Stored and reported; mq has one throughput mode (SQS: FifoThroughputLimit)."""

    @classmethod
    def from_json(cls, obj: object, defaults: QueueAttributes | None = None) -> QueueAttributes:
        """Return ``defaults`` (or the built-in defaults) overlaid with the keys of ``obj``.

        Raises:
            InvalidAttribute: ``obj`` is not an object, has an unknown key or a value out of range.
        """
        changes = check_changes(obj)
        return effective({k: v for k, v in changes.items() if v is not None}, defaults or cls())

    def to_json(self) -> dict[str, Any]:
        """Every attribute as a JSON-ready dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: The JSON keys of queue attributes.
KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueueAttributes))

_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "visibility_timeout_seconds": (0, MAX_VISIBILITY_TIMEOUT_SECONDS, "SQS: VisibilityTimeout 0-43200"),
    "delay_seconds": (0, MAX_DELAY_SECONDS, "SQS: DelaySeconds 0-900"),
    "receive_wait_seconds": (0, MAX_WAIT_SECONDS, "SQS: ReceiveMessageWaitTimeSeconds 0-20"),
    "retention_seconds": (MIN_RETENTION_SECONDS, MAX_RETENTION_SECONDS, "SQS: MessageRetentionPeriod 60-1209600"),
    "max_message_bytes": (1, MAX_MESSAGE_BYTES, "SQS: MaximumMessageSize up to 1 MiB"),
    "max_receive_count": (1, MAX_RECEIVE_COUNT_LIMIT, "SQS: maxReceiveCount 1-1000"),
    "capacity": (1, MAX_CAPACITY, "1-1000000000 ready messages"),
    "capacity_wait_seconds": (0, MAX_WAIT_SECONDS, "0-20 seconds, as long polling"),
}


#: Attributes that are JSON booleans.
_BOOL_KEYS = ("content_based_deduplication",)
#: Attributes that are one of a few strings (the first is the default), with their rule.
_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "deduplication_scope": (("queue", "message_group"), "SQS: DeduplicationScope"),
    "fifo_throughput_limit": (("per_queue", "per_message_group_id"), "SQS: FifoThroughputLimit"),
}


def check_changes(obj: object) -> dict[str, Any]:
    """Check a partial attributes object ``{key: value or None}``; return it with checked values.

    ``None`` means "back to the default". Integers must be JSON integers (not
    strings, not booleans).

    Raises:
        InvalidAttribute: Not an object, an unknown key, a wrong type or a value out of range
            (``details["name"]`` names the key).
    """
    if not isinstance(obj, dict):
        raise InvalidAttribute("queue attributes must be a JSON object", name=None)
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key not in KEYS:
            raise InvalidAttribute(f"unknown queue attribute {echo(key)}; known: {', '.join(KEYS)}", name=cap(key))
        if value is None:
            out[key] = None
            continue
        if key in _BOOL_KEYS:
            if type(value) is not bool:
                raise InvalidAttribute(f"{key} must be true or false, got {echo(value)}", name=key)
            out[key] = value
            continue
        if key in _CHOICES:
            choices, rule = _CHOICES[key]
            if value not in choices:
                raise InvalidAttribute(
                    f"{key} must be one of {', '.join(choices)} ({rule}), got {echo(value)}", name=key
                )
            out[key] = value
            continue
        if key == "dead_letter_queue":
            try:
                out[key] = check_queue_name(value)
            except ValueError:
                raise InvalidAttribute(
                    "dead_letter_queue must be a queue name (1-80 characters of A-Z, a-z, 0-9, '-', '_')", name=key
                ) from None
            continue
        low, high, rule = _INT_RANGES[key]
        if type(value) is not int or not low <= value <= high:
            raise InvalidAttribute(f"{key} must be an integer {low}-{high} ({rule}), got {echo(value)}", name=key)
        out[key] = value
    return out


def check_queue_kind(queue: str, changes: dict[str, Any]) -> None:
    """Refuse attributes that do not fit the queue's kind (FIFO or standard; SQS's rules).

    Raises:
        InvalidAttribute: ``content_based_deduplication`` true, or ``deduplication_scope`` /
            ``fifo_throughput_limit`` other than their defaults, on a queue whose name does not end ``.fifo``.
        InvalidRequest: A ``dead_letter_queue`` of the other kind: a FIFO queue's must be FIFO, a
            standard queue's standard (SQS: "Dead-letter queue must be same type of queue as the
            source", InvalidParameterValue on CreateQueue and SetQueueAttributes).
    """
    target = changes.get("dead_letter_queue")
    if target is not None and is_fifo_queue(target) != is_fifo_queue(queue):
        kind = "a FIFO queue" if is_fifo_queue(queue) else "a standard queue"
        raise InvalidRequest(
            f"the dead-letter queue of {kind} must be {kind} too (SQS: same type of queue as the source)",
            parameter="dead_letter_queue",
            value=target,
        )
    if changes.get("content_based_deduplication") and not is_fifo_queue(queue):
        raise InvalidAttribute(
            "content_based_deduplication is for FIFO queues only (names ending in .fifo)",
            name="content_based_deduplication",
        )
    if not is_fifo_queue(queue):
        for key, (choices, _) in _CHOICES.items():
            if changes.get(key) not in (None, choices[0]):
                raise InvalidAttribute(f"{key} is for FIFO queues only (names ending in .fifo)", name=key)


def check_fifo_throughput(explicit: dict[str, Any]) -> None:
    """A queue's explicit attributes (after a change): ``per_message_group_id`` needs ``message_group`` scope.

    SQS: FifoThroughputLimit perMessageGroupId is allowed only with DeduplicationScope messageGroup.

    Raises:
        InvalidAttribute: ``fifo_throughput_limit`` ``per_message_group_id`` without that scope.
    """
    if explicit.get("fifo_throughput_limit") == "per_message_group_id" and (
        explicit.get("deduplication_scope") != "message_group"
    ):
        raise InvalidAttribute(
            "fifo_throughput_limit per_message_group_id needs deduplication_scope message_group "
            "(SQS: FifoThroughputLimit perMessageGroupId needs DeduplicationScope messageGroup)",
            name="fifo_throughput_limit",
        )


def effective(explicit: dict[str, Any], defaults: QueueAttributes) -> QueueAttributes:
    """``defaults`` overlaid with the explicitly set keys of a queue.

    A dead-letter queue without ``max_receive_count`` gets
    :data:`DEFAULT_MAX_RECEIVE_COUNT` (SMQ: 5 attempts). Keys unknown to this
    version (written by a newer one) are ignored.
    """
    values = {k: v for k, v in explicit.items() if k in KEYS and v is not None}
    attrs = dataclasses.replace(defaults, **values)
    if attrs.dead_letter_queue is not None and attrs.max_receive_count is None:
        attrs = dataclasses.replace(attrs, max_receive_count=DEFAULT_MAX_RECEIVE_COUNT)
    if attrs.max_message_bytes > defaults.max_message_bytes:  # the daemon's limit caps the queue's
        attrs = dataclasses.replace(attrs, max_message_bytes=defaults.max_message_bytes)
    return attrs


def check_message_attributes(obj: object) -> dict[str, str]:
    """Check user attributes of a message: a JSON object of name -> string value.

    Rules (SQS's, for the string type): at most 10 attributes; names 1-256
    characters of ``[A-Za-z0-9_.-]``, not starting or ending with ``.``, no
    ``..``, not starting with ``AWS.`` or ``Amazon.`` (any case). Values are
    strings of the characters SQS allows; their size counts towards the
    message size limit. All of them together are at most
    :data:`MAX_ATTRIBUTES_JSON_BYTES` as compact ASCII JSON (mq's own rule:
    they travel in one HTTP header).

    Raises:
        InvalidAttribute: Any rule broken (``details["name"]`` names the attribute).
    """
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise InvalidAttribute("message attributes must be a JSON object of name -> string", name=None)
    if len(obj) > MAX_MESSAGE_ATTRIBUTES:
        raise InvalidAttribute(
            f"a message has at most {MAX_MESSAGE_ATTRIBUTES} attributes (SQS), got {len(obj)}", name=None
        )
    for name, value in obj.items():
        if (
            not isinstance(name, str)
            or not _ATTRIBUTE_NAME_RE.fullmatch(name)
            or name.startswith(".")
            or name.endswith(".")
            or ".." in name
            or name.lower().startswith(("aws.", "amazon."))
        ):
            raise InvalidAttribute(
                "message attribute names are 1-256 characters of A-Z, a-z, 0-9, '_', '-', '.' "
                "(no leading, trailing or double '.', no 'AWS.'/'Amazon.' prefix)",
                name=cap(name) if isinstance(name, str) else None,
            )
        if not isinstance(value, str):
            raise InvalidAttribute(f"message attribute {echo(name)} must have a string value", name=cap(name))
        if not _SQS_TEXT_RE.fullmatch(value):
            raise InvalidAttribute(
                f"message attribute {echo(name)} holds a character SQS does not allow (controls other than tab, "
                "newline and carriage return, lone surrogates, U+FFFE/U+FFFF)",
                name=cap(name),
            )
    size = len(json.dumps(obj, separators=(",", ":")))
    if size > MAX_ATTRIBUTES_JSON_BYTES:
        raise InvalidAttribute(
            f"message attributes are at most {MAX_ATTRIBUTES_JSON_BYTES} bytes as JSON (they travel in an HTTP "
            f"header), got {size}",
            name=None,
        )
    return dict(obj)


def attributes_size(attributes: dict[str, str]) -> int:
    """Bytes that message attributes count towards the size limit (UTF-8 names plus values, as SQS)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in attributes.items())
