"""The ``mq`` daemon's knowledge of its queues: ready indexes, cached metadata, watches, rescans, wake-ups.

:class:`QueueStates` keeps, per queue, a :class:`QueueState` (ready index,
cached attributes and purge point, capacity reservations) on the queue's
:class:`Fetcher` (a lock and a thread that serialize its receives), kept fresh
by the daemon's own sends, inotify events and a periodic rescan; and the
long-poll and capacity notifications (:class:`Signal`): ``arrivals`` wakes
long polls, ``room`` wakes senders waiting under a capacity. Everything runs
on the event loop; listings and reads run on the fetcher or saver threads.
The operations themselves are :class:`daemons._broker.Broker`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from daemons._handoff import Handoff
from daemons._own import OwnNames
from daemons._settings import Settings
from daemons._turns import CheckTurns
from daemons._wakes import Wake
from mqcore.attributes import QueueAttributes, effective
from mqcore.errors import MQError, QueueNotFound
from mqcore.fsinfo import dir_stamp, mount_of, settled_dir_stamp
from mqcore.index import Listing, ReadyIndex, RescanDiff
from mqcore.names import ATTRIBUTES_FILE, PURGE_FILE, MessageId, QueueName
from mqcore.protocol import LeasePolicy, Store
from mqcore.service.receive import lease_policy
from mqcore.watch import ARRIVED, DIR_GONE, LEFT, OVERFLOW, DirWatcher, open_watcher

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

T = TypeVar("T")

#: Queue names whose fetcher is remembered (a cache of crc32 results; cleared when full).
MAX_CACHED_QUEUE_NAMES = 100_000
#: Seconds between the cheap change checks of indexed queues on a shared filesystem (docs/cluster.md).
CHANGE_CHECK_SECONDS = 0.05
#: Seconds inotify events of the queue directories gather before one read, while other processes keep changing
#: them (mq-mover's redeliveries, other daemons' and clients' sends, leases and deletes): one wake of the loop per
#: window instead of one per rename (this daemon's own leases are departures too). See :meth:`QueueStates.start`.
WATCH_WINDOW_SECONDS = 0.005
#: Seconds a rescan's comparison of a listing with the index (a saver) sleeps between chunks, so that the
#: threads coming back from system calls get the GIL at once (:meth:`mqcore.index.IndexSnapshot.compare`).
RESCAN_PAUSE_SECONDS = 0.002
#: Queues to list whatever their stamp (a periodic rescan's turn), or None.
Due = Callable[[QueueName], bool] | None
#: (explicit attributes, created_ms, purged_before) of a queue: one read of ``.attributes`` and one of ``.purge``.
Meta = tuple[dict[str, Any], int | None, MessageId | None]


@dataclass
class QueueState:
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


class Signal:
    """A one-shot notification that is re-armed after every firing (asyncio, loop thread only).

    Waiters take :meth:`event` *before* looking at the state they wait for, so
    a firing between the look and the wait is never missed. ``holders``
    counts the waiters between taking the event and giving up on it
    (:meth:`QueueStates.holding`), so the broker keeps a signal only while
    someone holds it.
    """

    __slots__ = ("_event", "holders")

    def __init__(self) -> None:
        self._event: Wake | None = None
        self.holders = 0

    def event(self) -> Wake:
        """The event the next :meth:`fire` sets (its timed wait does not cancel the waiter: daemons/_wakes.py)."""
        if self._event is None:
            self._event = Wake()
        return self._event

    def fire(self) -> None:
        """Wake every current waiter (costs nothing when nobody waits)."""
        if self._event is not None:
            self._event.set()
            self._event = None


class Fetcher:
    """One fetcher of a worker pair: a thread that runs the receives of its queues in order, and a lock.

    The thread is a :class:`daemons._handoff.Handoff` (receives handed over
    together are leased in one batch). The lock is held by what must not
    interleave with receives (a purge, a queue deletion, an attempt's retry);
    a receive waits for it before it pops names from the index.
    """

    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = asyncio.Lock()
        self.thread = Handoff(f"mq-fetcher-{number}")
        self.queues: dict[QueueName, QueueState] = {}


class QueueStates:
    """The indexes and cached metadata of the queues this daemon served, their watches and wake-ups.

    Args:
        settings: Daemon settings (root, workers, peers, rescan interval, queue defaults).
        store: The daemon's store.
        savers: The saver threads (metadata reads, change checks).
    """

    def __init__(self, settings: Settings, store: Store, savers: Executor) -> None:
        self.settings = settings
        self.defaults = settings.queue_defaults
        self.store = store
        self.savers = savers
        self.fetchers = [Fetcher(i) for i in range(settings.workers)]
        self._fetcher_of: dict[str, Fetcher] = {}
        self.watcher: DirWatcher | None = None
        #: Long polls waiting for a message, per queue.
        self.arrivals: dict[QueueName, Signal] = {}
        #: Senders waiting for room under a capacity, per queue.
        self.room: dict[QueueName, Signal] = {}
        self._loading: dict[QueueName, asyncio.Task[QueueState]] = {}
        #: Events (tag, name, kind) of queues being loaded, applied once their listing is in.
        self._early_events: dict[QueueName, list[tuple[str, str, int]]] = {}
        self._rescan_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        #: The filesystem of the root (None if /proc/mounts cannot tell).
        self.mount = mount_of(store.layout.root)
        #: Seconds between change checks of indexed queues' directories (0 = off; see :meth:`rescan_changed`).
        self.change_check_seconds = CHANGE_CHECK_SECONDS if self.mount is not None and self.mount.shared else 0.0
        self._stamps: dict[QueueName, tuple[int, int, int] | None] = {}
        #: Which queues each change check looks at (a shared filesystem).
        self.turns = CheckTurns(CHANGE_CHECK_SECONDS)
        #: The end of the current inotify window (None: the loop waits for the descriptor).
        self._window: asyncio.TimerHandle | None = None
        #: The ready names this daemon's sends publish into watched queues (daemons/_own.py).
        self.own = OwnNames()
        #: Queues whose ``GET /metrics`` row (daemons/_scrape.py) is current (a scrape read the indexed, watched
        #: queue); any inotify event of its directory, a changing rescan, an overflow or forgetting it takes it out.
        self.metrics_current: set[str] = set()
        self.unrepaired = 0  #: Inotify overflows not yet rescanned (:func:`_rescan_after_overflow`).

    @property
    def checked_stamps(self) -> Mapping[QueueName, tuple[int, int, int] | None]:
        """Queue -> its directory's stamp at its last listing (None: too recent to trust), unchanged at its last
        change check since (:meth:`check_tick`, a shared filesystem). Read-only; any thread."""
        return self._stamps

    def start(self) -> None:
        """Attach inotify to the loop and start the periodic rescan.

        The queue directories' events are read in windows: when the
        descriptor becomes readable the loop stops watching it and reads every
        event queued :data:`WATCH_WINDOW_SECONDS` later, then again every window
        while events keep coming, and watches the descriptor again once a window
        brought none (no wake while idle). Before, every rename woke the loop once,
        and most renames are this daemon's own leases (a departure each): about one
        wake, an ``ioctl`` and a ``read`` per message received (docs/performance.md,
        "Receive side: batches"). What this daemon does itself does not wait for a
        window: its sends index their own names at once, without a read (:meth:`note_ready`,
        daemons/_own.py), its changes of visibility read the events at once, as do a delete
        by id that has no lease to go by and a receive that finds the index empty (:meth:`catch_up`).
        """
        self.watcher = open_watcher()
        if self.watcher is not None:
            asyncio.get_running_loop().add_reader(self.watcher.fileno(), self._on_readable)
        self._rescan_task = asyncio.create_task(self.rescan_loop(), name="mq-rescan")

    def _on_readable(self) -> None:
        """The inotify descriptor became readable: read what it holds at the end of a window."""
        assert self.watcher is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.watcher.fileno())
        self._window = loop.call_later(WATCH_WINDOW_SECONDS, self._window_ended)

    def _window_ended(self) -> None:
        """End of a window: read the events; another window if there were any, else watch the descriptor."""
        self._window = None
        if self.watcher is None or self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        if self.on_watch_events():
            self._window = loop.call_later(WATCH_WINDOW_SECONDS, self._window_ended)
        else:
            loop.add_reader(self.watcher.fileno(), self._on_readable)

    def catch_up(self) -> bool:
        """Read the inotify events a window holds back (a receive found nothing ready); True if there were any."""
        return self._window is not None and self.on_watch_events()

    def wake_all(self) -> None:
        """Wake every waiting receive and send (mq stops: they look again and return)."""
        for signals in (self.arrivals, self.room):
            for signal in signals.values():
                signal.fire()

    async def close(self) -> None:
        """Stop the rescans, the watches and the fetcher threads."""
        self._stop.set()
        if self._rescan_task is not None:
            self._rescan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rescan_task
        if self._window is not None:
            self._window.cancel()
            self._window = None
        if self.watcher is not None:
            asyncio.get_running_loop().remove_reader(self.watcher.fileno())
            self.watcher.close()
        for fetcher in self.fetchers:
            fetcher.thread.shutdown(wait=True)

    def fetcher_for(self, queue: QueueName) -> Fetcher:
        """The fetcher that serves ``queue`` (crc32 of the name modulo the worker count)."""
        fetcher = self._fetcher_of.get(queue)
        if fetcher is None:
            if len(self._fetcher_of) >= MAX_CACHED_QUEUE_NAMES:
                self._fetcher_of.clear()
            fetcher = self._fetcher_of[queue] = self.fetchers[zlib.crc32(queue.encode()) % len(self.fetchers)]
        return fetcher

    async def _in(self, pool: Executor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    @contextlib.contextmanager
    def holding(self, signals: dict[QueueName, Signal], queue: QueueName) -> Iterator[Wake]:
        """The event the next firing of ``queue``'s signal in ``signals`` sets, held for the ``with`` block.

        Take it *before* looking at the state waited for. The signal stays
        in ``signals`` while someone holds it and the last holder drops it,
        so the maps hold only queues with waiters, never every queue ever
        used (and a firing with nobody waiting costs one dict lookup).
        """
        signal = signals.get(queue)
        if signal is None:
            signal = signals[queue] = Signal()
        signal.holders += 1
        try:
            yield signal.event()
        finally:
            signal.holders -= 1
            if signal.holders == 0 and signals.get(queue) is signal:
                del signals[queue]

    def fire(self, signals: dict[QueueName, Signal], queue: QueueName) -> None:
        signal = signals.get(queue)
        if signal is not None:
            signal.fire()

    # -- queue state: index and cached metadata ----------------------------

    def read_meta(self, queue: QueueName) -> tuple[dict[str, Any], int | None, MessageId | None]:
        """(explicit attributes, created_ms, purged_before) of ``queue``: one read of ``.attributes``, one of
        ``.purge`` (worker thread; QueueNotFound)."""
        explicit, created_ms = self.store.queue_settings(queue)
        return explicit, created_ms, self.store.purged_before(queue)

    def _list_names(self, queue: QueueName) -> tuple[list[str], Meta]:
        # Stamp first: a change during the listing changes the stamp again, and is listed next time.
        with contextlib.suppress(OSError):
            # A change right after an unsettled stamp may leave it equal: keep None, list again at the next check.
            stamp, settled = settled_dir_stamp(self.store.layout.queue_dir(queue))
            self._stamps[queue] = stamp if settled else None
        return self.store.list_queue_dir(queue), self.read_meta(queue)

    def _list_and_index(self, queue: QueueName) -> tuple[ReadyIndex, Meta]:
        """:meth:`_list_names` and the index built from the listing, all on the calling (fetcher) thread.

        With 1,000,000 ready messages the build takes about 2 s of CPU (loaded machine):
        off the event loop, other queues are served meanwhile (issue 12).
        """
        names, meta = self._list_names(queue)
        return ReadyIndex(Listing(names)), meta

    def apply_meta(
        self, queue: QueueName, state: QueueState, meta: tuple[dict[str, Any], int | None, MessageId | None]
    ) -> None:
        explicit, created_ms, purged_before = meta
        state.explicit = explicit
        state.attrs = effective(explicit, self.defaults)
        state.created_ms = created_ms
        state.purged_before = purged_before
        state.policy = lease_policy(state.attrs, purged_before)
        self.fire(self.room, queue)  # the capacity may have changed

    async def queue_state(self, queue: QueueName) -> QueueState:
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
                meta = await self._in(self.savers, self.read_meta, queue)
            except QueueNotFound:
                self.forget_queue(queue)
                raise
            except BaseException:
                state.meta_stale = True
                raise
            self.apply_meta(queue, state, meta)
        return state

    def _loaded(self, queue: QueueName, task: asyncio.Task[QueueState]) -> None:
        if self._loading.get(queue) is task:
            del self._loading[queue]
        if not task.cancelled():
            task.exception()  # retrieved here: the awaiting requests got it too

    async def _load_queue(self, fetcher: Fetcher, queue: QueueName) -> QueueState:
        qdir = self.store.layout.queue_dir(queue)
        watched = self.watcher.watch(qdir, queue) if self.watcher is not None else False
        early: list[tuple[str, str, int]] = []
        self._early_events[queue] = early
        try:
            index, meta = await fetcher.thread.run(self._list_and_index, queue)
        except BaseException:
            if self._early_events.get(queue) is early:
                del self._early_events[queue]
            if self.watcher is not None and fetcher.queues.get(queue) is None:
                self.watcher.unwatch(queue)
            raise
        if self._early_events.get(queue) is early:
            del self._early_events[queue]
        attrs = effective(meta[0], self.defaults)
        policy = lease_policy(attrs, meta[2])
        state = QueueState(index, watched, meta[0], attrs, meta[1], meta[2], policy)
        fetcher.queues[queue] = state
        for _, name, kind in early:
            self._apply_to_state(queue, state, name, kind)
        logger.info("indexed queue=%s ready=%d inotify=%s", queue, len(state.index), watched)
        return state

    def forget_queue(self, queue: QueueName) -> None:
        self.fetcher_for(queue).queues.pop(queue, None)
        self.metrics_current.discard(queue)
        self._stamps.pop(queue, None)
        self.turns.forget(queue)
        if self.watcher is not None:
            self.watcher.unwatch(queue)
        for signals in (self.arrivals, self.room):
            signal = signals.pop(queue, None)
            if signal is not None:
                signal.fire()  # waiters look again (and find the queue gone: 404)

    def on_watch_events(self) -> bool:
        """Apply every inotify event queued now (never blocks); True if there were any."""
        assert self.watcher is not None
        events = self.watcher.read_tagged()
        settled, discard = self.own.settled, self.metrics_current.discard
        for tag, name, kind in events:
            if kind == ARRIVED and settled(name):  # this daemon's own send, indexed at its answer: nothing but
                discard(tag)  # what any event of the queue does to its metrics row (as _apply_event)
            else:
                self._apply_event(tag, name, kind)
        return bool(events)

    def _apply_event(self, tag: str, name: str, kind: int) -> None:
        """One event of :meth:`mqcore.watch.DirWatcher.read_tagged` (``tag`` is the queue)."""
        if kind == OVERFLOW:
            self.metrics_current.clear()
            logger.warning("inotify queue overflowed, rescanning every indexed queue")
            _rescan_after_overflow(self)
            return
        self.metrics_current.discard(tag)
        queue = QueueName(tag)
        early = self._early_events.get(queue)
        if early is not None:
            early.append((tag, name, kind))
            return
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            self._apply_to_state(queue, state, name, kind)

    def _apply_to_state(self, queue: QueueName, state: QueueState, name: str, kind: int) -> None:
        """One inotify event of ``queue``'s directory. Names starting with "." are metadata, never messages."""
        if kind == DIR_GONE:
            self.forget_queue(queue)
            return
        if name.startswith("."):
            if kind == ARRIVED and name in (ATTRIBUTES_FILE, PURGE_FILE):
                state.meta_stale = True
                self.fire(self.room, queue)  # a waiting sender re-reads the capacity
            return
        if kind == ARRIVED:
            if self.own.arrived(name):
                try:
                    state.index.add(name)  # parses the name once: ValueError for any name that is not ID.RC
                except ValueError:
                    return  # not a message (a stray file)
                self.fire(self.arrivals, queue)
        elif kind == LEFT and state.index.discard(name):  # one parse of the name; most are this daemon's own leases
            self.fire(self.room, queue)

    def expect_ready(self, queue: QueueName, names: list[str]) -> None:
        """A saver is about to rename ``names`` into ``queue`` (any thread): mark them if the queue is watched."""
        watcher = self.watcher
        if watcher is not None and watcher.watching(queue):
            self.own.expect(names)

    def drop_ready(self, names: list[str]) -> None:
        """A saver's renames of ``names`` failed (any thread): no event comes for them."""
        self.own.drop(names)

    def note_ready(self, queue: QueueName, *names: str) -> None:
        """This daemon made ``names`` ready in ``queue`` (its renames are done): index them and wake long polls.

        On a queue watched by inotify, each name is indexed once, by this
        call or by its event, whichever the loop meets first (the savers
        marked it before its rename: daemons/_own.py), so that no name a
        receive leased in between comes back as a stale entry. Names not
        marked so (a change of visibility, a redrive, a FIFO send) are taken
        from the events the renames queued, read now (so a receive right
        after finds them).
        """
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None and self.watcher is not None and self.watcher.watching(queue):
            if not self.own.noted(names, state.index):
                self.on_watch_events()
        else:
            self.own.drop(names)  # marked while watched, maybe: its events will not come, or are not for an index
            if state is not None:
                state.index.update(names)
        self.fire(self.arrivals, queue)

    async def rescan_loop(self) -> None:
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
                    if self.change_check_seconds:
                        await self.relist_turn()
                    else:
                        await self.rescan_all(everything=False)
                    next_full = loop.time() + interval
                else:
                    await self.check_tick()
            except (MQError, OSError) as exc:  # OSError: e.g. ENOTCONN from a lost FUSE mount; retried next time
                logger.error("rescan failed error=%s", exc)

    async def rescan_all(self, *, everything: bool = True) -> None:
        """List every indexed queue again, re-read its metadata, and bring its index in line with the listing.

        With ``everything`` False (the periodic rescan on a local filesystem), a queue
        watched by inotify is listed only on its turn, one rescan in
        :data:`FULL_RESCAN_TURNS`: the kernel reports every entry added or
        removed (a lost event overflows the inotify queue, which lists every
        queue at once), and 10,000 idle queues listed and their metadata read
        every ``--rescan-interval`` slowed every receive, while one busy queue
        of 1,000,000 ready messages, whose directory changes all the time, was
        listed and compared with its index every ``--rescan-interval`` (about
        3 s of CPU each time, its receives waiting meanwhile; issue 12,
        docs/performance.md). A queue without a watch is also listed when its
        directory's change stamp (one ``stat``, as :meth:`rescan_changed`) is
        not the one of its last listing: any entry added or removed changes it.

        Names the index missed are added (long polls are woken). Names the
        index held before the listing started and the listing did not find
        are dropped (senders waiting for room are woken): another process
        took them, and without inotify (NFS across hosts, ``MQ_NO_INOTIFY``)
        nothing else would tell this daemon, whose ready count, oldest age
        and capacity check would stay inflated for ever. Names noted while
        the listing ran stay: they may have arrived after it read their part
        of the directory.
        """
        if everything:
            for fetcher in self.fetchers:
                for queue in list(fetcher.queues):
                    await self._rescan_queue(fetcher, queue)
            return
        await self.rescan_changed(self.turns.next_relist(), trust_watches=True)

    async def relist_turn(self) -> None:
        """Periodic rescan on a shared filesystem: list the queues whose turn it is (1 in :data:`FULL_RESCAN_TURNS`),
        changed or not, under the change checks (listing all took longer than a rescan interval at 10,000 queues)."""
        due = self.turns.next_relist()
        queues = [(fetcher, queue, False) for fetcher in self.fetchers for queue in list(fetcher.queues) if due(queue)]
        await self._check(queues, lambda _queue: True)

    async def rescan_changed(
        self, due: Callable[[QueueName], bool] | None = None, *, trust_watches: bool = False
    ) -> None:
        """Rescan (as :meth:`rescan_all`) only the indexed queues whose directory changed since its last listing.

        On a shared filesystem inotify misses other hosts' sends, leases and
        deletes; a ``stat`` of a queue's directory finds them (its mtime changes
        with every entry added or removed, docs/protocol.md section 13). The
        change checks every ``CHANGE_CHECK_SECONDS`` take a bounded number of
        those at each tick (:meth:`check_tick`); this method checks every
        indexed queue at once (the periodic rescan on a local filesystem).

        Args:
            due: Queues to list whatever their stamp (the periodic rescan's
                turn, :meth:`rescan_all`); None: none.
            trust_watches: A queue watched by inotify is listed only when
                ``due`` (a local filesystem: the kernel reports its changes).
        """
        watcher = self.watcher if trust_watches else None
        watched = watcher.watching if watcher is not None else lambda _queue: False
        await self._check([(f, queue, watched(queue)) for f in self.fetchers for queue in list(f.queues)], due)

    async def check_tick(self) -> None:
        """One change check on a shared filesystem (every ``CHANGE_CHECK_SECONDS``): :meth:`rescan_changed` of
        the indexed queues :class:`daemons._turns.CheckTurns` picks, a bounded number whatever the number of
        queues (docs/api.md, "Long polling", states the resulting delays)."""
        now = asyncio.get_running_loop().time()
        picked = self.turns.pick(
            now, [*self.arrivals, *self.room], lambda: [q for fetcher in self.fetchers for q in fetcher.queues]
        )
        await self._check([(f, q, False) for q in picked if q in (f := self.fetcher_for(q)).queues], None, hot=now)

    async def _check(self, indexed: list[tuple[Fetcher, QueueName, bool]], due: Due, *, hot: float = 0.0) -> int:
        """Rescan those of ``indexed`` (fetcher, queue, trust its watch) that are ``due`` or whose directory stamp
        changed (how many: returned); with ``hot`` (the loop time, > 0), note the latter as changed then."""
        if not indexed:
            return 0

        def changed() -> list[int]:
            out = []
            for i, (_, queue, watched) in enumerate(indexed):
                if due is not None and due(queue):
                    out.append(i)
                    continue
                if watched:
                    continue
                try:
                    stamp = dir_stamp(self.store.layout.queue_dir(queue))
                except OSError:
                    out.append(i)  # gone or unreadable: the rescan finds out which
                    continue
                if self._stamps.get(queue) != stamp:
                    out.append(i)
            return out

        for i in (rescanned := await self._in(self.savers, changed)):
            fetcher, queue, _ = indexed[i]
            if hot:
                self.turns.changed(queue, hot)
            await self._rescan_queue(fetcher, queue)
        return len(rescanned)

    async def _rescan_queue(self, fetcher: Fetcher, queue: QueueName) -> None:
        listed = fetcher.queues.get(queue)
        if listed is None:
            return
        snapshot = listed.index.snapshot()

        def list_and_compare() -> tuple[list[str], RescanDiff, Meta]:
            names, meta = self._list_names(queue)
            return names, snapshot.compare(names, pause=_pause_for_the_gil), meta

        try:
            # On a saver, not the queue's fetcher: its receives go on meanwhile, and the loop applies only the
            # differences (a 1,000,000-message queue stalled every request for ~2 s per rescan; issue 12).
            names, diff, meta = await self._in(self.savers, list_and_compare)
        except QueueNotFound:
            self.forget_queue(queue)
            return
        state = fetcher.queues.get(queue)
        if state is None:
            return
        self.apply_meta(queue, state, meta)
        before = len(state.index)
        if state is listed:
            gone = state.index.apply_rescan(diff)
            before -= len(gone)
        else:  # loaded again meanwhile: note what was listed
            gone = []
            state.index.update(Listing(names))
        if gone or len(state.index) > before:
            self.metrics_current.discard(queue)
        if gone:
            logger.info("rescan dropped queue=%s gone=%d", queue, len(gone))
            self.fire(self.room, queue)
        if len(state.index) > before:
            logger.info("rescan found queue=%s new=%d", queue, len(state.index) - before)
            self.fire(self.arrivals, queue)


async def recheck(states: QueueStates, queue: QueueName) -> bool:
    """A receive found ``queue`` empty (or ``GET /{queue}`` counts it) on a shared filesystem: check its stamp now,
    unless a check did less than a tick ago, and rescan it if it changed. True if it was rescanned.

    The ticks check a queue nobody waits on only every :data:`daemons._turns.QUIET_CHECK_SECONDS` once its
    checks find nothing; this check makes a short poll find another host's send as soon as a long poll would
    (one ``stat``, docs/cluster.md). At most one a tick per queue: a tight poll loop costs no more ``stat`` s
    than a long poll's ticks. (A function, not a method: QueueStates is at its size limit.)
    """
    now = asyncio.get_running_loop().time()
    fetcher = states.fetcher_for(queue)
    if not states.change_check_seconds or queue not in fetcher.queues or states.turns.checked_within(queue, now):
        return False
    states.turns.checking(queue, now)
    return await states._check([(fetcher, queue, False)], None, hot=now) > 0


def _rescan_after_overflow(states: QueueStates) -> None:
    """Start :meth:`QueueStates.rescan_all` after an inotify overflow, counted in ``states.unrepaired`` until it ends.

    While that is above 0 an index may lack ready names whose events were lost, so a FIFO receive's step 4
    (docs/protocol.md 19.3, :mod:`daemons._fifo_order`) trusts no index.
    """

    def repaired(_task: asyncio.Task[None]) -> None:
        states.unrepaired -= 1

    states.unrepaired += 1
    asyncio.get_running_loop().create_task(states.rescan_all()).add_done_callback(repaired)


def _pause_for_the_gil() -> None:
    """Let the other threads of mq have the GIL for a moment (between chunks of a rescan's comparison)."""
    time.sleep(RESCAN_PAUSE_SECONDS)
