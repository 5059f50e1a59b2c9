"""mq-mover: makes in-flight and delayed messages ready again when their deadline passes.

A receive renames ``queues/Q/ID.RC`` to ``delay/DL.Q.ID.RC.LT`` (``DL`` = deadline
in epoch milliseconds, ``RC`` >= 1, ``LT`` the receive's lease token); a send
with a delay writes ``delay/DL.Q.ID.0.LT`` (``RC`` = 0). Names of protocol
version 1 (no ``.LT``) left on disk are moved the same way. When ``DL`` has passed this daemon moves
each file on (``docs/protocol.md``, "Redelivery"), deciding by the queue's
policy (:meth:`mqcore.protocol.Store.policy`: ``queues/Q/.attributes`` and
``queues/Q/.purge``, read once per queue per batch, so changes are seen at the
next batch):

- purged (id <= the purge marker's id) or past the queue's retention period
  (send time from the id + ``retention_seconds``) -> ``remove/Q.ID``;
- ``RC >= max_receive_count`` with a dead-letter queue set ->
  ``queues/DLQ/ID.RC`` (:meth:`~mqcore.protocol.Store.dead_letter`: same id and
  receive count, body and header untouched). If the dead-letter queue does not
  exist the message is redelivered to its own queue instead, and a warning is
  logged once per queue;
- otherwise -> ``queues/Q/ID.RC`` (a redelivery; for ``RC`` = 0, a delayed
  send becoming visible), or ``remove/Q.ID`` when the queue itself is gone,
  so nothing is ever stranded in ``delay/``.

How it finds the files (the Go original watched inotify only, so files already
in ``delay/`` at start-up stayed there forever):

- a full scan of ``delay/`` at start-up, before the readiness line;
- inotify on ``delay/`` (:class:`mqcore.watch.DirWatcher` on the event loop),
  read in batches (:data:`BATCH_WINDOW_SECONDS` after the first event of a
  burst, then every window while events keep coming: one wake of the process
  per window, not one per lease), so a new lease or delayed send is known
  within ~10 ms. Of an arrival only the deadline is parsed; the whole name
  when it comes due;
- a full rescan every ``--rescan-interval`` seconds, as a safety net for what
  inotify cannot see (other hosts on NFS, lost events, ``IN_Q_OVERFLOW``), and
  the only mechanism where inotify is unavailable (``MQ_NO_INOTIFY=1``).

Known files sit in a heap ordered by deadline. The loop sleeps until the
earliest deadline or the next rescan, whichever comes first, and is woken
early only by an arrival that is due sooner: it never polls. Under a steady
receive+delete load (every lease deleted long before its deadline) it wakes
only to read the events. Entries may be
stale (the message was deleted or redelivered elsewhere); handling one costs
a failed rename and returns ``"gone"``.

Every move is one ``rename(2)``; a crash between two of them leaves each file
either still in ``delay/`` (handled again after a restart: the start-up scan
finds it due) or already moved. Blocking directory work runs in threads
(``asyncio.to_thread``); the loop only parses names and keeps the heap.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from daemons._metrics_cli import check_metrics_port, metrics_options, start_daemon_metrics
from daemons._runtime import (
    check_interval,
    check_log_level,
    check_root_value,
    config_option,
    log_level_option,
    root_option,
    stop_timeout_option,
)
from daemons._stopguard import MOVER_STOP_TIMEOUT_SECONDS
from daemons._watched import WatchedDirDaemon, console_main, run_cli, serve_daemon
from mqcore.errors import MQError, QueueNotFound
from mqcore.names import InFlightName, QueueName, parse_in_flight_name
from mqcore.protocol import LeasePolicy, Store
from mqcore.watch import DirWatcher, open_watcher

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from daemons._metrics import MoverMetrics

logger = logging.getLogger("mq.mover")

#: Default interval between full rescans of ``delay/``, in seconds.
DEFAULT_RESCAN_INTERVAL_SECONDS = 10.0
#: Most redeliveries done in one worker-thread call (keeps shutdown and logging prompt in a flood).
REDELIVER_BATCH = 512
#: Stale heap entries tolerated beyond twice the live ones before the heap is rebuilt.
COMPACT_SLACK = 1024
#: Watch tag of ``delay/``.
_DELAY_TAG = "delay"
#: Seconds inotify events on ``delay/`` gather before one read (bounds how late a lease due at once is seen).
BATCH_WINDOW_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class MoverSettings:
    """Settings of mq-mover (CLI > env > TOML ``[mq-mover]`` > defaults)."""

    root: str
    """Root of the folder tree (``--root``, ``MQ_ROOT``)."""
    rescan_interval_seconds: float = DEFAULT_RESCAN_INTERVAL_SECONDS
    """Seconds between full rescans of ``delay/`` (``--rescan-interval``, ``MQ_MOVER_RESCAN_INTERVAL``)."""
    log_level: str = "INFO"
    """Logging level name (``--log-level``, ``MQ_LOG_LEVEL``)."""
    metrics_port: int = 0
    """TCP port of the Prometheus ``/metrics`` listener, 0 = off (``--metrics-port``, ``MQ_MOVER_METRICS_PORT``)."""
    metrics_address: str = "127.0.0.1"
    """Address of that listener (``--metrics-address``, ``MQ_MOVER_METRICS_ADDRESS``)."""

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            ConfigError: A value is out of range; ``details["key"]`` names the option.
        """
        check_root_value(self.root)
        check_interval("rescan-interval", self.rescan_interval_seconds)
        check_log_level(self.log_level)
        check_metrics_port(self.metrics_port)


