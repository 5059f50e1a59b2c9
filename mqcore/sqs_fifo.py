"""SQS FIFO queues on the wire: queue type at CreateQueue, FIFO attributes, send parameters, system attributes.

A translation onto :mod:`mqcore.service.fifo` (the rules) and the queue name
(:func:`mqcore.names.is_fifo_queue`: a queue is FIFO if and only if its name ends
``.fifo``, as SQS). Nothing here is stored apart from ``content_based_deduplication``,
an mq queue attribute. docs/sqs.md lists what is supported.
"""

from __future__ import annotations

from typing import Any

from mqcore.attributes import QueueAttributes
from mqcore.model import ReceivedMessage
from mqcore.names import MAX_FIFO_ID_CHARS, is_fifo_queue
from mqcore.service.fifo import message_fields, sequence_number

#: FIFO queue attributes GetQueueAttributes reports for a FIFO queue (values: see :func:`queue_attributes_out`).
FIFO_QUEUE_ATTRIBUTES = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
#: System attributes of a FIFO message a receive may ask for.
FIFO_SYSTEM_ATTRIBUTES = ("MessageGroupId", "MessageDeduplicationId", "SequenceNumber")
#: The high-throughput settings: SQS name -> (mq attribute, {SQS value: mq value}); the first value is the default.
_CHOICES: dict[str, tuple[str, dict[str, str]]] = {
    "DeduplicationScope": ("deduplication_scope", {"messageQueue": "queue", "messageGroup": "message_group"}),
    "FifoThroughputLimit": (
        "fifo_throughput_limit",
        {"perQueue": "per_queue", "perMessageGroupId": "per_message_group_id"},
    ),
}

_NAME_RULE = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, "
    "must end with .fifo suffix and be 1 to 80 in length."
)


def _error(code: str, message: str) -> Exception:
    from mqcore.sqs import SqsError  # mqcore.sqs imports this module

    return SqsError(code, message)


def check_queue_type(queue: str, attributes: object) -> None:
    """CreateQueue: a ``.fifo`` name needs ``FifoQueue=true``, and ``FifoQueue=true`` a ``.fifo`` name (SQS).

    Raises:
        SqsError: InvalidParameterValue (the name and FifoQueue disagree), InvalidAttributeValue (not true/false).
    """
    value = attributes.get("FifoQueue") if isinstance(attributes, dict) else None
    if value is not None and (not isinstance(value, str) or value.lower() not in ("true", "false")):
        raise _error("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
    fifo = isinstance(value, str) and value.lower() == "true"
    if fifo != is_fifo_queue(queue):
        raise _error(
            "InvalidParameterValue",
            _NAME_RULE
            if fifo
            else "Can only include alphanumeric characters, "
            "hyphens, or underscores. 1 to 80 in length (a name ending .fifo needs FifoQueue=true)",
        )


def translate_attribute(name: str, value: str, changes: dict[str, Any], *, creating: bool) -> bool:
    """Translate a FIFO queue attribute of CreateQueue / SetQueueAttributes into ``changes``; False if not one.

    ``FifoQueue`` only at creation (checked by :func:`check_queue_type`); ``ContentBasedDeduplication``
    ``true``/``false`` becomes ``content_based_deduplication``; ``DeduplicationScope``
    (``messageQueue``/``messageGroup``) becomes ``deduplication_scope`` and ``FifoThroughputLimit``
    (``perQueue``/``perMessageGroupId``) ``fifo_throughput_limit`` (their rules: mqcore.attributes).

    Raises:
        SqsError: InvalidAttributeName (FifoQueue on SetQueueAttributes), InvalidAttributeValue.
    """
    if name == "FifoQueue":
        if not creating:
            raise _error("InvalidAttributeName", "Unknown Attribute FifoQueue (it is set only at creation).")
        return True
    if name == "ContentBasedDeduplication":
        if value.lower() not in ("true", "false"):
            raise _error("InvalidAttributeValue", "Invalid value for the parameter ContentBasedDeduplication.")
        changes["content_based_deduplication"] = value.lower() == "true"
        return True
    if name in _CHOICES:
        key, values = _CHOICES[name]
        if value not in values:
            raise _error(
                "InvalidAttributeValue", f"Invalid value for the parameter {name}: one of {', '.join(values)}."
            )
        changes[key] = values[value]
        return True
    return False


def queue_attributes_out(queue: str, attrs: QueueAttributes, names: list[str]) -> dict[str, str]:
    """The FIFO attributes among ``names`` for GetQueueAttributes (none for a standard queue, as SQS)."""
    if not is_fifo_queue(queue):
        return {}
    values = {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true" if attrs.content_based_deduplication else "false",
    }
    for name, (key, choices) in _CHOICES.items():
        current = getattr(attrs, key)
        values[name] = next(wire for wire, value in choices.items() if value == current)
    return {n: values[n] for n in names if n in values}


def check_send(queue: str, entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """The MessageGroupId and MessageDeduplicationId of a send, checked against the queue's type.

    A FIFO queue needs a MessageGroupId and refuses a per-message DelaySeconds; a standard queue
    refuses both FIFO parameters (SQS). The ids' form and content-based deduplication are
    :mod:`mqcore.service.fifo`'s (errors come back as InvalidParameterValue).

    Raises:
        SqsError: MissingParameter (no MessageGroupId on a FIFO queue), InvalidParameterValue.
    """
    group, dedup = entry.get("MessageGroupId"), entry.get("MessageDeduplicationId")
    for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
        if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= MAX_FIFO_ID_CHARS):
            raise _error("InvalidParameterValue", f"Value for parameter {name} is invalid: 1-128 characters.")
    if not is_fifo_queue(queue):
        for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
            if value is not None:
                raise _error(
                    "InvalidParameterValue",
                    f"The request include parameter {name} that is not valid for this queue type.",
                )
        return None, None
    if group is None:
        raise _error("MissingParameter", "The request must contain the parameter MessageGroupId.")
    if entry.get("DelaySeconds") is not None:
        raise _error(
            "InvalidParameterValue",
            f"Value {entry.get('DelaySeconds')} for parameter DelaySeconds is invalid. Reason: The request include "
            "parameter that is not valid for this queue type.",
        )
    return group, dedup


def sent_fields(queue: str, message_id: str) -> dict[str, str]:
    """``SequenceNumber`` of a SendMessage answer (and batch entry) on a FIFO queue ({} on a standard queue)."""
    return {"SequenceNumber": sequence_number(message_id)} if is_fifo_queue(queue) else {}


def system_attributes(message: ReceivedMessage) -> dict[str, str]:
    """MessageGroupId, MessageDeduplicationId and SequenceNumber of a FIFO message ({} for others)."""
    return message_fields(message, "MessageGroupId", "SequenceNumber", "MessageDeduplicationId")
