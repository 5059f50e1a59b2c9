"""mq: the HTTP front end (SoftLayer MQ's six endpoints plus SQS semantics) over the mqcore protocol.

Worker pairs, as in SoftLayer MQ: ``--workers N`` starts N savers (threads
that write, fsync and publish sent messages; their directory fsyncs are
group-committed) and N fetchers. All receives of one queue run on one
fetcher, chosen by a hash of the queue name, so they are serialized: with
``--peers 0`` a queue is strictly FIFO. Each fetcher keeps an in-memory index
of its queues' ready files, filled by one listing when a queue is first used
and kept fresh by this process's own sends, inotify events and a periodic
rescan, so a receive costs the same on a queue of 100 or 100,000 messages.

On top of that (issue 3, the routes of ``docs/api.md``): receipt handles and
change of visibility, receives of up to 10 messages in one fetcher round trip,
long polling (a receive waits on a per-queue asyncio notification set by this
daemon's sends, inotify arrivals and rescans: no polling), batch send with one
group commit, receive request attempt ids, delayed sends, message attributes,
queue attributes (cached per queue, re-read when inotify or a rescan sees the
``.attributes`` or ``.purge`` file change), capacity (a send to a full queue
waits on a notification set when the ready count drops), purge, queue
statistics and redrive tasks out of dead-letter queues. Every state lives in
the folder tree (``docs/protocol.md``); this module holds only caches, waiters
and the one redrive task it runs per dead-letter queue.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import os
import re
import sys
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from aiohttp import web

from daemons import _runtime
from mqcore.attributes import (
    MAX_DELAY_SECONDS,
    MAX_VISIBILITY_TIMEOUT_SECONDS,
    MAX_WAIT_SECONDS,
    QueueAttributes,
    attributes_size,
    check_message_attributes,
    effective,
)
from mqcore.errors import (
    ConfigError,
    InvalidAttribute,
    InvalidReceiptHandle,
    InvalidRequest,
    MessageTooLarge,
    MQError,
    QueueFull,
    QueueNotFound,
    RedriveInProgress,
    RedriveNotRunning,
    StorageUnavailable,
)
from mqcore.index import ReadyIndex
from mqcore.model import ReceivedMessage
from mqcore.names import (
    ATTRIBUTES_FILE,
    PURGE_FILE,
    InFlightName,
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    parse_in_flight_name,
    parse_ready_name,
    parse_receipt_handle,
    ready_name,
    sent_ms_of,
)
from mqcore.protocol import LeasePolicy, SendEntry, Store, now_ms
from mqcore.watch import DirEvent, DirWatcher, open_watcher

logger = logging.getLogger("mq.front")

T = TypeVar("T")

#: Default maximum body size, in bytes (SQS: 1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
#: Seconds a stopping mq waits for requests in progress before cancelling them. A send
#: whose body has arrived finishes in milliseconds (its fsync); what is still waiting
#: after this is a client that has not finished uploading, and never got a 201.
#: Long polls and sends waiting for room return at once when mq stops.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
#: How many of this process's leases (and receipt handles) are remembered to make deletes cheap.
MAX_REMEMBERED_LEASES = 100_000
#: Queue names whose fetcher is remembered (a cache of crc32 results; cleared when full).
MAX_CACHED_QUEUE_NAMES = 100_000
#: Most messages one receive returns (SQS: MaxNumberOfMessages 1-10).
MAX_RECEIVE_MESSAGES = 10
#: Most entries of a batch delete or batch change of visibility (SQS: 10).
MAX_HANDLE_BATCH = 10
#: Default and largest --max-batch-messages (entries of a batch send; SQS: 10).
DEFAULT_MAX_BATCH_MESSAGES = 10
MAX_BATCH_MESSAGES_LIMIT = 1000
#: Longest receive request attempt id, in characters (SQS: ReceiveRequestAttemptId 1-128).
MAX_ATTEMPT_ID_CHARS = 128
#: Largest JSON body of the small JSON endpoints (attributes, visibility, batch delete), in bytes.
SMALL_JSON_LIMIT_BYTES = 65_536
#: Bytes a batch send's JSON may use per entry beyond its body and attributes (id, keys, content type).
BATCH_ENTRY_OVERHEAD_BYTES = 4096
#: JSON escapes (``\\u0000``) make a ``body`` string up to 6 bytes per body byte.
JSON_EXPANSION = 6
#: Redrive rate limits, in messages per second (SQS StartMessageMoveTask: 1-500; here up to 10,000).
DEFAULT_REDRIVE_RATE = 500
MAX_REDRIVE_RATE = 10_000
#: A redrive status "running" not rewritten for this long is reported as "failed" (its daemon died), in ms.
REDRIVE_STALE_MS = 10_000
#: How often a running redrive rewrites its status (and looks for a cancel request), in seconds (< 1 s).
REDRIVE_STATUS_INTERVAL_SECONDS = 0.5
#: Most messages a redrive moves in one fetcher round trip.
REDRIVE_CHUNK = 100
#: Longest Content-Type of a batch send entry, in characters.
MAX_CONTENT_TYPE_CHARS = 1024

_ENTRY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_-]{0,80}")
_ATTEMPT_ID_RE = re.compile(r"[\x21-\x7e]{1,128}")
_CONTENT_TYPE_RE = re.compile(r"[\x20-\x7e]{1,1024}")
_DIGITS_RE = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings of the ``mq`` daemon (checked on construction)."""

    root: str = "/tmp/mq"
    """Root directory of the folder tree (created if missing)."""
    address: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8080
    """TCP port; 0 picks a free one (logged in the readiness line)."""
    workers: int = 8
    """Worker pairs: N saver threads and N fetchers (SoftLayer MQ: --workers, default 8)."""
    peers: int = 0
    """Receive picks at random among the oldest peers+1 ready messages (0 = strict FIFO)."""
    visibility_timeout_seconds: int = 30
    """Default visibility timeout of a queue, in seconds (SQS: 0-43200, default 30)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest accepted body, in bytes (default 1 MiB = 1,048,576 bytes, as SQS); caps every queue's limit."""
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    """Most entries of a batch send (default 10, as SQS SendMessageBatch; 1-1000)."""
    rescan_interval_seconds: float = 10.0
    """Seconds between listings of each active queue (catches changes inotify cannot see, e.g. over NFS)."""
    log_level: str = "INFO"
    """Logging level name."""
    access_log: bool = False
    """Log one line per HTTP request on the ``mq.access`` logger (costs ~20% of send throughput)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}", key="port")
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1-1024, got {self.workers}", key="workers")
        _runtime.positive("peers", self.peers, allow_zero=True)
        if not 0 <= self.visibility_timeout_seconds <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                f"visibility-timeout must be 0-{MAX_VISIBILITY_TIMEOUT_SECONDS} seconds (as SQS), "
                f"got {self.visibility_timeout_seconds}",
                key="visibility_timeout",
            )
        _runtime.positive("max-message-size", self.max_message_bytes)
        if not 1 <= self.max_batch_messages <= MAX_BATCH_MESSAGES_LIMIT:
            raise ConfigError(
                f"max-batch-messages must be 1-{MAX_BATCH_MESSAGES_LIMIT}, got {self.max_batch_messages}",
                key="max_batch_messages",
            )
        _runtime.positive("rescan-interval", self.rescan_interval_seconds)

    @property
    def queue_defaults(self) -> QueueAttributes:
        """The attributes of a queue that sets none (``--visibility-timeout``, ``--max-message-size``)."""
        return QueueAttributes(
            visibility_timeout_seconds=self.visibility_timeout_seconds, max_message_bytes=self.max_message_bytes
        )

    @property
    def batch_request_limit_bytes(self) -> int:
        """Largest JSON body of a batch send, in bytes: bodies and attributes with JSON escapes, plus overhead."""
        return JSON_EXPANSION * self.max_message_bytes + BATCH_ENTRY_OVERHEAD_BYTES * self.max_batch_messages


def lease_policy(attrs: QueueAttributes, purged_before: MessageId | None) -> LeasePolicy:
    """The checks a receive makes (dead-letter, retention, purge) for a queue with ``attrs``."""
    return LeasePolicy(
        max_receive_count=attrs.max_receive_count,
        dead_letter_queue=attrs.dead_letter_queue,
        retention_ms=attrs.retention_seconds * 1000,
        purged_before=purged_before,
    )


@dataclass
class _QueueState:
    """What this daemon knows about one queue: its ready index and its cached metadata."""

    index: ReadyIndex
    watched: bool
    explicit: dict[str, Any]
    attrs: QueueAttributes
    created_ms: int | None
    purged_before: MessageId | None
    policy: LeasePolicy
    meta_stale: bool = False
    """Set by inotify when ``.attributes`` or ``.purge`` changed: re-read before the next use."""
    sending: int = 0
    """Sends admitted under the capacity rule and not yet published (counted as ready)."""


@dataclass
class _Lease:
    """A receive made by this daemon: its current ``delay/`` name (changes with each change of visibility)."""

    current: str


class _Signal:
    """A one-shot notification that is re-armed after every firing (asyncio, loop thread only).

    Waiters take :meth:`event` *before* looking at the state they wait for, so
    a firing between the look and the wait is never missed.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def event(self) -> asyncio.Event:
        """The event the next :meth:`fire` sets."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def fire(self) -> None:
        """Wake every current waiter (costs nothing when nobody waits)."""
        if self._event is not None:
            self._event.set()
            self._event = None


async def _wait_event(event: asyncio.Event, timeout_seconds: float) -> bool:
    """Wait for ``event`` at most ``timeout_seconds``; True if it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


