"""Amazon SQS wire compatibility: the pure translation between SQS's API shapes and mq's (docs/sqs.md).

The ``mq`` daemon serves SQS's AWS JSON 1.0 protocol on ``POST /`` (``daemons/_sqs.py``). That
layer is thin: it parses the JSON request, calls the same service layer the native routes use
(``daemons._broker.Broker``) and shapes SQS's answer with the functions here. What lives here is
only what the wire protocol adds: SQS's error codes and their legacy query codes, queue URLs and
ARNs, queue attribute names and string values, typed message attributes and their MD5
(MD5OfMessageAttributes, as the AWS SDKs for Java, .NET and Go verify it), system attributes,
batch request rules with SQS's error codes, pagination tokens and message-move task handles.
Every rule of the queue itself (ranges, receipt handles, attempts, dead-letter, redrive) stays in
the service layer and ``mqcore.attributes``.

Pure code: no I/O, no HTTP.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from mqcore import sqs_fifo
from mqcore.attributes import (
    MAX_DELAY_SECONDS,
    MAX_RECEIVE_COUNT_LIMIT,
    QueueAttributes,
    check_message_attributes,
    is_sqs_text,
)
from mqcore.errors import InvalidAttribute, MQError
from mqcore.names import QueueName, check_queue_name
from mqcore.service import requests as service_requests
from mqcore.service.requests import Limit

#: Account id in queue URLs and ARNs unless configured (ElasticMQ's and LocalStack's too).
DEFAULT_ACCOUNT_ID = "000000000000"
#: Region in ARNs unless configured.
DEFAULT_REGION = "us-east-1"
#: Most entries of an SQS batch request (SQS: 10).
MAX_BATCH_ENTRIES = 10
#: Largest SQS batch request, bodies and attributes together, in bytes (SQS: 1 MiB).
MAX_BATCH_BYTES = 1_048_576
#: Most tags on a queue (SQS: 50); key 1-128 characters, value 0-256.
MAX_TAGS = 50
#: A purge within this long of the last one answers PurgeQueueInProgress, in ms (SQS: 60 s).
PURGE_INTERVAL_MS = 60_000
#: Largest MaxResults of ListQueues / ListDeadLetterSourceQueues (SQS: 1-1000).
MAX_LIST_RESULTS = 1000
#: ListMessageMoveTasks' MaxResults (SQS: 1-10).
MOVE_TASKS_MAX_RESULTS = Limit("MaxResults", 1, 10)
#: StartMessageMoveTask's MaxNumberOfMessagesPerSecond (SQS: 1-500; mq's own API allows more).
REDRIVE_RATE = Limit(service_requests.REDRIVE_RATE.name, 1, min(500, service_requests.REDRIVE_RATE.high))

_ENTRY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_DATA_TYPE_RE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]{1,200})?")
_DIGITS_RE = re.compile(r"-?[0-9]{1,12}")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")

#: SQS error code -> (the legacy query error code botocore maps back to the code, HTTP status).
#: Source: the SQS API reference's "Errors" sections and botocore's SQS model (awsQueryCompatible).
ERRORS: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "MissingParameter": ("MissingParameter", 400),
    "InvalidAction": ("InvalidAction", 400),
    "InvalidAddress": ("InvalidAddress", 404),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "RequestThrottled": ("RequestThrottled", 400),
    "OverLimit": ("OverLimit", 403),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "InternalError": ("InternalError", 500),
}

#: mq error code -> SQS error code (anything else: InternalError). Receipt-handle outcomes that
#: SQS treats as success or as MessageNotInflight are decided per action (daemons/_sqs.py).
_FROM_MQ: dict[str, str] = {
    "queue_not_found": "QueueDoesNotExist",
    "queue_name_exists": "QueueNameExists",
    "invalid_receipt_handle": "ReceiptHandleIsInvalid",
    "message_not_in_flight": "MessageNotInflight",
    "stale_receipt_handle": "MessageNotInflight",
    "message_not_found": "MessageNotInflight",
    "invalid_attribute": "InvalidAttributeValue",
    "invalid_request": "InvalidParameterValue",
    "invalid_queue_name": "InvalidParameterValue",
    "invalid_message_id": "InvalidParameterValue",
    "message_too_large": "InvalidParameterValue",
    "queue_full": "RequestThrottled",
    "storage_unavailable": "ServiceUnavailable",
    "insufficient_storage": "ServiceUnavailable",
    "redrive_in_progress": "UnsupportedOperation",
    "redrive_not_running": "ResourceNotFoundException",
}


class SqsError(MQError):
    """An error answered with one of SQS's error codes (:data:`ERRORS`).

    Args:
        sqs_code: The SQS code, a key of :data:`ERRORS` (e.g. ``QueueDoesNotExist``).
        message: Human-readable explanation (the JSON error's ``message``).
    """

    code: ClassVar[str] = "sqs_error"
    status: ClassVar[int] = 400

    def __init__(self, sqs_code: str, message: str) -> None:
        super().__init__(message, sqs_code=sqs_code)
        self.sqs_code = sqs_code

    @property
    def http_status(self) -> int:
        """The HTTP status SQS answers this code with."""
        return ERRORS.get(self.sqs_code, ("", 400))[1]

    @property
    def query_error(self) -> str:
        """The ``x-amzn-query-error`` header value: ``LegacyCode;Sender`` (``;Receiver`` for 5xx)."""
        legacy, status = ERRORS.get(self.sqs_code, (self.sqs_code, 400))
        return f"{legacy};{'Receiver' if status >= 500 else 'Sender'}"

    def to_wire(self) -> dict[str, str]:
        """The AWS JSON 1.0 error body ``{"__type": "com.amazonaws.sqs#Code", "message": ...}``."""
        return {"__type": f"com.amazonaws.sqs#{self.sqs_code}", "message": self.message}


def from_mq_error(exc: MQError) -> SqsError:
    """The SQS error for an error of mq's service layer (mq's message kept; unknown codes: InternalError)."""
    if isinstance(exc, SqsError):
        return exc
    code = _FROM_MQ.get(exc.code, "InternalError")
    if code == "QueueDoesNotExist":
        return SqsError(code, "The specified queue does not exist.")
    return SqsError(code, exc.message if code != "InternalError" else "internal error; see the server log")


# -- queue URLs and ARNs -------------------------------------------------------


def queue_url(base_url: str, account_id: str, queue: str) -> str:
    """``<base_url>/<account_id>/<queue>``, e.g. ``http://127.0.0.1:8080/000000000000/jobs``."""
    return f"{base_url.rstrip('/')}/{account_id}/{queue}"


