"""mq-reaper: unlinks deleted messages and queues, drops unacknowledged writes, expires messages.

Deleting is a rename into ``remove/`` (``docs/protocol.md``, "Delete" and
"Delete queue"); this daemon makes the space free again:

- every entry of ``remove/`` is unlinked; a deleted queue's directory
  (``remove/Q.TOKEN.queue``) is removed with everything in it. Entries are
  found by a scan at start-up (what was there before it started), by inotify
  on ``remove/`` (arrivals only, read in :data:`BATCH_WINDOW_SECONDS` windows,
  so each batch of unlinks is one worker-thread call and one wake of the
  process), and by a full rescan every ``--rescan-interval`` seconds (NFS, lost
  events, no inotify). Each unlink is logged at DEBUG; INFO gets one summary a
  minute at most;
- at start-up and on every rescan, files in ``new/`` older than
  ``--new-grace`` seconds are unlinked (``Store.sweep_new``): a sender answers
  201 only after its file has left ``new/``, so such a file belongs to a
  writer that died before acknowledging it, and it must never be delivered.

Once right after start-up and then every ``--expire-interval`` seconds
(counted from the end of the previous sweep), an expiry sweep runs beside the
reaping (paced to a tenth of a core after the first, and skipping the queue
directories unchanged since a sweep after which nothing in them is gone yet:
:mod:`daemons._expiry`):

- for each queue, ``Store.expire_queue``: ready files ``queues/Q/ID.RC`` that
  are past the queue's retention period (send time from the id +
  ``retention_seconds``) or purged (id <= the ``.purge`` marker's id) are
  renamed to ``remove/Q.ID``; and of a FIFO queue, ``sweep_dedup``: its
  deduplication records ``queues/Q/.dedup.HASH`` older than the 5-minute
  window plus a minute are unlinked (docs/protocol.md 19.2);
- ``Store.expire_in_flight``: the same for ``delay/DL.Q.ID.RC`` (in flight or
  delayed), without waiting for their deadline;
- ``Store.sweep_attempts``: receive request attempt records in ``attempts/``
  older than their 5-minute window are unlinked;
- ``Store.sweep_staging``: ``queues/.Q.TOKEN.creating`` directories of queue
  creations that died midway, older than ``--new-grace``, are removed.

What the sweep moves into ``remove/`` is then reaped like any delete (inotify
or the next rescan). Each move is a single rename, so a crash mid-sweep leaves
every file either where it was (expired again by the next sweep) or in
``remove/``.

All unlinks and sweeps run in worker threads in batches (one queue per
call), so a flood of deletes (or one huge queue directory) never blocks the
event loop; arrivals during a batch simply join the next one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import click

from daemons._expiry import SWEEP_CPU_SHARE, CpuShare, SweptQueues
from daemons._metrics_cli import check_metrics_port, metrics_options, start_daemon_metrics
from daemons._runtime import (
    check_interval,
    check_log_level,
    check_root_value,
    config_option,
    log_level_option,
    root_option,
    stop_timeout_option,
    wait_for_wake,
)
from daemons._stopguard import REAPER_STOP_TIMEOUT_SECONDS
from daemons._watched import WatchedDirDaemon, console_main, run_cli, serve_daemon
from mqcore.errors import MQError
from mqcore.names import REMOVED_QUEUE_SUFFIX, is_fifo_queue
from mqcore.protocol import Store
from mqcore.protocol.fifo import REAPER_MIN_AGE_MS, sweep_dedup
from mqcore.watch import DirWatcher, open_watcher

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from daemons._metrics import ReaperMetrics

logger = logging.getLogger("mq.reaper")

#: Default age after which a file in ``new/`` counts as abandoned, in seconds.
DEFAULT_NEW_GRACE_SECONDS = 300.0
#: Default interval between full rescans of ``remove/`` and sweeps of ``new/``, in seconds.
DEFAULT_RESCAN_INTERVAL_SECONDS = 60.0
#: Default interval between expiry sweeps (retention, purge, attempts, staging), in seconds.
DEFAULT_EXPIRE_INTERVAL_SECONDS = 60.0
#: Most entries of ``remove/`` removed in one worker-thread call.
REAP_BATCH = 1024
#: Watch tag of ``remove/``.
_REMOVE_TAG = "remove"
#: Seconds inotify events on ``remove/`` gather before one read, so unlinks go in batches.
BATCH_WINDOW_SECONDS = 0.1
#: Least seconds between two INFO summaries of reaping (each unlink is logged at DEBUG).
REAP_SUMMARY_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ReaperSettings:
    """Settings of mq-reaper (CLI > env > TOML ``[mq-reaper]`` > defaults)."""

    root: str
    """Root of the folder tree (``--root``, ``MQ_ROOT``)."""
    new_grace_seconds: float = DEFAULT_NEW_GRACE_SECONDS
    """Age in seconds after which a file in ``new/`` is abandoned (``--new-grace``, ``MQ_REAPER_NEW_GRACE``).
    It must exceed the longest write plus fsync a sender can take."""
    rescan_interval_seconds: float = DEFAULT_RESCAN_INTERVAL_SECONDS
    """Seconds between rescans of ``remove/`` and sweeps of ``new/`` (``--rescan-interval``,
    ``MQ_REAPER_RESCAN_INTERVAL``)."""
    expire_interval_seconds: float = DEFAULT_EXPIRE_INTERVAL_SECONDS
    """Seconds between expiry sweeps of the queues, ``delay/``, ``attempts/`` and staging directories
    (``--expire-interval``, ``MQ_REAPER_EXPIRE_INTERVAL``)."""
    log_level: str = "INFO"
    """Logging level name (``--log-level``, ``MQ_LOG_LEVEL``)."""
    metrics_port: int = 0
    """TCP port of the Prometheus ``/metrics`` listener, 0 = off (``--metrics-port``, ``MQ_REAPER_METRICS_PORT``)."""
    metrics_address: str = "127.0.0.1"
    """Address of that listener (``--metrics-address``, ``MQ_REAPER_METRICS_ADDRESS``)."""

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            ConfigError: A value is out of range; ``details["key"]`` names the option.
        """
        check_root_value(self.root)
        check_interval("new-grace", self.new_grace_seconds)
        check_interval("rescan-interval", self.rescan_interval_seconds)
        check_interval("expire-interval", self.expire_interval_seconds)
        check_log_level(self.log_level)
        check_metrics_port(self.metrics_port)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ExpirySweep:
    """What one expiry sweep did (counts of entries moved or unlinked)."""

    queues: int = 0
    """Queues swept (listed, or skipped as unchanged: see :attr:`listed`)."""
    ready: int = 0
    """Ready files moved to ``remove/`` (expired or purged)."""
    in_flight: int = 0
    """Files of ``delay/`` moved to ``remove/`` (expired or purged)."""
    attempts: int = 0
    """Receive request attempt records unlinked."""
    staging: int = 0
    """Staging directories of abandoned queue creations removed."""
    errors: int = 0
    """Steps that failed (logged; retried at the next sweep)."""
    dedup: int = 0
    """Expired deduplication records of FIFO queues unlinked (docs/protocol.md 19.2)."""
    listed: int = 0
    """Queue directories listed (the others were unchanged since a sweep that left nothing gone before now)."""

    @property
    def removed(self) -> int:
        """Everything moved or unlinked."""
        return self.ready + self.in_flight + self.attempts + self.staging + self.dedup