@dataclass
class _Redrive:
    """A redrive task this daemon runs (one per dead-letter queue at most)."""

    status: dict[str, Any]
    task: asyncio.Task[None] | None = None
    cancel: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def _redrive_running(status: dict[str, Any] | None, now: int) -> bool:
    """True if ``status`` says running and was rewritten within the last 10 s."""
    if not status or status.get("state") != "running":
        return False
    updated = status.get("updated_ms")
    return isinstance(updated, int) and now - updated <= REDRIVE_STALE_MS


def present_redrive_status(status: dict[str, Any] | None, now: int) -> dict[str, Any] | None:
    """A redrive status as clients see it: "running" not rewritten for 10 s is reported "failed"."""
    if status is None:
        return None
    if status.get("state") == "running" and not _redrive_running(status, now):
        return {**status, "state": "failed", "error": "the daemon running the redrive stopped updating it (it died?)"}
    return status


class Fetcher:
    """One fetcher of a worker pair: a lock and a thread that serialize receives of its queues."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = asyncio.Lock()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mq-fetcher-{number}")
        self.queues: dict[QueueName, _QueueState] = {}


class Broker:
    """The daemon's state: the store, the worker pairs, the indexes, the watches, the waiters.

    Every method runs on the event loop; blocking file calls go to the saver
    threads or to the queue's fetcher thread.

    Args:
        settings: Daemon settings.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.defaults = settings.queue_defaults
        self.store = Store(settings.root)
        self.savers = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="mq-saver")
        self.fetchers = [Fetcher(i) for i in range(settings.workers)]
        self.leases: OrderedDict[tuple[str, str], _Lease] = OrderedDict()
        self.handles: OrderedDict[str, _Lease] = OrderedDict()
        self.redrives: dict[QueueName, _Redrive] = {}
        self._fetcher_of: dict[str, Fetcher] = {}
        self.watcher: DirWatcher | None = None
        self.stopping = False
        self._arrivals: dict[QueueName, _Signal] = {}
        self._room: dict[QueueName, _Signal] = {}
        self._loading: dict[QueueName, asyncio.Task[_QueueState]] = {}
        self._early_events: dict[QueueName, list[DirEvent]] = {}
        self._attempt_locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._redrive_lock = asyncio.Lock()
        self._rescan_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Attach inotify to the loop and start the periodic rescan."""
        self.watcher = open_watcher()
        if self.watcher is not None:
            asyncio.get_running_loop().add_reader(self.watcher.fileno(), self._on_watch_events)
        self._rescan_task = asyncio.create_task(self._rescan_loop(), name="mq-rescan")

    async def begin_stop(self) -> None:
        """First step of a clean stop: waiting receives and sends return at once, redrive tasks end.

        A running redrive records state "failed" (error "mq stopped") so a
        client can start it again on another daemon at once.
        """
        self.stopping = True
        for signals in (self._arrivals, self._room):
            for signal in signals.values():
                signal.fire()
        tasks = [r.task for r in self.redrives.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop background work and the worker threads (after in-flight requests finished)."""
        if not self.stopping:
            await self.begin_stop()
        self._stop.set()
        if self._rescan_task is not None:
            self._rescan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rescan_task
        if self.watcher is not None:
            asyncio.get_running_loop().remove_reader(self.watcher.fileno())
            self.watcher.close()
        self.savers.shutdown(wait=True)
        for fetcher in self.fetchers:
            fetcher.thread.shutdown(wait=True)
        self.store.close()

    # -- helpers -----------------------------------------------------------

    def fetcher_for(self, queue: QueueName) -> Fetcher:
        """The fetcher that serves ``queue`` (crc32 of the name modulo the worker count)."""
        fetcher = self._fetcher_of.get(queue)
        if fetcher is None:
            if len(self._fetcher_of) >= MAX_CACHED_QUEUE_NAMES:
                self._fetcher_of.clear()
            fetcher = self._fetcher_of[queue] = self.fetchers[zlib.crc32(queue.encode()) % len(self.fetchers)]
        return fetcher

    async def _in(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _signal(self, signals: dict[QueueName, _Signal], queue: QueueName) -> _Signal:
        signal = signals.get(queue)
        if signal is None:
            signal = signals[queue] = _Signal()
        return signal

    def _fire(self, signals: dict[QueueName, _Signal], queue: QueueName) -> None:
        signal = signals.get(queue)
        if signal is not None:
            signal.fire()

    # -- queue state: index and cached metadata ----------------------------

    def _read_meta(self, queue: QueueName) -> tuple[dict[str, Any], int | None, MessageId | None]:
        """(explicit attributes, created_ms, purged_before) of ``queue`` (worker thread; QueueNotFound)."""
        explicit = self.store.get_attributes(queue)
        return explicit, self.store.queue_created_ms(queue), self.store.purged_before(queue)

    def _list_and_read(self, queue: QueueName) -> tuple[list[str], tuple[dict[str, Any], int | None, MessageId | None]]:
        names = self.store.scan_ready(queue)
        return names, self._read_meta(queue)

    def _apply_meta(
        self, queue: QueueName, state: _QueueState, meta: tuple[dict[str, Any], int | None, MessageId | None]
    ) -> None:
        explicit, created_ms, purged_before = meta
        state.explicit = explicit
        state.attrs = effective(explicit, self.defaults)
        state.created_ms = created_ms
        state.purged_before = purged_before
        state.policy = lease_policy(state.attrs, purged_before)
        self._fire(self._room, queue)  # the capacity may have changed

    async def queue_state(self, queue: QueueName) -> _QueueState:
        """The daemon's index and metadata of ``queue``, loaded by one listing on first use.

        Concurrent first users share one load. The inotify watch is set before
        the listing, and events that arrive during it are applied after it, so
        no file slips between them. Metadata marked stale by inotify is re-read.

        Raises:
            QueueNotFound: No such queue.
        """
        fetcher = self.fetcher_for(queue)
        state = fetcher.queues.get(queue)
        if state is None:
            task = self._loading.get(queue)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._load_queue(fetcher, queue))
                self._loading[queue] = task
                task.add_done_callback(functools.partial(self._loaded, queue))
            return await asyncio.shield(task)
        if state.meta_stale:
            state.meta_stale = False
            try:
                meta = await self._in(self.savers, self._read_meta, queue)
            except QueueNotFound:
                self._forget_queue(queue)
                raise
            except BaseException:
                state.meta_stale = True
                raise
            self._apply_meta(queue, state, meta)
        return state

    def _loaded(self, queue: QueueName, task: asyncio.Task[_QueueState]) -> None:
        if self._loading.get(queue) is task:
            del self._loading[queue]
        if not task.cancelled():
            task.exception()  # retrieved here: the awaiting requests got it too

    async def _load_queue(self, fetcher: Fetcher, queue: QueueName) -> _QueueState:
        qdir = self.store.layout.queue_dir(queue)
        watched = self.watcher.watch(qdir, queue) if self.watcher is not None else False
        early: list[DirEvent] = []
        self._early_events[queue] = early
        try:
            names, meta = await self._in(fetcher.thread, self._list_and_read, queue)
        except BaseException:
            if self._early_events.get(queue) is early:
                del self._early_events[queue]
            if self.watcher is not None and fetcher.queues.get(queue) is None:
                self.watcher.unwatch(queue)
            raise
        if self._early_events.get(queue) is early:
            del self._early_events[queue]
        attrs = effective(meta[0], self.defaults)
        state = _QueueState(ReadyIndex(names), watched, meta[0], attrs, meta[1], meta[2], lease_policy(attrs, meta[2]))
        fetcher.queues[queue] = state
        for event in early:
            self._apply_to_state(queue, state, event)
        logger.info("indexed queue=%s ready=%d inotify=%s", queue, len(state.index), watched)
        return state

    def _forget_queue(self, queue: QueueName) -> None:
        self.fetcher_for(queue).queues.pop(queue, None)
        if self.watcher is not None:
            self.watcher.unwatch(queue)
        self._fire(self._arrivals, queue)  # waiters look again (and find the queue gone: 404)
        self._fire(self._room, queue)

    def _on_watch_events(self) -> None:
        assert self.watcher is not None
        for event in self.watcher.read():
            self._apply_event(event)

    def _apply_event(self, event: DirEvent) -> None:
        if event.overflow:
            logger.warning("inotify queue overflowed, rescanning every indexed queue")
            asyncio.get_running_loop().create_task(self.rescan_all())
            return
        queue = QueueName(event.tag)
        early = self._early_events.get(queue)
        if early is not None:
            early.append(event)
            return
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            self._apply_to_state(queue, state, event)

    def _apply_to_state(self, queue: QueueName, state: _QueueState, event: DirEvent) -> None:
        """One inotify event of ``queue``'s directory. Names starting with "." are metadata, never messages."""
        if event.dir_gone:
            self._forget_queue(queue)
            return
        name = event.name
        if name.startswith("."):
            if event.arrived and name in (ATTRIBUTES_FILE, PURGE_FILE):
                state.meta_stale = True
                self._fire(self._room, queue)  # a waiting sender re-reads the capacity
            return
        if event.arrived:
            if parse_ready_name(name) is not None:
                state.index.add(name)
                self._fire(self._arrivals, queue)
        elif event.left and name in state.index:
            state.index.discard(name)
            self._fire(self._room, queue)

    def _note_ready(self, queue: QueueName, name: str) -> None:
        """This daemon made ``name`` ready in ``queue``: index it and wake long polls."""
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            state.index.add(name)
        self._fire(self._arrivals, queue)

    async def _rescan_loop(self) -> None:
        interval = self.settings.rescan_interval_seconds
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=interval)
            if not self._stop.is_set():
                try:
                    await self.rescan_all()
                except MQError as exc:
                    logger.error("rescan failed error=%s", exc)

    async def rescan_all(self) -> None:
        """List every indexed queue again, add what the index missed and re-read its metadata."""
        for fetcher in self.fetchers:
            for queue in list(fetcher.queues):
                try:
                    names, meta = await self._in(fetcher.thread, self._list_and_read, queue)
                except QueueNotFound:
                    self._forget_queue(queue)
                    continue
                state = fetcher.queues.get(queue)
                if state is None:
                    continue
                self._apply_meta(queue, state, meta)
                before = len(state.index)
                state.index.update(names)
                if len(state.index) > before:
                    logger.info("rescan found queue=%s new=%d", queue, len(state.index) - before)
                    self._fire(self._arrivals, queue)

    # -- queues --------------------------------------------------------------

    async def queue_exists(self, queue: QueueName) -> bool:
        """True if the queue exists."""
        return await self._in(self.savers, self.store.queue_exists, queue)

    async def create_queue(
        self, queue: QueueName, attributes: dict[str, Any] | None = None
    ) -> tuple[bool, QueueAttributes]:
        """Create a queue with optional explicit attributes (SQS CreateQueue).

        Args:
            queue: The name.
            attributes: ``{key: value}`` of ``mqcore.attributes.KEYS``, or None.
        Returns:
            (created, effective attributes); created is False if it existed.
        Raises:
            InvalidAttribute: A bad key or value, or a dead-letter queue that does not exist.
            QueueNameExists: It exists and a given key differs from its effective value (409).
        """

        def create() -> tuple[bool, dict[str, Any]]:
            created = self.store.create_queue(queue, attributes or None, defaults=self.defaults)
            return created, self.store.get_attributes(queue)

        created, explicit = await self._in(self.savers, create)
        if created:
            logger.info("created queue=%s attributes=%s", queue, json.dumps(explicit, sort_keys=True))
        return created, effective(explicit, self.defaults)

    async def delete_queue(self, queue: QueueName) -> None:
        """Delete a queue and all its messages (QueueNotFound if missing)."""
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            await self._in(fetcher.thread, self.store.delete_queue, queue)
            self._forget_queue(queue)
        redrive = self.redrives.get(queue)
        if redrive is not None and redrive.task is not None:
            redrive.task.cancel()
        logger.info("deleted queue=%s", queue)

    async def list_queues(self, prefix: str = "") -> list[QueueName]:
        """Queue names starting with ``prefix``, sorted."""
        return await self._in(self.savers, self.store.list_queues, prefix)

    async def ready_count(self, queue: QueueName) -> int:
        """Approximate number of ready messages (from the index)."""
        return len((await self.queue_state(queue)).index)

    async def get_attributes(self, queue: QueueName) -> QueueAttributes:
        """The effective attributes of ``queue`` (QueueNotFound)."""
        return (await self.queue_state(queue)).attrs

    async def set_attributes(self, queue: QueueName, changes: dict[str, Any]) -> QueueAttributes:
        """Merge ``changes`` (None = back to the default) into the queue's attributes (SQS SetQueueAttributes).

        Returns:
            The effective attributes after the change.
        Raises:
            InvalidAttribute: A bad key or value (nothing changed).
            QueueNotFound: No such queue.
        """
        explicit = await self._in(self.savers, self.store.set_attributes, queue, changes)
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            self._apply_meta(queue, state, (explicit, state.created_ms, state.purged_before))
        logger.info("attributes changed queue=%s explicit=%s", queue, json.dumps(explicit, sort_keys=True))
        return effective(explicit, self.defaults)

    async def stats(self, queue: QueueName) -> dict[str, Any]:
        """The JSON of ``GET /<queue>``: counts, age of the oldest ready message, attributes, redrive status.

        ``ready`` and the oldest age come from this daemon's index; ``in_flight``
        and ``delayed`` from one listing of ``delay/`` (Store.count_delay).
        """
        state = await self.queue_state(queue)

        def read() -> tuple[tuple[int, int], dict[str, Any] | None]:
            counts = self.store.count_delay(queue).get(queue, (0, 0))
            return counts, self.store.read_redrive_status(queue)

        (in_flight, delayed), redrive = await self._in(self.savers, read)
        now = now_ms()
        oldest = state.index.peek_oldest()
        age = None
        if oldest is not None:
            parsed = parse_ready_name(oldest)
            if parsed is not None:
                age = round(max(0, now - sent_ms_of(parsed[0])) / 1000, 3)
        return {
            "queue": queue,
            "ready": len(state.index),
            "in_flight": in_flight,
            "delayed": delayed,
            "oldest_ready_age_seconds": age,
            "created_ms": state.created_ms,
            "attributes": state.attrs.to_json(),
            "redrive": present_redrive_status(redrive, now),
        }

    async def purge(self, queue: QueueName) -> int:
        """Remove every message sent before now, in one step as seen by consumers (SQS PurgeQueue).

        Runs under the queue's fetcher lock, so no receive of this daemon
        interleaves; the purged names (a prefix of the index: ids sort by send
        time) are dropped from the index and waiting senders are woken.

        Returns:
            Message files moved to ``remove/`` at once.
        """
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            await self.queue_state(queue)

            def purge() -> tuple[int, tuple[dict[str, Any], int | None, MessageId | None]]:
                return self.store.purge(queue), self._read_meta(queue)

            removed, meta = await self._in(fetcher.thread, purge)
            state = fetcher.queues.get(queue)
            if state is not None:
                self._apply_meta(queue, state, meta)
                threshold = meta[2]
                while threshold is not None:
                    name = state.index.peek_oldest()
                    if name is None or name.partition(".")[0] > threshold:
                        break
                    state.index.discard(name)
        self._fire(self._room, queue)
        logger.info("purged queue=%s removed=%d", queue, removed)
        return removed

    # -- send ----------------------------------------------------------------

    async def _reserve(self, queue: QueueName, state: _QueueState, wanted: int) -> tuple[_QueueState, int]:
        """Admit up to ``wanted`` sends under the queue's capacity; wait for room up to capacity_wait_seconds.

        Returns:
            (the state the reservation is counted on, how many were admitted: 0 = the queue stayed full).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + state.attrs.capacity_wait_seconds
        while True:
            capacity = state.attrs.capacity
            if capacity is None:
                state.sending += wanted
                return state, wanted
            room = capacity - len(state.index) - state.sending
            if room > 0:
                taken = min(room, wanted)
                state.sending += taken
                return state, taken
            remaining = deadline - loop.time()
            if remaining <= 0 or self.stopping:
                return state, 0
            await _wait_event(self._signal(self._room, queue).event(), remaining)
            state = await self.queue_state(queue)

    def _queue_full(self, queue: QueueName, state: _QueueState) -> QueueFull:
        return QueueFull(
            f"queue {queue!r} holds its capacity of {state.attrs.capacity} ready messages and no room was made "
            f"within {state.attrs.capacity_wait_seconds} s",
            queue=queue,
            capacity=state.attrs.capacity,
        )

    async def send(
        self,
        queue: QueueName,
        body: bytes,
        content_type: str | None = None,
        attributes: dict[str, str] | None = None,
        delay_ms: int = 0,
    ) -> MessageId:
        """Store a message durably (fsynced) and index it; return its id (SQS SendMessage).

        Args:
            queue: The queue.
            body: Body bytes (size checked by the caller).
            content_type: Stored Content-Type, or None.
            attributes: Checked user attributes, or None.
            delay_ms: Invisible for this long (0-900,000 ms); held in ``delay/`` meanwhile.
        Raises:
            QueueNotFound: No such queue.
            QueueFull: The queue stayed at capacity for capacity_wait_seconds (429).
            StorageUnavailable: It could not be guaranteed stored (503).
        """
        state = await self.queue_state(queue)
        state, admitted = await self._reserve(queue, state, 1)
        if not admitted:
            raise self._queue_full(queue, state)
        try:
            message_id = await self._in(
                self.savers, lambda: self.store.send(queue, body, content_type, attributes or None, delay_ms)
            )
            if delay_ms == 0:
                self._note_ready(queue, ready_name(message_id, 0))
        finally:
            state.sending -= admitted
        return message_id

    async def send_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Send several messages with one group commit (SQS SendMessageBatch); a result per entry, in order.

        Entries that do not fit under the queue's capacity (after waiting up to
        capacity_wait_seconds for any room) get QueueFull.

        Raises:
            QueueNotFound: No such queue.
        """
        state = await self.queue_state(queue)
        state, admitted = await self._reserve(queue, state, len(entries))
        results: list[MessageId | MQError] = []
        try:
            if admitted:
                results = await self._in(self.savers, self.store.send_batch, queue, entries[:admitted])
                ready = self.fetcher_for(queue).queues.get(queue)
                for entry, result in zip(entries, results, strict=False):
                    if isinstance(result, str) and entry.delay_ms == 0 and ready is not None:
                        ready.index.add(ready_name(result, 0))
                self._fire(self._arrivals, queue)
        finally:
            state.sending -= admitted
        full = self._queue_full(queue, state)
        return results + [full] * (len(entries) - admitted)

    # -- receive ---------------------------------------------------------------

    def _remember(self, message: ReceivedMessage) -> None:
        lease = _Lease(message.in_flight_name)
        self._remember_lease(message.queue, message.message_id, lease)
        self._remember_handle(message.receipt_handle, lease)

    def _remember_lease(self, queue: str, message_id: str, lease: _Lease) -> None:
        key = (queue, message_id)
        self.leases[key] = lease
        self.leases.move_to_end(key)
        while len(self.leases) > MAX_REMEMBERED_LEASES:
            self.leases.popitem(last=False)

    def _remember_handle(self, handle: str, lease: _Lease) -> None:
        self.handles[handle] = lease
        self.handles.move_to_end(handle)
        while len(self.handles) > MAX_REMEMBERED_LEASES:
            self.handles.popitem(last=False)

    def _lease_names(
        self, queue: QueueName, names: list[str], visibility_timeout_ms: int, policy: LeasePolicy
    ) -> tuple[list[ReceivedMessage], MQError | None, list[str]]:
        """Fetcher thread: lease each name; stop at the first storage error (returned with the untried names)."""
        out: list[ReceivedMessage] = []
        for i, name in enumerate(names):
            try:
                message = self.store.lease(queue, name, visibility_timeout_ms, policy=policy)
            except MQError as exc:
                return out, exc, names[i:]
            if message is not None:
                out.append(message)
        return out, None, []

    async def _lease_some(
        self, queue: QueueName, wanted: int, visibility_timeout_ms: int, check_exists: bool
    ) -> list[ReceivedMessage]:
        """Lease up to ``wanted`` ready messages, oldest first, in as few fetcher round trips as possible.

        Raises:
            QueueNotFound: Nothing was ready and (``check_exists``) the queue does not exist.
            StorageUnavailable: A lease failed and nothing was leased.
        """
        fetcher = self.fetcher_for(queue)
        out: list[ReceivedMessage] = []
        async with fetcher.lock:
            state = await self.queue_state(queue)
            popped = False
            while len(out) < wanted:
                names = []
                while len(names) < wanted - len(out):
                    name = state.index.pop_fuzzed(self.settings.peers)
                    if name is None:
                        break
                    names.append(name)
                if not names:
                    break
                popped = True
                leased, error, untried = await self._in(
                    fetcher.thread, self._lease_names, queue, names, visibility_timeout_ms, state.policy
                )
                state.index.update(untried)
                out.extend(leased)
                if error is not None:
                    if not out:
                        raise error
                    logger.error("receive stopped early queue=%s error=%s", queue, error)
                    break
            if popped:
                self._fire(self._room, queue)
            if not out and check_exists and not await self._in(fetcher.thread, self.store.queue_exists, queue):
                self._forget_queue(queue)
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        for message in out:
            self._remember(message)
        return out

    async def _receive_waiting(
        self, queue: QueueName, wanted: int, visibility_timeout_ms: int, wait_seconds: float
    ) -> list[ReceivedMessage]:
        """Lease up to ``wanted`` messages; if none is ready, wait up to ``wait_seconds`` for one (long polling).

        The wait is on the queue's arrival notification (sends through this
        daemon, inotify arrivals, rescans), never a poll; it ends at once when
        the daemon stops.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        check_exists = True
        while True:
            arrival = self._signal(self._arrivals, queue).event()
            messages = await self._lease_some(queue, wanted, visibility_timeout_ms, check_exists)
            remaining = deadline - loop.time()
            if messages or self.stopping or remaining <= 0:
                return messages
            check_exists = not await _wait_event(arrival, remaining) or self.stopping

    async def receive(
        self,
        queue: QueueName,
        max_messages: int = 1,
        visibility_timeout_seconds: int | None = None,
        wait_seconds: int | None = None,
        attempt_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages`` (1-10) messages (SQS ReceiveMessage); [] if none became ready.

        Args:
            queue: The queue.
            max_messages: 1-10.
            visibility_timeout_seconds: 0-43,200; None = the queue's visibility_timeout_seconds.
            wait_seconds: Long-polling wait, 0-20 s; None = the queue's receive_wait_seconds.
            attempt_id: SQS ReceiveRequestAttemptId: if a receive with it returned messages within
                the last 5 minutes, those messages are received again (fresh handles) instead of new ones.
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The receive failed.
        """
        state = await self.queue_state(queue)
        attrs = state.attrs
        vt_seconds = (
            attrs.visibility_timeout_seconds if visibility_timeout_seconds is None else visibility_timeout_seconds
        )
        wait = attrs.receive_wait_seconds if wait_seconds is None else wait_seconds
        vt_ms = vt_seconds * 1000
        if attempt_id is None:
            return await self._receive_waiting(queue, max_messages, vt_ms, wait)
        async with self._attempt_lock(queue, attempt_id):

            def load() -> tuple[list[str] | None, int | None]:
                handles = self.store.load_attempt(queue, attempt_id)
                return handles, (self.store.attempt_created_ms(queue, attempt_id) if handles is not None else None)

            handles, created_ms = await self._in(self.savers, load)
            rest: list[str] = []
            if handles is not None:
                # At most max_messages are received again; the others stay recorded for a later retry.
                handles, rest = handles[:max_messages], handles[max_messages:]
                messages = await self._relet(queue, handles, vt_ms)
                logger.info("receive attempt retried queue=%s handles=%d relet=%d", queue, len(handles), len(messages))
            else:
                messages = await self._receive_waiting(queue, max_messages, vt_ms, wait)
            if messages:
                record = [m.receipt_handle for m in messages] + rest
                try:
                    await self._in(
                        self.savers,
                        lambda: self.store.save_attempt(queue, attempt_id, record, created_ms=created_ms),
                    )
                except MQError as exc:
                    logger.error("receive attempt not recorded queue=%s error=%s", queue, exc)
            return messages

    @contextlib.asynccontextmanager
    async def _attempt_lock(self, queue: QueueName, attempt_id: str) -> AsyncIterator[None]:
        """Serialize receives with the same attempt id in this daemon (a retry waits for the first try)."""
        key = (queue, attempt_id)
        lock, users = self._attempt_locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
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

    async def _relet(self, queue: QueueName, handles: list[str], visibility_timeout_ms: int) -> list[ReceivedMessage]:
        """Receive again the messages of earlier receives (an attempt-id retry), on the queue's fetcher."""
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            state = await self.queue_state(queue)
            hints = [lease.current if (lease := self.handles.get(h)) else None for h in handles]

            def relet_all() -> list[ReceivedMessage]:
                out = []
                for handle, hint in zip(handles, hints, strict=True):
                    try:
                        message = self.store.relet(queue, handle, visibility_timeout_ms, policy=state.policy, hint=hint)
                    except InvalidReceiptHandle:
                        continue
                    if message is not None:
                        out.append(message)
                return out

            messages = await self._in(fetcher.thread, relet_all)
            for message in messages:
                state.index.discard(ready_name(message.message_id, message.receive_count - 1))
        self._fire(self._room, queue)
        for message in messages:
            self._remember(message)
        return messages

    # -- delete and visibility ----------------------------------------------------

    async def delete(self, queue: QueueName, message_id: MessageId) -> str:
        """Delete a message by id wherever it is (SoftLayer); return where it was.

        Hints from the index and from this process's leases make the usual
        case a single rename; when they miss (another process moved the
        message, or a redelivery's inotify event is still queued), the store
        lists ``delay/`` and the queue directory before answering 404.
        """
        if self.watcher is not None:
            self._on_watch_events()
        state = self.fetcher_for(queue).queues.get(queue)
        ready_hints = [ready_name(message_id, 0)]
        indexed = state.index.name_for(message_id) if state is not None else None
        if indexed:
            ready_hints.insert(0, indexed)
        lease = self.leases.pop((queue, message_id), None)
        in_flight = lease.current if lease else None
        if in_flight:
            parsed = parse_in_flight_name(in_flight)
            if parsed is not None:
                ready_hints.append(ready_name(message_id, parsed.receive_count))
        where = await self._in(
            self.savers,
            lambda: self.store.delete(
                queue, message_id, ready_hint=ready_hints, in_flight_hint=[in_flight] if in_flight else []
            ),
        )
        if indexed and state is not None:
            state.index.discard(indexed)
        if where == "ready":
            self._fire(self._room, queue)
        return where

    @staticmethod
    def check_handle(queue: QueueName, handle: object, message_id: str | None = None) -> InFlightName:
        """Parse a receipt handle of ``queue`` (and of ``message_id`` if given).

        Raises:
            InvalidReceiptHandle: Malformed, or of another queue or message.
        """
        parsed = parse_receipt_handle(handle)  # type: ignore[arg-type]
        if parsed.queue != queue:
            raise InvalidReceiptHandle(
                f"receipt handle belongs to queue {parsed.queue!r}, not {queue!r}", receipt_handle=handle
            )
        if message_id is not None and parsed.message_id != message_id:
            raise InvalidReceiptHandle(
                f"receipt handle is of message {parsed.message_id}, not {message_id}", receipt_handle=handle
            )
        return parsed

    async def delete_by_handle(self, queue: QueueName, handle: str, message_id: str | None = None) -> tuple[str, str]:
        """Delete the message a receive got, only if no later receive took it (SQS DeleteMessage).

        Returns:
            (message id, where it was: "in_flight" or "ready").
        Raises:
            InvalidReceiptHandle: Malformed, or of another queue or message (400).
            StaleReceiptHandle: Received again since; the newer lease is untouched (410).
            MessageNotFound: Already gone (404).
        """
        parsed = self.check_handle(queue, handle, message_id)
        lease = self.handles.get(handle)
        hint = lease.current if lease else None
        where = await self._in(self.savers, self.store.delete_by_handle, queue, handle, hint)
        self.leases.pop((queue, parsed.message_id), None)
        if where == "ready":
            state = self.fetcher_for(queue).queues.get(queue)
            if state is not None:
                state.index.discard(ready_name(parsed.message_id, parsed.receive_count))
            self._fire(self._room, queue)
        return parsed.message_id, where

    async def change_visibility(
        self, queue: QueueName, handle: str, visibility_timeout_seconds: int, message_id: str | None = None
    ) -> tuple[str, str, int]:
        """Set the visibility timeout of an in-flight message to now + the given seconds (SQS ChangeMessageVisibility).

        0 makes it ready at once (its long-polling consumers are woken).

        Returns:
            (message id, the lease's current receipt handle, new visibility deadline in epoch ms).
        Raises:
            InvalidReceiptHandle: Malformed, or of another queue or message (400).
            MessageNotInFlight: Its visibility timeout had already ended (400).
            StaleReceiptHandle: Received again since (410).
            MessageNotFound: Gone (404).
        """
        parsed = self.check_handle(queue, handle, message_id)
        lease = self.handles.get(handle)
        hint = lease.current if lease else None
        vt_ms = visibility_timeout_seconds * 1000
        now = now_ms()
        new = await self._in(
            self.savers, lambda: self.store.change_visibility(queue, handle, vt_ms, now=now, hint=hint)
        )
        if vt_ms == 0:
            self.leases.pop((queue, parsed.message_id), None)
            self._note_ready(queue, ready_name(parsed.message_id, parsed.receive_count))
            return parsed.message_id, handle, now
        if lease is None:
            lease = _Lease(new)
            self._remember_handle(handle, lease)
        lease.current = new
        self._remember_lease(queue, parsed.message_id, lease)
        self._remember_handle(new, lease)
        return parsed.message_id, new, now + vt_ms

    # -- redrive -------------------------------------------------------------------

    async def start_redrive(self, source: QueueName, destination: QueueName | None, rate: int) -> dict[str, Any]:
        """Start moving the ready messages of dead-letter queue ``source`` back (SQS StartMessageMoveTask).

        Args:
            source: The dead-letter queue.
            destination: Where to move them; None = each message's original queue.
            rate: Most messages moved per second (1-10,000).
        Returns:
            The task's first status (also written to ``queues/source/.redrive``).
        Raises:
            QueueNotFound: ``source`` or ``destination`` does not exist.
            InvalidRequest: ``destination`` is ``source``.
            RedriveInProgress: A redrive out of ``source`` is running (here or in another daemon).
        """
        state = await self.queue_state(source)
        if destination is not None:
            if destination == source:
                raise InvalidRequest("destination must differ from the dead-letter queue", field="destination")
            if not await self.queue_exists(destination):
                raise QueueNotFound(f"destination queue {destination!r} does not exist", queue=destination)
        async with self._redrive_lock:
            local = self.redrives.get(source)
            if local is not None and local.task is not None and not local.task.done():
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            current = await self._in(self.savers, self.store.read_redrive_status, source)
            now = now_ms()
            if _redrive_running(current, now):
                raise RedriveInProgress(f"a redrive out of {source!r} is running", queue=source)
            status: dict[str, Any] = {
                "task_id": uuid.uuid4().hex,
                "source": source,
                "destination": destination,
                "max_messages_per_second": rate,
                "state": "running",
                "moved": 0,
                "skipped": 0,
                "to_move": len(state.index),
                "started_ms": now,
                "updated_ms": now,
            }
            await self._in(self.savers, self.store.write_redrive_status, source, status)
            redrive = _Redrive(status)
            redrive.task = asyncio.get_running_loop().create_task(self._run_redrive(source, redrive))
            self.redrives[source] = redrive
        logger.info(
            "redrive started queue=%s destination=%s rate=%d task=%s", source, destination, rate, status["task_id"]
        )
        return dict(status)

    async def read_redrive(self, source: QueueName) -> dict[str, Any] | None:
        """The status of the last redrive out of ``source`` as clients see it, or None (QueueNotFound)."""

        def read() -> dict[str, Any] | None:
            if not self.store.queue_exists(source):
                raise QueueNotFound(f"queue {source!r} does not exist", queue=source)
            return self.store.read_redrive_status(source)

        return present_redrive_status(await self._in(self.savers, read), now_ms())

    async def cancel_redrive(self, source: QueueName) -> dict[str, Any]:
        """Ask the running redrive out of ``source`` to stop (SQS CancelMessageMoveTask).

        Writes state "cancelled" into the status file; the daemon running the
        task (this one or another) notices it at its next status write (within
        a second) and records its final counts.

        Raises:
            QueueNotFound: No such queue.
            RedriveNotRunning: No redrive out of ``source`` is running (404).
        """
        status = await self.read_redrive(source)
        now = now_ms()
        if status is None or not _redrive_running(status, now):
            raise RedriveNotRunning(f"no redrive out of {source!r} is running", queue=source)
        status = {**status, "state": "cancelled", "updated_ms": now, "cancel_requested_ms": now}
        await self._in(self.savers, self.store.write_redrive_status, source, status)
        local = self.redrives.get(source)
        if local is not None and local.status.get("task_id") == status.get("task_id"):
            local.status["cancel_requested_ms"] = now
            local.cancel = True
            local.wake.set()
        logger.info("redrive cancel requested queue=%s task=%s", source, status.get("task_id"))
        return status

    def _redrive_names(
        self, source: QueueName, names: list[str], destination: QueueName | None
    ) -> list[tuple[str, QueueName | None, str | None, bool]]:
        """Fetcher thread: redrive each name.

        Returns:
            Per name: (name, destination or None, its ready name there if it kept its id,
            still in the dead-letter queue). A message moved into a queue purged after its
            send gets a fresh id (Store.redrive_one): inotify or a rescan indexes that one.
        """
        out = []
        qdir = self.store.layout.queue_dir(source)
        for name in names:
            dest = self.store.redrive_one(source, name, destination)
            if dest is None:
                out.append((name, None, None, os.path.lexists(os.path.join(qdir, name))))
                continue
            same = ready_name(MessageId(name.partition(".")[0]), 0)
            kept = os.path.lexists(os.path.join(self.store.layout.queue_dir(dest), same))
            out.append((name, dest, same if kept else None, False))
        return out

    async def _redrive_step(
        self, source: QueueName, destination: QueueName | None, wanted: int, skipped: set[str]
    ) -> tuple[int, int, int] | None:
        """Move up to ``wanted`` of the oldest ready messages; (tried, moved, newly skipped), None if none left."""
        fetcher = self.fetcher_for(source)
        async with fetcher.lock:
            state = await self.queue_state(source)
            names: list[str] = []
            held: list[str] = []
            while len(names) < wanted:
                name = state.index.pop_oldest()
                if name is None:
                    break
                (held if name in skipped else names).append(name)
            state.index.update(held)
            if not names:
                return None
            results = await self._in(fetcher.thread, self._redrive_names, source, names, destination)
        moved = newly_skipped = 0
        for name, dest, ready, stays in results:
            if dest is not None:
                moved += 1
                if ready is not None:
                    self._note_ready(dest, ready)
                else:
                    self._fire(self._arrivals, dest)
            elif stays:
                newly_skipped += 1
                skipped.add(name)
                state.index.add(name)
        self._fire(self._room, source)
        return len(names), moved, newly_skipped

    async def _redrive_done(self, source: QueueName, skipped: set[str]) -> bool:
        """True if a fresh listing finds no ready message left (other than skipped ones)."""
        fetcher = self.fetcher_for(source)
        names = await self._in(fetcher.thread, self.store.scan_ready, source)
        left = [n for n in names if n not in skipped]
        if not left:
            return True
        state = await self.queue_state(source)
        state.index.update(left)
        return False

    async def _run_redrive(self, source: QueueName, redrive: _Redrive) -> None:
        """The redrive task: oldest first, at most ``max_messages_per_second``, status every 0.5 s.

        Ends "completed" when the queue has no ready message left (messages
        without a known or existing destination are skipped and stay),
        "cancelled" when a cancel request is seen in the status file (or made
        through this daemon), "failed" on an error or when mq stops.
        """
        loop = asyncio.get_running_loop()
        status = redrive.status
        rate: int = status["max_messages_per_second"]
        destination = status["destination"]
        skipped: set[str] = set()
        started = last_write = loop.time()
        tried = 0
        try:
            while True:
                if loop.time() - last_write >= REDRIVE_STATUS_INTERVAL_SECONDS:
                    if await self._redrive_cancelled(source, redrive):
                        break
                    await self._write_redrive(source, status)
                    last_write = loop.time()
                if redrive.cancel:
                    break
                due = started + tried / rate
                wait = due - loop.time()
                if wait > 0:
                    redrive.wake.clear()
                    await _wait_event(redrive.wake, min(wait, REDRIVE_STATUS_INTERVAL_SECONDS))
                    continue
                allowance = int((loop.time() - started) * rate) + 1 - tried
                step = await self._redrive_step(source, destination, max(1, min(allowance, REDRIVE_CHUNK)), skipped)
                if step is None:
                    if await self._redrive_done(source, skipped):
                        status["state"] = "completed"
                        break
                    continue
                tried += step[0]
                status["moved"] += step[1]
                status["skipped"] += step[2]
            if status["state"] == "running":
                status["state"] = "cancelled"
            await self._write_redrive(source, status)
            logger.info(
                "redrive %s queue=%s moved=%d skipped=%d", status["state"], source, status["moved"], status["skipped"]
            )
        except asyncio.CancelledError:
            status.update(state="failed", error="mq stopped (or the queue was deleted) while the redrive ran")
            with contextlib.suppress(MQError, RuntimeError):
                await self._write_redrive(source, status)
            raise
        except QueueNotFound:
            logger.info("redrive ended: queue=%s was deleted", source)
        except Exception as exc:
            logger.exception("redrive failed queue=%s", source)
            status.update(state="failed", error=str(exc))
            with contextlib.suppress(MQError):
                await self._write_redrive(source, status)

    async def _redrive_cancelled(self, source: QueueName, redrive: _Redrive) -> bool:
        """True if the status file asks this task to stop (cancelled, or replaced by another task)."""
        if redrive.cancel:
            return True
        current = await self._in(self.savers, self.store.read_redrive_status, source)
        if current is None or current.get("task_id") != redrive.status["task_id"]:
            redrive.cancel = True
            return True
        if current.get("state") == "cancelled":
            redrive.cancel = True
            if "cancel_requested_ms" in current:
                redrive.status["cancel_requested_ms"] = current["cancel_requested_ms"]
            return True
        return False

    async def _write_redrive(self, source: QueueName, status: dict[str, Any]) -> None:
        status["updated_ms"] = now_ms()
        await self._in(self.savers, self.store.write_redrive_status, source, dict(status))


