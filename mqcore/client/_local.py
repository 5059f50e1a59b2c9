"""Brokerless client: the client interface run directly on a queue root, with no daemon.

:class:`LocalClient` does what ``mq``, ``mq-mover`` and ``mq-reaper`` would do
for each call, in this process, through :class:`mqcore.protocol.Store`: the
same renames of the same file names (``docs/protocol.md``), so it is safe
alongside running daemons and other brokerless processes on the same root
(VSQS: "does not require active broker daemons"). What the daemons do in the
background happens here on the call that needs it, in the modules beside this one:

- ``_local_send``: the checks of a send and capacity admission (a send to a
  full queue waits up to ``capacity_wait_seconds``, woken by inotify, then
  raises :class:`QueueFull`, as the broker);
- ``_local_receive``: redelivery of due ``delay/`` files and dead-lettering
  (mq-mover's job), FIFO leasing, long polling, attempt records;
  reaping of removed files (mq-reaper's job);
- ``_local_waiters``: the inotify watches that wake long polls and capacity
  waits, and the operations (generators) the calls that wait are written as;
- ``_local_redrive``: redrive runs synchronously and returns its final status.

The rules of a request (argument ranges, receipt-handle checks, capacity
admission, attempt records and their lock, the dead-letter and retention
policy, redrive tasks, the ``GET /{queue}`` answer) are :mod:`mqcore.service`'s,
the same code the ``mq`` daemon drives; these modules drive them synchronously
and add the waiting. :class:`~mqcore.client._local_async.AsyncLocalClient` is
the asyncio twin.
Queue defaults are :class:`QueueAttributes()` (the daemon's defaults when it
runs without options). Errors are the :mod:`mqcore.errors` classes the HTTP
API would answer for the same mistake.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from mqcore.attributes import QueueAttributes, effective
from mqcore.client._local_receive import MAX_REMEMBERED_LEASES, Receiver, as_client, reap_message, reap_queue
from mqcore.client._local_redrive import RedriveRunner
from mqcore.client._local_send import Sender, json_body
from mqcore.client._local_waiters import RESCAN_INTERVAL_SECONDS, Watches, drive
from mqcore.client._types import JSON_CONTENT_TYPE, BatchEntry, Message, PeekedMessage, PeekPage
from mqcore.errors import InvalidRequest, MQError, QueueNotFound
from mqcore.names import IdGenerator, QueueName, check_message_id, check_queue_name
from mqcore.protocol import DEFAULT_PEEK_LIMIT, Store, now_ms
from mqcore.service.handles import LeaseMemory, check_handle
from mqcore.service.queues import queue_stats
from mqcore.service.requests import (
    PEEK_LIMIT,
    VISIBILITY_TIMEOUT_SECONDS,
    check_after,
    check_partition_args,
    check_prefix,
)

__all__ = ["RESCAN_INTERVAL_SECONDS", "LocalClient"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

#: One id generator per process: ids of every LocalClient in it strictly increase (FIFO).
_IDS = IdGenerator()


def _queue_stats(store: Store, defaults: QueueAttributes, name: QueueName) -> dict[str, Any]:
    """``LocalClient.queue_stats`` of an existing queue, counted from its files (:func:`mqcore.service.queue_stats`)."""
    explicit, created_ms = store.queue_settings(name)
    names = store.scan_ready(name)
    in_flight, delayed = store.count_delay(name).get(name, (0, 0))
    return queue_stats(
        name,
        ready=len(names),
        oldest_ready=min(names) if names else None,
        in_flight=in_flight,
        delayed=delayed,
        created_ms=created_ms,
        attrs=effective(explicit, defaults),
        redrive=store.read_redrive_status(name),
        now=now_ms(),
    )


def _each(
    store: Store, queue: str, items: Iterable[ItemT], one: Callable[[QueueName, ItemT], ResultT]
) -> list[ResultT | MQError]:
    """``one(queue, item)`` per item; its result or the MQError it raised, in order (QueueNotFound: none ran)."""
    name = check_queue_name(queue)
    todo = list(items)
    if todo and not store.queue_exists(name):
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    out: list[ResultT | MQError] = []
    for item in todo:
        try:
            out.append(one(name, item))
        except MQError as exc:
            out.append(exc)
    return out


class LocalClient:
    """The client interface on a queue root, with no daemon (brokerless mode).

    Safe alongside running ``mq``/``mq-mover``/``mq-reaper`` daemons and other
    brokerless clients on the same root (one host, or hosts sharing the root
    as ``docs/protocol.md`` section 13 allows), and across threads of this
    process (one client can serve a multi-threaded worker).

    Args:
        root: The queue root (``new/``, ``queues/``, ``delay/``, ``remove/``,
            ``attempts/`` are created if missing).
        fsync: Make writes durable before a call returns (turn off only to
            measure throughput without a disk).
    Raises:
        OSError: The root cannot be created or fsynced.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.store = Store(root, ids=_IDS, fsync=fsync)
        #: The attributes of a queue that sets none (the daemon's defaults without options).
        self.defaults = QueueAttributes()
        self.root = self.store.layout.root
        self._watches = Watches(self.store)
        self._leases = LeaseMemory(MAX_REMEMBERED_LEASES)
        #: Sends (their operations are also run by the asyncio client).
        self.sender = Sender(self.store, self.defaults, self._watches)
        #: Receives (their operations are also run by the asyncio client).
        self.receiver = Receiver(self.store, self.defaults, self._watches, self._leases)
        self._redrive = RedriveRunner(self.store)

    def __repr__(self) -> str:
        return f"LocalClient({self.root!r})"

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the inotify watches; waiting receives and sends return at once (empty / QueueFull)."""
        self._watches.close()
        self.store.close()

    # -- queues -----------------------------------------------------------------

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues starting with ``prefix``, sorted (SQS ListQueues).

        Raises:
            InvalidRequest: ``prefix`` is not 0-80 characters of ``[A-Za-z0-9_-]``.
        """
        return list(self.store.list_queues(check_prefix(prefix)))

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        """Create a queue, optionally with attributes (SQS CreateQueue; idempotent).

        Args:
            queue: 1-80 characters of ``[A-Za-z0-9_-]``.
            attributes: Queue attributes (``mqcore.attributes`` keys), or None for the defaults.
        Returns:
            True if the queue was created by this call, False if it existed.
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: ``attributes`` is not a mapping.
            InvalidAttribute: Unknown key, bad value, or a dead-letter queue that does not exist.
            QueueNameExists: The queue exists and a given attribute differs from its value.
            StorageUnavailable: The queue could not be made durable.
        """
        name = check_queue_name(queue)
        if attributes is not None and not isinstance(attributes, Mapping):
            raise InvalidRequest("queue attributes must be a mapping (a JSON object)")
        return self.store.create_queue(name, dict(attributes) if attributes else None, defaults=self.defaults)

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and every message in it (ready, in flight, delayed); its files are unlinked at once.

        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
            StorageUnavailable: The deletion could not be made durable.
        """
        name = check_queue_name(queue)
        self.store.delete_queue(name)
        reap_queue(self.store, name)

    def queue_stats(self, queue: str) -> dict[str, Any]:
        """The queue's counts and settings, as ``GET /{queue}``.

        ``ready`` counts the queue directory; ``in_flight`` and ``delayed`` the
        queue's ``delay/`` files (a message whose visibility timeout ended
        counts as in flight until a receive or mq-mover redelivers it).

        Returns:
            ``{"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds" (None if none
            ready), "created_ms" (None if unknown), "attributes" (effective), "redrive" (status or None)}``.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        name = check_queue_name(queue)
        return _queue_stats(self.store, self.defaults, name)

    def get_attributes(self, queue: str) -> dict[str, Any]:
        """The queue's effective attributes (every key; defaults filled in).

        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        return self.sender.attributes(check_queue_name(queue)).to_json()

    def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``changes`` into the queue's attributes (SQS SetQueueAttributes); a None value = back to default.

        Returns:
            The effective attributes after the change.
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: ``changes`` is not a mapping.
            InvalidAttribute: Unknown key or bad value (nothing changed).
            QueueNotFound: No such queue.
            StorageUnavailable: The change could not be made durable.
        """
        name = check_queue_name(queue)
        if not isinstance(changes, Mapping):
            raise InvalidRequest("attribute changes must be a mapping (a JSON object)")
        explicit = self.store.set_attributes(name, dict(changes))
        return effective(explicit, self.defaults).to_json()

    def purge(self, queue: str) -> int:
        """Remove every message sent before now, ready, in flight or delayed (SQS PurgeQueue).

        Returns:
            Messages removed at once (others the purge covers are removed when met).
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
            StorageUnavailable: The purge marker could not be made durable.
        """
        name = check_queue_name(queue)
        removed = self.store.purge(name)
        reap_queue(self.store, name)
        return removed

    # -- send ---------------------------------------------------------------------

    def send(
        self,
        queue: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """Send one message; return its id once it is durable (SQS SendMessage).

        Args:
            queue: The queue.
            body: ``bytes`` as is; ``str`` as UTF-8 with content type ``text/plain; charset=utf-8``.
            content_type: Stored and returned on receive (1-1024 printable ASCII characters).
            attributes: User message attributes, name -> string (SQS's rules; at most 10).
            delay_seconds: 0-900 s invisible after the send; None = the queue's ``delay_seconds``.
        Returns:
            The message id.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
            InvalidRequest: ``delay_seconds`` out of range, bad ``content_type``.
            InvalidAttribute: Bad message attributes.
            MessageTooLarge: Body plus attributes over the queue's ``max_message_bytes``.
            QueueFull: The queue held ``capacity`` ready messages for ``capacity_wait_seconds``
                (never for a delayed send).
            StorageUnavailable: It could not be guaranteed stored.
            TypeError: ``body`` is neither bytes nor str.
        """
        return drive(self.sender.send_op(queue, BatchEntry(body, content_type, attributes, delay_seconds)))

    def send_json(
        self,
        queue: str,
        value: Any,
        *,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """Send ``json.dumps(value)`` as an ``application/json`` message (SMQ's payloads); see :meth:`send`.

        Raises:
            TypeError: ``value`` is not JSON-serialisable; and every error of :meth:`send`.
        """
        return self.send(
            queue, json_body(value), content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = 10
    ) -> list[str | MQError]:
        """Send any number of messages, ``batch_size`` per group commit (SQS SendMessageBatch).

        Each chunk is checked as one HTTP batch request (an entry fails alone;
        a chunk too large as a whole is split in halves; on a full queue the
        entries that find no room get QueueFull): see ``_local_send.Sender``.

        Args:
            queue: The queue.
            entries: ``bytes``, ``str`` (UTF-8 text) or :class:`BatchEntry` items.
            batch_size: Entries per chunk, 1-1000 (the HTTP API's default limit is 10).
        Returns:
            One result per entry, in order: its message id, or the error it got.
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: ``batch_size`` out of range.
            QueueNotFound: No such queue (entries of earlier chunks were sent).
            TypeError: An entry is not bytes, str or BatchEntry.
        """
        return drive(self.sender.send_batch_op(queue, entries, batch_size))

    def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_time_seconds: int | None = None,
        visibility_timeout_seconds: int | None = None,
        attempt_id: str | None = None,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` messages, oldest first (SQS ReceiveMessage); [] if none came.

        Due in-flight and delayed messages of the queue are made ready first
        (dead-lettered past ``max_receive_count``), so this works with no
        mq-mover. Each message is leased for the visibility timeout: it is in
        flight, and comes back with a higher receive count unless deleted.

        Args:
            queue: The queue.
            max_messages: 1-10 (SQS: MaxNumberOfMessages).
            wait_time_seconds: Long polling, 0-20 s; None = the queue's ``receive_wait_seconds``.
                Returns as soon as at least one message was leased.
            visibility_timeout_seconds: 0-43200 s; None = the queue's ``visibility_timeout_seconds``.
            attempt_id: SQS ReceiveRequestAttemptId (1-128 printable ASCII, no space): a retry
                within 5 minutes receives the same messages again (fresh handles) instead of new ones.
            partition: Only messages with ``partition_of(message_id, partitions) == partition``
                (SMQ's batches); with ``partitions``, ``0 <= partition < partitions <= 1000``.
            partitions: The number of partitions (both or neither).
        Returns:
            The messages received ([] when none became ready within the wait).
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: An argument out of range, or only one of partition/partitions.
            QueueNotFound: No such queue (also when it is deleted during the wait).
            StorageUnavailable: The receive failed and nothing was received.
        """
        receiver = self.receiver
        op = receiver.receive_op(
            queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
        )
        return drive(op, receiver.expand)

    # -- delete and visibility ------------------------------------------------------------

    def delete(self, queue: str, receipt_handle: str) -> None:
        """Delete the message a receive got, only if no later receive took it (SQS DeleteMessage).

        The message's file is unlinked at once (``remove/`` is fsynced first,
        so the delete survives a power cut).

        Raises:
            InvalidQueueName: Bad name.
            InvalidReceiptHandle: Malformed, or of another queue.
            StaleReceiptHandle: The message was received again since (the newer lease is untouched).
            MessageNotFound: The message is gone (deleted, dead-lettered, purged, expired).
            QueueNotFound: The queue was deleted.
            StorageUnavailable: The delete could not be made durable.
        """
        name = check_queue_name(queue)
        handle = check_handle(receipt_handle, name)
        self.store.delete_by_handle(name, handle.text, self._leases.current(handle))
        self._leases.released(handle)
        reap_message(self.store, name, handle.message_id)

    def delete_by_id(self, queue: str, message_id: str) -> None:
        """Delete a message by id wherever it is: ready, in flight, delayed or being written (SoftLayer).

        Raises:
            InvalidQueueName: Bad name.
            InvalidMessageId: Not a message id.
            MessageNotFound: No such message in the queue.
            QueueNotFound: No such queue.
            StorageUnavailable: The delete could not be made durable.
        """
        name = check_queue_name(queue)
        mid = check_message_id(message_id)
        self.store.delete(name, mid)
        reap_message(self.store, name, mid)

    def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        """Delete several messages by receipt handle (SQS DeleteMessageBatch); a result per handle.

        Returns:
            None for each message deleted, or the error of :meth:`delete` it got, in order.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue (nothing is deleted).
        """
        return _each(self.store, queue, receipt_handles, self.delete)

    def change_visibility(self, queue: str, receipt_handle: str, timeout_seconds: int) -> int:
        """Set the message's visibility timeout to ``timeout_seconds`` from now (SQS ChangeMessageVisibility).

        0 makes it ready at once (a nack). The receive count does not change;
        the handle stays usable.

        Returns:
            The new visibility deadline, epoch ms (now for 0).
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: ``timeout_seconds`` not 0-43200 (SQS: VisibilityTimeout).
            InvalidReceiptHandle: Malformed, or of another queue.
            MessageNotInFlight: Its visibility timeout had already ended (it is ready again).
            StaleReceiptHandle: The message was received again since.
            MessageNotFound: The message is gone.
            QueueNotFound: The queue was deleted.
        """
        name = check_queue_name(queue)
        timeout = VISIBILITY_TIMEOUT_SECONDS.check(timeout_seconds, key="field")
        handle = check_handle(receipt_handle, name)
        now = now_ms()
        current = self.store.change_visibility(
            name, handle.text, timeout * 1000, now=now, hint=self._leases.current(handle)
        )
        if timeout == 0:
            self._leases.released(handle)
            return now
        self._leases.moved(handle, current)
        return now + timeout * 1000

    def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        """Change the visibility of several receives (SQS ChangeMessageVisibilityBatch); a result per entry.

        Args:
            queue: The queue.
            entries: (receipt handle, timeout in seconds 0-43200) pairs.
        Returns:
            The new deadline (epoch ms) or the error of :meth:`change_visibility`, per entry, in order.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        return _each(self.store, queue, entries, lambda name, entry: self.change_visibility(name, *entry))

    def ack(self, message: Message) -> None:
        """Delete a received message: ``delete(message.queue, message.receipt_handle)``."""
        self.delete(message.queue, message.receipt_handle)

    def nack(self, message: Message, delay_seconds: int = 0) -> None:
        """Give a received message back, to be received again after ``delay_seconds`` (0-43200; 0 = now).

        ``change_visibility(message.queue, message.receipt_handle, delay_seconds)``.
        """
        self.change_visibility(message.queue, message.receipt_handle, delay_seconds)

    # -- peek -------------------------------------------------------------------------------

    def peek(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> PeekPage:
        """Read a page of the queue's messages, oldest first, without receiving them (nothing changes).

        Ready, in-flight and delayed messages are all shown, each with its state.

        Args:
            queue: The queue.
            after: Only messages with ids greater than this (a page's ``next_after``).
            limit: 1-1000 messages.
            partition: With ``partitions``: only messages of this partition (as a partitioned receive).
            partitions: Number of partitions, 1-1000.
        Raises:
            InvalidQueueName: Bad name.
            InvalidRequest: ``after`` is not a message id, or ``limit`` or the partition out of range.
            QueueNotFound: No such queue.
        """
        name = check_queue_name(queue)
        size = PEEK_LIMIT.check(limit)
        split = check_partition_args(partition, partitions)
        files, next_after = self.store.peek(name, after=check_after(after), limit=size, partition=split)
        return PeekPage([as_client(PeekedMessage, f) for f in files], next_after)

    def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        """Read the given messages without receiving them, wherever they are; ids not in the queue are left out.

        Returns:
            The messages found, in id order.
        Raises:
            InvalidQueueName: Bad name.
            InvalidMessageId: An id is malformed.
            QueueNotFound: No such queue.
        """
        name = check_queue_name(queue)
        ids = [check_message_id(i) for i in message_ids]
        return [as_client(PeekedMessage, f) for f in self.store.peek_ids(name, ids)] if ids else []

    def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        """Delete several messages by id, wherever they are (SoftLayer delete, batched); a result per id.

        Returns:
            None for each message deleted, or the error of :meth:`delete_by_id` it got, in order.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue (nothing is deleted).
        """
        return _each(self.store, queue, message_ids, self.delete_by_id)

    def iter_peek(
        self,
        queue: str,
        *,
        page_size: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> Iterator[PeekedMessage]:
        """Every message of the queue (or of one partition), oldest first, by pages of ``page_size`` (1-1000)."""
        after: str | None = None
        while True:
            page = self.peek(queue, after=after, limit=page_size, partition=partition, partitions=partitions)
            yield from page.messages
            if page.next_after is None:
                return
            after = page.next_after

    # -- redrive ------------------------------------------------------------------------------

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        """Move the ready messages of dead-letter queue ``queue`` back, oldest first (SQS StartMessageMoveTask).

        Runs in this call, at most ``max_messages_per_second``, and returns the
        final status (also in ``queues/<queue>/.redrive``, where daemons and
        other clients read it). Each message gets a new id and a receive count
        of 0. Messages without a known or existing destination are skipped and
        stay. A cancel requested meanwhile (:meth:`cancel_redrive`, from any
        process) is seen within a second.

        Args:
            queue: The dead-letter queue.
            destination: Where to move them; None = each message's original queue.
            max_messages_per_second: 1-10000; None = 500.
        Returns:
            The status: state ``completed`` (or ``cancelled``), ``moved``, ``skipped``, ...
        Raises:
            InvalidQueueName: Bad name (``queue`` or ``destination``).
            InvalidRequest: Rate out of range, or ``destination`` is ``queue``.
            QueueNotFound: ``queue`` or ``destination`` does not exist (or ``queue`` was deleted meanwhile).
            RedriveInProgress: Another process runs a redrive out of ``queue``.
            StorageUnavailable: A move or a status write failed (the status says ``failed``).
        """
        return self._redrive.start(queue, destination, max_messages_per_second)

    def redrive_status(self, queue: str) -> dict[str, Any] | None:
        """The status of the last redrive out of ``queue`` (by any process), or None if there never was one.

        A "running" status not rewritten for 10 s is reported "failed" (its process died).

        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        return self._redrive.status(queue)

    def cancel_redrive(self, queue: str) -> dict[str, Any]:
        """Ask the running redrive out of ``queue`` (in any process) to stop (SQS CancelMessageMoveTask).

        Returns:
            Its status as the cancel leaves it: state ``cancelled``, ``cancel_requested_ms``.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
            RedriveNotRunning: No redrive out of ``queue`` is running.
            StorageUnavailable: The request could not be written.
        """
        return self._redrive.cancel(queue)
