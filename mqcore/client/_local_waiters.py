"""Brokerless waits: inotify waiters, and the calls that wait written once as operations.

A brokerless long poll or capacity wait cannot be woken by a daemon, so the
client watches the root itself (:class:`Watches`, one inotify instance per
client, read by one background thread) and wakes its :class:`Waiter` objects.

The calls that may wait (send, send_batch, receive) are written once, as
*operations*: generators that yield the steps they need and are sent each
step's result (the style of :mod:`mqcore.client._http`). A step is
:class:`~mqcore.service.plans.Blocking` (file work), :class:`Undoable` (file
work that takes something) or :class:`Sleep` (wait until a waiter fires).
:func:`drive` runs an operation in the calling thread (``LocalClient``); the
asyncio client runs the same operation with the file work in worker threads
and the sleeps awaited on the event loop (``mqcore.client._local_async``).
Operations are :mod:`mqcore.service.plans` plans, run by its two step runners,
so a service plan (an attempted receive) runs inside them unchanged.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from mqcore.names import ATTRIBUTES_FILE, PURGE_FILE, QueueName, parse_in_flight_name, parse_ready_name
from mqcore.protocol import Store, now_ms
from mqcore.service.plans import Blocking, Plan, run_sync
from mqcore.watch import DirEvent, DirWatcher, open_watcher

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest a long poll or capacity wait goes without listing its queue again, in seconds: the
#: safety net for what inotify cannot see (other hosts on NFS, ``MQ_NO_INOTIFY=1``).
RESCAN_INTERVAL_SECONDS = 2.0
#: inotify watch tag of ``delay/`` (a "/" never appears in a queue name, so no queue can clash).
_DELAY_TAG = "delay/"

#: What a waiter waits for: ``"arrivals"`` (a receive) or ``"room"`` (a send waiting for capacity).
WaitKind = Literal["arrivals", "room"]


class Waiter:
    """One long poll or capacity wait of one queue; ``fired`` is set when what it waits for may have happened.

    Fields are read and written under the :class:`Watches` lock.
    """

    __slots__ = ("fired", "kind", "notify", "queue", "until_ms")

    def __init__(self, queue: QueueName, kind: WaitKind, notify: Callable[[], None]) -> None:
        self.queue = queue
        self.kind = kind
        #: Called (lock held, from the watch thread) when the waiter fires.
        self.notify = notify
        self.fired = False
        #: A receive waiter is woken by a new ``delay/`` file of its queue due at or before this (epoch ms).
        self.until_ms: float = math.inf


class Watches:
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

    Args:
        store: The store of the root to watch.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cond = threading.Condition(threading.Lock())
        self._watcher: DirWatcher | None = None
        self._opened = False
        self._closed = False
        self._waiters: dict[QueueName, list[Waiter]] = {}
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

    def add(self, queue: QueueName, kind: WaitKind) -> Waiter:
        """Register a waiter on ``queue`` (before looking at the state it waits for).

        Args:
            queue: The queue.
            kind: ``"arrivals"`` (a receive) or ``"room"`` (a send waiting for capacity).
        Returns:
            The waiter; it wakes the threads blocked in :meth:`wait` until :meth:`listen` says otherwise.
        """
        with self._cond:
            self._open()
            waiter = Waiter(queue, kind, self._cond.notify_all)
            self._waiters.setdefault(queue, []).append(waiter)
            self._watch_queue(queue)
            return waiter

    def _watch_queue(self, queue: QueueName) -> None:
        """(Re-)establish the watch on the queue directory (lock held; idempotent)."""
        if self._watcher is not None and not self._closed:
            self._watcher.watch(self._store.layout.queue_dir(queue), queue)
            if not self._watcher.watching(_DELAY_TAG):
                self._watcher.watch(self._store.layout.delay, _DELAY_TAG)

    def arm(self, waiter: Waiter) -> None:
        """Reset ``waiter`` before a look at the queue: any event from now on fires it."""
        with self._cond:
            waiter.fired = False
            waiter.until_ms = math.inf
            self._watch_queue(waiter.queue)  # the directory may have been re-created

    def until(self, waiter: Waiter, until_ms: float) -> None:
        """From now on, wake ``waiter`` only for ``delay/`` files due at or before ``until_ms`` (epoch ms)."""
        with self._cond:
            waiter.until_ms = until_ms

    def wait(self, waiter: Waiter, timeout_seconds: float) -> bool:
        """Block until ``waiter`` fired, the client closed, or ``timeout_seconds`` passed; False for the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: waiter.fired or self._closed, timeout_seconds)

    def listen(self, waiter: Waiter, notify: Callable[[], None]) -> bool:
        """Call ``notify`` (lock held, from the watch thread or :meth:`close`) when ``waiter`` fires.

        Returns:
            False if it already fired or the watches are closed: there is nothing to wait for.
        """
        with self._cond:
            waiter.notify = notify
            return not (waiter.fired or self._closed)

    def remove(self, waiter: Waiter) -> None:
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

    def _fire(self, waiter: Waiter) -> None:
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
        waiters = self._waiters.get(QueueName(event.tag), [])
        if event.dir_gone:
            for waiter in waiters:
                self._fire(waiter)
            return
        name = event.name
        kind: WaitKind | None = None
        if name.startswith("."):
            if event.arrived and name in (ATTRIBUTES_FILE, PURGE_FILE):
                kind = "room"  # the capacity may have changed, or a purge made room
        elif parse_ready_name(name) is not None:
            kind = "arrivals" if event.arrived else "room" if event.left else None
        if kind is not None:
            for waiter in waiters:
                if waiter.kind == kind:
                    self._fire(waiter)


