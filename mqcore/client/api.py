"""The client interface of mq, written once: :class:`QueueClient` (blocking) and :class:`AsyncQueueClient` (asyncio).

Every client has these methods with these arguments, results and errors:
:class:`~mqcore.client.Client` / :class:`~mqcore.client.AsyncClient` over the
HTTP API (docs/api.md) and :class:`~mqcore.client.LocalClient` /
:class:`~mqcore.client.AsyncLocalClient` brokerless on a root folder
(docs/protocol.md). They subclass these Protocols, which also hold the methods
written in terms of the others, once for every client: ``send_json``, ``ack``,
``nack``, ``iter_peek`` and the context manager (any other class with these
methods satisfies the Protocols structurally all the same).
``tests/client/test_interface.py`` compares their signatures with these, and
mypy checks them where :func:`mqcore.client.connect` returns them. Code that
works with any client (:class:`~mqcore.client.Worker`, mqctl, the Spark
source) is typed against these Protocols.

A new method is declared here (in both Protocols, the docstring in
:class:`QueueClient`) and defined once per kind of client: an operation in
``mqcore/client/_operations.py`` made a method of ``Client`` and ``AsyncClient``
by their driver wrappers (``_blocking`` / ``_awaited`` in ``_http.py``), and a
method of ``LocalClient`` made one of ``AsyncLocalClient`` by its wrapper
(``_coroutine`` in ``_local_async.py``); the three list it once, in the table
``mqcore/client/_table.py``.

The keyword options of ``send``, ``send_json``, ``receive``, ``peek`` and
``iter_peek`` are declared once, as ``TypedDict`` s in
:mod:`mqcore.client.options`, and each method here and in every client takes
them as ``**options: Unpack[...]`` (PEP 692): mypy checks each keyword at the
call, the docstrings below still list each option.

Every method of every client raises :class:`~mqcore.errors.InvalidQueueName`
for a bad queue name (before any request or file access) and
:class:`~mqcore.errors.QueueNotFound` when the queue does not exist (unless it
creates or lists queues); the HTTP clients also raise
:class:`~mqcore.errors.ConnectionFailed` when the server gave no answer after
their retries, and :class:`~mqcore.errors.StorageUnavailable` (503) when the
storage failed (brokerless: at once). Only the errors particular to a method
are listed below. Errors are the :mod:`mqcore.errors` classes the daemons
answer with, so a caller catches the same classes in every mode.

Units are in the names (docs/glossary.md): ``_seconds``, ``_ms`` (epoch
milliseconds for points in time). The limits are SQS's where SQS has the idea
(e.g. SQS: WaitTimeSeconds 0-20), the rest mq's (docs/api.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar, Unpack, runtime_checkable

from mqcore.client.options import MessageOptions, PartitionOptions, PeekOptions, ReceiveOptions, SendOptions
from mqcore.client.types import JSON_CONTENT_TYPE, BatchEntry, Message, PeekedMessage, PeekPage, json_body
from mqcore.errors import MQError
from mqcore.limits import DEFAULT_BATCH_MESSAGES, DEFAULT_PEEK_LIMIT

__all__ = ["DEFAULT_URL", "AsyncQueueClient", "QueueClient", "documented_by"]

_C = TypeVar("_C", bound=type)

#: Default base URL of the mq daemon (its default ``--host`` and ``--port``); mqctl's ``--url`` default.
DEFAULT_URL = "http://127.0.0.1:8080"


@runtime_checkable
class QueueClient(Protocol):
    """A blocking mq client: :class:`~mqcore.client.Client` (HTTP) or :class:`~mqcore.client.LocalClient`.

    Both are thread-safe: one client can serve many threads. Use it as a context manager, or call
    :meth:`close`.
    """

    # -- lifecycle --

    def close(self) -> None:
        """Release the client's connections or inotify watches; it cannot be used afterwards.

        A brokerless receive or send waiting in another thread returns at once (empty / QueueFull).
        """

    def __enter__(self) -> Self:
        """The client itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """:meth:`close`."""
        self.close()

    # -- queues --

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues, sorted (``GET /``; SQS ListQueues).

        Args:
            prefix: Only names starting with it (0-80 characters of ``[A-Za-z0-9_-]``).
                SQS: QueueNamePrefix.
        Raises:
            InvalidRequest: ``prefix`` is not 0-80 characters of ``[A-Za-z0-9_-]``.
        """
        ...

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        """Create a queue, with attributes, atomically (``PUT /{queue}``; SQS CreateQueue); idempotent.

        Args:
            queue: Queue name, 1-80 characters of ``[A-Za-z0-9_-]`` (SQS's rule).
            attributes: Queue attributes to set (docs/api.md, Queue attributes; the keys of
                :class:`mqcore.attributes.QueueAttributes`), e.g.
                ``{"visibility_timeout_seconds": 60, "dead_letter_queue": "jobs-dlq"}``; None = defaults.
        Returns:
            True if the queue was created by this call, False if it existed already.
        Raises:
            QueueNameExists: The queue exists and a given attribute differs from its value
                (SQS CreateQueue semantics).
            InvalidAttribute: An unknown key, a value out of range, or a dead-letter queue that does
                not exist (``details["name"]``).
            InvalidRequest: ``attributes`` is not a mapping.
        """
        ...

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and every message in it, ready, in flight or delayed (``DELETE /{queue}``)."""
        ...

    def queue_stats(self, queue: str) -> dict[str, Any]:
        """Counts, attributes and redrive status of a queue (``GET /{queue}``).

        ``in_flight`` and ``delayed`` count the queue's ``delay/`` files: a message whose visibility
        timeout ended counts as in flight until a receive or mq-mover makes it ready again.

        Returns:
            ``{"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds" (float, None if
            none is ready), "created_ms" (epoch ms or None), "attributes" (effective), "redrive" (task
            status or None)}``; counts are approximate while others work on the queue (as SQS's).
        """
        ...

    def get_attributes(self, queue: str) -> dict[str, Any]:
        """Effective attributes of a queue, every key, defaults filled in (``GET /{queue}/attributes``)."""
        ...

    def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change some attributes of a queue (``PUT /{queue}/attributes``, a merge; SQS SetQueueAttributes).

        Args:
            queue: Queue name.
            changes: Attribute keys to change; a ``None`` value returns the key to its default.
        Returns:
            The effective attributes after the change.
        Raises:
            InvalidAttribute: Unknown key or value out of range (nothing is changed).
            InvalidRequest: ``changes`` is not a mapping.
        """
        ...

    def purge(self, queue: str) -> int:
        """Delete every message sent before now, in any state (``POST /{queue}/purge``; SQS PurgeQueue).

        Returns:
            How many messages were removed at once (the others the purge covers are never
            delivered either, and are removed when met).
        """
        ...

    # -- sending --

    def send(self, queue: str, body: bytes | str, **options: Unpack[SendOptions]) -> str:
        """Send one message (``POST /{queue}/messages``; SQS SendMessage); durable when this returns.

        The options are keyword arguments, each optional, typed by
        :class:`~mqcore.client.options.SendOptions` (mypy checks their names and types at the call).

        Args:
            queue: Queue name.
            body: ``bytes`` as is; ``str`` as UTF-8 (content type ``text/plain; charset=utf-8``
                unless ``content_type`` is given). At most the queue's ``max_message_bytes``.
            content_type: 1-1,024 printable ASCII characters, stored and returned on receive
                (default ``application/octet-stream`` for bytes).
            attributes: Message attributes, name -> string (at most 10; SQS's name rules).
                SQS: MessageAttributes.
            delay_seconds: 0-900: invisible this long; None = the queue's ``delay_seconds``.
                SQS: DelaySeconds. Refused on a FIFO queue (as SQS does).
            group_id: The message group: required on a FIFO queue (a name ending ``.fifo``),
                refused elsewhere; 1-128 characters of ``[!-~]``. SQS: MessageGroupId.
            deduplication_id: FIFO queues only: a send with the id of a message sent in the last
                5 minutes stores nothing and returns that message's id; None = the body's SHA-256
                if the queue has ``content_based_deduplication`` (else InvalidRequest); 1-128
                characters of ``[!-~]``. SQS: MessageDeduplicationId.
        Returns:
            The message id (a lowercase UUIDv7); for a duplicate, the first message's id.
        Raises:
            MessageTooLarge: Body plus attributes over ``max_message_bytes``
                (``details["size_bytes"]``, ``details["max_bytes"]``).
            InvalidAttribute: A bad message attribute.
            InvalidRequest: ``delay_seconds`` out of range, or a bad ``content_type``; on a FIFO
                queue no ``group_id``, no deduplication id (given or content-based), a bad one,
                or a ``delay_seconds``; FIFO arguments on a standard queue.
            QueueFull: The queue held its ``capacity`` of ready messages for
                ``capacity_wait_seconds`` (never for a delayed send; HTTP: after the retries).
            ConnectionFailed: No answer; the message may or may not have been stored (a retry
                after a lost answer can store it twice: delivery is at least once; on a FIFO
                queue a retry with the same deduplication id within 5 minutes stores it once).
            TypeError: ``body`` is neither bytes nor str, or an option is not one of these.
        """
        ...

    def send_json(self, queue: str, value: Any, **options: Unpack[MessageOptions]) -> str:
        """Send ``json.dumps(value)`` as UTF-8 with content type ``application/json`` (SMQ's payloads).

        Read it back with :meth:`Message.json <mqcore.client.types.Message.json>`. Arguments and
        errors as :meth:`send`, but no ``content_type`` (the options:
        :class:`~mqcore.client.options.MessageOptions`; ``group_id`` and ``deduplication_id`` for a
        FIFO queue).

        Raises:
            TypeError: ``value`` is not JSON-serialisable (before anything is sent).
        """
        return self.send(queue, json_body(value), content_type=JSON_CONTENT_TYPE, **options)

    def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = DEFAULT_BATCH_MESSAGES
    ) -> list[str | MQError]:
        """Send any number of messages, ``batch_size`` per request (``POST /{queue}/messages/batch``).

        SQS SendMessageBatch. An entry with a bad body, content type, attributes or delay fails
        alone. A request refused whole because its bodies together exceed ``max_message_bytes``
        (413) is split in halves and sent again, so each entry that fits alone is sent. On a queue
        with a ``capacity``, as many entries without a delay as fit are sent (after waiting up to
        ``capacity_wait_seconds`` for any room) and the others get QueueFull. Entries that failed
        are not sent again, whatever the error.

        Args:
            queue: Queue name.
            entries: Bodies (as :meth:`send`) or :class:`~mqcore.client.types.BatchEntry` items
                with content type, attributes and delay.
            batch_size: Entries per request, 1 to the server's ``--max-batch-messages`` (at most
                1,000; default 10, as SQS SendMessageBatch).
        Returns:
            One result per entry, in order: the message id, or the error that entry failed with
            (e.g. InvalidAttribute, MessageTooLarge, QueueFull: a batch may be sent in part).
        Raises:
            InvalidRequest: ``batch_size`` < 1 (before anything is sent), or over the server's limit.
            QueueNotFound: The queue does not exist (entries of earlier requests were sent).
        """
        ...

    # -- receiving --

    def receive(self, queue: str, **options: Unpack[ReceiveOptions]) -> list[Message]:
        """Receive up to ``max_messages`` ready messages, oldest first (``GET /{queue}/messages``; SQS ReceiveMessage).

        Each message stays in flight (invisible) for the visibility timeout; delete it with
        :meth:`delete` / :meth:`ack` before then, or it is delivered again with a higher receive
        count (and dead-lettered past the queue's ``max_receive_count``). Brokerless, due in-flight
        and delayed messages of the queue are made ready first, so this works with no mq-mover.

        The options are keyword arguments, each optional, typed by
        :class:`~mqcore.client.options.ReceiveOptions` (their defaults:
        :data:`~mqcore.client.options.RECEIVE_DEFAULTS`).

        Args:
            queue: Queue name.
            max_messages: 1-10. SQS: MaxNumberOfMessages.
            wait_time_seconds: Long polling: 0-20 seconds to wait for a message when none is
                ready (returns as soon as one is leased); None = the queue's
                ``receive_wait_seconds``. SQS: WaitTimeSeconds.
            visibility_timeout_seconds: 0-43,200; None = the queue's. SQS: VisibilityTimeout.
            attempt_id: 1-128 printable ASCII characters, no space: a receive retried with the
                same attempt id within 5 minutes returns the same messages, with fresh receipt
                handles (SQS ReceiveRequestAttemptId). Pass one to make the HTTP client's automatic
                retry after a ConnectionFailed safe; without one, messages leased by a lost answer
                come back only after their visibility timeout.
            partition: With ``partitions``: only messages whose id falls in this partition,
                ``0 <= partition < partitions`` (``mqcore.names.partition_of``; SMQ's batches).
            partitions: Number of partitions, 1-1,000; give both or neither.
        Returns:
            The messages, oldest first; ``[]`` when none became ready within the wait.
        Raises:
            InvalidRequest: A parameter out of range, or only one of partition/partitions.
            QueueNotFound: No such queue (also when it is deleted during the wait).
            TypeError: An option that is not one of these.
        """
        ...

    def delete(self, queue: str, receipt_handle: str) -> None:
        """Delete a received message by its receipt handle (SQS DeleteMessage).

        Over HTTP it is sent as a one-entry ``POST /{queue}/messages/delete`` so the handle stays
        opaque (never in a URL); brokerless, the file is unlinked at once.

        Raises:
            StaleReceiptHandle: The message was received again since this handle was issued;
                the newer receive is left alone.
            MessageNotFound: Already deleted (or expired, purged, dead-lettered). After a
                retried ConnectionFailed this may mean the first attempt deleted it.
            InvalidReceiptHandle: Malformed, or a handle of another queue.
        """
        ...

    def delete_by_id(self, queue: str, message_id: str) -> None:
        """Delete a message by id wherever it is: ready, in flight, delayed (SoftLayer delete).

        Raises:
            InvalidMessageId: ``message_id`` is not a lowercase UUIDv7 (before any request).
            MessageNotFound: No such message.
        """
        ...

    def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        """Delete any number of received messages by receipt handle, 10 per request (SQS DeleteMessageBatch).

        Returns:
            One result per handle, in order: None if deleted, else the error :meth:`delete` would
            raise (StaleReceiptHandle, MessageNotFound, InvalidReceiptHandle, ...).
        """
        ...

    def change_visibility(self, queue: str, receipt_handle: str, visibility_timeout_seconds: int) -> int:
        """Set the visibility timeout of a received message, counted from now (SQS ChangeMessageVisibility).

        Args:
            queue: Queue name.
            receipt_handle: Handle from the receive (it stays valid after the change).
            visibility_timeout_seconds: The new visibility timeout, 0-43,200 seconds from now; 0
                makes the message ready at once. SQS: VisibilityTimeout. Its former name
                ``timeout_seconds=`` still works in 0.1 with a DeprecationWarning and goes in 0.2.
        Returns:
            The new visibility deadline, epoch milliseconds.
        Raises:
            StaleReceiptHandle: The message was received again since this handle was issued.
            MessageNotInFlight: Its visibility timeout had already ended.
            MessageNotFound: The message was deleted.
            InvalidReceiptHandle: Malformed, or a handle of another queue.
            InvalidRequest: ``visibility_timeout_seconds`` out of range.
        """
        ...

    def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        """Change visibility timeouts of any number of received messages, 10 per request.

        SQS ChangeMessageVisibilityBatch.

        Args:
            queue: Queue name.
            entries: ``(receipt_handle, visibility_timeout_seconds)`` pairs, as :meth:`change_visibility`.
        Returns:
            One result per entry, in order: the new visibility deadline (epoch ms) or the error.
        """
        ...

    def lease_bulk(
        self, queue: str, key: str, *, max_messages: int = 10, visibility_timeout_seconds: int | None = None
    ) -> list[Message]:
        """Lease up to ``max_messages`` ready messages under ``key`` in one request (a bulk lease, issue 17).

        The server records the leases under ``key`` (``queues/Q/.lease.KEY``, docs/protocol.md 20)
        before it answers. A call with a key that has a record leases that record's messages again
        (fresh receipt handles, receive count + 1; those deleted or taken by someone else since are
        left out; nothing new): a retried task reads the same messages. No waiting: ``[]`` when
        nothing is ready.

        Args:
            queue: Queue name (a standard queue: a FIFO queue is refused).
            key: The lease key, 1-128 characters of ``A-Z a-z 0-9 - _ :``.
            max_messages: 1-10,000.
            visibility_timeout_seconds: 1-43,200; None = the queue's ``visibility_timeout_seconds``.
        Returns:
            The messages, oldest first when leased anew.
        Raises:
            InvalidRequest: A malformed key or an argument out of range (before any file is touched).
            QueueNotFound: No such queue.
        """
        ...

    def delete_bulk(self, queue: str, key: str) -> int:
        """Delete every message leased under ``key`` (its record's leases still in flight), then the record.

        Idempotent: a key without a record deletes nothing. A lease of the record that is over
        (its message deleted, or received again by someone else) is left alone.

        Returns:
            How many messages were deleted.
        Raises:
            InvalidRequest: A malformed key.
        """
        ...

    def ack(self, message: Message) -> None:
        """Delete a received message: ``delete(message.queue, message.receipt_handle)``. Errors as :meth:`delete`."""
        self.delete(message.queue, message.receipt_handle)

    def nack(self, message: Message, delay_seconds: int = 0) -> None:
        """Give a received message back, to be received again after ``delay_seconds`` (0-43,200).

        ``change_visibility(message.queue, message.receipt_handle, delay_seconds)``; the receive
        count goes up on the next receive. Errors as :meth:`change_visibility`.
        """
        self.change_visibility(message.queue, message.receipt_handle, delay_seconds)

    # -- peeking --

    def peek(self, queue: str, **options: Unpack[PeekOptions]) -> PeekPage:
        """Read messages without receiving them: no lease, no receive count change (``GET /{queue}/peek``).

        The options are keyword arguments, each optional, typed by
        :class:`~mqcore.client.options.PeekOptions` (their defaults: :data:`~mqcore.client.options.PEEK_DEFAULTS`).

        Args:
            queue: Queue name.
            after: Only messages with ids greater than this one (a page's ``next_after``).
            limit: 1-1,000 messages per page (default :data:`mqcore.limits.DEFAULT_PEEK_LIMIT`, 100).
            partition: With ``partitions``: only messages of this partition (as a partitioned receive).
            partitions: Number of partitions, 1-1,000.
        Returns:
            A page of ready, in-flight and delayed messages, oldest first, each with its state.
        Raises:
            InvalidRequest: ``limit`` or the partition out of range, or ``after`` not a message id.
            TypeError: An option that is not one of these.
        """
        ...

    def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        """Read the given messages without receiving them, wherever they are (``POST /{queue}/peek``).

        Any number of ids (the HTTP client sends 1,000 per request). Ids not in the queue
        (deleted, never sent) are left out of the answer.

        Returns:
            The messages found, in id order (within each 1,000).
        Raises:
            InvalidMessageId: An id is malformed (before any request).
        """
        ...

    def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        """Delete any number of messages by id, wherever they are, 10 per request (SoftLayer delete, batched).

        Returns:
            One result per id, in order: None if deleted, else the error :meth:`delete_by_id`
            would raise (MessageNotFound, ...).
        Raises:
            InvalidMessageId: An id is malformed (HTTP: before any request).
        """
        ...

    def iter_peek(
        self, queue: str, *, page_size: int = DEFAULT_PEEK_LIMIT, **partition: Unpack[PartitionOptions]
    ) -> Iterator[PeekedMessage]:
        """Every message of a queue (or of one partition), oldest first, read page by page with :meth:`peek`.

        Messages sent while iterating appear if their ids sort after the current page. Errors as
        :meth:`peek`, raised while iterating.

        Args:
            queue: Queue name.
            page_size: Messages per :meth:`peek`, 1-1,000 (default as :meth:`peek`'s ``limit``).
            partition: As :meth:`peek`.
            partitions: As :meth:`peek`.
        """
        after: str | None = None
        while True:
            page = self.peek(queue, after=after, limit=page_size, **partition)
            yield from page.messages
            if page.next_after is None:
                return
            after = page.next_after

    # -- redrive --

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        """Start moving a dead-letter queue's ready messages back, oldest first (SQS StartMessageMoveTask).

        Over HTTP the server runs the task; brokerless it runs in this call and the final status
        is returned. Each message moved gets a new id and a receive count of 0; messages without a
        known or existing destination are skipped and stay.

        Args:
            queue: The dead-letter queue to empty.
            destination: Move everything to this queue; None = each message's original queue.
            max_messages_per_second: 1-10,000 (default 500). SQS: MaxNumberOfMessagesPerSecond.
        Returns:
            The task status (docs/api.md, Redrive task status): ``task_id``, ``state``, ``moved``...
        Raises:
            RedriveInProgress: A redrive out of this queue is running.
            QueueNotFound: The queue or the destination does not exist.
            InvalidRequest: The destination is the queue itself, or the rate is out of range.
        """
        ...

    def redrive_status(self, queue: str) -> dict[str, Any] | None:
        """Status of the last redrive out of ``queue`` (SQS ListMessageMoveTasks), or None if there never was one."""
        ...

    def cancel_redrive(self, queue: str) -> dict[str, Any]:
        """Cancel the running redrive out of ``queue`` (SQS CancelMessageMoveTask); messages moved stay moved.

        Returns:
            The task status, ``state`` ``cancelled``.
        Raises:
            RedriveNotRunning: No redrive out of this queue is running.
        """
        ...


@runtime_checkable
class AsyncQueueClient(Protocol):
    """An asyncio mq client: :class:`~mqcore.client.AsyncClient` or :class:`~mqcore.client.AsyncLocalClient`.

    The methods, arguments, results and errors of :class:`QueueClient`, as coroutines
    (:meth:`iter_peek` is an async generator); the docstrings are :class:`QueueClient`'s. Use
    it with ``async with``, or await :meth:`close`. Brokerless, file work runs in
    ``asyncio.to_thread`` and waits are awaited on the loop (never parked in a thread).
    """

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def list_queues(self, prefix: str = "") -> list[str]: ...

    async def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool: ...

    async def delete_queue(self, queue: str) -> None: ...

    async def queue_stats(self, queue: str) -> dict[str, Any]: ...

    async def get_attributes(self, queue: str) -> dict[str, Any]: ...

    async def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]: ...

    async def purge(self, queue: str) -> int: ...

    async def send(self, queue: str, body: bytes | str, **options: Unpack[SendOptions]) -> str: ...

    async def send_json(self, queue: str, value: Any, **options: Unpack[MessageOptions]) -> str:
        return await self.send(queue, json_body(value), content_type=JSON_CONTENT_TYPE, **options)

    async def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = DEFAULT_BATCH_MESSAGES
    ) -> list[str | MQError]: ...

    async def receive(self, queue: str, **options: Unpack[ReceiveOptions]) -> list[Message]: ...

    async def delete(self, queue: str, receipt_handle: str) -> None: ...

    async def delete_by_id(self, queue: str, message_id: str) -> None: ...

    async def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]: ...

    async def change_visibility(self, queue: str, receipt_handle: str, visibility_timeout_seconds: int) -> int: ...

    async def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]: ...

    async def lease_bulk(
        self, queue: str, key: str, *, max_messages: int = 10, visibility_timeout_seconds: int | None = None
    ) -> list[Message]: ...

    async def delete_bulk(self, queue: str, key: str) -> int: ...

    async def ack(self, message: Message) -> None:
        await self.delete(message.queue, message.receipt_handle)

    async def nack(self, message: Message, delay_seconds: int = 0) -> None:
        await self.change_visibility(message.queue, message.receipt_handle, delay_seconds)

    async def peek(self, queue: str, **options: Unpack[PeekOptions]) -> PeekPage: ...

    async def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]: ...

    async def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]: ...

    async def iter_peek(
        self, queue: str, *, page_size: int = DEFAULT_PEEK_LIMIT, **partition: Unpack[PartitionOptions]
    ) -> AsyncIterator[PeekedMessage]:
        after: str | None = None
        while True:
            page = await self.peek(queue, after=after, limit=page_size, **partition)
            for message in page.messages:
                yield message
            if page.next_after is None:
                return
            after = page.next_after

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]: ...

    async def redrive_status(self, queue: str) -> dict[str, Any] | None: ...

    async def cancel_redrive(self, queue: str) -> dict[str, Any]: ...


def documented_by(protocol: type) -> Callable[[_C], _C]:
    """Class decorator: each method without a docstring gets the docstring of ``protocol``'s method of that name.

    So the docstrings are written once, here, and ``help(Client.send)`` still shows them.
    """

    def decorate(cls: _C) -> _C:
        for name, method in vars(cls).items():
            source = getattr(protocol, name, None)
            if callable(method) and getattr(method, "__doc__", None) is None and source is not None:
                method.__doc__ = source.__doc__
        return cls

    return decorate


documented_by(QueueClient)(AsyncQueueClient)
