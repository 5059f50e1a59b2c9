"""Receive request attempts (SQS ReceiveRequestAttemptId), written once for the daemon and the brokerless client.

SQS: a receive retried with the same ReceiveRequestAttemptId within 5 minutes
of the first returns the messages the first returned (here: received again,
with fresh receipt handles and receive count + 1) instead of new ones. The
record of what an attempt returned lives in ``attempts/`` (docs/protocol.md,
:meth:`mqcore.protocol.Store.save_attempt`).

The whole rule is the plan :func:`attempted_receive` (:mod:`mqcore.service.plans`):
load the record, then either receive anew (:class:`ReceiveNew`, the driver's
waiting receive) or receive the recorded messages again (:class:`Relet`, the
driver calls :func:`relet` where it leases), then record what was returned.
A driver runs it under its :class:`KeyedLocks` lock of ``(queue, attempt_id)``.
The file work is in these functions; the waiting and the threads are the driver's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mqcore.errors import InvalidReceiptHandle, MQError
from mqcore.model import ReceivedMessage
from mqcore.names import ReceiptHandle
from mqcore.protocol import LeasePolicy, Store
from mqcore.service.plans import Blocking, Plan
from mqcore.service.requests import ReceiveRequest

logger = logging.getLogger("mq.service")

__all__ = [
    "Attempt",
    "KeyedLocks",
    "ReceiveNew",
    "Relet",
    "attempted_receive",
    "load_attempt",
    "record_attempt",
    "relet",
]


L = TypeVar("L")


class KeyedLocks(Generic[L]):
    """One lock per key, kept only while someone holds or waits for it (the attempt-id lock, SQS).

    Receives with the same ``(queue, attempt_id)`` in one process run one after
    the other, so a retry sent while the first try still runs waits for its
    record instead of leasing other messages. The map holds a key only while
    it has users, never every attempt id ever seen.

    Args:
        factory: Makes a lock: ``threading.Lock`` for threads (use :meth:`holding`), ``asyncio.Lock``
            for one event loop (use :meth:`holding_async`; then only that loop's thread may call).
    """

    def __init__(self, factory: Callable[[], L]) -> None:
        self._factory = factory
        self._locks: dict[Hashable, tuple[L, int]] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._locks)

    def _take(self, key: Hashable) -> L:
        with self._guard:
            lock, users = self._locks.get(key) or (self._factory(), 0)
            self._locks[key] = (lock, users + 1)
        return lock

    def _give_back(self, key: Hashable) -> None:
        with self._guard:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextlib.contextmanager
    def holding(self, key: Hashable) -> Iterator[None]:
        """Hold ``key``'s lock for the ``with`` block (a lock with ``__enter__``: threads)."""
        lock: Any = self._take(key)
        try:
            with lock:
                yield
        finally:
            self._give_back(key)

    @contextlib.asynccontextmanager
    async def holding_async(self, key: Hashable) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the ``async with`` block (a lock with ``__aenter__``: one event loop)."""
        lock: Any = self._take(key)
        try:
            async with lock:
                yield
        finally:
            self._give_back(key)


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt record found for a retried receive.

    Attributes:
        created_ms: When the first try was recorded (epoch ms): a retry keeps it, so retrying
            never extends the 5-minute window.
        handles: The receipt handles to receive again now (at most the retry's ``max_messages``).
        rest: The recorded handles beyond that, kept in the record for a later retry.
    """

    created_ms: int
    handles: list[str]
    rest: list[str]


def load_attempt(store: Store, request: ReceiveRequest) -> Attempt | None:
    """The record of ``request.attempt_id`` on its queue made within 5 minutes, split by ``max_messages``.

    Blocking (one file read). None when there is none (or no attempt id): the
    driver then receives new messages.
    """
    if request.attempt_id is None:
        return None
    record = store.load_attempt_record(request.queue, request.attempt_id)
    if record is None:
        return None
    handles, created_ms = record
    return Attempt(created_ms, handles[: request.max_messages], handles[request.max_messages :])


def relet(
    store: Store,
    request: ReceiveRequest,
    handles: list[str],
    policy: LeasePolicy,
    hints: Mapping[str, str] | None = None,
) -> list[ReceivedMessage]:
    """Receive again the messages of ``handles`` (an attempt's retry): fresh handles, receive count + 1.

    Blocking. At most one listing of ``delay/`` for the handles neither found
    by name nor by ``hints``. A handle whose message is gone, was deleted or
    was received by someone else since is left out.

    Args:
        store: The store.
        request: The retried receive (queue, visibility timeout).
        handles: The recorded handles to receive again (:attr:`Attempt.handles`, as text; one that is
            malformed or of another queue is left out).
        policy: The queue's dead-letter and retention policy.
        hints: Receipt handle -> its lease's current ``delay/`` name, where the driver remembers one.
    """
    parsed: list[ReceiptHandle] = []
    for text in handles:  # read from the attempt record on disk: parsed here, once
        try:
            parsed.append(ReceiptHandle.parse(text, request.queue))
        except InvalidReceiptHandle:
            continue
    current = store.find_leases(request.queue, parsed, dict(hints) if hints else None)
    out: list[ReceivedMessage] = []
    for handle in parsed:
        message = store.relet(
            request.queue,
            handle,
            request.visibility_timeout_ms,
            policy=policy,
            hint=current.get(handle.text),
            search=False,
        )
        if message is not None:
            out.append(message)
    logger.info("receive attempt retried queue=%s handles=%d relet=%d", request.queue, len(handles), len(out))
    return out


def record_attempt(
    store: Store, request: ReceiveRequest, messages: list[ReceivedMessage], attempt: Attempt | None
) -> None:
    """Record the handles an attempted receive returned (blocking; nothing when it returned nothing).

    The record is the new handles followed by the ones a retry did not take
    (:attr:`Attempt.rest`), with the first try's ``created_ms``. A failed
    write is logged, not raised: the messages were received, and a retry
    then gets new messages while these come back after their visibility
    timeout (at-least-once holds).
    """
    if not messages or request.attempt_id is None:
        return
    record = [m.receipt_handle for m in messages] + (attempt.rest if attempt else [])
    try:
        store.save_attempt(
            request.queue, request.attempt_id, record, created_ms=attempt.created_ms if attempt else None
        )
    except MQError as exc:
        logger.error("receive attempt not recorded queue=%s error=%s", request.queue, exc)


@dataclass(frozen=True, slots=True)
class ReceiveNew:
    """Operation of :func:`attempted_receive`: receive new messages as the driver does (waiting up to
    ``request.wait_time_seconds``); send back the list received."""

    request: ReceiveRequest


@dataclass(frozen=True, slots=True)
class Relet:
    """Operation of :func:`attempted_receive`: receive again the messages of ``handles`` (:func:`relet`,
    where the driver leases, with its hints); send back the list received."""

    request: ReceiveRequest
    handles: list[str]


def attempted_receive(store: Store, request: ReceiveRequest) -> Plan[list[ReceivedMessage]]:
    """The plan of a receive with an attempt id (SQS ReceiveRequestAttemptId), for :mod:`mqcore.service.plans`.

    Yields :class:`~mqcore.service.plans.Blocking` (the record's read and
    write), then one :class:`ReceiveNew` (no record within 5 minutes) or one
    :class:`Relet` (a retry: at most ``max_messages`` of the recorded handles;
    the others stay recorded). The caller holds the ``(queue, attempt_id)``
    lock around it, so a retry waits for the first try's record.

    Returns:
        The messages received.
    """
    attempt: Attempt | None = yield Blocking(lambda: load_attempt(store, request))
    messages: list[ReceivedMessage]
    if attempt is None:
        messages = yield ReceiveNew(request)
    else:
        messages = yield Relet(request, attempt.handles)
    if messages:
        yield Blocking(lambda: record_attempt(store, request, messages, attempt))
    return messages