def queue_arn(region: str, account_id: str, queue: str) -> str:
    """``arn:aws:sqs:<region>:<account_id>:<queue>`` (SQS QueueArn)."""
    return f"arn:aws:sqs:{region}:{account_id}:{queue}"


def queue_from_url(url: object) -> QueueName:
    """The queue a QueueUrl names: its last path segment (any host and account id are accepted).

    Raises:
        SqsError: MissingParameter (absent), QueueDoesNotExist (not a URL ending in a queue name).
    """
    if url is None:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    if not isinstance(url, str):
        raise SqsError("InvalidParameterValue", "QueueUrl must be a string.")
    path = urlsplit(url).path if "://" in url else url
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return check_queue_name(name)
    except ValueError:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None


def queue_from_arn(arn: object, field: str) -> QueueName:
    """The queue an ``arn:aws:sqs:REGION:ACCOUNT:QUEUE`` names (any region and account are accepted).

    Raises:
        SqsError: InvalidParameterValue (not such an ARN), MissingParameter (absent).
    """
    if arn is None:
        raise SqsError("MissingParameter", f"The request must contain the parameter {field}.")
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"]:
        raise SqsError("InvalidParameterValue", f"{field} must be an SQS queue ARN arn:aws:sqs:REGION:ACCOUNT:QUEUE.")
    try:
        return check_queue_name(parts[5])
    except ValueError:
        raise SqsError("InvalidParameterValue", f"{field} does not name a valid queue.") from None


def check_new_queue_name(name: object) -> QueueName:
    """A CreateQueue QueueName: 1-80 characters of ``[A-Za-z0-9_-]``, a FIFO queue's ending ``.fifo`` (SQS).

    Raises:
        SqsError: MissingParameter, InvalidParameterValue.
    """
    if name is None:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    try:
        return check_queue_name(name)  # type: ignore[arg-type]
    except ValueError:
        raise SqsError(
            "InvalidParameterValue",
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ) from None