# -- HTTP ------------------------------------------------------------------

BROKER = web.AppKey("broker", Broker)


def _json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every error into a status plus a JSON body ``{"error": code, "message": ...}``.

    Retriable errors (503 storage_unavailable, 429 queue_full) carry ``Retry-After`` in seconds.
    """
    try:
        return await handler(request)
    except MQError as exc:
        headers = {}
        retry_after = getattr(exc, "retry_after_seconds", None)
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if isinstance(exc, StorageUnavailable):
            logger.error("storage unavailable method=%s path=%s error=%s", request.method, request.path, exc)
        return web.json_response(exc.to_json(), status=exc.status, headers=headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "message_too_large"}.get(exc.status, "http_error")
        return _json_error(exc.status, code, exc.reason or "error")
    except Exception:
        logger.exception("internal error method=%s path=%s", request.method, request.path)
        return _json_error(500, "internal_error", "internal error; see the server log")


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """Read the request body, at most ``max_bytes`` bytes (stops reading as soon as it is over).

    Raises:
        MessageTooLarge: Content-Length or the bytes received exceed ``max_bytes``.
    """
    if request.content_length is not None:
        if request.content_length > max_bytes:
            raise MessageTooLarge(request.content_length, max_bytes)
        return await request.read()
    chunks = bytearray()
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return bytes(chunks)
        chunks += chunk
        if len(chunks) > max_bytes:
            raise MessageTooLarge(len(chunks), max_bytes)


async def read_json(request: web.Request, max_bytes: int = SMALL_JSON_LIMIT_BYTES, *, required: bool = True) -> Any:
    """The request body parsed as JSON; None for an empty body when not ``required``.

    Raises:
        MessageTooLarge: Body over ``max_bytes`` (413).
        InvalidRequest: Empty (when required) or not valid JSON (400).
    """
    raw = await read_body(request, max_bytes)
    if not raw.strip():
        if required:
            raise InvalidRequest("a JSON body is required")
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages name bad input without echoing all of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def query_params(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each given at most once and each one of ``allowed``.

    Raises:
        InvalidRequest: An unknown or repeated parameter (400, ``details.parameter``).
    """
    out: dict[str, str] = {}
    for key, value in request.query.items():
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise InvalidRequest(f"unknown query parameter {_short(key)} (known: {known})", parameter=key[:80])
        if key in out:
            raise InvalidRequest(f"query parameter {_short(key)} is given more than once", parameter=key[:80])
        out[key] = value
    return out


