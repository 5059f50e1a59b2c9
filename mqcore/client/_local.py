"""Brokerless clients: the client interface run directly on a queue root, with no daemon.

:class:`LocalClient` does what ``mq``, ``mq-mover`` and ``mq-reaper`` would do
for each call, in this process, through :class:`mqcore.protocol.Store`: the
same renames of the same file names (``docs/protocol.md``), so it is safe
alongside running daemons and other brokerless processes on the same root
(VSQS: "does not require active broker daemons"). What the daemons do in the
background happens here on the call that needs it:

- **redelivery** (mq-mover's job): a receive first moves on the queue's due
  ``delay/`` files with :meth:`Store.move_due` (redeliver, dead-letter,
  or remove if purged or expired), so visibility timeouts, delays and
  dead-letter queues work with no mq-mover running;
- **FIFO**: a receive lists the queue directory and leases names in sorted
  order (ids sort by send time), with the queue's lease policy;
- **long polling**: inotify (:class:`mqcore.watch.DirWatcher`) on the queue
  directory and on ``delay/``, plus a timer for the queue's next due deadline
  and a safety-net rescan every :data:`RESCAN_INTERVAL_SECONDS`;
- **capacity**: a send to a full queue waits up to ``capacity_wait_seconds``
  (woken by inotify), then raises :class:`QueueFull`, as the broker;
- **reaping**: deletes unlink their ``remove/`` entry at once (no mq-reaper needed);
- **redrive** runs synchronously and returns its final status.

:class:`AsyncLocalClient` has the same methods as coroutines: blocking file
work runs in ``asyncio.to_thread``; long polls and capacity waits are awaited
on the event loop (woken from the inotify thread), never parked in a thread.

Queue defaults are :class:`QueueAttributes()` (the daemon's defaults when it
runs without options). Errors are the :mod:`mqcore.errors` classes the HTTP
API would answer for the same mistake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import select
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from mqcore.attributes import (
    MAX_CONTENT_TYPE_CHARS,
    MAX_DELAY_SECONDS,
    MAX_RECEIVE_MESSAGES,
    MAX_VISIBILITY_TIMEOUT_SECONDS,
    MAX_WAIT_SECONDS,
    QueueAttributes,
    attributes_size,
    check_message_attributes,
    effective,
    is_attempt_id,
    is_content_type,
)
from mqcore.client._types import (
    JSON_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    BatchEntry,
    Message,
    PeekedMessage,
    PeekPage,
)
from mqcore.errors import (
    InvalidReceiptHandle,
    InvalidRequest,
    MessageTooLarge,
    MQError,
    QueueFull,
    QueueNotFound,
    RedriveInProgress,
    RedriveNotRunning,
)
from mqcore.model import ReceivedMessage
from mqcore.names import (
    ATTRIBUTES_FILE,
    MAX_PARTITIONS,
    PURGE_FILE,
    IdGenerator,
    MessageId,
    QueueName,
    check_message_id,
    check_partition,
    check_queue_name,
    is_queue_prefix,
    parse_in_flight_name,
    parse_ready_name,
    parse_receipt_handle,
    partition_of,
    removed_name,
    sent_ms_of,
)
from mqcore.protocol import DEFAULT_PEEK_LIMIT, MAX_PEEK_LIMIT, LeasePolicy, PeekedFile, SendEntry, Store, now_ms
from mqcore.redrive import (
    DEFAULT_REDRIVE_RATE,
    MAX_REDRIVE_RATE,
    REDRIVE_STATUS_INTERVAL_SECONDS,
    present_redrive_status,
    redrive_running,
)
from mqcore.watch import DirEvent, DirWatcher, open_watcher

logger = logging.getLogger(__name__)

__all__ = ["RESCAN_INTERVAL_SECONDS", "AsyncLocalClient", "LocalClient"]

#: Longest a long poll or capacity wait goes without listing its queue again, in seconds: the
#: safety net for what inotify cannot see (other hosts on NFS, ``MQ_NO_INOTIFY=1``).
RESCAN_INTERVAL_SECONDS = 2.0
#: Receipt handles whose current ``delay/`` name is remembered (after a change of visibility).
MAX_REMEMBERED_HINTS = 10_000
#: Most entries one chunk of ``send_batch`` may hold (the daemon's ``--max-batch-messages`` cap).
MAX_BATCH_SIZE = 1000

#: One id generator per process: ids of every LocalClient in it strictly increase (FIFO).
_IDS = IdGenerator()
#: inotify watch tag of ``delay/`` (a "/" never appears in a queue name, so no queue can clash).
_DELAY_TAG = "delay/"

_WaitKind = Literal["arrivals", "room"]


def _check_int(value: object, name: str, low: int, high: int, *, key: str = "parameter") -> int:
    """``value`` if it is an int (not a bool) in ``low..high``.

    Raises:
        InvalidRequest: Anything else (``details[key]`` names the argument, as the HTTP API's
            ``details.parameter`` or ``details.field``).
    """
    if type(value) is not int or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer {low}-{high}, got {value!r}", **{key: name})
    return value


def _check_content_type(content_type: object) -> str | None:
    if content_type is None:
        return None
    if not is_content_type(content_type):
        raise InvalidRequest(
            f"content_type must be 1-{MAX_CONTENT_TYPE_CHARS} printable ASCII characters", field="content_type"
        )
    return content_type


def _encode_body(body: object, content_type: str | None) -> tuple[bytes, str | None]:
    """Body bytes and content type: ``str`` is UTF-8 ``text/plain; charset=utf-8`` unless a type is given.

    Raises:
        InvalidRequest: A ``str`` with a lone surrogate (not encodable as UTF-8).
        TypeError: Neither bytes-like nor str.
    """
    if isinstance(body, str):
        try:
            data = body.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("body is not valid Unicode (lone surrogate)", field="body") from None
        return data, content_type or TEXT_CONTENT_TYPE
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def _message_attributes(attributes: object) -> dict[str, str]:
    """Checked user attributes (SQS's rules, ``check_message_attributes``); {} for None."""
    if isinstance(attributes, Mapping):
        attributes = dict(attributes)
    return check_message_attributes(attributes)


def _as_message(message: ReceivedMessage) -> Message:
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


def _as_peeked(message: PeekedFile) -> PeekedMessage:
    return PeekedMessage(
        queue=message.queue,
        message_id=message.message_id,
        state=message.state,  # type: ignore[arg-type]
        body=message.body,
        content_type=message.content_type,
        attributes=message.attributes,
        sent_ms=message.sent_ms,
        receive_count=message.receive_count,
        visible_at_ms=message.visible_at_ms,
        source_queue=message.source_queue,
    )


# -- waking long polls and capacity waits ----------------------------------------------------


class _Waiter:
    """One long poll or capacity wait of one queue; ``fired`` is set when what it waits for may have happened.

    Fields are read and written under the :class:`_Watches` lock.
    """

    __slots__ = ("fired", "kind", "notify", "queue", "until_ms")

    def __init__(self, queue: QueueName, kind: _WaitKind, notify: Callable[[], None]) -> None:
        self.queue = queue
        self.kind = kind
        self.notify = notify
        self.fired = False
        #: A receive waiter is woken by a new ``delay/`` file of its queue due at or before this (epoch ms).
        self.until_ms: float = math.inf


class _Watches:
    """The inotify watches of one client, read by one background thread that wakes the waiters.

    Opened on the first wait (a client that never waits uses no inotify
    instance). Watches: ``delay/`` (for the due deadlines of in-flight and
    delayed messages), and each queue directory while someone waits on it.
    Receive waiters wake on ready names arriving in their queue and on new
    ``delay/`` files of their queue due before they would wake anyway;
    capacity waiters on ready names leaving their queue and on changes of its
    ``.attributes`` or ``.purge``. Every waiter wakes when its queue directory
    goes away or events were lost (overflow). Without inotify
    (:func:`mqcore.watch.open_watcher` returns None) waiters wake only on their
    timeouts (the rescan interval). Thread-safe.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cond = threading.Condition(threading.Lock())
        self._watcher: DirWatcher | None = None
        self._opened = False
        self._closed = False
        self._waiters: dict[QueueName, list[_Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _open(self) -> None:
        """Open the inotify instance and start its reader thread (lock held)."""
        if self._opened or self._closed:
            return
        self._opened = True
        self._watcher = open_watcher()
        if self._watcher is None:
            return
        self._watcher.watch(self._store.layout.delay, _DELAY_TAG)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="mq-local-watch", daemon=True)
        self._thread.start()

    def add(self, queue: QueueName, kind: _WaitKind, notify: Callable[[], None] | None = None) -> _Waiter:
        """Register a waiter on ``queue`` (before looking at the state it waits for).

        Args:
            queue: The queue.
            kind: ``"arrivals"`` (a receive) or ``"room"`` (a send waiting for capacity).
            notify: Called (with the lock held, from the watch thread) when the waiter fires;
                default: wake the threads blocked in :meth:`wait`.
        """
        with self._cond:
            self._open()
            waiter = _Waiter(queue, kind, notify or self._cond.notify_all)
            self._waiters.setdefault(queue, []).append(waiter)
            self._watch_queue(queue)
            return waiter

    def _watch_queue(self, queue: QueueName) -> None:
        """(Re-)establish the watch on the queue directory (lock held; idempotent)."""
        if self._watcher is not None and not self._closed:
            self._watcher.watch(self._store.layout.queue_dir(queue), queue)
            if not self._watcher.watching(_DELAY_TAG):
                self._watcher.watch(self._store.layout.delay, _DELAY_TAG)

    def arm(self, waiter: _Waiter) -> None:
        """Reset ``waiter`` before a look at the queue: any event from now on fires it."""
        with self._cond:
            waiter.fired = False
            waiter.until_ms = math.inf
            self._watch_queue(waiter.queue)  # the directory may have been re-created

    def until(self, waiter: _Waiter, until_ms: float) -> None:
        """From now on, wake ``waiter`` only for ``delay/`` files due at or before ``until_ms`` (epoch ms)."""
        with self._cond:
            waiter.until_ms = until_ms

    def wait(self, waiter: _Waiter, timeout_seconds: float) -> None:
        """Block until ``waiter`` fired, the client closed, or ``timeout_seconds`` passed."""
        with self._cond:
            self._cond.wait_for(lambda: waiter.fired or self._closed, timeout_seconds)

    def remove(self, waiter: _Waiter) -> None:
        """Unregister ``waiter``; the queue directory is unwatched when its last waiter leaves."""
        with self._cond:
            waiters = self._waiters.get(waiter.queue)
            if waiters is None or waiter not in waiters:
                return
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[waiter.queue]
                if self._watcher is not None and not self._closed:
                    self._watcher.unwatch(waiter.queue)

    def close(self) -> None:
        """Wake every waiter, stop the reader thread and close the inotify descriptor."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for waiters in self._waiters.values():
                for waiter in waiters:
                    self._fire(waiter)
            self._cond.notify_all()
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join()
            os.close(self._stop_r)
            os.close(self._stop_w)
        if self._watcher is not None:
            self._watcher.close()

    # -- the reader thread ----------------------------------------------------

    def _run(self) -> None:
        watcher = self._watcher
        assert watcher is not None
        fd = watcher.fileno()
        while True:
            try:
                ready, _, _ = select.select([fd, self._stop_r], [], [])
            except OSError as exc:  # pragma: no cover - the descriptor broke: fall back to rescans
                logger.warning("inotify reader stopped error=%s (long polls rely on rescans)", exc)
                return
            if self._stop_r in ready:
                return
            with self._cond:
                if self._closed:
                    return
                for event in watcher.read():
                    self._dispatch(event)

    def _fire(self, waiter: _Waiter) -> None:
        if not waiter.fired:
            waiter.fired = True
            waiter.notify()

    def _dispatch(self, event: DirEvent) -> None:
        """Wake the waiters one inotify event concerns (lock held)."""
        if event.overflow:
            for waiters in self._waiters.values():
                for waiter in waiters:
                    self._fire(waiter)
            return
        if event.tag == _DELAY_TAG:
            item = parse_in_flight_name(event.name) if event.arrived else None
            if item is not None:
                for waiter in self._waiters.get(item.queue, ()):
                    if waiter.kind == "arrivals" and item.deadline_ms <= waiter.until_ms:
                        self._fire(waiter)
            return
        waiters = self._waiters.get(QueueName(event.tag), ())
        if event.dir_gone:
            for waiter in waiters:
                self._fire(waiter)
            return
        name = event.name
        kind: _WaitKind | None = None
        if name.startswith("."):
            if event.arrived and name in (ATTRIBUTES_FILE, PURGE_FILE):
                kind = "room"  # the capacity may have changed, or a purge made room
        elif parse_ready_name(name) is not None:
            kind = "arrivals" if event.arrived else "room" if event.left else None
        if kind is not None:
            for waiter in waiters:
                if waiter.kind == kind:
                    self._fire(waiter)


# -- the synchronous client ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ReceiveRequest:
    """A checked receive: every default resolved."""

    queue: QueueName
    max_messages: int
    visibility_timeout_ms: int
    wait_seconds: int
    attempt_id: str | None
    partition: int | None
    partitions: int | None


@dataclass(frozen=True, slots=True)
class _Attempt:
    """An attempt record found for a retried receive: when it was made, and the handles not re-let now."""

    created_ms: int
    rest: list[str]


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One request's worth of a batch send, checked: each entry a SendEntry or its error."""

    entries: list[SendEntry | MQError]
    too_large: MessageTooLarge | None

    @property
    def immediate(self) -> list[int]:
        """Indexes of the valid entries without a delay (the ones capacity counts)."""
        return [i for i, e in enumerate(self.entries) if isinstance(e, SendEntry) and e.delay_ms == 0]


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
        self._watches = _Watches(self.store)
        self._lock = threading.Lock()
        self._hints: OrderedDict[str, str] = OrderedDict()
        self._sending: dict[QueueName, int] = {}
        self._capacity_lock = threading.Lock()
        self._attempt_locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}
        self._redrive_lock = threading.Lock()

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

    # -- helpers ----------------------------------------------------------------

    def _attrs(self, queue: QueueName) -> QueueAttributes:
        """Effective attributes of ``queue`` (QueueNotFound)."""
        return effective(self.store.get_attributes(queue), self.defaults)

    def _policy(self, queue: QueueName, attrs: QueueAttributes | None = None) -> LeasePolicy:
        return LeasePolicy.for_queue(attrs or self._attrs(queue), self.store.purged_before(queue))

    def _hint(self, handle: str) -> str | None:
        with self._lock:
            return self._hints.get(handle) if isinstance(handle, str) else None

    def _remember(self, handle: str, current: str) -> None:
        with self._lock:
            for key in (handle, current):
                self._hints[key] = current
                self._hints.move_to_end(key)
            while len(self._hints) > MAX_REMEMBERED_HINTS:
                self._hints.popitem(last=False)

    def _forget(self, handle: str) -> None:
        with self._lock:
            current = self._hints.pop(handle, None)
            if current is not None:
                self._hints.pop(current, None)

    def _reap(self, queue: QueueName, message_id: MessageId) -> None:
        """Unlink ``remove/Q.ID`` now (mq-reaper's job: everything in ``remove/`` is garbage)."""
        try:
            self.store.reap(removed_name(queue, message_id))
        except OSError as exc:
            logger.warning("cannot reap removed message queue=%s id=%s error=%s", queue, message_id, exc)

    def _reap_queue(self, queue: QueueName) -> None:
        """Unlink every ``remove/`` entry of ``queue`` (messages ``Q.ID`` and deleted directories ``Q.TOKEN.queue``)."""
        prefix = f"{queue}."
        for name in self.store.scan_removed():
            if name.startswith(prefix):
                try:
                    self.store.reap(name)
                except OSError as exc:
                    logger.warning("cannot reap removed entry name=%s error=%s", name, exc)

    @contextlib.contextmanager
    def _attempt_lock(self, queue: str, attempt_id: str) -> Iterator[None]:
        """Serialize receives with the same attempt id in this client (a retry waits for the first try)."""
        key = (queue, attempt_id)
        with self._lock:
            lock, users = self._attempt_locks.get(key, (threading.Lock(), 0))
            self._attempt_locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._attempt_locks[key]
                if users <= 1:
                    del self._attempt_locks[key]
                else:
                    self._attempt_locks[key] = (lock, users - 1)

    # -- queues -----------------------------------------------------------------

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues starting with ``prefix``, sorted (SQS ListQueues).

        Raises:
            InvalidRequest: ``prefix`` is not 0-80 characters of ``[A-Za-z0-9_-]``.
        """
        if not is_queue_prefix(prefix):
            raise InvalidRequest(
                "prefix must be 0-80 characters of A-Z, a-z, 0-9, '-' and '_' (a queue name prefix)",
                parameter="prefix",
            )
        return list(self.store.list_queues(prefix))

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
        self._reap_queue(name)

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
        explicit, created_ms = self.store.queue_settings(name)
        names = self.store.scan_ready(name)
        in_flight, delayed = self.store.count_delay(name).get(name, (0, 0))
        redrive = self.store.read_redrive_status(name)
        now = now_ms()
        age = None
        if names:
            oldest = min(names).partition(".")[0]
            age = round(max(0, now - sent_ms_of(MessageId(oldest))) / 1000, 3)
        return {
            "queue": name,
            "ready": len(names),
            "in_flight": in_flight,
            "delayed": delayed,
            "oldest_ready_age_seconds": age,
            "created_ms": created_ms,
            "attributes": effective(explicit, self.defaults).to_json(),
            "redrive": present_redrive_status(redrive, now),
        }

    def get_attributes(self, queue: str) -> dict[str, Any]:
        """The queue's effective attributes (every key; defaults filled in).

        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        return self._attrs(check_queue_name(queue)).to_json()

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
        self._reap_queue(name)
        return removed

    # -- send ---------------------------------------------------------------------

    def _prepare_send(
        self,
        queue: str,
        body: bytes | str,
        content_type: str | None,
        attributes: Mapping[str, str] | None,
        delay_seconds: int | None,
    ) -> tuple[QueueName, SendEntry]:
        """Check a single send in the HTTP API's order: name, queue, delay, attributes, size."""
        name = check_queue_name(queue)
        attrs = self._attrs(name)
        delay = attrs.delay_seconds
        if delay_seconds is not None:
            delay = _check_int(delay_seconds, "delay_seconds", 0, MAX_DELAY_SECONDS)
        message_attributes = _message_attributes(attributes)
        data, ctype = _encode_body(body, _check_content_type(content_type))
        size = len(data) + attributes_size(message_attributes)
        if size > attrs.max_message_bytes:
            raise MessageTooLarge(size, attrs.max_message_bytes)
        return name, SendEntry(data, ctype, message_attributes or None, delay * 1000)

    def _queue_full(self, queue: QueueName) -> QueueFull:
        try:
            attrs = self._attrs(queue)
        except MQError:
            attrs = self.defaults
        return QueueFull(
            f"queue {queue!r} holds its capacity of {attrs.capacity} ready messages and no room was made "
            f"within {attrs.capacity_wait_seconds} s",
            queue=queue,
            capacity=attrs.capacity,
        )

    def _reserve(self, queue: QueueName, wanted: int) -> tuple[int, QueueAttributes]:
        """Admit up to ``wanted`` sends under the queue's capacity now (no waiting).

        Room = capacity - ready files - this client's sends in progress (the
        broker's rule; other processes' sends are seen once published).

        Returns:
            (how many were admitted, to be given back with :meth:`_release`; the attributes read).
        """
        attrs = self._attrs(queue)
        with self._capacity_lock:
            taken = wanted
            if attrs.capacity is not None:
                room = attrs.capacity - len(self.store.scan_ready(queue)) - self._sending.get(queue, 0)
                taken = max(0, min(room, wanted))
            if taken:
                self._sending[queue] = self._sending.get(queue, 0) + taken
        return taken, attrs

    def _release(self, queue: QueueName, admitted: int) -> None:
        if admitted:
            with self._capacity_lock:
                left = self._sending.get(queue, 0) - admitted
                if left > 0:
                    self._sending[queue] = left
                else:
                    self._sending.pop(queue, None)

    def _admit(self, queue: QueueName, wanted: int) -> int:
        """Admit up to ``wanted`` sends; wait up to capacity_wait_seconds for any room (0 = the queue stayed full)."""
        taken, attrs = self._reserve(queue, wanted)
        if taken or attrs.capacity_wait_seconds <= 0:
            return taken
        end = time.monotonic() + attrs.capacity_wait_seconds
        waiter = self._watches.add(queue, "room")
        try:
            while True:
                self._watches.arm(waiter)
                taken, _ = self._reserve(queue, wanted)
                remaining = end - time.monotonic()
                if taken or remaining <= 0 or self._watches.closed:
                    return taken
                self._watches.wait(waiter, min(remaining, RESCAN_INTERVAL_SECONDS))
        finally:
            self._watches.remove(waiter)

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
        name, entry = self._prepare_send(queue, body, content_type, attributes, delay_seconds)
        admitted = 0
        if entry.delay_ms == 0:
            admitted = self._admit(name, 1)
            if not admitted:
                raise self._queue_full(name)
        try:
            return self.store.send(name, entry.body, entry.content_type, entry.attributes, entry.delay_ms)
        finally:
            self._release(name, admitted)

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
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return self.send(
            queue, data, content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    def _prepare_entry(self, entry: bytes | str | BatchEntry, default_delay: int) -> SendEntry:
        if isinstance(entry, BatchEntry):
            body, content_type, attributes, delay = (
                entry.body,
                entry.content_type,
                entry.attributes,
                entry.delay_seconds,
            )
        else:
            body, content_type, attributes, delay = entry, None, None, None
        delay = (
            default_delay if delay is None else _check_int(delay, "delay_seconds", 0, MAX_DELAY_SECONDS, key="field")
        )
        data, ctype = _encode_body(body, _check_content_type(content_type))
        message_attributes = _message_attributes(attributes)
        return SendEntry(data, ctype, message_attributes or None, delay * 1000)

    def _prepare_chunk(self, queue: QueueName, chunk: Sequence[bytes | str | BatchEntry]) -> _Chunk:
        """Check one request's entries as ``POST /{queue}/messages/batch`` does (QueueNotFound for the whole)."""
        attrs = self._attrs(queue)
        entries: list[SendEntry | MQError] = []
        for entry in chunk:
            try:
                entries.append(self._prepare_entry(entry, attrs.delay_seconds))
            except MQError as exc:
                entries.append(exc)
        valid = [e for e in entries if isinstance(e, SendEntry)]
        total = sum(len(e.body) + attributes_size(e.attributes or {}) for e in valid)
        too_large = MessageTooLarge(total, attrs.max_message_bytes) if total > attrs.max_message_bytes else None
        return _Chunk(entries, too_large)

    def _store_chunk(self, queue: QueueName, chunk: _Chunk, admitted: int) -> list[str | MQError]:
        """Write and publish the admitted entries of ``chunk`` with one group commit; a result per entry."""
        refused = set(chunk.immediate[admitted:])
        chosen = [i for i, e in enumerate(chunk.entries) if isinstance(e, SendEntry) and i not in refused]
        stored = self.store.send_batch(queue, [chunk.entries[i] for i in chosen]) if chosen else []  # type: ignore[misc]
        by_entry: dict[int, str | MQError] = dict(zip(chosen, stored, strict=True))
        full = self._queue_full(queue) if refused else None
        out: list[str | MQError] = []
        for i, entry in enumerate(chunk.entries):
            if isinstance(entry, MQError):
                out.append(entry)
            elif i in refused:
                assert full is not None
                out.append(full)
            else:
                out.append(by_entry[i])
        return out

    def _send_items(self, queue: QueueName, items: Sequence[bytes | str | BatchEntry]) -> list[str | MQError]:
        """Send one chunk; a chunk too large as a whole is split in halves until each entry is alone (as Client)."""
        chunk = self._prepare_chunk(queue, items)
        if chunk.too_large is not None:
            if len(items) == 1:
                return [chunk.too_large]
            half = len(items) // 2
            return self._send_items(queue, items[:half]) + self._send_items(queue, items[half:])
        immediate = len(chunk.immediate)
        admitted = self._admit(queue, immediate) if immediate else 0
        try:
            return self._store_chunk(queue, chunk, admitted)
        finally:
            self._release(queue, admitted)

    def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = 10
    ) -> list[str | MQError]:
        """Send any number of messages, ``batch_size`` per group commit (SQS SendMessageBatch).

        Each chunk is checked as one HTTP batch request: an entry with a bad
        body, content type, attributes or delay fails alone. A chunk whose
        valid entries together exceed the queue's ``max_message_bytes`` is
        split in halves and sent again (as :class:`mqcore.client.Client`
        does), so each entry that fits alone is sent; one too large alone gets
        :class:`MessageTooLarge`. On a queue with a capacity, as many entries
        without a delay as fit are sent (after waiting up to
        ``capacity_wait_seconds`` for any room) and the others get
        :class:`QueueFull`.

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
        name = check_queue_name(queue)
        size = _check_int(batch_size, "batch_size", 1, MAX_BATCH_SIZE)
        items = list(entries)
        results: list[str | MQError] = []
        for start in range(0, len(items), size):
            results.extend(self._send_items(name, items[start : start + size]))
        return results

    # -- receive --------------------------------------------------------------------

    def _receive_request(
        self,
        queue: str,
        max_messages: int,
        wait_time_seconds: int | None,
        visibility_timeout_seconds: int | None,
        attempt_id: str | None,
        partition: int | None,
        partitions: int | None,
    ) -> _ReceiveRequest:
        """Check a receive as ``GET /{queue}/messages`` does (arguments first, then the queue) and resolve defaults."""
        name = check_queue_name(queue)
        wanted = _check_int(max_messages, "max_messages", 1, MAX_RECEIVE_MESSAGES)
        wait = (
            None
            if wait_time_seconds is None
            else _check_int(wait_time_seconds, "wait_time_seconds", 0, MAX_WAIT_SECONDS)
        )
        visibility = (
            None
            if visibility_timeout_seconds is None
            else _check_int(visibility_timeout_seconds, "visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS)
        )
        if attempt_id is not None and not is_attempt_id(attempt_id):
            raise InvalidRequest(
                "attempt_id must be 1-128 printable ASCII characters without spaces", parameter="attempt_id"
            )
        checked = check_partition(
            None if partition is None else _check_int(partition, "partition", 0, MAX_PARTITIONS - 1),
            None if partitions is None else _check_int(partitions, "partitions", 1, MAX_PARTITIONS),
        )
        partition, partitions = checked if checked is not None else (None, None)
        attrs = self._attrs(name)
        return _ReceiveRequest(
            queue=name,
            max_messages=wanted,
            visibility_timeout_ms=(attrs.visibility_timeout_seconds if visibility is None else visibility) * 1000,
            wait_seconds=attrs.receive_wait_seconds if wait is None else wait,
            attempt_id=attempt_id,
            partition=partition,
            partitions=partitions,
        )

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
                self._reap(queue, item.message_id)
            elif result == "kept":
                logger.warning(
                    "dead-letter queue missing queue=%s dead_letter_queue=%s (redelivered to its queue)",
                    queue,
                    policy.dead_letter_queue,
                )
            logger.debug("%s queue=%s id=%s receive_count=%d", result, queue, item.message_id, item.receive_count)
        return next_due

    def _receive_pass(self, request: _ReceiveRequest) -> tuple[list[ReceivedMessage], int | None]:
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

    def _wait_plan(self, end: float, next_due: int | None) -> tuple[float, float] | None:
        """(seconds to wait, wake for ``delay/`` files due by this epoch ms), or None when the wait is over."""
        remaining = end - time.monotonic()
        if remaining <= 0:
            return None
        now = now_ms()
        until_ms = now + remaining * 1000
        timeout = min(remaining, RESCAN_INTERVAL_SECONDS)
        if next_due is not None and next_due < until_ms:
            until_ms = next_due
            timeout = min(timeout, max(0.0, (next_due - now + 1) / 1000))  # +1 ms: wake at or after it
        return timeout, until_ms

    def _receive_waiting(self, request: _ReceiveRequest) -> list[ReceivedMessage]:
        """Lease up to max_messages; when none is ready, wait up to wait_seconds for one (long polling)."""
        if request.wait_seconds <= 0:
            return self._receive_pass(request)[0]
        end = time.monotonic() + request.wait_seconds
        waiter = self._watches.add(request.queue, "arrivals")
        try:
            while True:
                self._watches.arm(waiter)
                messages, next_due = self._receive_pass(request)
                plan = self._wait_plan(end, next_due)
                if messages or plan is None or self._watches.closed:
                    return messages
                self._watches.until(waiter, plan[1])
                self._watches.wait(waiter, plan[0])
        finally:
            self._watches.remove(waiter)

    def _relet_attempt(self, request: _ReceiveRequest) -> tuple[_Attempt | None, list[ReceivedMessage]]:
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
        hints = {h: hint for h in handles if (hint := self._hint(h))}
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
                self._forget(handle)
                out.append(message)
        logger.info("receive attempt retried queue=%s handles=%d relet=%d", request.queue, len(handles), len(out))
        return _Attempt(created_ms, rest), out

    def _record_attempt(
        self, request: _ReceiveRequest, messages: list[ReceivedMessage], attempt: _Attempt | None
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
        request = self._receive_request(
            queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
        )
        if request.attempt_id is None:
            return [_as_message(m) for m in self._receive_waiting(request)]
        with self._attempt_lock(request.queue, request.attempt_id):
            attempt, messages = self._relet_attempt(request)
            if attempt is None:
                messages = self._receive_waiting(request)
            self._record_attempt(request, messages, attempt)
        return [_as_message(m) for m in messages]

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
        parsed = parse_receipt_handle(receipt_handle)
        self.store.delete_by_handle(name, receipt_handle, self._hint(receipt_handle))
        self._forget(receipt_handle)
        self._reap(name, parsed.message_id)

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
        self._reap(name, mid)

    def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        """Delete several messages by receipt handle (SQS DeleteMessageBatch); a result per handle.

        Returns:
            None for each message deleted, or the error of :meth:`delete` it got, in order.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue (nothing is deleted).
        """
        name = check_queue_name(queue)
        handles = list(receipt_handles)
        if handles and not self.store.queue_exists(name):
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        out: list[MQError | None] = []
        for handle in handles:
            try:
                self.delete(name, handle)
                out.append(None)
            except MQError as exc:
                out.append(exc)
        return out

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
        timeout = _check_int(
            timeout_seconds, "visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS, key="field"
        )
        now = now_ms()
        current = self.store.change_visibility(
            name, receipt_handle, timeout * 1000, now=now, hint=self._hint(receipt_handle)
        )
        if timeout == 0:
            self._forget(receipt_handle)
            return now
        self._remember(receipt_handle, current)
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
        name = check_queue_name(queue)
        items = list(entries)
        if items and not self.store.queue_exists(name):
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        out: list[int | MQError] = []
        for handle, timeout in items:
            try:
                out.append(self.change_visibility(name, handle, timeout))
            except MQError as exc:
                out.append(exc)
        return out

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
        size = _check_int(limit, "limit", 1, MAX_PEEK_LIMIT)
        split = check_partition(
            None if partition is None else _check_int(partition, "partition", 0, MAX_PARTITIONS - 1),
            None if partitions is None else _check_int(partitions, "partitions", 1, MAX_PARTITIONS),
        )
        start: MessageId | None = None
        if after is not None:
            try:
                start = check_message_id(after)
            except InvalidRequest as exc:
                raise InvalidRequest(f"after must be a message id: {exc.message}", parameter="after") from None
        files, next_after = self.store.peek(name, after=start, limit=size, partition=split)
        return PeekPage([_as_peeked(f) for f in files], next_after)

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
        return [_as_peeked(f) for f in self.store.peek_ids(name, ids)] if ids else []

    def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        """Delete several messages by id, wherever they are (SoftLayer delete, batched); a result per id.

        Returns:
            None for each message deleted, or the error of :meth:`delete_by_id` it got, in order.
        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue (nothing is deleted).
        """
        name = check_queue_name(queue)
        ids = list(message_ids)
        if ids and not self.store.queue_exists(name):
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        out: list[MQError | None] = []
        for message_id in ids:
            try:
                self.delete_by_id(name, message_id)
                out.append(None)
            except MQError as exc:
                out.append(exc)
        return out

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
        source = check_queue_name(queue)
        rate = DEFAULT_REDRIVE_RATE
        if max_messages_per_second is not None:
            rate = _check_int(max_messages_per_second, "max_messages_per_second", 1, MAX_REDRIVE_RATE, key="field")
        dest = check_queue_name(destination) if destination is not None else None
        if not self.store.queue_exists(source):
            raise QueueNotFound(f"queue {source!r} does not exist", queue=source)
        if dest is not None:
            if dest == source:
                raise InvalidRequest("destination must differ from the dead-letter queue", field="destination")
            if not self.store.queue_exists(dest):
                raise QueueNotFound(f"destination queue {dest!r} does not exist", queue=dest)
        with self._redrive_lock:
            now = now_ms()
            if redrive_running(self.store.read_redrive_status(source), now):
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            status: dict[str, Any] = {
                "task_id": uuid.uuid4().hex,
                "source": source,
                "destination": dest,
                "max_messages_per_second": rate,
                "state": "running",
                "moved": 0,
                "skipped": 0,
                "to_move": len(self.store.scan_ready(source)),
                "started_ms": now,
                "updated_ms": now,
            }
            self.store.write_redrive_status(source, status)
        logger.info("redrive started queue=%s destination=%s rate=%d task=%s", source, dest, rate, status["task_id"])
        return self._run_redrive(source, dest, status)

    def _write_redrive_status(self, source: QueueName, status: dict[str, Any]) -> None:
        status["updated_ms"] = now_ms()
        self.store.write_redrive_status(source, dict(status))

    def _redrive_stop(self, source: QueueName, status: dict[str, Any]) -> Literal["cancelled", "replaced"] | None:
        """Why this task must stop (a cancel request names it, or the status file names another task), or None."""
        request = self.store.redrive_cancel_request(source)
        if request is not None and request.get("task_id") == status["task_id"]:
            if "requested_ms" in request:
                status["cancel_requested_ms"] = request["requested_ms"]
            return "cancelled"
        current = self.store.read_redrive_status(source)
        if current is None or current.get("task_id") != status["task_id"]:
            return "replaced"  # two redrives were started at once: the one in the file goes on
        if current.get("state") == "cancelled":
            if "cancel_requested_ms" in current:
                status["cancel_requested_ms"] = current["cancel_requested_ms"]
            return "cancelled"
        return None

    def _run_redrive(self, source: QueueName, destination: QueueName | None, status: dict[str, Any]) -> dict[str, Any]:
        """The redrive task of daemons/_redrive.py, synchronous: oldest first, rate-limited, status every 0.5 s."""
        rate: int = status["max_messages_per_second"]
        qdir = self.store.layout.queue_dir(source)
        skipped: set[str] = set()
        started = last_write = time.monotonic()
        tried = 0
        stop: Literal["cancelled", "replaced"] | None = None
        try:
            while stop is None:
                names = sorted(n for n in self.store.scan_ready(source) if n not in skipped)
                if not names:
                    status["state"] = "completed"
                    break
                for name in names:
                    if time.monotonic() - last_write >= REDRIVE_STATUS_INTERVAL_SECONDS:
                        stop = self._redrive_stop(source, status)
                        if stop is not None:
                            break
                        self._write_redrive_status(source, status)
                        last_write = time.monotonic()
                    wait = started + tried / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    tried += 1
                    if self.store.redrive_one(source, name, destination) is not None:
                        status["moved"] += 1
                    elif os.path.lexists(os.path.join(qdir, name)):
                        skipped.add(name)
                        status["skipped"] += 1
        except QueueNotFound:
            logger.info("redrive ended: queue=%s was deleted", source)
            raise
        except BaseException as exc:
            status.update(state="failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(MQError):
                self._write_redrive_status(source, status)
            raise
        if stop == "replaced":
            logger.info("redrive yielded queue=%s moved=%d (another task runs)", source, status["moved"])
            return dict(status)
        if status["state"] == "running":
            status["state"] = "cancelled"
        self._write_redrive_status(source, status)
        logger.info(
            "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
        )
        return dict(status)

    def redrive_status(self, queue: str) -> dict[str, Any] | None:
        """The status of the last redrive out of ``queue`` (by any process), or None if there never was one.

        A "running" status not rewritten for 10 s is reported "failed" (its process died).

        Raises:
            InvalidQueueName: Bad name.
            QueueNotFound: No such queue.
        """
        name = check_queue_name(queue)
        if not self.store.queue_exists(name):
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        return present_redrive_status(self.store.read_redrive_status(name), now_ms())

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
        name = check_queue_name(queue)
        status = self.redrive_status(name)
        now = now_ms()
        if status is None or not redrive_running(status, now):
            raise RedriveNotRunning(f"no redrive out of {name!r} is running", queue=name)
        self.store.request_redrive_cancel(name, status.get("task_id"), now)  # type: ignore[arg-type]
        return {**status, "state": "cancelled", "updated_ms": now, "cancel_requested_ms": now}


# -- the asyncio client ----------------------------------------------------------------------


class AsyncLocalClient:
    """:class:`LocalClient` with every method a coroutine, for asyncio programs.

    File work runs in ``asyncio.to_thread``; long polls and capacity waits
    are awaited on the event loop (woken by the inotify thread), so a waiting
    receive ties up no thread and never blocks the loop.

    Args:
        root: The queue root.
        fsync: As :class:`LocalClient`.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.sync = LocalClient(root, fsync=fsync)
        self.root = self.sync.root
        self._attempt_locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    def __repr__(self) -> str:
        return f"AsyncLocalClient({self.root!r})"

    async def __aenter__(self) -> AsyncLocalClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """See :meth:`LocalClient.close`."""
        await asyncio.to_thread(self.sync.close)

    # -- waits on the loop ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _waiter(self, queue: QueueName, kind: _WaitKind) -> AsyncIterator[tuple[_Waiter, asyncio.Event]]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(event.set)

        watches = self.sync._watches
        waiter = watches.add(queue, kind, notify)
        try:
            yield waiter, event
        finally:
            watches.remove(waiter)

    @staticmethod
    async def _sleep_on(waiter: _Waiter, event: asyncio.Event, timeout_seconds: float) -> None:
        if not waiter.fired:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_seconds)

    async def _reserve(self, queue: QueueName, wanted: int) -> tuple[int, QueueAttributes]:
        """:meth:`LocalClient._reserve` in a thread; a reservation made for a cancelled caller is given back."""
        sync = self.sync
        future = asyncio.ensure_future(asyncio.to_thread(sync._reserve, queue, wanted))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:

            def give_back(done: asyncio.Future[tuple[int, QueueAttributes]]) -> None:
                if not done.cancelled() and done.exception() is None:
                    sync._release(queue, done.result()[0])

            future.add_done_callback(give_back)
            raise

    async def _admit(self, queue: QueueName, wanted: int) -> int:
        taken, attrs = await self._reserve(queue, wanted)
        if taken or attrs.capacity_wait_seconds <= 0:
            return taken
        end = time.monotonic() + attrs.capacity_wait_seconds
        watches = self.sync._watches
        async with self._waiter(queue, "room") as (waiter, event):
            while True:
                watches.arm(waiter)
                event.clear()
                taken, _ = await self._reserve(queue, wanted)
                remaining = end - time.monotonic()
                if taken or remaining <= 0 or watches.closed:
                    return taken
                await self._sleep_on(waiter, event, min(remaining, RESCAN_INTERVAL_SECONDS))

    async def _receive_waiting(self, request: _ReceiveRequest) -> list[ReceivedMessage]:
        sync = self.sync
        if request.wait_seconds <= 0:
            return (await asyncio.to_thread(sync._receive_pass, request))[0]
        end = time.monotonic() + request.wait_seconds
        watches = sync._watches
        async with self._waiter(request.queue, "arrivals") as (waiter, event):
            while True:
                watches.arm(waiter)
                event.clear()
                messages, next_due = await asyncio.to_thread(sync._receive_pass, request)
                plan = sync._wait_plan(end, next_due)
                if messages or plan is None or watches.closed:
                    return messages
                watches.until(waiter, plan[1])
                await self._sleep_on(waiter, event, plan[0])

    @contextlib.asynccontextmanager
    async def _attempt_lock(self, queue: str, attempt_id: str) -> AsyncIterator[None]:
        key = (queue, attempt_id)
        lock, users = self._attempt_locks.get(key, (asyncio.Lock(), 0))
        self._attempt_locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._attempt_locks[key]
            if users <= 1:
                del self._attempt_locks[key]
            else:
                self._attempt_locks[key] = (lock, users - 1)

    # -- the interface -------------------------------------------------------------------

    async def list_queues(self, prefix: str = "") -> list[str]:
        """See :meth:`LocalClient.list_queues`."""
        return await asyncio.to_thread(self.sync.list_queues, prefix)

    async def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        """See :meth:`LocalClient.create_queue`."""
        return await asyncio.to_thread(self.sync.create_queue, queue, attributes)

    async def delete_queue(self, queue: str) -> None:
        """See :meth:`LocalClient.delete_queue`."""
        await asyncio.to_thread(self.sync.delete_queue, queue)

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        """See :meth:`LocalClient.queue_stats`."""
        return await asyncio.to_thread(self.sync.queue_stats, queue)

    async def get_attributes(self, queue: str) -> dict[str, Any]:
        """See :meth:`LocalClient.get_attributes`."""
        return await asyncio.to_thread(self.sync.get_attributes, queue)

    async def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`LocalClient.set_attributes`."""
        return await asyncio.to_thread(self.sync.set_attributes, queue, changes)

    async def purge(self, queue: str) -> int:
        """See :meth:`LocalClient.purge`."""
        return await asyncio.to_thread(self.sync.purge, queue)

    async def send(
        self,
        queue: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """See :meth:`LocalClient.send` (a wait for capacity is awaited on the loop)."""
        sync = self.sync
        name, entry = await asyncio.to_thread(sync._prepare_send, queue, body, content_type, attributes, delay_seconds)
        admitted = 0
        if entry.delay_ms == 0:
            admitted = await self._admit(name, 1)
            if not admitted:
                raise await asyncio.to_thread(sync._queue_full, name)
        try:
            return await asyncio.to_thread(
                sync.store.send, name, entry.body, entry.content_type, entry.attributes, entry.delay_ms
            )
        finally:
            sync._release(name, admitted)

    async def send_json(
        self,
        queue: str,
        value: Any,
        *,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """See :meth:`LocalClient.send_json`."""
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return await self.send(
            queue, data, content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    async def _send_items(self, queue: QueueName, items: Sequence[bytes | str | BatchEntry]) -> list[str | MQError]:
        sync = self.sync
        chunk = await asyncio.to_thread(sync._prepare_chunk, queue, items)
        if chunk.too_large is not None:
            if len(items) == 1:
                return [chunk.too_large]
            half = len(items) // 2
            return await self._send_items(queue, items[:half]) + await self._send_items(queue, items[half:])
        immediate = len(chunk.immediate)
        admitted = await self._admit(queue, immediate) if immediate else 0
        try:
            return await asyncio.to_thread(sync._store_chunk, queue, chunk, admitted)
        finally:
            sync._release(queue, admitted)

    async def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = 10
    ) -> list[str | MQError]:
        """See :meth:`LocalClient.send_batch` (waits for capacity are awaited on the loop)."""
        name = check_queue_name(queue)
        size = _check_int(batch_size, "batch_size", 1, MAX_BATCH_SIZE)
        items = list(entries)
        results: list[str | MQError] = []
        for start in range(0, len(items), size):
            results.extend(await self._send_items(name, items[start : start + size]))
        return results

    async def receive(
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
        """See :meth:`LocalClient.receive` (long polling is awaited on the loop, not in a thread)."""
        sync = self.sync
        request = await asyncio.to_thread(
            sync._receive_request,
            queue,
            max_messages,
            wait_time_seconds,
            visibility_timeout_seconds,
            attempt_id,
            partition,
            partitions,
        )
        if request.attempt_id is None:
            return [_as_message(m) for m in await self._receive_waiting(request)]
        async with self._attempt_lock(request.queue, request.attempt_id):
            attempt, messages = await asyncio.to_thread(sync._relet_attempt, request)
            if attempt is None:
                messages = await self._receive_waiting(request)
            await asyncio.to_thread(sync._record_attempt, request, messages, attempt)
        return [_as_message(m) for m in messages]

    async def delete(self, queue: str, receipt_handle: str) -> None:
        """See :meth:`LocalClient.delete`."""
        await asyncio.to_thread(self.sync.delete, queue, receipt_handle)

    async def delete_by_id(self, queue: str, message_id: str) -> None:
        """See :meth:`LocalClient.delete_by_id`."""
        await asyncio.to_thread(self.sync.delete_by_id, queue, message_id)

    async def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        """See :meth:`LocalClient.delete_batch`."""
        return await asyncio.to_thread(self.sync.delete_batch, queue, receipt_handles)

    async def change_visibility(self, queue: str, receipt_handle: str, timeout_seconds: int) -> int:
        """See :meth:`LocalClient.change_visibility`."""
        return await asyncio.to_thread(self.sync.change_visibility, queue, receipt_handle, timeout_seconds)

    async def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        """See :meth:`LocalClient.change_visibility_batch`."""
        return await asyncio.to_thread(self.sync.change_visibility_batch, queue, entries)

    async def ack(self, message: Message) -> None:
        """See :meth:`LocalClient.ack`."""
        await asyncio.to_thread(self.sync.ack, message)

    async def nack(self, message: Message, delay_seconds: int = 0) -> None:
        """See :meth:`LocalClient.nack`."""
        await asyncio.to_thread(self.sync.nack, message, delay_seconds)

    async def peek(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> PeekPage:
        """See :meth:`LocalClient.peek`."""
        return await asyncio.to_thread(
            lambda: self.sync.peek(queue, after=after, limit=limit, partition=partition, partitions=partitions)
        )

    async def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        """See :meth:`LocalClient.peek_ids`."""
        return await asyncio.to_thread(self.sync.peek_ids, queue, message_ids)

    async def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        """See :meth:`LocalClient.delete_by_ids`."""
        return await asyncio.to_thread(self.sync.delete_by_ids, queue, message_ids)

    def iter_peek(
        self,
        queue: str,
        *,
        page_size: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> AsyncIterator[PeekedMessage]:
        """Every message of the queue, oldest first, by pages (an async iterator); see :meth:`LocalClient.peek`."""

        async def pages() -> AsyncIterator[PeekedMessage]:
            after: str | None = None
            while True:
                page = await self.peek(queue, after=after, limit=page_size, partition=partition, partitions=partitions)
                for message in page.messages:
                    yield message
                if page.next_after is None:
                    return
                after = page.next_after

        return pages()

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        """See :meth:`LocalClient.start_redrive` (runs to the end in a worker thread)."""
        return await asyncio.to_thread(
            lambda: self.sync.start_redrive(
                queue, destination=destination, max_messages_per_second=max_messages_per_second
            )
        )

    async def redrive_status(self, queue: str) -> dict[str, Any] | None:
        """See :meth:`LocalClient.redrive_status`."""
        return await asyncio.to_thread(self.sync.redrive_status, queue)

    async def cancel_redrive(self, queue: str) -> dict[str, Any]:
        """See :meth:`LocalClient.cancel_redrive`."""
        return await asyncio.to_thread(self.sync.cancel_redrive, queue)
