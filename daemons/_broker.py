"""The state of the ``mq`` daemon: the store, the worker pairs, the ready indexes, the watches, the waiters.

:class:`Broker` is what the HTTP handlers (``daemons/_http.py``) call: one
method per operation of ``docs/api.md``, each on the event loop, its blocking
file calls on a saver thread or on the queue's fetcher thread. Per queue it
keeps a :class:`_QueueState` (ready index, cached attributes and purge point,
capacity reservations) on the queue's :class:`Fetcher`, kept fresh by its own
sends, inotify events and a periodic rescan; the long-poll and capacity
notifications (:class:`_Signal`); and the leases and receipt handles it made.
It owns the :class:`daemons._redrive.RedriveRunner` of its redrive tasks and
does the moves they ask for under the fetcher lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from daemons import _runtime
from daemons._health import Health
from daemons._metrics import BrokerMetrics
from daemons._redrive import RedriveRunner
from daemons._settings import Settings
from mqcore.attributes import QueueAttributes, effective
from mqcore.errors import InvalidReceiptHandle, MQError, QueueFull, QueueNotFound, ServerBusy
from mqcore.fsinfo import dir_stamp, mount_of
from mqcore.index import ReadyIndex
from mqcore.model import ReceivedMessage
from mqcore.names import (
    ATTRIBUTES_FILE,
    PURGE_FILE,
    InFlightName,
    MessageId,
    QueueName,
    parse_in_flight_name,
    parse_ready_name,
    parse_receipt_handle,
    ready_name,
    sent_ms_of,
)
from mqcore.protocol import LeasePolicy, PeekedFile, PendingMessage, SendEntry, Store, now_ms
from mqcore.redrive import present_redrive_status
from mqcore.watch import DirEvent, DirWatcher, open_watcher

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

T = TypeVar("T")

#: How many of this process's leases (and receipt handles) are remembered to make deletes cheap.
MAX_REMEMBERED_LEASES = 100_000
#: Queue names whose fetcher is remembered (a cache of crc32 results; cleared when full).
MAX_CACHED_QUEUE_NAMES = 100_000
#: Seconds between the cheap change checks of indexed queues on a shared filesystem (docs/cluster.md).
CHANGE_CHECK_SECONDS = 0.05
#: A directory mtime this close to now (ns, either way: hosts' clocks differ) may hide a later change in the same tick.
RECENT_CHANGE_NS = 200_000_000


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
    a firing between the look and the wait is never missed. ``holders``
    counts the waiters between taking the event and giving up on it
    (:meth:`Broker._holding`), so the broker keeps a signal only while
    someone holds it.
    """

    __slots__ = ("_event", "holders")

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self.holders = 0

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
        self.redrives = RedriveRunner(self)
        self._fetcher_of: dict[str, Fetcher] = {}
        self.watcher: DirWatcher | None = None
        self.stopping = False
        self._arrivals: dict[QueueName, _Signal] = {}
        self._room: dict[QueueName, _Signal] = {}
        self._loading: dict[QueueName, asyncio.Task[_QueueState]] = {}
        self._early_events: dict[QueueName, list[DirEvent]] = {}
        self._attempt_locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._rescan_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        #: Requests and connections refused to protect mq, by reason (connections, body_timeout,
        #: waiters, unauthorized, forbidden): what /metrics can export (docs/security.md).
        self.refusals: Counter[str] = Counter()
        self.metrics = BrokerMetrics(self)
        self.counts = self.metrics.counts
        self.health = Health(settings.root, settings.min_free_bytes)
        #: The filesystem of the root (None if /proc/mounts cannot tell).
        self.mount = mount_of(self.store.layout.root)
        #: Seconds between change checks of indexed queues' directories (0 = off; see :meth:`rescan_changed`).
        self.change_check_seconds = CHANGE_CHECK_SECONDS if self.mount is not None and self.mount.shared else 0.0
        self._stamps: dict[QueueName, tuple[int, int, int] | None] = {}

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
        await self.redrives.stop_all()

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
        self.health.close()

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

    @contextlib.contextmanager
    def _holding(self, signals: dict[QueueName, _Signal], queue: QueueName) -> Iterator[asyncio.Event]:
        """The event the next firing of ``queue``'s signal in ``signals`` sets, held for the ``with`` block.

        Take it *before* looking at the state waited for. The signal stays
        in ``signals`` while someone holds it and the last holder drops it,
        so the maps hold only queues with waiters, never every queue ever
        used (and a firing with nobody waiting costs one dict lookup).
        """
        signal = signals.get(queue)
        if signal is None:
            signal = signals[queue] = _Signal()
        signal.holders += 1
        try:
            yield signal.event()
        finally:
            signal.holders -= 1
            if signal.holders == 0 and signals.get(queue) is signal:
                del signals[queue]

    def _fire(self, signals: dict[QueueName, _Signal], queue: QueueName) -> None:
        signal = signals.get(queue)
        if signal is not None:
            signal.fire()

    # -- queue state: index and cached metadata ----------------------------

    def _read_meta(self, queue: QueueName) -> tuple[dict[str, Any], int | None, MessageId | None]:
        """(explicit attributes, created_ms, purged_before) of ``queue``: one read of ``.attributes``, one of
        ``.purge`` (worker thread; QueueNotFound)."""
        explicit, created_ms = self.store.queue_settings(queue)
        return explicit, created_ms, self.store.purged_before(queue)

    def _list_and_read(self, queue: QueueName) -> tuple[list[str], tuple[dict[str, Any], int | None, MessageId | None]]:
        if self.change_check_seconds:
            # Stamp first: a change during the listing changes the stamp again, and is listed next time.
            with contextlib.suppress(OSError):
                stamp = dir_stamp(self.store.layout.queue_dir(queue))
                # A directory's mtime has the granularity of the kernel's coarse clock (a few ms): a change right
                # after this stamp may leave it equal. While the mtime is recent, list again at the next check.
                recent = abs(time.time_ns() - stamp[1]) < RECENT_CHANGE_NS
                self._stamps[queue] = None if recent else stamp
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
        state.policy = LeasePolicy.for_queue(state.attrs, purged_before)
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
        policy = LeasePolicy.for_queue(attrs, meta[2])
        state = _QueueState(ReadyIndex(names), watched, meta[0], attrs, meta[1], meta[2], policy)
        fetcher.queues[queue] = state
        for event in early:
            self._apply_to_state(queue, state, event)
        logger.info("indexed queue=%s ready=%d inotify=%s", queue, len(state.index), watched)
        return state

    def _forget_queue(self, queue: QueueName) -> None:
        self.fetcher_for(queue).queues.pop(queue, None)
        self._stamps.pop(queue, None)
        if self.watcher is not None:
            self.watcher.unwatch(queue)
        for signals in (self._arrivals, self._room):
            signal = signals.pop(queue, None)
            if signal is not None:
                signal.fire()  # waiters look again (and find the queue gone: 404)

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

    def _note_ready(self, queue: QueueName, *names: str) -> None:
        """This daemon made ``names`` ready in ``queue`` (its renames are done): index them and wake long polls.

        On a queue watched by inotify, the names are taken from the events
        the renames queued, read now (so a receive right after finds them).
        Adding them here as well could bring back a name that a long poll,
        woken by such an event before this call, has already leased: a
        stale entry counted as ready (and against the capacity) until a
        receive or a rescan dropped it.
        """
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            if self.watcher is not None and self.watcher.watching(queue):
                self._on_watch_events()
            else:
                state.index.update(names)
        self._fire(self._arrivals, queue)

    async def _rescan_loop(self) -> None:
        interval = self.settings.rescan_interval_seconds
        loop = asyncio.get_running_loop()
        next_full = loop.time() + interval
        while not self._stop.is_set():
            timeout = next_full - loop.time()
            if self.change_check_seconds:
                timeout = min(timeout, self.change_check_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=max(timeout, 0))
            if self._stop.is_set():
                break
            try:
                if loop.time() >= next_full:
                    await self.rescan_all()
                    next_full = loop.time() + interval
                else:
                    await self.rescan_changed()
            except (MQError, OSError) as exc:  # OSError: e.g. ENOTCONN from a lost FUSE mount; retried next time
                logger.error("rescan failed error=%s", exc)

    async def rescan_all(self) -> None:
        """List every indexed queue again, re-read its metadata, and bring its index in line with the listing.

        Names the index missed are added (long polls are woken). Names the
        index held before the listing started and the listing did not find
        are dropped (senders waiting for room are woken): another process
        took them, and without inotify (NFS across hosts, ``MQ_NO_INOTIFY``)
        nothing else would tell this daemon, whose ready count, oldest age
        and capacity check would stay inflated for ever. Names noted while
        the listing ran stay: they may have arrived after it read their part
        of the directory.
        """
        for fetcher in self.fetchers:
            for queue in list(fetcher.queues):
                await self._rescan_queue(fetcher, queue)

    async def rescan_changed(self) -> None:
        """Rescan (as :meth:`rescan_all`) only the indexed queues whose directory changed since its last listing.

        On a shared filesystem inotify misses other hosts' sends, leases and
        deletes; one ``stat`` per indexed queue every ``CHANGE_CHECK_SECONDS``
        finds them (the directory's mtime changes with every entry added or
        removed, docs/protocol.md section 13), so a message sent through
        another host is delivered here within about that interval plus the
        filesystem's attribute delay, instead of a ``--rescan-interval``.
        """
        indexed = [(fetcher, queue) for fetcher in self.fetchers for queue in list(fetcher.queues)]
        if not indexed:
            return

        def changed() -> list[int]:
            out = []
            for i, (_, queue) in enumerate(indexed):
                try:
                    stamp = dir_stamp(self.store.layout.queue_dir(queue))
                except OSError:
                    out.append(i)  # gone or unreadable: the rescan finds out which
                    continue
                if self._stamps.get(queue) != stamp:
                    out.append(i)
            return out

        for i in await self._in(self.savers, changed):
            await self._rescan_queue(*indexed[i])

    async def _rescan_queue(self, fetcher: Fetcher, queue: QueueName) -> None:
        listed = fetcher.queues.get(queue)
        if listed is None:
            return
        mark = listed.index.mark()
        try:
            names, meta = await self._in(fetcher.thread, self._list_and_read, queue)
        except QueueNotFound:
            self._forget_queue(queue)
            return
        state = fetcher.queues.get(queue)
        if state is None:
            return
        self._apply_meta(queue, state, meta)
        gone = state.index.drop_unlisted(mark, names) if state is listed else []
        before = len(state.index)
        state.index.update(names)
        if gone:
            logger.info("rescan dropped queue=%s gone=%d", queue, len(gone))
            self._fire(self._room, queue)
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
        self.redrives.stop(queue)
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

    async def peek(
        self, queue: QueueName, after: MessageId | None, limit: int, partition: tuple[int, int] | None = None
    ) -> tuple[list[PeekedFile], MessageId | None]:
        """A page of the queue's messages read without receiving them (:meth:`mqcore.protocol.Store.peek`).

        Runs on a saver thread, not the queue's fetcher: a large page never
        holds up receives.

        Raises:
            QueueNotFound: No such queue.
        """
        return await self._in(self.savers, lambda: self.store.peek(queue, after, limit, partition=partition))

    async def peek_ids(self, queue: QueueName, message_ids: list[str]) -> list[PeekedFile]:
        """The given messages read without receiving them (:meth:`mqcore.protocol.Store.peek_ids`).

        Raises:
            QueueNotFound: No such queue.
        """
        return await self._in(self.savers, self.store.peek_ids, queue, message_ids)

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
        self.counts.add("purged", queue, removed)
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
            with self._holding(self._room, queue) as room_made:
                await _runtime.wait_for_wake(room_made, remaining)
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
        attribute_types: dict[str, str] | None = None,
    ) -> MessageId:
        """Store a message durably (fsynced) and index it; return its id (SQS SendMessage).

        Args:
            queue: The queue.
            body: Body bytes (size checked by the caller).
            content_type: Stored Content-Type, or None.
            attributes: Checked user attributes, or None.
            delay_ms: Invisible for this long (0-900,000 ms); held in ``delay/`` meanwhile.
            attribute_types: SQS DataType of attributes that are not plain ``String``, or None.
        Raises:
            QueueNotFound: No such queue.
            QueueFull: The queue stayed at capacity for capacity_wait_seconds (429; never for a delayed send).
            StorageUnavailable: It could not be guaranteed stored (503).
            InsufficientStorage: Free space is below ``--min-free-bytes`` (507).
        """
        self.health.check_send()
        state = await self.queue_state(queue)
        admitted = 0
        if delay_ms == 0:  # a delayed message is not ready: capacity never holds or refuses it
            state, admitted = await self._reserve(queue, state, 1)
            if not admitted:
                self.counts.add("capacity_rejected", queue)
                raise self._queue_full(queue, state)
        try:
            message_id = await self._in(
                self.savers,
                lambda: self.store.send(queue, body, content_type, attributes or None, delay_ms, attribute_types),
            )
            if delay_ms == 0:
                self._note_ready(queue, ready_name(message_id, 0))
        finally:
            state.sending -= admitted
        self.counts.add("sent", queue)
        return message_id

    async def send_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Send several messages with one group commit (SQS SendMessageBatch); a result per entry, in order.

        Of the entries without a delay, those that do not fit under the
        queue's capacity (after waiting up to capacity_wait_seconds for any
        room) get QueueFull, the first ones in entry order being sent. Delayed
        entries are never held or refused: capacity counts ready messages only.

        Raises:
            QueueNotFound: No such queue.
            InsufficientStorage: Free space is below ``--min-free-bytes`` (507; nothing sent).
        """
        self.health.check_send()
        state = await self.queue_state(queue)
        immediate = [i for i, entry in enumerate(entries) if entry.delay_ms == 0]
        admitted = 0
        if immediate:
            state, admitted = await self._reserve(queue, state, len(immediate))
        refused = set(immediate[admitted:])
        chosen = [i for i in range(len(entries)) if i not in refused]
        stored: list[MessageId | MQError] = []
        try:
            if chosen:
                stored = await self._store_batch(queue, [entries[i] for i in chosen])
                ready = [
                    ready_name(result, 0)
                    for i, result in zip(chosen, stored, strict=True)
                    if isinstance(result, str) and entries[i].delay_ms == 0
                ]
                self._note_ready(queue, *ready)
        finally:
            state.sending -= admitted
        by_entry = dict(zip(chosen, stored, strict=True))
        self.counts.add("sent", queue, sum(isinstance(result, str) for result in stored))
        self.counts.add("capacity_rejected", queue, len(refused))
        full = self._queue_full(queue, state)
        return [by_entry.get(i, full) for i in range(len(entries))]

    async def _store_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Write a batch's files on several saver threads at once, then publish them with one directory fsync.

        The ids are taken first, in entry order, so the batch keeps its order
        (FIFO) whichever write finishes first; each write fsyncs its own file
        and the writes' fsyncs overlap. ``Store.publish_many`` then renames
        them all and fsyncs each target directory once (group commit).

        Raises:
            QueueNotFound: No such queue (nothing is written).
        """
        if not await self._in(self.savers, self.store.queue_exists, queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        ids = [self.store.ids.next_id() for _ in entries]
        loop = asyncio.get_running_loop()
        writes = await asyncio.gather(
            *(
                loop.run_in_executor(
                    self.savers,
                    functools.partial(self.store.write_new, queue, e.body, e.content_type, e.attributes, message_id),
                )
                for e, message_id in zip(entries, ids, strict=True)
            ),
            return_exceptions=True,
        )
        results: list[MessageId | MQError] = []
        written: list[tuple[int, PendingMessage, int]] = []
        for i, (entry, outcome) in enumerate(zip(entries, writes, strict=True)):
            if isinstance(outcome, MQError):
                results.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results.append(outcome.message_id)
                written.append((i, outcome, entry.delay_ms))
        published = await self._in(self.savers, self.store.publish_many, [(p, d) for _, p, d in written])
        for (i, _, _), error in zip(written, published, strict=True):
            if error is not None:
                results[i] = error
        return results

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
        self,
        queue: QueueName,
        wanted: int,
        visibility_timeout_ms: int,
        check_exists: bool,
        partition: tuple[int, int] | None = None,
    ) -> list[ReceivedMessage]:
        """Lease up to ``wanted`` ready messages, oldest first, in as few fetcher round trips as possible.

        An answer holds each message at most once. A message leased by an
        earlier round trip of this call can be ready again before the next
        one (visibility timeout 0: mq-mover redelivers it and inotify
        indexes it); its new name is set aside and put back in the index,
        not leased again, so the handle this call returns stays the
        message's latest.

        With ``partition`` = ``(i, M)`` only messages of partition ``i`` of ``M``
        are leased (SMQ's batches; strict FIFO within the partition, no peer fuzz).

        Raises:
            QueueNotFound: Nothing was ready and (``check_exists``) the queue does not exist.
            StorageUnavailable: A lease failed and nothing was leased.
        """
        fetcher = self.fetcher_for(queue)
        out: dict[str, ReceivedMessage] = {}
        async with fetcher.lock:
            state = await self.queue_state(queue)
            popped = False
            held: list[str] = []
            while len(out) < wanted:
                names = []
                while len(names) < wanted - len(out):
                    name = (
                        state.index.pop_fuzzed(self.settings.peers)
                        if partition is None
                        else state.index.pop_oldest_in(*partition)
                    )
                    if name is None:
                        break
                    (held if name.partition(".")[0] in out else names).append(name)
                if not names:
                    break
                popped = True
                leased, error, untried = await self._in(
                    fetcher.thread, self._lease_names, queue, names, visibility_timeout_ms, state.policy
                )
                state.index.update(untried)
                for message in leased:
                    out[message.message_id] = message
                if error is not None:
                    if not out:
                        raise error
                    logger.error("receive stopped early queue=%s error=%s", queue, error)
                    break
            state.index.update(held)
            if popped:
                self._fire(self._room, queue)
            if not out and check_exists and not await self._in(fetcher.thread, self.store.queue_exists, queue):
                self._forget_queue(queue)
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        for message in out.values():
            self._remember(message)
        self.counts.add("received", queue, len(out))
        return list(out.values())

    async def _receive_waiting(
        self,
        queue: QueueName,
        wanted: int,
        visibility_timeout_ms: int,
        wait_seconds: float,
        partition: tuple[int, int] | None = None,
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
            with self._holding(self._arrivals, queue) as arrival:
                messages = await self._lease_some(queue, wanted, visibility_timeout_ms, check_exists, partition)
                remaining = deadline - loop.time()
                if messages or self.stopping or remaining <= 0:
                    return messages
                if self._arrivals[queue].holders > self.settings.max_waiters:
                    self.refusals["waiters"] += 1
                    raise ServerBusy(
                        f"more than {self.settings.max_waiters} long polls wait on queue {queue} (--max-waiters)",
                        queue=queue,
                    )
                woken = await _runtime.wait_for_wake(arrival, remaining)
            check_exists = not woken or self.stopping

    async def receive(
        self,
        queue: QueueName,
        max_messages: int = 1,
        visibility_timeout_seconds: int | None = None,
        wait_seconds: int | None = None,
        attempt_id: str | None = None,
        partition: tuple[int, int] | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages`` (1-10) messages (SQS ReceiveMessage); [] if none became ready.

        Args:
            queue: The queue.
            max_messages: 1-10.
            visibility_timeout_seconds: 0-43,200; None = the queue's visibility_timeout_seconds.
            wait_seconds: Long-polling wait, 0-20 s; None = the queue's receive_wait_seconds.
            attempt_id: SQS ReceiveRequestAttemptId: if a receive with it returned messages within
                the last 5 minutes, those messages are received again (fresh handles) instead of new ones.
            partition: ``(i, M)``: only messages of partition ``i`` of ``M`` (SMQ's batches;
                :func:`mqcore.names.partition_of`), None = any message.
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
            return await self._receive_waiting(queue, max_messages, vt_ms, wait, partition)
        async with self._attempt_lock(queue, attempt_id):
            record = await self._in(self.savers, self.store.load_attempt_record, queue, attempt_id)
            handles, created_ms = record if record is not None else (None, None)
            rest: list[str] = []
            if handles is not None:
                # At most max_messages are received again; the others stay recorded for a later retry.
                handles, rest = handles[:max_messages], handles[max_messages:]
                messages = await self._relet(queue, handles, vt_ms)
                logger.info("receive attempt retried queue=%s handles=%d relet=%d", queue, len(handles), len(messages))
            else:
                messages = await self._receive_waiting(queue, max_messages, vt_ms, wait, partition)
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
            hints = {h: lease.current for h in handles if (lease := self.handles.get(h))}

            def relet_all() -> list[ReceivedMessage]:
                # One listing of delay/ at most for the handles this daemon has no hint for
                # (a retry sent to another daemon), not one per handle.
                current = self.store.find_leases(queue, handles, hints)
                out = []
                for handle in handles:
                    try:
                        message = self.store.relet(
                            queue,
                            handle,
                            visibility_timeout_ms,
                            policy=state.policy,
                            hint=current.get(handle),
                            search=False,
                        )
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
        self.counts.add("received", queue, len(messages))
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
        self.counts.add("deleted", queue)
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
        self.counts.add("deleted", queue)
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

    # -- redrive: the moves of a task (daemons/_redrive.py), under the fetcher lock ----------

    def _redrive_names(
        self, source: QueueName, names: list[str], destination: QueueName | None
    ) -> list[tuple[str, tuple[QueueName, str] | None, bool]]:
        """Fetcher thread: redrive each name.

        Returns:
            Per name: (name, (destination, its new ready name there) or None, still in the
            dead-letter queue).
        """
        out = []
        qdir = self.store.layout.queue_dir(source)
        for name in names:
            moved = self.store.redrive_one(source, name, destination)
            out.append((name, moved, moved is None and os.path.lexists(os.path.join(qdir, name))))
        return out

    async def redrive_step(
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
        for name, target, stays in results:
            if target is not None:
                moved += 1
                self._note_ready(*target)
            elif stays:
                newly_skipped += 1
                skipped.add(name)
                state.index.add(name)
        self._fire(self._room, source)
        return len(names), moved, newly_skipped

    async def redrive_done(self, source: QueueName, skipped: set[str]) -> bool:
        """True if a fresh listing finds no ready message left (other than skipped ones)."""
        fetcher = self.fetcher_for(source)
        names = await self._in(fetcher.thread, self.store.scan_ready, source)
        left = [n for n in names if n not in skipped]
        if not left:
            return True
        state = await self.queue_state(source)
        state.index.update(left)
        return False