def int_param(params: dict[str, str], name: str, low: int, high: int) -> int | None:
    """Query parameter ``name`` as a decimal integer in ``low..high``; None if absent.

    Raises:
        InvalidRequest: Not digits only, or out of range (400, ``details.parameter``).
    """
    text = params.get(name)
    if text is None:
        return None
    if not _DIGITS_RE.fullmatch(text) or not low <= int(text) <= high:
        raise InvalidRequest(f"{name} must be an integer {low}-{high}, got {_short(text)}", parameter=name)
    return int(text)


def int_field(obj: dict[str, Any], name: str, low: int, high: int, where: str) -> int | None:
    """JSON field ``name`` as an integer (not a bool or float) in ``low..high``; None if absent or null.

    Raises:
        InvalidRequest: Wrong type or out of range (400, ``details.field``).
    """
    value = obj.get(name)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise InvalidRequest(
            f"{where}{name} must be an integer {low}-{high}, got {_short(value)}", field=f"{where}{name}"
        )
    return value


def check_keys(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """Raise InvalidRequest naming the first key of ``obj`` not in ``allowed``."""
    for key in obj:
        if key not in allowed:
            raise InvalidRequest(
                f"unknown key {_short(key)} in {where} (known: {', '.join(allowed)})",
                field=f"{where}.{key}"[:120],
            )


def batch_entries(body: Any, key: str, limit: int, *, default_ids: bool) -> list[tuple[str, dict[str, Any]]]:
    """The entries of a batch request ``{key: [entry, ...]}`` with their ids.

    Whole-request rules (SQS's batch rules): a JSON object with only ``key``;
    1..``limit`` entries, each an object; ids of 1-80 characters of
    ``[A-Za-z0-9_-]``, distinct (default: the entry's index, if ``default_ids``).

    Raises:
        InvalidRequest: Any of those broken (400); the message names the entry.
    """
    if not isinstance(body, dict):
        raise InvalidRequest(f'the body must be a JSON object {{"{key}": [...]}}')
    check_keys(body, (key,), "the request")
    items = body.get(key)
    if not isinstance(items, list):
        raise InvalidRequest(f"{key} must be a list of 1-{limit} entries", field=key)
    if not 1 <= len(items) <= limit:
        raise InvalidRequest(
            f"a batch holds 1-{limit} entries, got {len(items)}", field=key, entries=len(items), max_entries=limit
        )
    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"{key}[{i}] must be a JSON object", field=f"{key}[{i}]")
        entry_id = item.get("id", str(i) if default_ids else None)
        if not isinstance(entry_id, str) or not _ENTRY_ID_RE.fullmatch(entry_id):
            raise InvalidRequest(
                f"{key}[{i}].id must be 1-80 characters of A-Z, a-z, 0-9, '-', '_', got {_short(entry_id)}",
                field=f"{key}[{i}].id",
            )
        if entry_id in seen:
            raise InvalidRequest(f"entry id {_short(entry_id)} is used more than once", field=f"{key}[{i}].id")
        seen.add(entry_id)
        out.append((entry_id, item))
    return out