def page(names: Sequence[str], max_results: object, next_token: object) -> tuple[list[str], str | None]:
    """One page of sorted ``names`` after ``next_token`` (SQS ListQueues' MaxResults 1-1000 / NextToken).

    Without MaxResults every name is returned (as SQS, up to 1,000) and no token.

    Returns:
        (the names of this page, the NextToken of the next page or None).
    Raises:
        SqsError: InvalidParameterValue (MaxResults out of range, a token mq did not make).
    """
    if max_results is not None and (type(max_results) is not int or not 1 <= max_results <= MAX_LIST_RESULTS):
        raise SqsError("InvalidParameterValue", f"MaxResults must be an integer 1-{MAX_LIST_RESULTS}.")
    start = ""
    if next_token is not None:
        try:
            start = base64.urlsafe_b64decode(str(next_token).encode()).decode()
        except (ValueError, binascii.Error):
            raise SqsError("InvalidParameterValue", "Invalid NextToken value.") from None
    rest = [n for n in names if n > start]
    if max_results is None:
        return rest[:MAX_LIST_RESULTS], None
    chosen = rest[:max_results]
    token = base64.urlsafe_b64encode(chosen[-1].encode()).decode() if len(rest) > max_results else None
    return chosen, token


# -- queue attributes ----------------------------------------------------------

#: SQS queue attribute -> mq attribute key (integer seconds or bytes; mqcore.attributes).
INT_ATTRIBUTES: dict[str, str] = {
    "VisibilityTimeout": "visibility_timeout_seconds",
    "DelaySeconds": "delay_seconds",
    "ReceiveMessageWaitTimeSeconds": "receive_wait_seconds",
    "MessageRetentionPeriod": "retention_seconds",
    "MaximumMessageSize": "max_message_bytes",
}
#: Attributes mq keeps as given in the queue's ``.sqs`` file and reports back, without acting on them.
STORED_ATTRIBUTES = (
    "RedriveAllowPolicy",
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
)
#: Attributes only GetQueueAttributes reports.
READ_ONLY_ATTRIBUTES = (
    "QueueArn",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
#: Every name GetQueueAttributes knows ("All" asks for all of them).
ALL_QUEUE_ATTRIBUTES = (
    *INT_ATTRIBUTES,
    "RedrivePolicy",
    *STORED_ATTRIBUTES,
    *READ_ONLY_ATTRIBUTES,
    *sqs_fifo.FIFO_QUEUE_ATTRIBUTES,
)


@dataclass(frozen=True, slots=True)
class QueueAttributeChanges:
    """SQS queue attributes translated: ``mq`` changes for the service layer, the rest for ``.sqs``.

    Attributes:
        changes: ``{mq key: value or None}`` (None = back to the default), for Broker.set_attributes.
        stored: ``{SQS name: string or None}`` of :data:`STORED_ATTRIBUTES` ("" or None removes one).
    """

    changes: dict[str, Any]
    stored: dict[str, str | None]


def translate_queue_attributes(attributes: object, *, creating: bool = False) -> QueueAttributeChanges:
    """Translate SQS ``Attributes`` of CreateQueue (``creating``) / SetQueueAttributes (name -> string value).

    RedrivePolicy is ``{"deadLetterTargetArn": ARN, "maxReceiveCount": 1-1000}`` as a JSON string
    (an empty string removes it). The FIFO attributes are :func:`mqcore.sqs_fifo.translate_attribute`'s.

    Raises:
        SqsError: InvalidAttributeName (unknown or read-only name, FifoQueue after creation),
            InvalidAttributeValue (not a string, not an integer where one is needed, a bad RedrivePolicy).
    """
    if attributes is None:
        return QueueAttributeChanges({}, {})
    if not isinstance(attributes, dict):
        raise SqsError("InvalidParameterValue", "Attributes must be a map of attribute name to string value.")
    changes: dict[str, Any] = {}
    stored: dict[str, str | None] = {}
    for name, value in attributes.items():
        if not isinstance(value, str):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        if name in INT_ATTRIBUTES:
            if not _DIGITS_RE.fullmatch(value):
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            changes[INT_ATTRIBUTES[name]] = int(value)
        elif name == "RedrivePolicy":
            changes.update(_redrive_policy(value))
        elif name in STORED_ATTRIBUTES:
            stored[name] = value or None
        elif sqs_fifo.translate_attribute(name, value, changes, creating=creating):
            pass
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    try:
        QueueAttributes.from_json({k: v for k, v in changes.items() if v is not None})  # mq's ranges, once
    except InvalidAttribute as exc:
        sqs_name = next((s for s, k in INT_ATTRIBUTES.items() if k == exc.details.get("name")), "RedrivePolicy")
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {sqs_name}: {exc.message}") from None
    return QueueAttributeChanges(changes, stored)


def _redrive_policy(value: str) -> dict[str, Any]:
    if not value:
        return {"dead_letter_queue": None, "max_receive_count": None}
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict) or "deadLetterTargetArn" not in policy:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map "
            "with deadLetterTargetArn and maxReceiveCount.",
        )
    try:
        target = queue_from_arn(policy.get("deadLetterTargetArn"), "deadLetterTargetArn")
    except SqsError as exc:
        raise SqsError(
            "InvalidAttributeValue", f"Invalid value for the parameter RedrivePolicy. {exc.message}"
        ) from None
    count = policy.get("maxReceiveCount", None)
    if isinstance(count, str) and _DIGITS_RE.fullmatch(count):
        count = int(count)
    if type(count) is not int or not 1 <= count <= MAX_RECEIVE_COUNT_LIMIT:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter RedrivePolicy: maxReceiveCount must be 1-{MAX_RECEIVE_COUNT_LIMIT}.",
        )
    return {"dead_letter_queue": target, "max_receive_count": count}


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """What GetQueueAttributes reports about one queue, gathered by the daemon.

    Attributes:
        attributes: Its effective mq attributes.
        stored: Its ``.sqs`` attributes (:data:`STORED_ATTRIBUTES`).
        ready, in_flight, delayed: Approximate message counts.
        created_ms, modified_ms: Creation and last change of its attributes, epoch ms (None: unknown).
    """

    attributes: QueueAttributes
    stored: dict[str, str]
    ready: int
    in_flight: int
    delayed: int
    created_ms: int | None
    modified_ms: int | None


