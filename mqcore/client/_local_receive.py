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

:func:`reap_message` and :func:`reap_queue` do mq-reaper's job on the call
that removed something.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mqcore.attributes import (
    MAX_RECEIVE_MESSAGES,
    MAX_VISIBILITY_TIMEOUT_SECONDS,
    MAX_WAIT_SECONDS,
    QueueAttributes,
    effective,
    is_attempt_id,
)
from mqcore.client._local_send import check_int
from mqcore.client._local_waiters import Blocking, Op, Watches, poll_op
from mqcore.client._types import Message
from mqcore.errors import InvalidReceiptHandle, InvalidRequest, MQError
from mqcore.model import ReceivedMessage
from mqcore.names import (
    MAX_PARTITIONS,
    MessageId,
    QueueName,
    check_partition,
    check_queue_name,
    parse_in_flight_name,
    partition_of,
    removed_name,
)
from mqcore.protocol import LeasePolicy, Store, now_ms

logger = logging.getLogger(__name__)

#: Receipt handles whose current ``delay/`` name is remembered (after a change of visibility).
MAX_REMEMBERED_HINTS = 10_000


def reap_message(store: Store, queue: QueueName, message_id: MessageId) -> None:
    """Unlink ``remove/Q.ID`` now (mq-reaper's job: everything in ``remove/`` is garbage)."""
    try:
        store.reap(removed_name(queue, message_id))
    except OSError as exc:
        logger.warning("cannot reap removed message queue=%s id=%s error=%s", queue, message_id, exc)


def reap_queue(store: Store, queue: QueueName) -> None:
    """Unlink every ``remove/`` entry of ``queue`` (messages ``Q.ID`` and deleted directories ``Q.TOKEN.queue``)."""
    prefix = f"{queue}."
    for name in store.scan_removed():
        if name.startswith(prefix):
            try:
                store.reap(name)
            except OSError as exc:
                logger.warning("cannot reap removed entry name=%s error=%s", name, exc)


def as_message(message: ReceivedMessage) -> Message:
    """The client's :class:`Message` for a message the store leased."""
    return Message(
        queue=message.queue,
        message_id=message.message_id,
        receipt_handle=message.receipt_handle,
        body=message.body,
        content_type=message.content_type,
        attributes=message.attributes,
        sent_ms=message.sent_ms,
        receive_count=message.receive_count,
        first_receive_ms=message.first_receive_ms,
        visibility_deadline_ms=message.deadline_ms,
    )


class HandleHints:
    """The current ``delay/`` name of receipt handles whose visibility this client changed (thread-safe).

    A change of visibility renames the lease file; remembering the new name
    spares a search of ``delay/`` when the handle is used again. Bounded to
    :data:`MAX_REMEMBERED_HINTS` (oldest forgotten first); a miss only costs
    the search.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hints: OrderedDict[str, str] = OrderedDict()

    def get(self, handle: str) -> str | None:
        """The remembered current name of ``handle``, or None."""
        with self._lock:
            return self._hints.get(handle) if isinstance(handle, str) else None

    def remember(self, handle: str, current: str) -> None:
        """``handle``'s lease file is now named ``current``."""
        with self._lock:
            for key in (handle, current):
                self._hints[key] = current
                self._hints.move_to_end(key)
            while len(self._hints) > MAX_REMEMBERED_HINTS:
                self._hints.popitem(last=False)

    def forget(self, handle: str) -> None:
        """``handle``'s lease ended (deleted, released, re-let)."""
        with self._lock:
            current = self._hints.pop(handle, None)
            if current is not None:
                self._hints.pop(current, None)


@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    """A checked receive: every default resolved."""

    queue: QueueName
    max_messages: int
    visibility_timeout_ms: int
    wait_time_seconds: int
    attempt_id: str | None
    partition: int | None
    partitions: int | None


@dataclass(frozen=True, slots=True)
class _Attempt:
    """An attempt record found for a retried receive: when it was made, and the handles not re-let now."""

    created_ms: int
    rest: list[str]