def failed_entry(entry_id: str, exc: MQError) -> dict[str, Any]:
    """A ``failed`` item of a batch answer; sender_fault is true for 4xx errors a retry cannot fix."""
    return {
        "id": entry_id,
        "error": exc.code,
        "message": exc.message,
        "sender_fault": 400 <= exc.status < 500 and not exc.retriable,
    }


def parse_message_attributes(text: str | None) -> dict[str, str]:
    """The ``X-Message-Attributes`` header: a JSON object name -> string (SQS message attribute rules).

    Raises:
        InvalidAttribute: Not JSON, or any rule of ``check_message_attributes`` broken (400).
    """
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidAttribute("X-Message-Attributes must be a JSON object of name -> string", name=None) from None
    return check_message_attributes(obj)


def _received_json(message: ReceivedMessage) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "receipt_handle": message.receipt_handle,
        "body_base64": base64.b64encode(message.body).decode("ascii"),
        "content_type": message.content_type,
        "attributes": message.attributes,
        "sent_timestamp_ms": message.sent_ms,
        "receive_count": message.receive_count,
        "first_receive_timestamp_ms": message.first_receive_ms,
        "visibility_deadline_ms": message.deadline_ms,
    }


# -- queues ----------------------------------------------------------------


async def list_queues(request: web.Request) -> web.Response:
    """GET /?prefix=P -> 200 {"queues": [names]} (sorted; only names starting with P; SQS ListQueues)."""
    params = query_params(request, ("prefix",))
    prefix = params.get("prefix", "")
    if not _PREFIX_RE.fullmatch(prefix):
        raise InvalidRequest(
            "prefix must be 0-80 characters of A-Z, a-z, 0-9, '-' and '_' (a queue name prefix)", parameter="prefix"
        )
    return web.json_response({"queues": await request.app[BROKER].list_queues(prefix)})