def wanted_names(names: object, known: Iterable[str], field: str) -> list[str]:
    """The attribute names a request asks for (``All`` = every one of ``known``; [] if absent).

    Raises:
        SqsError: InvalidAttributeName (a name not in ``known``), InvalidParameterValue (not a list of strings).
    """
    if names is None:
        return []
    known = list(known)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SqsError("InvalidParameterValue", f"{field} must be a list of attribute names.")
    if "All" in names:
        return known
    for name in names:
        if name not in known:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    return list(dict.fromkeys(names))


def queue_attributes_out(
    facts: QueueFacts, names: list[str], *, region: str, account_id: str, queue: str
) -> dict[str, str]:
    """GetQueueAttributes' ``Attributes`` map (every value a string, as SQS) for the requested ``names``."""
    attrs = facts.attributes
    out: dict[str, str] = {}
    for name in names:
        if name in INT_ATTRIBUTES:
            out[name] = str(getattr(attrs, INT_ATTRIBUTES[name]))
        elif name == "RedrivePolicy":
            if attrs.dead_letter_queue is not None:
                out[name] = json.dumps(
                    {
                        "deadLetterTargetArn": queue_arn(region, account_id, attrs.dead_letter_queue),
                        "maxReceiveCount": attrs.max_receive_count,
                    },
                    separators=(",", ":"),
                )
        elif name in STORED_ATTRIBUTES:
            if name in facts.stored:
                out[name] = facts.stored[name]
        elif name == "QueueArn":
            out[name] = queue_arn(region, account_id, queue)
        elif name == "CreatedTimestamp":
            out[name] = str((facts.created_ms or 0) // 1000)
        elif name == "LastModifiedTimestamp":
            out[name] = str((facts.modified_ms or facts.created_ms or 0) // 1000)
        elif name == "ApproximateNumberOfMessages":
            out[name] = str(facts.ready)
        elif name == "ApproximateNumberOfMessagesNotVisible":
            out[name] = str(facts.in_flight)
        elif name == "ApproximateNumberOfMessagesDelayed":
            out[name] = str(facts.delayed)
    out.update(sqs_fifo.queue_attributes_out(queue, attrs, names))
    return out


def purge_in_progress(last_purge_ms: int | None, now_ms: int) -> bool:
    """True if a purge at ``now_ms`` comes within 60 s of the last one (SQS: PurgeQueueInProgress)."""
    return last_purge_ms is not None and 0 <= now_ms - last_purge_ms < PURGE_INTERVAL_MS


# -- tags ---------------------------------------------------------------------


def check_tags(tags: object) -> dict[str, str]:
    """TagQueue's / CreateQueue's ``tags``: at most 50, keys 1-128 and values 0-256 characters (SQS).

    Raises:
        SqsError: InvalidParameterValue.
    """
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise SqsError("InvalidParameterValue", "Tags must be a map of tag key to tag value.")
    for key, value in tags.items():
        if not isinstance(value, str) or not 1 <= len(key) <= 128 or len(value) > 256:
            raise SqsError("InvalidParameterValue", f"Invalid tag {key!r}: keys are 1-128, values 0-256 characters.")
    return dict(tags)


def merge_tags(current: dict[str, str], add: dict[str, str], remove: Iterable[str] = ()) -> dict[str, str]:
    """``current`` with ``add`` set and ``remove`` removed.

    Raises:
        SqsError: InvalidParameterValue (more than 50 tags result).
    """
    out = {**current, **add}
    for key in remove:
        out.pop(key, None)
    if len(out) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"A queue has at most {MAX_TAGS} tags.")
    return out


# -- messages -------------------------------------------------------------------


def md5_of_body(body: str) -> str:
    """MD5OfMessageBody: hex MD5 of the body's UTF-8 bytes (SQS)."""
    return hashlib.md5(body.encode("utf-8")).hexdigest()  # SQS's checksum, not a security use


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str | None:
    """MD5OfMessageAttributes as AWS documents it; None for no attributes.

    For each attribute, sorted by name: the name, then the DataType (each as a 4-byte big-endian
    length and UTF-8 bytes), one byte 1 (String, Number) or 2 (Binary), then the value (4-byte
    length and UTF-8 bytes, or the binary bytes). ``attributes`` is in SQS's wire form
    ``{name: {"DataType", "StringValue" | "BinaryValue" (base64)}}``.
    """
    if not attributes:
        return None
    out = bytearray()
    for name in sorted(attributes):
        value = attributes[name]
        data_type = value["DataType"]
        for text in (name, data_type):
            raw = text.encode("utf-8")
            out += struct.pack(">I", len(raw)) + raw
        if data_type.startswith("Binary"):
            raw = base64.b64decode(value["BinaryValue"])
            out += b"\x02" + struct.pack(">I", len(raw)) + raw
        else:
            raw = value["StringValue"].encode("utf-8")
            out += b"\x01" + struct.pack(">I", len(raw)) + raw
    return hashlib.md5(bytes(out)).hexdigest()  # SQS's checksum, not a security use


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message to store, translated from SendMessage / a SendMessageBatch entry.

    Attributes:
        body: The body as UTF-8 bytes.
        attributes: Stored user attributes, name -> string (Binary values as base64).
        attribute_types: DataType of each attribute that is not plain ``String``.
        delay_seconds: The message's DelaySeconds, or None for the queue's.
        size_bytes: What counts towards MaximumMessageSize (body, attribute names, types and values).
        md5_of_body, md5_of_attributes: The checksums of the answer.
        group_id, dedup_id: MessageGroupId and MessageDeduplicationId (FIFO queues: :mod:`mqcore.sqs_fifo`).
    """

    body: bytes
    attributes: dict[str, str]
    attribute_types: dict[str, str]
    delay_seconds: int | None
    size_bytes: int
    md5_of_body: str
    md5_of_attributes: str | None
    group_id: str | None = None
    dedup_id: str | None = None


def outgoing_message(entry: dict[str, Any]) -> OutgoingMessage:
    """Translate and check a SendMessage request or SendMessageBatch entry.

    Rules (SQS): a non-empty MessageBody of the characters SQS allows; DelaySeconds 0-900;
    at most 10 MessageAttributes whose names follow SQS's rules (mqcore.attributes), each with a
    DataType String, Number or Binary (optionally ``.custom``) and a non-empty value of that
    kind (a Number a decimal number). MessageSystemAttributes are not supported. MessageGroupId and
    MessageDeduplicationId are checked against the queue's type by :func:`mqcore.sqs_fifo.check_send`.

    Raises:
        SqsError: MissingParameter, InvalidParameterValue.
    """
    body = entry.get("MessageBody")
    if body is None:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if not isinstance(body, str) or not body:
        raise SqsError("InvalidParameterValue", "The message body must be a non-empty string.")
    if not is_sqs_text(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid binary character in the message body: see the allowed characters in SQS's documentation.",
        )
    if entry.get("MessageSystemAttributes"):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes (AWSTraceHeader) are not supported by mq.")
    delay = entry.get("DelaySeconds")
    if delay is not None and (type(delay) is not int or not 0 <= delay <= MAX_DELAY_SECONDS):
        raise SqsError("InvalidParameterValue", f"DelaySeconds must be an integer 0-{MAX_DELAY_SECONDS}.")
    wire = entry.get("MessageAttributes") or {}
    attributes, types = _stored_attributes(wire)
    raw = body.encode("utf-8")
    size = len(raw) + sum(
        len(k.encode()) + len(v.encode()) + len(types.get(k, "String")) for k, v in attributes.items()
    )
    md5 = hashlib.md5(raw).hexdigest()  # md5_of_body without encoding the body again; not a security use
    return OutgoingMessage(raw, attributes, types, delay, size, md5, md5_of_attributes(wire))


def _stored_attributes(wire: object) -> tuple[dict[str, str], dict[str, str]]:
    if not isinstance(wire, dict):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be a map of name to attribute value.")
    attributes: dict[str, str] = {}
    types: dict[str, str] = {}
    for name, value in wire.items():
        if not isinstance(value, dict):
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r} must be an attribute value.")
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not _DATA_TYPE_RE.fullmatch(data_type):
            raise SqsError(
                "InvalidParameterValue",
                f"The message attribute '{name}' has an invalid message attribute type, the set of supported type "
                "prefixes is Binary, Number, and String.",
            )
        kind = data_type.split(".", 1)[0]
        if kind == "Binary":
            text = value.get("BinaryValue")
            try:
                ok = isinstance(text, str) and len(base64.b64decode(text, validate=True)) > 0
            except (ValueError, binascii.Error):
                ok = False
            if not ok:
                raise SqsError(
                    "InvalidParameterValue",
                    f"Message (user) attribute '{name}' must contain a non-empty value of type 'Binary'.",
                )
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or not text:
                raise SqsError(
                    "InvalidParameterValue",
                    f"Message (user) attribute '{name}' must contain a non-empty value of type '{kind}'.",
                )
            if kind == "Number" and not _NUMBER_RE.fullmatch(text):
                raise SqsError(
                    "InvalidParameterValue", f"Can't cast the value of message (user) attribute '{name}' to a number."
                )
        attributes[name] = text  # type: ignore[assignment]
        if data_type != "String":
            types[name] = data_type
    try:
        check_message_attributes(attributes)  # mq's rules of names, count and characters, once
    except InvalidAttribute as exc:
        raise SqsError("InvalidParameterValue", exc.message) from None
    return attributes, types


def wire_attributes(attributes: dict[str, str], types: dict[str, str], names: object) -> dict[str, dict[str, str]]:
    """The stored user attributes a ReceiveMessage asks for (MessageAttributeNames), in SQS's wire form.

    ``names``: None or [] -> none; ``All`` or ``.*`` -> all; ``prefix.*`` -> names starting with
    ``prefix.``; otherwise exact names (SQS's rules).
    """
    if not names or not isinstance(names, list):
        return {}
    wanted = [n for n in names if isinstance(n, str)]

    def chosen(name: str) -> bool:
        for pattern in wanted:
            if pattern in ("All", ".*") or pattern == name:
                return True
            if pattern.endswith(".*") and name.startswith(pattern[:-1]):
                return True
        return False

    out: dict[str, dict[str, str]] = {}
    for name, value in attributes.items():
        if not chosen(name):
            continue
        data_type = types.get(name, "String")
        key = "BinaryValue" if data_type.startswith("Binary") else "StringValue"
        out[name] = {"DataType": data_type, key: value}
    return out


#: Message system attributes mq reports (MessageSystemAttributeNames / AttributeNames).
SYSTEM_ATTRIBUTES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "DeadLetterQueueSourceArn",
)
#: Names a receive may ask for that mq never has a value for (tracing): accepted, not reported.
_SILENT_SYSTEM_ATTRIBUTES = ("AWSTraceHeader",)


def system_attribute_names(*lists: object) -> list[str]:
    """The system attributes a receive asks for, from AttributeNames and MessageSystemAttributeNames.

    Raises:
        SqsError: InvalidAttributeName.
    """
    out: list[str] = []
    for names in lists:
        known = (*SYSTEM_ATTRIBUTES, *sqs_fifo.FIFO_SYSTEM_ATTRIBUTES, *_SILENT_SYSTEM_ATTRIBUTES)
        out += wanted_names(names, known, "AttributeNames")
    return [n for n in dict.fromkeys(out) if n not in _SILENT_SYSTEM_ATTRIBUTES]


def body_text(body: bytes) -> str:
    """A stored body as SQS's string Body (bytes that are not UTF-8 are replaced by U+FFFD)."""
    return body.decode("utf-8", errors="replace")


def body_and_md5(body: bytes) -> tuple[str, str]:
    """A stored body as SQS's Body (:func:`body_text`) and its MD5OfBody (:func:`md5_of_body`).

    A body that is UTF-8 (every body sent through SQS) is hashed as stored, without encoding
    its text again; one that is not is hashed as delivered (with U+FFFD).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body_text(body)
        return text, md5_of_body(text)
    return text, hashlib.md5(body).hexdigest()  # SQS's checksum, not a security use


def check_batch(entries: object, field: str) -> list[dict[str, Any]]:
    """A batch request's entries (SQS's batch rules, with SQS's codes).

    Raises:
        SqsError: MissingParameter, EmptyBatchRequest, TooManyEntriesInBatchRequest,
            InvalidBatchEntryId (Id not 1-80 of ``[A-Za-z0-9_-]``), BatchEntryIdsNotDistinct.
    """
    if entries is None:
        raise SqsError("MissingParameter", f"The request must contain the parameter {field}.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", f"{field} must be a list of entries.")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError(
            "TooManyEntriesInBatchRequest", f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}."
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID_RE.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failed_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    """A batch answer's ``Failed`` item: ``{"Id", "SenderFault", "Code", "Message"}``."""
    return {"Id": entry_id, "SenderFault": error.http_status < 500, "Code": error.sqs_code, "Message": error.message}


# -- message move tasks ------------------------------------------------------------

#: mq redrive state -> SQS message move task Status.
TASK_STATUS = {"running": "RUNNING", "completed": "COMPLETED", "cancelled": "CANCELLED", "failed": "FAILED"}


def task_handle(task_id: str, source_arn: str) -> str:
    """An opaque TaskHandle naming an mq redrive task (base64 of ``{"taskId", "sourceArn"}``, as SQS's)."""
    raw = json.dumps({"taskId": task_id, "sourceArn": source_arn}, separators=(",", ":"))
    return base64.b64encode(raw.encode()).decode()


def parse_task_handle(handle: object) -> tuple[str, QueueName]:
    """``(task id, source queue)`` of a TaskHandle made by :func:`task_handle`.

    Raises:
        SqsError: MissingParameter, ResourceNotFoundException (not such a handle).
    """
    if handle is None:
        raise SqsError("MissingParameter", "The request must contain the parameter TaskHandle.")
    try:
        obj = json.loads(base64.b64decode(str(handle), validate=True))
        return str(obj["taskId"]), queue_from_arn(obj["sourceArn"], "TaskHandle")
    except (ValueError, binascii.Error, KeyError, TypeError, SqsError):
        raise SqsError("ResourceNotFoundException", "The specified task handle is not valid.") from None


def task_entry(status: dict[str, Any], *, region: str, account_id: str) -> dict[str, Any]:
    """A ListMessageMoveTasks result entry for an mq redrive status (docs/api.md "Redrive")."""
    source_arn = queue_arn(region, account_id, status.get("source", ""))
    entry: dict[str, Any] = {
        "Status": TASK_STATUS.get(str(status.get("state")), "FAILED"),
        "SourceArn": source_arn,
        "MaxNumberOfMessagesPerSecond": status.get("max_messages_per_second"),
        "ApproximateNumberOfMessagesMoved": status.get("moved", 0),
        "ApproximateNumberOfMessagesToMove": status.get("to_move", 0),
        "StartedTimestamp": status.get("started_ms", 0),
    }
    if status.get("destination"):
        entry["DestinationArn"] = queue_arn(region, account_id, status["destination"])
    if entry["Status"] == "RUNNING":
        entry["TaskHandle"] = task_handle(str(status.get("task_id")), source_arn)
    if status.get("error"):
        entry["FailureReason"] = str(status["error"])
    return entry
