"""Brokerless receives: redelivery and reaping on the call, long polling, attempt records.

:class:`Receiver` does for a receive what ``mq`` and ``mq-mover`` would do:

- **redelivery** (mq-mover's job): a receive first moves on the queue's due
  ``delay/`` files with :meth:`Store.move_due` (redeliver, dead-letter, or
  remove if purged or expired), so visibility timeouts, delays and dead-letter
  queues work with no mq-mover running;
- **FIFO**: a receive lists the queue directory and leases names in sorted
  order (ids sort by send time), with the queue's lease policy;
- **long polling**: :func:`~mqcore.client._local_waiters.poll_op`, woken by
  inotify, by a timer for the queue's next due deadline, and by a rescan;
- **attempt records** (SQS ReceiveRequestAttemptId): a retry within 5 minutes
  re-lets the messages the first try got, serialized per (queue, attempt id).

The rules (argument ranges, the dead-letter and retention policy, redelivery,
leasing, attempt records and their lock) are :mod:`mqcore.service`'s; this
module drives them synchronously and adds the waiting.

:func:`reap_message` and :func:`reap_queue` do mq-reaper's job on the call
that removed something.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, TypeVar

from mqcore.attributes import QueueAttributes, effective
from mqcore.client._local_waiters import Op, Undoable, Watches, poll_op
from mqcore.client.types import Message
from mqcore.errors import InvalidRequest, MQError
from mqcore.model import ReceivedMessage
from mqcore.names import MessageId, QueueName, is_fifo_queue, removed_entry_queue, removed_name
from mqcore.protocol import LeasePolicy, Store, now_ms
from mqcore.service import fifo
from mqcore.service.attempts import KeyedLocks, ReceiveNew, Relet, attempted_receive, relet
from mqcore.service.bulk import BulkArgs, DeleteHandles, LeaseNew, bulk_delete, bulk_lease
from mqcore.service.handles import LeaseMemory
from mqcore.service.plans import Blocking, run_sync
from mqcore.service.receive import in_partition, lease_names, lease_policy, redeliver_due
from mqcore.service.requests import ReceiveArgs, ReceiveRequest

logger = logging.getLogger(__name__)

RecordT = TypeVar("RecordT")

#: Leases whose current ``delay/`` name a client remembers (after a change of visibility).
MAX_REMEMBERED_LEASES = 10_000


def reap_message(store: Store, queue: QueueName, message_id: MessageId) -> None:
    """Unlink ``remove/Q.ID`` now (mq-reaper's job: everything in ``remove/`` is garbage)."""
    try:
        store.reap(removed_name(queue, message_id))
    except OSError as exc:
        logger.warning("cannot reap removed message queue=%s id=%s error=%s", queue, message_id, exc)


def reap_queue(store: Store, queue: QueueName) -> None:
    """Unlink every ``remove/`` entry of ``queue`` (messages ``Q.ID`` and deleted directories ``Q.TOKEN.queue``)."""
    for name in store.scan_removed():
        if removed_entry_queue(name) == queue:  # from the end: queue "a" never takes "a.fifo"'s entries
            try:
                store.reap(name)
            except OSError as exc:
                logger.warning("cannot reap removed entry name=%s error=%s", name, exc)


def as_client(cls: type[RecordT], record: object, **renamed: str) -> RecordT:
    """The client dataclass ``cls`` (Message, PeekedMessage) of a store record, field by field.

    Args:
        cls: The client type.
        record: The store's record (``ReceivedMessage``, ``PeekedFile``).
        renamed: Field of ``cls`` -> attribute of ``record``, where the names differ.
    """
    return cls(**{f.name: getattr(record, renamed.get(f.name, f.name)) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]  # cls is a dataclass


def as_message(message: ReceivedMessage) -> Message:
    """The client's :class:`Message` for a message the store leased."""
    fields = {f.name for f in dataclasses.fields(Message)} - {"deduplication_id", "sequence_number"}
    out = Message(
        **{name: getattr(message, "deadline_ms" if name == "visibility_deadline_ms" else name) for name in fields}
    )
    if message.group_id is None:
        return out
    sequence = fifo.sequence_number(message.message_id)  # FIFO queues (docs/protocol.md 19)
    return dataclasses.replace(out, deduplication_id=message.dedup_id, sequence_number=sequence)


class Receiver:
    """Receives on a queue root with no daemon (thread-safe).

    Args:
        store: The root's store.
        defaults: The attributes of a queue that sets none.
        watches: The client's watches (long polls sleep on them).
        leases: The client's lease memory (a re-let attempt reads its hints).
    """

    def __init__(self, store: Store, defaults: QueueAttributes, watches: Watches, leases: LeaseMemory) -> None:
        self.store = store
        self.defaults = defaults
        self.watches = watches
        self.leases = leases
        self._attempt_locks: KeyedLocks[Any] = KeyedLocks(threading.Lock)

    def _policy(self, queue: QueueName) -> LeasePolicy:
        attrs = effective(self.store.get_attributes(queue), self.defaults)
        return lease_policy(attrs, self.store.purged_before(queue))

    def _receive_pass(self, request: ReceiveRequest) -> tuple[list[ReceivedMessage], int | None]:
        """One look at the queue: redeliver due files, list, lease oldest first (in the partition) up to max.

        Returns:
            (the messages leased, the next due deadline of the queue's ``delay/`` files or None).
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: A lease failed and nothing was leased.
        """
        queue = request.queue
        policy = self._policy(queue)
        redelivery = redeliver_due(self.store, queue, now_ms(), policy)
        for message_id in redelivery.removed:
            reap_message(self.store, queue, message_id)
        names = [n for n in sorted(self.store.scan_ready(queue)) if in_partition(n, request.partition)]
        outcome = lease_names(self.store, queue, names, request.visibility_timeout_ms, policy, request.max_messages)
        outcome.check(queue)
        return outcome.messages, redelivery.next_due_ms

    def _waiting_op(self, request: ReceiveRequest) -> Op[list[ReceivedMessage]]:
        """Lease up to max_messages; when none is ready, wait up to wait_time_seconds for one (long polling)."""
        look = Blocking(lambda: self._receive_pass(request))
        if request.wait_time_seconds <= 0:
            messages, _ = yield look
            return messages  # type: ignore[no-any-return]  # a step's result is Any
        return (yield from poll_op(self.watches, request.queue, "arrivals", request.wait_time_seconds, look))

    def expand(self, step: ReceiveNew | Relet) -> Op[list[ReceivedMessage]]:
        """The operation doing what a step of :func:`~mqcore.service.attempts.attempted_receive` asks.

        Raises:
            TypeError: Not a step of that plan.
        """
        if isinstance(step, ReceiveNew):
            return self._waiting_op(step.request)
        if isinstance(step, Relet):
            return self._relet_op(step)
        raise TypeError(f"no handler for {step!r}")

    def _relet(self, step: Relet) -> list[ReceivedMessage]:
        """Receive again the messages of a retried attempt (fresh handles, receive count + 1), with the hints."""
        hints = self.leases.hints(step.handles)
        return relet(self.store, step.request, step.handles, self._policy(step.request.queue), hints)

    def _relet_op(self, step: Relet) -> Op[list[ReceivedMessage]]:
        messages: list[ReceivedMessage] = yield Blocking(lambda: self._relet(step))
        return messages

    def _attempt_op(self, request: ReceiveRequest, attempt_id: str) -> Op[list[ReceivedMessage]]:
        """A receive with an attempt id (:func:`~mqcore.service.attempts.attempted_receive`), one at a time per id."""
        holding = self._attempt_locks.holding((request.queue, attempt_id))

        def leave(_: object = None) -> None:
            holding.__exit__(None, None, None)

        yield Undoable(holding.__enter__, leave)  # a retry waits here for the first try to end
        try:
            return (yield from attempted_receive(self.store, request))
        finally:
            leave()

    def lease_bulk(self, queue: QueueName, args: BulkArgs) -> list[ReceivedMessage]:
        """A bulk lease (:func:`mqcore.service.bulk.bulk_lease`): replay ``args.key``'s record, or lease and record.

        New leases are one pass of a receive (redelivery of due files, one listing, oldest first).
        Serialized per ``(queue, key)`` in this process.

        Raises:
            InvalidRequest: A FIFO queue.
            QueueNotFound: No such queue.
        """
        if is_fifo_queue(queue):
            raise InvalidRequest("bulk leases are for standard queues, not FIFO queues", queue=queue)
        request = args.resolve(queue, effective(self.store.get_attributes(queue), self.defaults))

        def lease_new(op: LeaseNew | Relet) -> list[ReceivedMessage]:
            return self._relet(op) if isinstance(op, Relet) else self._receive_pass(op.request)[0]

        with self._attempt_locks.holding((queue, "bulk", args.key)):
            done = run_sync(bulk_lease(self.store, queue, args, request), lease_new)
        for message in done.messages:
            self.leases.received(message)
        return done.messages

    def delete_bulk(self, queue: QueueName, key: str) -> int:
        """Delete every message leased under ``key`` (:func:`mqcore.service.bulk.bulk_delete`); return how many."""

        def delete(op: DeleteHandles) -> list[MQError | None]:
            out: list[MQError | None] = []
            for handle in op.handles:
                try:
                    self.store.delete_by_handle(op.queue, handle, self.leases.current(handle), sync=False)
                    out.append(None)
                except MQError as exc:
                    out.append(exc)
            self.store.disk.sync_dir(self.store.layout.remove, "fsync of remove/")
            for handle, result in zip(op.handles, out, strict=True):
                self.leases.released(handle)
                if result is None:
                    reap_message(self.store, op.queue, handle.message_id)
            return out

        with self._attempt_locks.holding((queue, "bulk", key)):
            return run_sync(bulk_delete(self.store, queue, key), delete).deleted

    def receive_op(self, name: QueueName, args: ReceiveArgs) -> Op[list[Message]]:
        """``LocalClient.receive`` as an operation, its arguments checked: resolve them, then receive.

        The arguments (checked by :func:`mqcore.service.requests.check_receive`) are resolved
        against the queue's attributes (QueueNotFound); then the receive waits (long polling) and
        keeps attempt records as the daemon does.
        """
        request: ReceiveRequest = yield Blocking(
            lambda: args.resolve(name, effective(self.store.get_attributes(name), self.defaults))
        )
        if request.attempt_id is None:
            messages = yield from self._waiting_op(request)
        else:
            messages = yield from self._attempt_op(request, request.attempt_id)
        if messages and is_fifo_queue(name):  # group ids of messages re-let by an attempt id, from their files
            leased = messages
            messages = yield Blocking(lambda: fifo.with_fifo_ids(self.store, leased))
        return [as_message(m) for m in messages]