async def get_queue(request: web.Request) -> web.Response:
    """GET /<queue> -> 200 {"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds",
    "created_ms", "attributes", "redrive"} or 404 (SQS GetQueueAttributes' approximate counts)."""
    queue = check_queue_name(request.match_info["queue"])
    return web.json_response(await request.app[BROKER].stats(queue))


async def put_queue(request: web.Request) -> web.Response:
    """PUT /<queue> [attributes JSON] -> 201 {"queue", "created", "attributes"} (idempotent, SQS CreateQueue).

    An empty body creates the queue with the defaults. 409 queue_name_exists if the queue
    exists and a given attribute differs from its explicit value; 400 invalid_attribute.
    """
    queue = check_queue_name(request.match_info["queue"])
    body = await read_json(request, required=False)
    if body is not None and not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object of queue attributes (or empty)")
    created, attrs = await request.app[BROKER].create_queue(queue, body)
    return web.json_response({"queue": queue, "created": created, "attributes": attrs.to_json()}, status=201)


async def delete_queue(request: web.Request) -> web.Response:
    """DELETE /<queue> -> 200 (the queue and every message in it) or 404."""
    queue = check_queue_name(request.match_info["queue"])
    await request.app[BROKER].delete_queue(queue)
    return web.json_response({"queue": queue, "deleted": True})


async def get_attributes(request: web.Request) -> web.Response:
    """GET /<queue>/attributes -> 200 {"queue", "attributes"} (effective: defaults filled in)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    attrs = await request.app[BROKER].get_attributes(queue)
    return web.json_response({"queue": queue, "attributes": attrs.to_json()})


async def put_attributes(request: web.Request) -> web.Response:
    """PUT /<queue>/attributes {key: value|null} -> 200 {"queue", "attributes"} (merge; SQS SetQueueAttributes)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object of queue attributes")
    attrs = await request.app[BROKER].set_attributes(queue, body)
    return web.json_response({"queue": queue, "attributes": attrs.to_json()})