class _KeyedLocks:
    """One lock per key while someone uses it (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}

    def take(self, key: tuple[str, str]) -> threading.Lock:
        """The lock of ``key``, counted in use until :meth:`drop`."""
        with self._lock:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
            return lock

    def drop(self, key: tuple[str, str]) -> None:
        """One user of ``key``'s lock is done; the lock is forgotten after the last."""
        with self._lock:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Receiver:
    """Receives on a queue root with no daemon (thread-safe).

    Args:
        store: The root's store.
        defaults: The attributes of a queue that sets none.
        watches: The client's watches (long polls sleep on them).
        hints: The client's handle hints (a re-let attempt uses and forgets them).
    """

    def __init__(self, store: Store, defaults: QueueAttributes, watches: Watches, hints: HandleHints) -> None:
        self.store = store
        self.defaults = defaults
        self.watches = watches
        self.hints = hints
        self._attempt_locks = _KeyedLocks()

    def _policy(self, queue: QueueName) -> LeasePolicy:
        attrs = effective(self.store.get_attributes(queue), self.defaults)
        return LeasePolicy.for_queue(attrs, self.store.purged_before(queue))

    def check(
        self,
        queue: str,
        max_messages: int,
        wait_time_seconds: int | None,
        visibility_timeout_seconds: int | None,
        attempt_id: str | None,
        partition: int | None,
        partitions: int | None,
    ) -> ReceiveRequest:
        """Check a receive as ``GET /{queue}/messages`` does (arguments first, then the queue) and resolve defaults."""
        name = check_queue_name(queue)
        wanted = check_int(max_messages, "max_messages", 1, MAX_RECEIVE_MESSAGES)
        wait = (
            None
            if wait_time_seconds is None
            else check_int(wait_time_seconds, "wait_time_seconds", 0, MAX_WAIT_SECONDS)
        )
        visibility = (
            None
            if visibility_timeout_seconds is None
            else check_int(visibility_timeout_seconds, "visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS)
        )
        if attempt_id is not None and not is_attempt_id(attempt_id):
            raise InvalidRequest(
                "attempt_id must be 1-128 printable ASCII characters without spaces", parameter="attempt_id"
            )
        checked = check_partition(
            None if partition is None else check_int(partition, "partition", 0, MAX_PARTITIONS - 1),
            None if partitions is None else check_int(partitions, "partitions", 1, MAX_PARTITIONS),
        )
        partition, partitions = checked if checked is not None else (None, None)
        attrs = effective(self.store.get_attributes(name), self.defaults)
        return ReceiveRequest(
            queue=name,
            max_messages=wanted,
            visibility_timeout_ms=(attrs.visibility_timeout_seconds if visibility is None else visibility) * 1000,
            wait_time_seconds=attrs.receive_wait_seconds if wait is None else wait,
            attempt_id=attempt_id,
            partition=partition,
            partitions=partitions,
        )

    # -- one look at the queue ---------------------------------------------------------------

    def _redeliver_due(self, queue: QueueName, now: int, policy: LeasePolicy) -> int | None:
        """Move on the queue's due ``delay/`` files as mq-mover would (``Store.move_due``).

        Returns:
            The earliest deadline (epoch ms) of the queue's ``delay/`` files not yet due, or None.
        """
        infix = f".{queue}."
        next_due: int | None = None
        try:
            names = os.listdir(self.store.layout.delay)
        except FileNotFoundError:
            return None
        for name in names:
            if infix not in name:
                continue
            item = parse_in_flight_name(name)
            if item is None or item.queue != queue:
                continue
            if item.deadline_ms > now:
                if next_due is None or item.deadline_ms < next_due:
                    next_due = item.deadline_ms
                continue
            try:
                result = self.store.move_due(item, now, policy)
            except MQError as exc:
                logger.error("redelivery failed queue=%s id=%s error=%s", queue, item.message_id, exc)
                continue
            if result in ("purged", "expired", "orphaned"):
                reap_message(self.store, queue, item.message_id)
            elif result == "kept":
                logger.warning(
                    "dead-letter queue missing queue=%s dead_letter_queue=%s (redelivered to its queue)",
                    queue,
                    policy.dead_letter_queue,
                )
            logger.debug("%s queue=%s id=%s receive_count=%d", result, queue, item.message_id, item.receive_count)
        return next_due

    def _receive_pass(self, request: ReceiveRequest) -> tuple[list[ReceivedMessage], int | None]:
        """One look at the queue: redeliver due files, list, lease oldest first (in the partition) up to max.

        Returns:
            (the messages leased, the next due deadline of the queue's ``delay/`` files or None).
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: A lease failed and nothing was leased.
        """
        queue = request.queue
        now = now_ms()
        policy = self._policy(queue)
        next_due = self._redeliver_due(queue, now, policy)
        names = sorted(self.store.scan_ready(queue))
        out: list[ReceivedMessage] = []
        for name in names:
            if request.partitions is not None and (
                partition_of(name.partition(".")[0], request.partitions) != request.partition
            ):
                continue
            try:
                message = self.store.lease(queue, name, request.visibility_timeout_ms, policy=policy)
            except MQError as exc:
                if not out:
                    raise
                logger.error("receive stopped early queue=%s error=%s", queue, exc)
                break
            if message is not None:
                out.append(message)
                if len(out) >= request.max_messages:
                    break
        return out, next_due

    def _waiting_op(self, request: ReceiveRequest) -> Op[list[ReceivedMessage]]:
        """Lease up to max_messages; when none is ready, wait up to wait_time_seconds for one (long polling)."""
        look = Blocking(lambda: self._receive_pass(request))
        if request.wait_time_seconds <= 0:
            messages, _ = yield look
            return messages  # type: ignore[no-any-return]  # a step's result is Any
        return (yield from poll_op(self.watches, request.queue, "arrivals", request.wait_time_seconds, look))

    # -- attempt records ---------------------------------------------------------------------

    def _relet_attempt(self, request: ReceiveRequest) -> tuple[_Attempt | None, list[ReceivedMessage]]:
        """Receive again the messages a receive with this attempt id got within 5 minutes (SQS).

        Returns:
            (the record found or None, the messages re-let: fresh handles, receive count + 1).
        """
        assert request.attempt_id is not None
        record = self.store.load_attempt_record(request.queue, request.attempt_id)
        if record is None:
            return None, []
        handles, created_ms = record
        handles, rest = handles[: request.max_messages], handles[request.max_messages :]
        policy = self._policy(request.queue)
        hints = {h: hint for h in handles if (hint := self.hints.get(h))}
        current = self.store.find_leases(request.queue, handles, hints)
        out = []
        for handle in handles:
            try:
                message = self.store.relet(
                    request.queue,
                    handle,
                    request.visibility_timeout_ms,
                    policy=policy,
                    hint=current.get(handle),
                    search=False,
                )
            except InvalidReceiptHandle:
                continue
            if message is not None:
                self.hints.forget(handle)
                out.append(message)
        logger.info("receive attempt retried queue=%s handles=%d relet=%d", request.queue, len(handles), len(out))
        return _Attempt(created_ms, rest), out

    def _record_attempt(
        self, request: ReceiveRequest, messages: list[ReceivedMessage], attempt: _Attempt | None
    ) -> None:
        """Record the handles a receive with an attempt id returned (nothing if it returned nothing)."""
        if not messages or request.attempt_id is None:
            return
        record = [m.receipt_handle for m in messages] + (attempt.rest if attempt else [])
        try:
            self.store.save_attempt(
                request.queue, request.attempt_id, record, created_ms=attempt.created_ms if attempt else None
            )
        except MQError as exc:
            logger.error("receive attempt not recorded queue=%s error=%s", request.queue, exc)

    def _attempt_op(self, request: ReceiveRequest, attempt_id: str) -> Op[list[ReceivedMessage]]:
        """A receive with an attempt id: re-let its record's messages, or receive and record (one at a time per id)."""
        key = (request.queue, attempt_id)
        lock = self._attempt_locks.take(key)
        try:
            if not lock.acquire(blocking=False):  # a retry waits for the first try to finish
                yield Blocking(lock.acquire, lambda _: lock.release())
            try:
                attempt, messages = yield Blocking(lambda: self._relet_attempt(request))
                if attempt is None:
                    messages = yield from self._waiting_op(request)
                yield Blocking(lambda: self._record_attempt(request, messages, attempt))
                return messages  # type: ignore[no-any-return]  # a step's result is Any
            finally:
                lock.release()
        finally:
            self._attempt_locks.drop(key)

    def receive_op(
        self,
        queue: str,
        max_messages: int,
        wait_time_seconds: int | None,
        visibility_timeout_seconds: int | None,
        attempt_id: str | None,
        partition: int | None,
        partitions: int | None,
    ) -> Op[list[Message]]:
        """``LocalClient.receive`` as an operation: check, then receive (long polling, attempt records)."""
        request: ReceiveRequest = yield Blocking(
            lambda: self.check(
                queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
            )
        )
        if request.attempt_id is None:
            messages = yield from self._waiting_op(request)
        else:
            messages = yield from self._attempt_op(request, request.attempt_id)
        return [as_message(m) for m in messages]