# -- the daemon ---------------------------------------------------------------


class Mover(WatchedDirDaemon):
    """Redelivers due in-flight messages of one root.

    Args:
        store: The protocol on the root.
        rescan_interval_seconds: Seconds between full rescans of ``delay/``.
        watcher: inotify watcher to use for ``delay/``, or None to rely on rescans.
    """

    log = logger
    dir_label = "delay/"
    watch_tag = _DELAY_TAG
    batch_window_seconds = BATCH_WINDOW_SECONDS

    def __init__(self, store: Store, *, rescan_interval_seconds: float, watcher: DirWatcher | None) -> None:
        super().__init__(store, rescan_interval_seconds=rescan_interval_seconds, watcher=watcher)
        #: (deadline_ms, file name); may hold stale and duplicate entries (lazy deletion).
        self._heap: list[tuple[int, str]] = []
        #: Deadline (epoch ms) of each file believed to be in ``delay/`` and not yet handled.
        #: Only the deadline is parsed when a file arrives; the whole name when it comes due.
        self._pending: dict[str, int] = {}
        #: Deadline (epoch ms) the loop sleeps until; an arrival due earlier wakes it.
        self._sleep_until_ms: float = math.inf
        #: Queues whose dead-letter queue was found missing (warned once; worker thread only).
        self._missing_dlq: set[QueueName] = set()
        #: Counters served on ``--metrics-port`` (None when off).
        self.metrics: MoverMetrics | None = None

    def __len__(self) -> int:
        """Number of in-flight files known and not yet handled."""
        return len(self._pending)

    def count_due(self, now: int) -> int:
        """Number of known in-flight files whose deadline is at or before ``now`` (epoch ms)."""
        return sum(1 for deadline_ms in self._pending.values() if deadline_ms <= now)

    def _watched_dir(self) -> str:
        return self.store.layout.delay

    # -- what is known --------------------------------------------------

    def add(self, item: InFlightName) -> None:
        """Remember an in-flight file; wake the loop if it is due before the current sleep ends."""
        self._add(item.filename, item.deadline_ms)

    def _add(self, name: str, deadline_ms: int) -> None:
        if name in self._pending:
            return
        self._pending[name] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, name))
        if deadline_ms < self._sleep_until_ms:
            self._wake.set()

    def on_arrived(self, name: str) -> None:
        """inotify: a lease was made; fold its deadline (the name's first field) into the heap.

        The rest of the name is parsed when it comes due (:meth:`_take_due`).
        """
        deadline, dot, _ = name.partition(".")
        if dot and deadline.isdecimal() and deadline.isascii():
            self._add(name, int(deadline))
        else:
            logger.debug("ignoring foreign file in delay/ name=%s", name)

    def on_left(self, name: str) -> None:
        """inotify: the file left ``delay/`` (deleted or redelivered elsewhere)."""
        self._pending.pop(name, None)

    def _after_events(self) -> None:
        self._compact()

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber live ones (bounds memory with long timeouts).

        Without this, messages received with a long visibility timeout and
        deleted at once would leave one heap entry each until their deadline.
        """
        if len(self._heap) > 2 * len(self._pending) + COMPACT_SLACK:
            self._heap = [(deadline_ms, name) for name, deadline_ms in self._pending.items()]
            heapq.heapify(self._heap)

    # -- rescans ----------------------------------------------------------

    async def rescan(self) -> None:
        """Re-establish the watch if lost, list ``delay/`` and add what is not known yet.

        A failed listing (e.g. EIO) is logged; the next rescan tries again.
        """
        items = await self._list_watched(self.store.scan_in_flight)
        if items is None:
            return
        before = len(self._pending)
        for item in items:
            self.add(item)
        logger.debug("rescanned delay/ files=%d new=%d", len(items), len(self._pending) - before)

    # -- redelivery -----------------------------------------------------

    def _take_due(self, now: int, limit: int) -> list[InFlightName]:
        batch: list[InFlightName] = []
        while self._heap and self._heap[0][0] <= now and len(batch) < limit:
            _, name = heapq.heappop(self._heap)
            if self._pending.pop(name, None) is None:
                continue  # stale: left delay/ or already handled
            item = parse_in_flight_name(name)
            if item is None:
                logger.debug("ignoring foreign file in delay/ name=%s", name)
            else:
                batch.append(item)
        return batch

    def _redeliver_batch(
        self, batch: list[InFlightName], now: int
    ) -> list[tuple[InFlightName, str | Exception, QueueName | None]]:
        """Worker thread: move each due item on; an OSError or MQError is returned, not raised.

        The policy of each queue is read once for the whole batch (a later
        batch reads it again, so a purge or an attribute change is seen).
        """
        policies: dict[QueueName, LeasePolicy | None] = {}
        out: list[tuple[InFlightName, str | Exception, QueueName | None]] = []
        store = self.store.at(now)  # one instant for the whole batch
        for item in batch:
            try:
                out.append((item, *self._move_one(store, item, policies)))
            except (OSError, MQError) as exc:
                out.append((item, exc, None))
        return out

    def _policy(self, queue: QueueName, cache: dict[QueueName, LeasePolicy | None]) -> LeasePolicy | None:
        """The policy of ``queue`` (None if the queue is gone), read once per batch."""
        if queue not in cache:
            try:
                cache[queue] = self.store.policy(queue)
            except QueueNotFound:
                cache[queue] = None
        return cache[queue]

    def _move_one(
        self, store: Store, item: InFlightName, policies: dict[QueueName, LeasePolicy | None]
    ) -> tuple[str, QueueName | None]:
        """Worker thread: remove, dead-letter or redeliver one due in-flight file, judged at ``store``'s clock.

        Returns:
            What happened, and the dead-letter queue involved (or None). What happened:
            ``"purged"`` or ``"expired"`` (moved to ``remove/``), ``"dead_lettered"``,
            ``"redelivered"`` (to its queue, also when its dead-letter queue is missing),
            ``"orphaned"`` (its queue is gone: moved to ``remove/``) or ``"gone"`` (the
            file had already left ``delay/``).
        """
        policy = self._policy(item.queue, policies)
        result = store.move_due(item, policy)
        if result == "dead_lettered":
            self._missing_dlq.discard(item.queue)
            return result, policy.dead_letter_queue if policy is not None else None
        if result == "kept":
            # The dead-letter queue does not exist: the message was redelivered to its
            # queue rather than stranded or dropped.
            if item.queue not in self._missing_dlq and policy is not None:
                self._missing_dlq.add(item.queue)
                logger.warning(
                    "dead-letter queue missing queue=%s dead_letter_queue=%s "
                    "(messages over max_receive_count=%s are redelivered to their queue; logged once)",
                    item.queue,
                    policy.dead_letter_queue,
                    policy.max_receive_count,
                )
            return "redelivered", None
        return result, None

    async def redeliver_due(self, stop: asyncio.Event | None = None, now: int | None = None) -> int:
        """Move on every known file whose deadline has passed, in worker-thread batches.

        Args:
            stop: When set, return after the current batch.
            now: The time to use, epoch ms (default: the store's clock, read per batch).
        Returns:
            Number of files moved (redelivered, dead-lettered, or sent to ``remove/``).
        """
        moved = 0
        while stop is None or not stop.is_set():
            batch_now = now if now is not None else self.store.clock()
            batch = self._take_due(batch_now, REDELIVER_BATCH)
            if not batch:
                break
            for item, result, dead_letter_queue in await asyncio.to_thread(self._redeliver_batch, batch, batch_now):
                if result != "gone" and not isinstance(result, Exception):
                    moved += 1
                if self.metrics is not None:
                    self.metrics.count(item.queue, result, item.receive_count, batch_now - item.deadline_ms)
                _log_result(item, result, dead_letter_queue, batch_now)
        return moved

    def _next_deadline_ms(self) -> int | None:
        while self._heap and self._heap[0][1] not in self._pending:
            heapq.heappop(self._heap)  # stale: left delay/ or already handled
        return self._heap[0][0] if self._heap else None

    async def work(self, stop: asyncio.Event) -> None:
        await self.redeliver_due(stop)

    def _begin_pass(self) -> None:
        self._sleep_until_ms = math.inf  # while working, any arrival re-runs the loop

    def _sleep_timeout(self, until_rescan_seconds: float) -> float:
        """Sleep until the next rescan or the earliest deadline, whichever comes first."""
        now = self.store.clock()
        # An arrival due after the rescan needs no wake: the loop runs then anyway.
        self._sleep_until_ms = now + until_rescan_seconds * 1000
        deadline = self._next_deadline_ms()
        if deadline is None or deadline >= self._sleep_until_ms:
            return until_rescan_seconds
        self._sleep_until_ms = deadline
        # +1 ms: wake at or after the deadline, never just before it.
        return (deadline - now + 1) / 1000

    def log_start_up(self) -> None:
        logger.info(
            "start-up scan in_flight=%d due=%d inotify=%s rescan_interval_seconds=%s",
            len(self),
            self.count_due(self.store.clock()),
            "yes" if self.watching else "no",
            self.rescan_interval_seconds,
        )


def _log_result(item: InFlightName, result: str | Exception, dead_letter_queue: QueueName | None, now: int) -> None:
    """Log what happened to one due in-flight file (key=value style)."""
    if isinstance(result, Exception):
        # Not re-queued (that could spin); the next rescan finds the file again.
        logger.error(
            "redelivery failed queue=%s id=%s name=%s error=%s (retried at next rescan)",
            item.queue,
            item.message_id,
            item.filename,
            result,
        )
    elif result == "redelivered":
        logger.info(
            "%s queue=%s id=%s receive_count=%d deadline_ms=%d late_ms=%d",
            "redelivered" if item.receive_count else "delayed message ready",
            item.queue,
            item.message_id,
            item.receive_count,
            item.deadline_ms,
            now - item.deadline_ms,
        )
    elif result == "dead_lettered":
        logger.info(
            "dead-lettered queue=%s id=%s receive_count=%d dead_letter_queue=%s",
            item.queue,
            item.message_id,
            item.receive_count,
            dead_letter_queue,
        )
    elif result in ("expired", "purged"):
        logger.info(
            "%s queue=%s id=%s receive_count=%d (moved to remove/)",
            result,
            item.queue,
            item.message_id,
            item.receive_count,
        )
    elif result == "orphaned":
        logger.info("orphaned queue=%s id=%s (queue is gone, moved to remove/)", item.queue, item.message_id)
    else:
        logger.debug("already gone queue=%s id=%s name=%s", item.queue, item.message_id, item.filename)


def _make_metrics(registry: CollectorRegistry) -> MoverMetrics:
    """mq-mover's counters on ``registry`` (prometheus-client is imported only with ``--metrics-port``)."""
    from daemons._metrics import MoverMetrics

    return MoverMetrics(registry)


async def serve(settings: MoverSettings, *, shutdown_trigger: asyncio.Event | None = None) -> None:
    """Run mq-mover until ``shutdown_trigger`` is set (or SIGTERM/SIGINT without one).

    Logs ``mq-mover ready root=...`` and notifies systemd (``READY=1``) once
    the start-up scan of ``delay/`` is done and the watch is in place.

    Args:
        settings: The daemon's settings.
        shutdown_trigger: Set it to stop; when None, SIGTERM and SIGINT set an
            internal one. The current batch of renames is finished first.
    """
    metrics, stop_metrics = start_daemon_metrics(
        "mq-mover", settings.root, settings.metrics_port, settings.metrics_address, _make_metrics
    )

    def make(store: Store) -> Mover:
        mover = Mover(store, rescan_interval_seconds=settings.rescan_interval_seconds, watcher=open_watcher())
        mover.metrics = metrics
        return mover

    try:
        await serve_daemon("mq-mover", logger, settings.root, make, shutdown_trigger)
    finally:
        stop_metrics()


# -- command line -------------------------------------------------------------


@click.command(name="mq-mover", help="Redeliver in-flight messages whose visibility timeout has passed.")
@config_option
@root_option
@click.option(
    "--rescan-interval",
    type=float,
    envvar="MQ_MOVER_RESCAN_INTERVAL",
    default=DEFAULT_RESCAN_INTERVAL_SECONDS,
    show_default=True,
    show_envvar=True,
    help="Seconds between full rescans of delay/ (safety net for NFS and lost inotify events).",
)
@metrics_options("MQ_MOVER")
@log_level_option
@stop_timeout_option(MOVER_STOP_TIMEOUT_SECONDS)
@click.pass_context
def cli(ctx: click.Context, /, rescan_interval: float, **common: object) -> int:
    """The command; ``common``: the options of every daemon, read by ``run_cli`` from ``ctx``."""
    return run_cli(ctx, MoverSettings, serve, rescan_interval_seconds=rescan_interval)


#: Console script ``mq-mover`` (``main(argv=None) -> int``, argv without the program name).
main = console_main(cli, "mq-mover")


if __name__ == "__main__":
    sys.exit(main())