async def purge_queue(request: web.Request) -> web.Response:
    """POST /<queue>/purge -> 200 {"queue", "purged": true, "removed": N} (SQS PurgeQueue)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    removed = await request.app[BROKER].purge(queue)
    return web.json_response({"queue": queue, "purged": True, "removed": removed})


# -- messages ----------------------------------------------------------------


async def send_message(request: web.Request) -> web.Response:
    """POST /<queue>/messages -> 201 + X-Message-Id once the message is durable (SQS SendMessage).

    Headers: Content-Type (stored), X-Delay-Seconds (0-900; default the queue's
    delay_seconds), X-Message-Attributes (JSON object name -> string). The body and
    the attributes together must fit the queue's max_message_bytes (413). A full
    queue answers 429 queue_full + Retry-After after capacity_wait_seconds.
    """
    queue = check_queue_name(request.match_info["queue"])
    broker = request.app[BROKER]
    state = await broker.queue_state(queue)
    attrs = state.attrs
    delay_text = request.headers.get("X-Delay-Seconds")
    delay = attrs.delay_seconds
    if delay_text is not None:
        value = int_param({"X-Delay-Seconds": delay_text.strip()}, "X-Delay-Seconds", 0, MAX_DELAY_SECONDS)
        delay = value if value is not None else delay
    message_attributes = parse_message_attributes(request.headers.get("X-Message-Attributes"))
    limit = attrs.max_message_bytes
    body = await read_body(request, limit)
    size = len(body) + attributes_size(message_attributes)
    if size > limit:
        raise MessageTooLarge(size, limit)
    content_type = request.headers.get("Content-Type")
    message_id = await broker.send(queue, body, content_type, message_attributes, delay * 1000)
    return web.Response(
        status=201,
        body=b'{"message_id": "%s"}' % message_id.encode(),
        content_type="application/json",
        headers={"X-Message-Id": message_id},
    )


_SEND_ENTRY_KEYS = ("id", "body", "body_base64", "content_type", "attributes", "delay_seconds")


def _send_entry(item: dict[str, Any], where: str, default_delay: int) -> SendEntry:
    """One entry of a batch send as a SendEntry (per-entry errors: InvalidRequest, InvalidAttribute)."""
    check_keys(item, _SEND_ENTRY_KEYS, where)
    if ("body" in item) == ("body_base64" in item):
        raise InvalidRequest(f"{where} needs exactly one of body and body_base64", field=where)
    if "body" in item:
        if not isinstance(item["body"], str):
            raise InvalidRequest(f"{where}.body must be a string (stored as UTF-8)", field=f"{where}.body")
        try:
            body = item["body"].encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"{where}.body is not valid Unicode (lone surrogate)", field=f"{where}.body") from None
    else:
        encoded = item["body_base64"]
        try:
            if not isinstance(encoded, str):
                raise TypeError
            body = base64.b64decode(encoded, validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise InvalidRequest(
                f"{where}.body_base64 must be a base64 string (RFC 4648, with padding)", field=f"{where}.body_base64"
            ) from None
    content_type = item.get("content_type")
    if content_type is not None and (not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type)):
        raise InvalidRequest(
            f"{where}.content_type must be 1-{MAX_CONTENT_TYPE_CHARS} printable ASCII characters",
            field=f"{where}.content_type",
        )
    attributes = check_message_attributes(item.get("attributes"))
    delay = int_field(item, "delay_seconds", 0, MAX_DELAY_SECONDS, f"{where}.")
    delay = default_delay if delay is None else delay
    return SendEntry(body, content_type, attributes or None, delay * 1000)


async def send_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/batch {"messages": [...]} -> 200 {"successful", "failed"} (SQS SendMessageBatch).

    Entries: {"id"?, "body" | "body_base64", "content_type"?, "attributes"?, "delay_seconds"?};
    1..--max-batch-messages of them, ids distinct. Valid entries are written with one group
    commit (Store.send_batch); each invalid one fails alone (sender_fault true). The sum of
    the bodies (and attributes) must fit max_message_bytes (413 for the whole request).
    """
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    broker = request.app[BROKER]
    state = await broker.queue_state(queue)
    attrs = state.attrs
    body = await read_json(request, broker.settings.batch_request_limit_bytes)
    entries = batch_entries(body, "messages", broker.settings.max_batch_messages, default_ids=True)
    failed: list[dict[str, Any]] = []
    valid: list[tuple[str, SendEntry]] = []
    for i, (entry_id, item) in enumerate(entries):
        try:
            valid.append((entry_id, _send_entry(item, f"messages[{i}]", attrs.delay_seconds)))
        except MQError as exc:
            failed.append(failed_entry(entry_id, exc))
    total = sum(len(e.body) + attributes_size(e.attributes or {}) for _, e in valid)
    if total > attrs.max_message_bytes:
        raise MessageTooLarge(total, attrs.max_message_bytes)
    successful: list[dict[str, Any]] = []
    if valid:
        results = await broker.send_batch(queue, [e for _, e in valid])
        for (entry_id, _), result in zip(valid, results, strict=True):
            if isinstance(result, MQError):
                failed.append(failed_entry(entry_id, result))
            else:
                successful.append({"id": entry_id, "message_id": result})
    return web.json_response({"successful": successful, "failed": failed})


_RECEIVE_PARAMS = ("max_messages", "wait_time_seconds", "visibility_timeout_seconds", "attempt_id")


async def receive_message(request: web.Request) -> web.Response:
    """GET /<queue>/messages -> one message raw (200, or 204 if none) or up to 10 as JSON (SQS ReceiveMessage).

    Query: max_messages (1-10; selects the JSON form), wait_time_seconds (0-20, long polling;
    default the queue's receive_wait_seconds), visibility_timeout_seconds (0-43200; default the
    queue's), attempt_id (1-128 printable ASCII, no space: SQS ReceiveRequestAttemptId).
    The raw form's headers: Content-Type, X-Message-Id, X-Receipt-Handle, X-Receive-Count,
    X-Sent-Timestamp, X-First-Receive-Timestamp, X-Visibility-Deadline (epoch ms),
    X-Message-Attributes (JSON, only if the message has attributes).
    """
    queue = check_queue_name(request.match_info["queue"])
    params = query_params(request, _RECEIVE_PARAMS)
    max_messages = int_param(params, "max_messages", 1, MAX_RECEIVE_MESSAGES)
    wait = int_param(params, "wait_time_seconds", 0, MAX_WAIT_SECONDS)
    visibility = int_param(params, "visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS)
    attempt_id = params.get("attempt_id")
    if attempt_id is not None and not _ATTEMPT_ID_RE.fullmatch(attempt_id):
        raise InvalidRequest(
            f"attempt_id must be 1-{MAX_ATTEMPT_ID_CHARS} printable ASCII characters without spaces",
            parameter="attempt_id",
        )
    messages = await request.app[BROKER].receive(queue, max_messages or 1, visibility, wait, attempt_id)
    if max_messages is not None:
        return web.json_response({"messages": [_received_json(m) for m in messages]})
    if not messages:
        return web.Response(status=204)
    message = messages[0]
    headers = {
        "Content-Type": message.content_type,
        "X-Message-Id": message.message_id,
        "X-Receive-Count": str(message.receive_count),
        "X-Sent-Timestamp": str(message.sent_ms),
        "X-Receipt-Handle": message.receipt_handle,
        "X-First-Receive-Timestamp": str(message.first_receive_ms),
        "X-Visibility-Deadline": str(message.deadline_ms),
    }
    if message.attributes:
        headers["X-Message-Attributes"] = json.dumps(message.attributes, separators=(",", ":"), ensure_ascii=True)
    return web.Response(body=message.body, headers=headers)


async def delete_message(request: web.Request) -> web.Response:
    """DELETE /<queue>/messages/<id>[?receipt_handle=H] -> 200 {"message_id", "deleted": true, "was"}.

    Without a handle: by id, wherever the message is (SoftLayer); 404 if nowhere; 400 bad id.
    With a handle (SQS DeleteMessage): only if H is the message's latest receive; 410
    stale_receipt_handle (the newer lease is untouched), 400 invalid_receipt_handle, 404.
    """
    queue = check_queue_name(request.match_info["queue"])
    message_id = check_message_id(request.match_info["message_id"])
    params = query_params(request, ("receipt_handle",))
    broker = request.app[BROKER]
    if "receipt_handle" in params:
        _, where = await broker.delete_by_handle(queue, params["receipt_handle"], message_id)
    else:
        where = await broker.delete(queue, message_id)
    return web.json_response({"message_id": message_id, "deleted": True, "was": where})


async def change_visibility(request: web.Request) -> web.Response:
    """POST /<queue>/messages/<id>/visibility {"receipt_handle", "visibility_timeout_seconds"}
    -> 200 {"message_id", "receipt_handle" (current), "visibility_deadline_ms"} (SQS ChangeMessageVisibility).

    The new timeout counts from now (0-43200 s; 0 = ready at once). 410 stale_receipt_handle,
    400 message_not_in_flight / invalid_receipt_handle / invalid_request, 404.
    """
    queue = check_queue_name(request.match_info["queue"])
    message_id = check_message_id(request.match_info["message_id"])
    query_params(request, ())
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object {"receipt_handle", "visibility_timeout_seconds"}')
    check_keys(body, ("receipt_handle", "visibility_timeout_seconds"), "the request")
    timeout = _required_timeout(body, "")
    _, handle, deadline = await request.app[BROKER].change_visibility(
        queue,
        body.get("receipt_handle"),
        timeout,
        message_id,  # type: ignore[arg-type]
    )
    return web.json_response({"message_id": message_id, "receipt_handle": handle, "visibility_deadline_ms": deadline})


def _required_timeout(obj: dict[str, Any], where: str) -> int:
    timeout = int_field(obj, "visibility_timeout_seconds", 0, MAX_VISIBILITY_TIMEOUT_SECONDS, where)
    if timeout is None:
        raise InvalidRequest(
            f"{where}visibility_timeout_seconds is required (0-{MAX_VISIBILITY_TIMEOUT_SECONDS})",
            field=f"{where}visibility_timeout_seconds",
        )
    return timeout


async def _run_entries(
    entries: list[tuple[str, dict[str, Any]]], op: Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]
) -> web.Response:
    """Run ``op`` on every entry concurrently (their fsyncs are group-committed); collect the batch answer."""

    async def one(i: int, entry_id: str, item: dict[str, Any]) -> dict[str, Any] | MQError:
        try:
            return await op(entry_id, item, f"entries[{i}]")
        except MQError as exc:
            return exc

    results = await asyncio.gather(*(one(i, entry_id, item) for i, (entry_id, item) in enumerate(entries)))
    successful: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for (entry_id, _), result in zip(entries, results, strict=True):
        if isinstance(result, MQError):
            failed.append(failed_entry(entry_id, result))
        else:
            successful.append(result)
    return web.json_response({"successful": successful, "failed": failed})


