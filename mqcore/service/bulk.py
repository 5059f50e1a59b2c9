"""Bulk leases (issue 17, docs/protocol.md 20): the rules of "lease up to n under key K" and "delete K".

Written once for the daemon and the brokerless client, as plans
(:mod:`mqcore.service.plans`):

- :func:`bulk_lease`: read ``K``'s record; if there is one, read its leases
  again in place (a retry: the same messages, those still in flight);
  otherwise lease up to ``n`` new messages as the driver leases
  (:class:`LeaseNew`: the daemon pops its index, the brokerless client lists
  the directory) and write the record before answering. A driver runs it under
  its :class:`~mqcore.service.attempts.KeyedLocks` lock of ``(queue, key)``, so
  a retry that arrives while the first try runs waits for its record.
- :func:`bulk_delete`: read ``K``'s record, delete its leases by their receipt
  handles (:class:`DeleteHandles`: the driver's delete by handle, then one
  fsync of ``remove/``), then unlink the record.

The file work is the Store's (:class:`mqcore.protocol.bulk.BulkLeases`); waiting, threads and the
daemon's indexes are the driver's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mqcore.attributes import MAX_VISIBILITY_TIMEOUT_SECONDS, QueueAttributes
from mqcore.errors import MessageNotFound, MQError, QueueNotFound, StaleReceiptHandle
from mqcore.model import ReceivedMessage
from mqcore.names import QueueName, ReceiptHandle, check_bulk_key
from mqcore.protocol import Store
from mqcore.service.attempts import Relet
from mqcore.service.plans import Blocking, Plan
from mqcore.service.requests import Limit, ReceiveArgs, ReceiveRequest

logger = logging.getLogger("mq.service")

__all__ = [
    "BULK_MAX_MESSAGES",
    "BULK_VISIBILITY_TIMEOUT_SECONDS",
    "BulkArgs",
    "BulkDeleted",
    "BulkLeased",
    "DeleteHandles",
    "LeaseNew",
    "bulk_delete",
    "bulk_lease",
    "check_bulk_lease",
]

#: Messages one bulk lease takes at most (a micro-batch's share; the answer holds every body).
BULK_MAX_MESSAGES = Limit("max_messages", 1, 10_000)
#: A bulk lease's visibility timeout: 1 s to 12 hours (SQS's upper bound; 0 would end the lease at once).
BULK_VISIBILITY_TIMEOUT_SECONDS = Limit("visibility_timeout_seconds", 1, MAX_VISIBILITY_TIMEOUT_SECONDS)


@dataclass(frozen=True, slots=True)
class BulkArgs:
    """A bulk lease's checked arguments.

    Attributes:
        key: The lease key (:func:`mqcore.names.check_bulk_key`).
        max_messages: 1-10,000.
        visibility_timeout_seconds: 1-43,200, or None (the queue's ``visibility_timeout_seconds``).
    """

    key: str
    max_messages: int
    visibility_timeout_seconds: int | None

    def resolve(self, queue: QueueName, attrs: QueueAttributes) -> ReceiveRequest:
        """The receive the new leases are made with (no waiting, no attempt id, no partition).

        Args:
            queue: The queue.
            attrs: Its effective attributes.
        """
        args = ReceiveArgs(self.max_messages, 0, self.visibility_timeout_seconds)
        return args.resolve(queue, attrs)


def check_bulk_lease(key: object, max_messages: object, visibility_timeout_seconds: object = None) -> BulkArgs:
    """A bulk lease's arguments checked (key first, before any path is built).

    Raises:
        InvalidRequest: The key is not 1-128 characters of ``A-Z a-z 0-9 - _ :`` (parameter ``key``), or
            a number out of range (``max_messages`` 1-10,000, ``visibility_timeout_seconds`` 1-43,200).
    """
    return BulkArgs(
        check_bulk_key(key),
        BULK_MAX_MESSAGES.check(max_messages),
        BULK_VISIBILITY_TIMEOUT_SECONDS.optional(visibility_timeout_seconds),
    )


@dataclass(frozen=True, slots=True)
class LeaseNew:
    """Operation of :func:`bulk_lease`: lease up to ``request.max_messages`` ready messages now (no
    waiting), as the driver leases; send back the list leased."""

    request: ReceiveRequest


@dataclass(frozen=True, slots=True)
class DeleteHandles:
    """Operation of :func:`bulk_delete`: delete by these receipt handles (15.6) and fsync ``remove/``;
    send back, per handle, ``None`` (deleted) or the error it met."""

    queue: QueueName
    handles: list[ReceiptHandle]


@dataclass(slots=True)
class BulkLeased:
    """What :func:`bulk_lease` returns.

    Attributes:
        key: The lease key.
        replayed: True if a record of the key existed: the messages are its messages, leased again.
        messages: The messages (bodies included), in the order leased.
    """

    key: str
    replayed: bool
    messages: list[ReceivedMessage] = field(default_factory=list)


@dataclass(slots=True)
class BulkDeleted:
    """What :func:`bulk_delete` returns.

    Attributes:
        key: The lease key.
        found: A record of the key existed.
        deleted: Messages deleted.
        missing: Leases of the record that were over (deleted already, received by someone else since,
            expired with the queue): not deleted, nothing done to them.
    """

    key: str
    found: bool
    deleted: int = 0
    missing: int = 0


def bulk_lease(store: Store, queue: QueueName, args: BulkArgs, request: ReceiveRequest) -> Plan[BulkLeased]:
    """The plan of a bulk lease (docs/protocol.md 20.2): replay ``args.key``'s record, or lease and record.

    Yields :class:`~mqcore.service.plans.Blocking` (the record's read and write), then one
    :class:`LeaseNew` (no record) or one :class:`~mqcore.service.attempts.Relet` of the record's
    handles (a retry: the driver re-lets them as for a retried receive attempt, 15.7: each
    recorded message still in flight under the key, or ready again after its lease ended with
    nobody receiving it since, is leased again with a new handle and receive count + 1; one
    deleted or received by someone else is left out). The record is then (re)written with the
    handles returned; nothing is written when nothing was leased.

    Args:
        store: The store.
        queue: The queue.
        args: The checked arguments.
        request: ``args.resolve(queue, attrs)``.
    Raises:
        QueueNotFound: No such queue (from the driver's lease).
        StorageUnavailable: A lease, a read or the record's write failed (nothing is answered: leases
            made before a failed record write end at their deadline).
    """
    record = yield Blocking(lambda: store.load_bulk_lease(queue, args.key))
    replayed = record is not None
    leased: list[ReceivedMessage]
    if record is not None:
        leased = yield Relet(request, record.handles)
        logger.info(
            "bulk lease replayed queue=%s key=%s recorded=%d relet=%d",
            queue,
            args.key,
            len(record.handles),
            len(leased),
        )
    else:
        leased = yield LeaseNew(request)
    if leased:
        deadline = max(m.deadline_ms for m in leased)
        yield Blocking(lambda: store.save_bulk_lease(queue, args.key, [m.receipt_handle for m in leased], deadline))
    return BulkLeased(args.key, replayed, leased)


def bulk_delete(store: Store, queue: QueueName, key: str) -> Plan[BulkDeleted]:
    """The plan of a delete by key (docs/protocol.md 20.3): delete the record's leases, then unlink it.

    A lease that is over (MessageNotFound, StaleReceiptHandle) counts as ``missing``; any other
    error (e.g. a failed fsync of ``remove/``) is raised and the record is kept, so a retry
    deletes again (deleting is idempotent).

    Raises:
        InvalidRequest: ``key`` is not a lease key.
        QueueNotFound: No such queue (a key of an existing queue without a record is ``found`` False).
        StorageUnavailable: A delete or the unlink failed.
    """
    check_bulk_key(key)
    record = yield Blocking(lambda: store.load_bulk_lease(queue, key))
    if record is None:
        if not (yield Blocking(lambda: store.queue_exists(queue))):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        return BulkDeleted(key, False)
    handles: list[ReceiptHandle] = []
    for text in record.handles:
        try:
            handles.append(ReceiptHandle.parse(text, queue))
        except MQError:
            continue
    out = BulkDeleted(key, True)
    if handles:
        results: list[MQError | None] = yield DeleteHandles(queue, handles)
        for result in results:
            if result is None:
                out.deleted += 1
            elif isinstance(result, MessageNotFound | StaleReceiptHandle):
                out.missing += 1
            else:
                raise result
    yield Blocking(lambda: store.drop_bulk_lease(queue, key))
    logger.debug("bulk lease deleted queue=%s key=%s deleted=%d missing=%d", queue, key, out.deleted, out.missing)
    return out