# -- operations: the calls that wait, written once ------------------------------------------


@dataclass(frozen=True, slots=True)
class Undoable(Generic[T]):
    """A step of an operation: file work that takes something (a capacity reservation, a lock).

    Attributes:
        fn: The work (blocking); its result is sent back into the operation.
        undo: Given the result when the caller was cancelled while ``fn`` ran (asyncio only):
            gives back what ``fn`` took.
    """

    fn: Callable[[], T]
    undo: Callable[[T], None]


@dataclass(frozen=True, slots=True)
class Sleep:
    """A step of an operation: wait until ``waiter`` fires, ``watches`` close, or ``timeout_seconds`` pass."""

    watches: Watches
    waiter: Waiter
    timeout_seconds: float


#: An operation (a :mod:`mqcore.service.plans` plan): yields :class:`~mqcore.service.plans.Blocking`,
#: :class:`Undoable`, :class:`Sleep`, or an operation of a service plan that the client expands
#: into an operation of its own; is sent their results; returns T.
Op = Plan[T]


def drive(op: Op[T], expand: Callable[[Any], Op[Any]] | None = None) -> T:
    """Run ``op`` in this thread (:func:`mqcore.service.plans.run_sync`): sleeps block on the watches' condition.

    Args:
        op: The operation.
        expand: The operation that does what a service plan's step asks (e.g. a receive that waits).
    Raises:
        Whatever ``op`` raises (an error of a step is thrown into it first).
    """

    def handle(step: Any) -> Any:
        if isinstance(step, Sleep):
            return step.watches.wait(step.waiter, step.timeout_seconds)
        if isinstance(step, Undoable):
            return step.fn()
        if expand is None:
            raise TypeError(f"no handler for {step!r}")
        return run_sync(expand(step), handle)

    return run_sync(op, handle)


def wait_plan(end: float, next_due: int | None) -> tuple[float, float] | None:
    """How long to sleep before looking at the queue again, or None when the wait is over.

    Args:
        end: When the wait ends, on the ``time.monotonic()`` clock.
        next_due: Earliest deadline (epoch ms) of the queue's ``delay/`` files not yet due, or None.
    Returns:
        (seconds to sleep: at most the rescan interval, and until just after ``next_due``;
        the epoch ms up to which a new ``delay/`` file of the queue should wake the waiter).
    """
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


def poll_op(
    watches: Watches,
    queue: QueueName,
    kind: WaitKind,
    wait_seconds: float,
    look: Blocking[tuple[T, int | None]] | Undoable[tuple[T, int | None]],
) -> Op[T]:
    """Look at ``queue`` until a look finds something or ``wait_seconds`` passed; sleep between looks.

    The waiter is armed before each look, so an event during the look is not
    missed; it sleeps until an event, the queue's next due deadline, or the
    rescan interval, whichever comes first.

    Args:
        watches: The client's watches.
        queue: The queue looked at.
        kind: What wakes the sleeps (``"arrivals"``: messages becoming ready; ``"room"``: leaving).
        wait_seconds: How long to keep looking (> 0).
        look: The look: (what it found, falsy for nothing; the queue's next due ``delay/`` deadline or None).
    Returns:
        What the last look found (falsy when the wait ended with nothing, or the client closed).
    """
    end = time.monotonic() + wait_seconds
    waiter = watches.add(queue, kind)
    try:
        while True:
            watches.arm(waiter)
            seen: tuple[T, int | None] = yield look
            found, next_due = seen
            plan = wait_plan(end, next_due)
            if found or plan is None or watches.closed:
                return found
            watches.until(waiter, plan[1])
            yield Sleep(watches, waiter, plan[0])
    finally:
        watches.remove(waiter)