class Reaper(WatchedDirDaemon):
    """Removes what was moved into ``remove/`` of one root, and sweeps ``new/``.

    Args:
        store: The protocol on the root.
        new_grace_seconds: Age in seconds after which a ``new/`` file (or a queue's
            staging directory) is abandoned.
        rescan_interval_seconds: Seconds between rescans and sweeps.
        watcher: inotify watcher to use for ``remove/``, or None to rely on rescans.
        expire_interval_seconds: Seconds between expiry sweeps (see :meth:`expire`).
    """

    log = logger
    dir_label = "remove/"
    watch_tag = _REMOVE_TAG
    batch_window_seconds = BATCH_WINDOW_SECONDS
    # Most departures from remove/ are this daemon's own unlinks: not worth an event each.
    watch_departures = False

    def __init__(
        self,
        store: Store,
        *,
        new_grace_seconds: float,
        rescan_interval_seconds: float,
        watcher: DirWatcher | None,
        expire_interval_seconds: float = DEFAULT_EXPIRE_INTERVAL_SECONDS,
    ) -> None:
        super().__init__(store, rescan_interval_seconds=rescan_interval_seconds, watcher=watcher)
        self.new_grace_seconds = new_grace_seconds
        self.new_grace_ms = math.ceil(new_grace_seconds * 1000)
        self.expire_interval_seconds = expire_interval_seconds
        #: Names in ``remove/`` to remove (a dict as an ordered set: oldest arrival first).
        self._pending: dict[str, None] = {}
        #: Counters served on ``--metrics-port`` (None when off).
        self.metrics: ReaperMetrics | None = None
        #: What was reaped since the last INFO summary: files, their bytes, queue directories.
        self._unreported = [0, 0, 0]
        self._last_summary = -math.inf
        self._summary_timer: asyncio.TimerHandle | None = None
        #: What the expiry sweeps found in each queue directory (those unchanged since are skipped).
        self.swept = SweptQueues()

    def __len__(self) -> int:
        """Number of entries of ``remove/`` known and not yet removed."""
        return len(self._pending)

    def _watched_dir(self) -> str:
        return self.store.layout.remove

    def on_arrived(self, name: str) -> None:
        """inotify: an entry was moved into ``remove/``; reap it soon."""
        self._pending[name] = None
        self._wake.set()

    def on_left(self, name: str) -> None:
        """Not called: departures from ``remove/`` are not watched (an entry gone meanwhile costs a failed unlink)."""

    async def rescan(self) -> None:
        """Re-establish the watch if lost, list ``remove/``, and sweep ``new/``.

        A failure (e.g. EIO) is logged; the next rescan tries again.
        """
        names = await self._list_watched(self.store.scan_removed)
        if names is not None:
            for name in names:
                self._pending[name] = None
            logger.debug("rescanned remove/ entries=%d", len(names))
        await self.sweep_new()

    async def sweep_new(self) -> list[str]:
        """Unlink files in ``new/`` older than the grace period (in a worker thread).

        Returns:
            The names unlinked (empty if the sweep failed; the error is logged).
        """
        try:
            swept = await asyncio.to_thread(self.store.sweep_new, self.new_grace_ms)
        except OSError as exc:
            logger.error("sweep of new/ failed error=%s", exc)
            return []
        for name in swept:
            logger.warning("dropped unacknowledged file from new/ name=%s grace_ms=%d", name, self.new_grace_ms)
        if self.metrics is not None:
            self.metrics.new_dropped.inc(len(swept))
        return swept

    def _reap_batch(self, names: list[str]) -> list[tuple[str, bool | OSError | ValueError, int]]:
        """Worker thread: remove each entry (:meth:`Store.reap_many`); an error is returned per entry, not raised.

        Returns:
            ``(name, removed or the error, size in bytes before the unlink (0 if unknown))`` per entry.
        """
        try:
            return self.store.reap_many(names)
        except OSError as exc:  # remove/ itself could not be opened: every entry gets the error
            return [(name, exc, 0) for name in names]

    def _count_reaped(self, files: int, size: int, queues: int) -> None:
        """Add to the next INFO summary; log it now if the last one is a minute old, else schedule it."""
        self._unreported[0] += files
        self._unreported[1] += size
        self._unreported[2] += queues
        wait = self._last_summary + REAP_SUMMARY_INTERVAL_SECONDS - self._loop.time()
        if wait <= 0:
            self.log_summary()
        elif self._summary_timer is None:
            self._summary_timer = self._loop.call_later(wait, self.log_summary)

    def log_summary(self) -> None:
        """Log one INFO line of what was reaped since the last one (nothing if nothing was)."""
        if self._summary_timer is not None:
            self._summary_timer.cancel()
            self._summary_timer = None
        files, size, queues = self._unreported
        if not (files or queues):
            return
        since = self._loop.time() - self._last_summary
        logger.info(
            "reaped files=%d bytes=%d queues=%d%s",
            files,
            size,
            queues,
            f" in the last {since:.0f} s" if math.isfinite(since) else "",
        )
        self._unreported = [0, 0, 0]
        self._last_summary = self._loop.time()

    def close(self) -> None:
        """Log what was reaped since the last summary, then stop watching."""
        self.log_summary()
        super().close()

    async def reap_pending(self, stop: asyncio.Event | None = None) -> int:
        """Remove every known entry of ``remove/``, in worker-thread batches.

        Args:
            stop: When set, return after the current batch.
        Returns:
            Number of entries removed.
        """
        removed = 0
        while self._pending and (stop is None or not stop.is_set()):
            batch = []
            for name in self._pending:
                batch.append(name)
                if len(batch) >= REAP_BATCH:
                    break
            for name in batch:
                del self._pending[name]
            files = queues = size = 0
            debug = logger.isEnabledFor(logging.DEBUG)
            for name, result, nbytes in await asyncio.to_thread(self._reap_batch, batch):
                if result is True and not name.endswith(REMOVED_QUEUE_SUFFIX):  # the usual case first
                    files += 1
                    size += nbytes
                    if debug:
                        logger.debug("reaped name=%s bytes=%d", name, nbytes)
                elif isinstance(result, Exception):
                    # Not re-queued (that could spin); the next rescan finds it again.
                    logger.error("reap failed name=%s error=%s (retried at next rescan)", name, result)
                elif not result:
                    logger.debug("already gone name=%s", name)
                else:
                    queues += 1
                    logger.info("removed deleted queue directory name=%s", name)
            if files or queues:
                logger.debug("reaped batch files=%d bytes=%d queues=%d", files, size, queues)
                self._count_reaped(files, size, queues)
            if self.metrics is not None:
                self.metrics.files.inc(files)
                self.metrics.queues.inc(queues)
                self.metrics.bytes.inc(size)
            removed += files + queues
        return removed

    async def work(self, stop: asyncio.Event) -> None:
        await self.reap_pending(stop)

    # -- expiry -------------------------------------------------------------

    async def _step(self, what: str, fn: Callable[..., T], *args: object) -> T | None:
        """Run one sweep step in a worker thread; a failure is logged and gives None."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (OSError, MQError) as exc:
            logger.error("expiry sweep step failed step=%s error=%s (retried at the next sweep)", what, exc)
            return None

    async def expire(self, now: int | None = None, stop: asyncio.Event | None = None) -> ExpirySweep:
        """One expiry sweep: every queue, then ``delay/``, ``attempts/`` and staging directories.

        Each step runs in a worker thread (one queue per call); a failed step is
        logged and skipped. Logs the counts.

        Args:
            now: The time to judge by, epoch ms (default: the store's clock at each step).
            stop: When set, the sweep ends after the current step.
        Returns:
            What was moved or unlinked.
        """
        started = time.monotonic()
        stopped = stop.is_set if stop is not None else lambda: False
        store = self.store if now is None else self.store.at(now)
        queues = await self._step("list_queues", store.list_queues)
        errors = int(queues is None)
        ready = swept = dedup = relisted = 0
        # The first sweep after start runs at full speed: start-up work ends fast (issue 12: mq-reaper starts as fast
        # as mq, 1.8 s of CPU at 1,000,000 ready against 18 s paced); the later ones, mostly skips, are paced.
        pause = CpuShare(SWEEP_CPU_SHARE if self.swept.sweeps else 1.0, stopped)
        self.swept.keep_only(queues or [])
        due = await self._step("to_sweep", self.swept.to_sweep, store, queues or [], store.clock())
        listed = set(queues or () if due is None else due)
        for queue in queues or ():
            if stopped():
                break
            moved = None
            swept += 1
            if queue in listed:
                done = await self._step(f"expire_queue queue={queue}", self.swept.sweep, store, queue, pause)
                relisted += 1
                if done is None:
                    self.swept.forget(queue)
                else:
                    self.swept.note(queue, done[0], done[1], store.clock())
                    moved = done[0].moved
            else:
                moved = 0  # unchanged since a sweep after which nothing of it is gone yet
            if moved is None:
                errors += 1
            elif moved:
                ready += moved
                if self.metrics is not None:
                    self.metrics.expired_ready(queue, moved)
                logger.info("expired ready messages queue=%s removed=%d", queue, moved)
            if is_fifo_queue(queue) and not stopped():  # so that a queue no longer sent to sheds its records
                records = await self._step(
                    f"sweep_dedup queue={queue}", sweep_dedup, store, queue, None, REAPER_MIN_AGE_MS
                )
                errors += records is None
                dedup += records or 0
        counts: list[int] = []
        for what, fn, args in (
            ("expire_in_flight", store.expire_in_flight, ()),
            ("sweep_attempts", store.sweep_attempts, ()),
            ("sweep_staging", store.sweep_staging, (self.new_grace_ms,)),
        ):
            n = 0 if stopped() else await self._step(what, fn, *args)
            if n is None:
                errors += 1
            counts.append(n or 0)
        result = ExpirySweep(swept, ready, counts[0], counts[1], counts[2], errors, dedup, relisted)
        if self.metrics is not None:
            self.metrics.in_flight_removed.inc(result.in_flight)
            self.metrics.errors.inc(result.errors)
        logger.log(
            logging.INFO if result.removed or result.errors else logging.DEBUG,
            "expiry sweep queues=%d ready_removed=%d in_flight_removed=%d attempts_removed=%d "
            "staging_removed=%d dedup_removed=%d errors=%d listed=%d paused_ms=%d elapsed_ms=%d",
            result.queues,
            result.ready,
            result.in_flight,
            result.attempts,
            result.staging,
            result.dedup,
            result.errors,
            result.listed,
            pause.slept * 1000,
            (time.monotonic() - started) * 1000,
        )
        return result

    async def _expire_loop(self, stop: asyncio.Event) -> None:
        """Sweep at once, then every ``expire_interval_seconds`` after the end of the previous sweep."""
        while not stop.is_set():
            try:
                await self.expire(stop=stop)
            except Exception:
                # A bug, not a storage error (those are handled per step): keep reaping, try again later.
                logger.exception(
                    "expiry sweep crashed (retried in expire_interval_seconds=%s)", self.expire_interval_seconds
                )
            await wait_for_wake(stop, self.expire_interval_seconds)

    async def run(self, stop: asyncio.Event) -> None:
        """Reap (the watched-directory loop) and run the expiry sweeps beside it, until ``stop`` is set."""
        sweeper = asyncio.create_task(self._expire_loop(stop), name="mq-reaper-expiry")
        try:
            await super().run(stop)
        finally:
            if not stop.is_set():
                sweeper.cancel()
            await asyncio.wait([sweeper])  # after stop: finishes its current step
            if not sweeper.cancelled() and sweeper.exception() is not None:
                logger.error("expiry sweeps failed error=%r", sweeper.exception())

    def _more_work(self) -> bool:
        return bool(self._pending)

    def log_start_up(self) -> None:
        logger.info(
            "start-up scan removed=%d inotify=%s new_grace_seconds=%s rescan_interval_seconds=%s "
            "expire_interval_seconds=%s",
            len(self),
            "yes" if self.watching else "no",
            self.new_grace_seconds,
            self.rescan_interval_seconds,
            self.expire_interval_seconds,
        )


def _make_metrics(registry: CollectorRegistry) -> ReaperMetrics:
    """mq-reaper's counters on ``registry`` (prometheus-client is imported only with ``--metrics-port``)."""
    from daemons._metrics import ReaperMetrics

    return ReaperMetrics(registry)


async def serve(settings: ReaperSettings, *, shutdown_trigger: asyncio.Event | None = None) -> None:
    """Run mq-reaper until ``shutdown_trigger`` is set (or SIGTERM/SIGINT without one).

    Logs ``mq-reaper ready root=...`` and notifies systemd (``READY=1``) once
    the start-up scan of ``remove/``, the sweep of ``new/`` and the watch are
    done; the first expiry sweep starts right after.

    Args:
        settings: The daemon's settings.
        shutdown_trigger: Set it to stop; when None, SIGTERM and SIGINT set an
            internal one. The current batch of unlinks is finished first.
    """
    metrics, stop_metrics = start_daemon_metrics(
        "mq-reaper", settings.root, settings.metrics_port, settings.metrics_address, _make_metrics
    )

    def make(store: Store) -> Reaper:
        reaper = Reaper(
            store,
            new_grace_seconds=settings.new_grace_seconds,
            rescan_interval_seconds=settings.rescan_interval_seconds,
            watcher=open_watcher(),
            expire_interval_seconds=settings.expire_interval_seconds,
        )
        reaper.metrics = metrics
        return reaper

    try:
        await serve_daemon("mq-reaper", logger, settings.root, make, shutdown_trigger)
    finally:
        stop_metrics()


@click.command(
    name="mq-reaper",
    help="Unlink deleted messages and queues; drop abandoned writes from new/; remove expired and purged messages.",
)
@config_option
@root_option
@click.option(
    "--new-grace",
    type=float,
    envvar="MQ_REAPER_NEW_GRACE",
    default=DEFAULT_NEW_GRACE_SECONDS,
    show_default=True,
    show_envvar=True,
    help="Seconds after which a file left in new/ by a dead writer is unlinked.",
)
@click.option(
    "--rescan-interval",
    type=float,
    envvar="MQ_REAPER_RESCAN_INTERVAL",
    default=DEFAULT_RESCAN_INTERVAL_SECONDS,
    show_default=True,
    show_envvar=True,
    help="Seconds between full rescans of remove/ and sweeps of new/.",
)
@click.option(
    "--expire-interval",
    type=float,
    envvar="MQ_REAPER_EXPIRE_INTERVAL",
    default=DEFAULT_EXPIRE_INTERVAL_SECONDS,
    show_default=True,
    show_envvar=True,
    help="Seconds between sweeps that remove expired and purged messages (queues and delay/), "
    "old receive attempt records and abandoned queue creations.",
)
@metrics_options("MQ_REAPER")
@log_level_option
@stop_timeout_option(REAPER_STOP_TIMEOUT_SECONDS)
@click.pass_context
def cli(
    ctx: click.Context, /, new_grace: float, rescan_interval: float, expire_interval: float, **common: object
) -> int:
    """The command; ``common``: the options of every daemon, read by ``run_cli`` from ``ctx``."""
    return run_cli(
        ctx,
        ReaperSettings,
        serve,
        new_grace_seconds=new_grace,
        rescan_interval_seconds=rescan_interval,
        expire_interval_seconds=expire_interval,
    )


#: Console script ``mq-reaper`` (``main(argv=None) -> int``, argv without the program name).
main = console_main(cli, "mq-reaper")


if __name__ == "__main__":
    sys.exit(main())
