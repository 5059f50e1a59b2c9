"""The keyword options of the client methods, declared once (public): what ``send``, ``receive`` and ``peek`` take.

Each is a ``TypedDict`` (``total=False``: every option may be left out) that
every client types its method with, ``**options: Unpack[SendOptions]``
(PEP 692): the two Protocols of :mod:`mqcore.client.api`, the HTTP operations
and :class:`~mqcore.client.LocalClient`, and through them the asyncio twins. A
caller passes keyword arguments as ever (``send(queue, body, delay_seconds=5)``);
mypy checks each name and type at the call, and at run time a misspelt one raises
TypeError naming it, as a keyword argument would. The values an option left out
takes are here too (:data:`RECEIVE_DEFAULTS`, :data:`PEEK_DEFAULTS`; a send
option left out is None), applied by :func:`completed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeVar

from mqcore.limits import DEFAULT_PEEK_LIMIT

__all__ = [
    "PEEK_DEFAULTS",
    "RECEIVE_DEFAULTS",
    "MessageOptions",
    "PartitionOptions",
    "PeekOptions",
    "ReceiveOptions",
    "SendOptions",
    "check_options",
    "completed",
]

#: A TypedDict of keyword options (:class:`ReceiveOptions`, :class:`PeekOptions`).
OptionsT = TypeVar("OptionsT", bound=Mapping[str, object])


class MessageOptions(TypedDict, total=False):
    """The options of a message that ``send_json`` takes: :class:`SendOptions` but the content type.

    Each may be left out (= None).
    """

    attributes: Mapping[str, str] | None
    """Message attributes, name -> string (at most 10; SQS's name rules). SQS: MessageAttributes."""
    delay_seconds: int | None
    """0-900: the message is invisible this long; None = the queue's ``delay_seconds``. SQS: DelaySeconds.
    Refused on a FIFO queue (as SQS does)."""
    group_id: str | None
    """The message group: required on a FIFO queue (a name ending ``.fifo``), refused elsewhere; 1-128
    characters of ``[!-~]``. SQS: MessageGroupId."""
    deduplication_id: str | None
    """FIFO queues only: a send with the id of a message sent in the last 5 minutes stores nothing and
    returns that message's id; None = the body's SHA-256 if the queue has ``content_based_deduplication``;
    1-128 characters of ``[!-~]``. SQS: MessageDeduplicationId."""


class SendOptions(MessageOptions, total=False):
    """The options of ``send`` (the fields of a :class:`~mqcore.client.types.BatchEntry` but its body).

    Each may be left out (= None).
    """

    content_type: str | None
    """1-1,024 printable ASCII characters, stored and returned on receive; None =
    ``text/plain; charset=utf-8`` for a ``str`` body, ``application/octet-stream`` for bytes."""


class PartitionOptions(TypedDict, total=False):
    """One partition of a queue (SMQ's batches), for ``receive``, ``peek`` and ``iter_peek``: both or neither."""

    partition: int | None
    """With ``partitions``: only messages whose id falls in this partition, ``0 <= partition < partitions``
    (``mqcore.names.partition_of``)."""
    partitions: int | None
    """Number of partitions, 1-1,000."""


class ReceiveOptions(PartitionOptions, total=False):
    """The options of ``receive`` (SQS ReceiveMessage); an option left out takes its :data:`RECEIVE_DEFAULTS` value."""

    max_messages: int
    """1-10 messages at most (default 1). SQS: MaxNumberOfMessages."""
    wait_time_seconds: int | None
    """Long polling: 0-20 seconds to wait when no message is ready; None = the queue's
    ``receive_wait_seconds``. SQS: WaitTimeSeconds."""
    visibility_timeout_seconds: int | None
    """0-43,200 seconds in flight; None = the queue's. SQS: VisibilityTimeout."""
    attempt_id: str | None
    """1-128 printable ASCII characters, no space: a receive retried with it within 5 minutes returns
    the same messages, with fresh receipt handles. SQS: ReceiveRequestAttemptId."""


class PeekOptions(PartitionOptions, total=False):
    """The options of ``peek``; an option left out takes its :data:`PEEK_DEFAULTS` value."""

    after: str | None
    """Only messages with ids greater than this one (a page's ``next_after``)."""
    limit: int
    """1-1,000 messages per page (default :data:`mqcore.limits.DEFAULT_PEEK_LIMIT`, 100)."""


#: Every receive option and its value when left out (None: the queue's setting, or no such condition).
RECEIVE_DEFAULTS: ReceiveOptions = {
    "max_messages": 1,
    "wait_time_seconds": None,
    "visibility_timeout_seconds": None,
    "attempt_id": None,
    "partition": None,
    "partitions": None,
}
#: Every peek option and its value when left out.
PEEK_DEFAULTS: PeekOptions = {"limit": DEFAULT_PEEK_LIMIT, "after": None, "partition": None, "partitions": None}


def completed(options: OptionsT, defaults: OptionsT, method: str) -> OptionsT:
    """Every option of a call: those given in ``options``, the ``defaults`` for the others.

    Args:
        options: The keyword options the caller gave (a :class:`ReceiveOptions` or :class:`PeekOptions`).
        defaults: Every option of that kind with its default (:data:`RECEIVE_DEFAULTS`, :data:`PEEK_DEFAULTS`).
        method: The method's name, for the error.
    Returns:
        A new dict with every key of ``defaults``.
    Raises:
        TypeError: An option that is not one of ``defaults``' keys (a misspelt keyword).
    """
    merged = {**defaults, **options}
    if len(merged) != len(defaults):
        check_options(options, frozenset(defaults), method)
    return merged  # type: ignore[return-value]  # mypy types a TypedDict merge as dict[str, object]


def check_options(options: Mapping[str, object], names: frozenset[str], method: str) -> None:
    """Raise TypeError, as Python does for an unexpected keyword argument, if an option is not one of ``names``.

    Args:
        options: The keyword options the caller gave.
        names: The options the method takes (e.g. ``SendOptions.__optional_keys__``).
        method: The method's name, for the error.
    Raises:
        TypeError: ``method() got an unexpected keyword argument 'name'``.
    """
    if not names.issuperset(options):
        unknown = min(options.keys() - names)
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown!r}")