async def delete_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/delete {"entries": [{"id", "receipt_handle" | "message_id"}]} (1-10)
    -> 200 {"successful": [{"id"}], "failed": [...]} (SQS DeleteMessageBatch; by id as SoftLayer)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    broker = request.app[BROKER]
    entries = batch_entries(await read_json(request), "entries", MAX_HANDLE_BATCH, default_ids=False)
    await broker.queue_state(queue)

    async def op(entry_id: str, item: dict[str, Any], where: str) -> dict[str, Any]:
        check_keys(item, ("id", "receipt_handle", "message_id"), where)
        if ("receipt_handle" in item) == ("message_id" in item):
            raise InvalidRequest(f"{where} needs exactly one of receipt_handle and message_id", field=where)
        if "receipt_handle" in item:
            await broker.delete_by_handle(queue, item["receipt_handle"])
        else:
            await broker.delete(queue, check_message_id(item["message_id"]))
        return {"id": entry_id}

    return await _run_entries(entries, op)


async def visibility_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/visibility {"entries": [{"id", "receipt_handle", "visibility_timeout_seconds"}]}
    (1-10) -> 200 {"successful": [{"id", "receipt_handle", "visibility_deadline_ms"}], "failed": [...]}
    (SQS ChangeMessageVisibilityBatch)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    broker = request.app[BROKER]
    entries = batch_entries(await read_json(request), "entries", MAX_HANDLE_BATCH, default_ids=False)
    await broker.queue_state(queue)

    async def op(entry_id: str, item: dict[str, Any], where: str) -> dict[str, Any]:
        check_keys(item, ("id", "receipt_handle", "visibility_timeout_seconds"), where)
        timeout = _required_timeout(item, f"{where}.")
        _, handle, deadline = await broker.change_visibility(queue, item.get("receipt_handle"), timeout)  # type: ignore[arg-type]
        return {"id": entry_id, "receipt_handle": handle, "visibility_deadline_ms": deadline}

    return await _run_entries(entries, op)


# -- redrive -------------------------------------------------------------------


async def start_redrive(request: web.Request) -> web.Response:
    """POST /<dlq>/redrive {"destination"?, "max_messages_per_second"? (1-10000, default 500)}
    -> 202 {"task": status}; 409 redrive_in_progress; 404 (SQS StartMessageMoveTask)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    body = await read_json(request, required=False)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object {"destination"?, "max_messages_per_second"?} (or empty)')
    check_keys(body, ("destination", "max_messages_per_second"), "the request")
    rate = int_field(body, "max_messages_per_second", 1, MAX_REDRIVE_RATE, "")
    destination = body.get("destination")
    if destination is not None:
        destination = check_queue_name(destination)
    status = await request.app[BROKER].start_redrive(queue, destination, rate or DEFAULT_REDRIVE_RATE)
    return web.json_response({"task": status}, status=202)


async def get_redrive(request: web.Request) -> web.Response:
    """GET /<dlq>/redrive -> 200 {"task": status or null} ("running" not updated for 10 s shows "failed")."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    return web.json_response({"task": await request.app[BROKER].read_redrive(queue)})


async def cancel_redrive(request: web.Request) -> web.Response:
    """DELETE /<dlq>/redrive -> 200 {"task": status} (cancel requested); 404 redrive_not_running."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    return web.json_response({"task": await request.app[BROKER].cancel_redrive(queue)})


def make_app(broker: Broker) -> web.Application:
    """The aiohttp application for ``broker`` (routes, error middleware).

    ``client_max_size`` admits a full batch send (JSON, base64 bodies); every
    handler reads its body with its own, smaller limit (a single send: the
    queue's max_message_bytes).
    """
    app = web.Application(middlewares=[errors_middleware], client_max_size=broker.settings.batch_request_limit_bytes)
    app[BROKER] = broker
    router = app.router
    # aiohttp tries the resources under "/{queue}..." in registration order: the hot ones first.
    router.add_post("/{queue}/messages", send_message)
    router.add_get("/{queue}/messages", receive_message, allow_head=False)  # a HEAD must not consume a message
    router.add_delete("/{queue}/messages/{message_id}", delete_message)
    router.add_post("/{queue}/messages/batch", send_batch)
    router.add_post("/{queue}/messages/delete", delete_batch)
    router.add_post("/{queue}/messages/visibility", visibility_batch)
    router.add_post("/{queue}/messages/{message_id}/visibility", change_visibility)
    router.add_get("/", list_queues)
    router.add_get("/{queue}", get_queue)
    router.add_put("/{queue}", put_queue)
    router.add_delete("/{queue}", delete_queue)
    router.add_get("/{queue}/attributes", get_attributes)
    router.add_put("/{queue}/attributes", put_attributes)
    router.add_post("/{queue}/purge", purge_queue)
    router.add_post("/{queue}/redrive", start_redrive)
    router.add_get("/{queue}/redrive", get_redrive)
    router.add_delete("/{queue}/redrive", cancel_redrive)
    return app


async def serve(settings: Settings, *, shutdown_trigger: asyncio.Event | None = None) -> int:
    """Run the HTTP front end until ``shutdown_trigger`` is set (or SIGTERM/SIGINT when None).

    On stop, long polls and sends waiting for room answer at once, then the
    other in-flight requests finish (up to SHUTDOWN_TIMEOUT_SECONDS). A
    request whose client disconnects is cancelled (a long poll must not lease
    messages for a consumer that is gone).

    Returns:
        Exit code 0.
    """
    stop = shutdown_trigger or asyncio.Event()
    if shutdown_trigger is None:
        _runtime.install_stop_signals(stop)
    broker = Broker(settings)
    await broker.start()
    access_log = logging.getLogger("mq.access") if settings.access_log else None
    runner = web.AppRunner(make_app(broker), access_log=access_log, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, settings.address, settings.port, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await broker.close()
        raise ConfigError(f"cannot listen on {settings.address}:{settings.port}: {exc.strerror}") from exc
    host, port = runner.addresses[0][:2]
    logger.info("mq listening on http://%s:%d root=%s workers=%d", host, port, settings.root, settings.workers)
    _runtime.sd_notify("READY=1")
    await stop.wait()
    logger.info("stopping: finishing in-flight requests")
    await broker.begin_stop()
    await runner.cleanup()
    await broker.close()
    logger.info("stopped")
    return _runtime.EXIT_OK


@click.command(name="mq", context_settings={"help_option_names": ["-h", "--help"]})
@_runtime.config_option
@_runtime.root_option
@click.option(
    "--address",
    default="127.0.0.1",
    envvar="MQ_ADDRESS",
    show_envvar=True,
    show_default=True,
    help="Address to listen on.",
)
@click.option(
    "--port",
    type=int,
    default=8080,
    envvar="MQ_PORT",
    show_envvar=True,
    show_default=True,
    help="TCP port (0 = any free port).",
)
@click.option(
    "--workers",
    type=int,
    default=8,
    envvar="MQ_WORKERS",
    show_envvar=True,
    show_default=True,
    help="Worker pairs (one saver thread and one fetcher each).",
)
@click.option(
    "--peers",
    type=int,
    default=0,
    envvar="MQ_PEERS",
    show_envvar=True,
    show_default=True,
    help="Receive picks among the oldest PEERS+1 messages (0 = strict FIFO).",
)
@click.option(
    "--visibility-timeout",
    type=int,
    default=30,
    envvar="MQ_VISIBILITY_TIMEOUT",
    show_envvar=True,
    show_default=True,
    help="Default seconds a received message stays invisible (0-43200; a queue's attribute overrides it).",
)
@click.option(
    "--max-message-size",
    type=int,
    default=DEFAULT_MAX_MESSAGE_BYTES,
    envvar="MQ_MAX_MESSAGE_SIZE",
    show_envvar=True,
    show_default=True,
    help="Largest body in bytes (caps every queue's max_message_bytes).",
)
@click.option(
    "--max-batch-messages",
    type=int,
    default=DEFAULT_MAX_BATCH_MESSAGES,
    envvar="MQ_MAX_BATCH_MESSAGES",
    show_envvar=True,
    show_default=True,
    help="Most entries of a batch send (1-1000; SQS: 10).",
)
@click.option(
    "--rescan-interval",
    type=float,
    default=10.0,
    envvar="MQ_RESCAN_INTERVAL",
    show_envvar=True,
    show_default=True,
    help="Seconds between listings of active queues.",
)
@_runtime.log_level_option
@click.option(
    "--access-log/--no-access-log",
    default=False,
    envvar="MQ_ACCESS_LOG",
    show_envvar=True,
    show_default=True,
    help="Log one line per HTTP request (logger mq.access).",
)
@click.pass_context
def cli(ctx: click.Context, **values: Any) -> int:
    """mq: the HTTP front end of the queue."""
    _runtime.setup_logging(values["log_level"])
    _runtime.log_sources(ctx, values)
    settings = Settings(
        root=_runtime.check_root(values["root"]),
        address=values["address"],
        port=values["port"],
        workers=values["workers"],
        peers=values["peers"],
        visibility_timeout_seconds=values["visibility_timeout"],
        max_message_bytes=values["max_message_size"],
        max_batch_messages=values["max_batch_messages"],
        rescan_interval_seconds=values["rescan_interval"],
        log_level=values["log_level"],
        access_log=values["access_log"],
    )
    return _runtime.run(lambda: serve(settings))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mq`` console script; returns the exit code."""
    return _runtime.run_command(cli, argv, "mq")


if __name__ == "__main__":
    sys.exit(main())
