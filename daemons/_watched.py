"""What mq-mover and mq-reaper share: one watched directory, rescans, a wake-driven loop, serve/CLI skeletons.

Both daemons keep a set of files known to be in one directory of the root
(``delay/`` for mq-mover, ``remove/`` for mq-reaper), learnt three ways
(``docs/protocol.md``, "Redelivery" and "Reaper"):

- a full scan at start-up, before the readiness line;
- inotify on the directory (:class:`mqcore.watch.DirWatcher` on the event
  loop), folded into the set by :meth:`WatchedDirDaemon.on_arrived` and
  :meth:`WatchedDirDaemon.on_left`;
- a full rescan every ``--rescan-interval`` seconds, which also re-establishes
  a lost watch (recreating the tree if the directory was removed), and is
  requested early on ``IN_Q_OVERFLOW`` or when the directory goes away.

The loop (:meth:`WatchedDirDaemon.run`) never polls: it does one pass of work,
then waits for the wake event or a timeout (the next rescan, or earlier if the
subclass says so).

inotify events are read in batches: when the descriptor becomes readable the
daemon stops watching it for :attr:`WatchedDirDaemon.batch_window_seconds`,
letting the kernel queue what arrives meanwhile, then reads everything queued
at once. Under load that is one wake of the process per window instead of one
per event (the wake, not the event, was most of the cost: issue 12). The
kernel queue holds ``/proc/sys/fs/inotify/max_queued_events`` (16,384 by
default) events; beyond that ``IN_Q_OVERFLOW`` requests a rescan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import click

from daemons import _watchdog
from daemons._runtime import (
    EXIT_OK,
    build_settings,
    check_interval,
    check_root,
    freeze_start_up,
    install_stop_signals,
    log_sources,
    run,
    run_command,
    sd_notify,
    setup_logging,
    wait_for_wake,
)
from mqcore.fsinfo import journal_warning, mount_of
from mqcore.protocol import Store
from mqcore.watch import DirWatcher

T = TypeVar("T")


class WatchedDirDaemon:
    """Base of a daemon that reacts to the files of one directory of a root.

    Subclasses set :attr:`log`, :attr:`dir_label` and :attr:`watch_tag`, and
    implement :meth:`_watched_dir`, :meth:`on_arrived`, :meth:`on_left`,
    :meth:`rescan`, :meth:`work` and :meth:`log_start_up`.

    Args:
        store: The protocol on the root.
        rescan_interval_seconds: Seconds between full rescans of the directory.
        watcher: inotify watcher to use for the directory, or None to rely on rescans.
    """

    #: Logger of the daemon (``mq.mover``, ``mq.reaper``).
    log: logging.Logger
    #: Directory name for log lines, e.g. ``"delay/"``.
    dir_label: str
    #: Watch tag of the directory in the :class:`DirWatcher`.
    watch_tag: str
    #: Seconds between the descriptor becoming readable and the read of every event queued by then.
    batch_window_seconds: float = 0.0
    #: Whether :meth:`on_left` is wanted (False: inotify reports arrivals only, half the events).
    watch_departures: bool = True

    def __init__(self, store: Store, *, rescan_interval_seconds: float, watcher: DirWatcher | None) -> None:
        self.store = store
        self.rescan_interval_seconds = rescan_interval_seconds
        self.watcher = watcher
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._rescan_requested = False
        self._reading = False
        self._read_timer: asyncio.TimerHandle | None = None

    @property
    def watching(self) -> bool:
        """True while inotify watches the directory."""
        return self.watcher is not None and self.watcher.watching(self.watch_tag)

    # -- hooks ------------------------------------------------------------

    def _watched_dir(self) -> str:
        """Path of the watched directory."""
        raise NotImplementedError

    def on_arrived(self, name: str) -> None:
        """A file ``name`` appeared in the directory (on the loop; must not block)."""
        raise NotImplementedError

    def on_left(self, name: str) -> None:
        """A file ``name`` left the directory (on the loop; must not block)."""
        raise NotImplementedError

    def _after_events(self) -> None:
        """Called after each batch of inotify events (on the loop)."""

    async def rescan(self) -> None:
        """List the directory (see :meth:`_list_watched`) and fold what is found in."""
        raise NotImplementedError

    def _begin_pass(self) -> None:
        """Called at the start of each loop pass, right after the wake event is cleared."""

    async def work(self, stop: asyncio.Event) -> None:
        """Handle what is known (one pass; return early when ``stop`` is set)."""
        raise NotImplementedError

    def _more_work(self) -> bool:
        """True if the loop should run another pass at once instead of sleeping."""
        return False

    def _sleep_timeout(self, until_rescan_seconds: float) -> float:
        """Seconds to sleep, given the seconds until the next rescan."""
        return until_rescan_seconds

    def log_start_up(self) -> None:
        """Log what the start-up scan found (before the readiness line)."""
        raise NotImplementedError

    # -- inotify ------------------------------------------------------------

    def _request_rescan(self) -> None:
        self._rescan_requested = True
        self._wake.set()

    def _on_readable(self) -> None:
        """inotify descriptor readable (on the loop): read now, or start reading in batch windows."""
        if self.batch_window_seconds <= 0:
            self._read_events()
            return
        assert self.watcher is not None
        self._loop.remove_reader(self.watcher.fileno())
        self._reading = False
        self._read_timer = self._loop.call_later(self.batch_window_seconds, self._read_batch)

    def _read_batch(self) -> None:
        """End of a batch window: read every queued event.

        While events keep coming, the next read is after another window (a
        timer: one wake per window); once a window brought none, the daemon
        waits for the descriptor again (no wake at all while idle).
        """
        self._read_timer = None
        assert self.watcher is not None
        if self._read_events():
            self._read_timer = self._loop.call_later(self.batch_window_seconds, self._read_batch)
        else:
            self._loop.add_reader(self.watcher.fileno(), self._on_readable)
            self._reading = True

    def _read_events(self) -> bool:
        """Dispatch the queued events to the hooks (on the loop); never blocks.

        Returns:
            True if there were any.
        """
        assert self.watcher is not None
        changes = self.watcher.read_changes()
        if changes.overflow:
            self.log.warning("inotify queue overflowed, rescanning %s", self.dir_label)
            self._request_rescan()
        if changes.gone:
            self.log.warning("%s was removed or moved, recreating and rescanning", self.dir_label)
            self._request_rescan()
        on_arrived, on_left = self.on_arrived, self.on_left
        for name, arrived in changes.names:
            if arrived:
                on_arrived(name)
            else:
                on_left(name)
        self._after_events()
        return bool(changes.names or changes.overflow or changes.gone)

    # -- start-up, rescans --------------------------------------------------

    async def start(self) -> None:
        """Watch the directory (if inotify is there), then rescan it once.

        The watch comes first, so a file arriving during the scan is seen by
        one or the other.
        """
        if self.watcher is not None:
            self._loop.add_reader(self.watcher.fileno(), self._on_readable)
            self._reading = True
        await self.rescan()

    async def _list_watched(self, scan: Callable[[], list[T]]) -> list[T] | None:
        """Re-establish the watch if lost, then run ``scan`` in a worker thread.

        Returns:
            What ``scan`` returned, or None if it (or recreating the tree)
            failed with an OSError (e.g. EIO), which is logged; the next
            rescan tries again.
        """
        self._rescan_requested = False
        try:
            if not self.watching:
                # The directory may have been removed (dir_gone); Layout.create is idempotent.
                await asyncio.to_thread(self.store.layout.create)
                if self.watcher is not None:
                    self.watcher.watch(self._watched_dir(), self.watch_tag, departures=self.watch_departures)
            return await asyncio.to_thread(scan)
        except OSError as exc:
            self.log.error("rescan of %s failed error=%s", self.dir_label, exc)
            return None

    # -- the loop -----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, sleeping until woken, the next rescan or the subclass's timeout."""
        stop_waiter = asyncio.ensure_future(stop.wait())
        stop_waiter.add_done_callback(lambda _: self._wake.set())
        next_rescan = self._loop.time() + self.rescan_interval_seconds
        try:
            while not stop.is_set():
                self._wake.clear()
                self._begin_pass()
                if self._rescan_requested or self._loop.time() >= next_rescan:
                    await self.rescan()
                    next_rescan = self._loop.time() + self.rescan_interval_seconds
                await self.work(stop)
                if stop.is_set() or self._rescan_requested or self._more_work():
                    continue
                await wait_for_wake(self._wake, self._sleep_timeout(next_rescan - self._loop.time()))
        finally:
            stop_waiter.cancel()

    def close(self) -> None:
        """Stop reading inotify events and close the watcher."""
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self.watcher is not None:
            if self._reading:
                self._loop.remove_reader(self.watcher.fileno())
                self._reading = False
            self.watcher.close()


async def serve_daemon(
    name: str,
    log: logging.Logger,
    root: str,
    make: Callable[[Store], WatchedDirDaemon],
    shutdown_trigger: asyncio.Event | None,
) -> None:
    """Run a watched-directory daemon until ``shutdown_trigger`` is set (or SIGTERM/SIGINT without one).

    Logs ``<name> ready root=...`` and notifies systemd (``READY=1``) once the
    start-up scan is done and the watch is in place; logs ``<name> stopped``
    at the end.

    Args:
        name: Program name, e.g. ``mq-mover``.
        log: The daemon's logger.
        root: Root of the folder tree.
        make: Builds the daemon on the opened store.
        shutdown_trigger: Set it to stop; when None, SIGTERM and SIGINT set an
            internal one. The current batch is finished first.
    """
    stop = shutdown_trigger if shutdown_trigger is not None else asyncio.Event()
    if shutdown_trigger is None:
        install_stop_signals(stop)
    store = await asyncio.to_thread(Store, root)
    journal = journal_warning(store.layout.root, mount_of(store.layout.root))
    if journal:
        log.warning("%s", journal)
    daemon = make(store)
    try:
        await daemon.start()
        daemon.log_start_up()
        freeze_start_up(name)
        log.info("%s ready root=%s", name, store.layout.root)
        sd_notify("READY=1")
        watchdog = asyncio.create_task(_watchdog.run(lambda: f"{name}: running"))
        try:
            await daemon.run(stop)
        finally:
            watchdog.cancel()
    finally:
        daemon.close()
        store.close()
        log.info("%s stopped", name)


#: The options of both mq-mover and mq-reaper (``--root``, ``root_option``; ``metrics_options``), by field name.
COMMON_FIELDS = ("root", "metrics_port", "metrics_address")


def run_cli(
    ctx: click.Context, factory: Callable[..., Any], serve: Callable[[Any], Awaitable[None]], **fields: Any
) -> int:
    """Body of a daemon's click command: logging, settings (CLI > env > TOML > defaults), run ``serve``.

    Args:
        ctx: The click context; the options every daemon has (:data:`COMMON_FIELDS` and
            ``--log-level``) are read from its ``params``.
        factory: The settings dataclass.
        serve: The daemon's ``serve(settings)``.
        fields: The daemon's own settings fields.
    Returns:
        0 after SIGTERM/SIGINT.
    Raises:
        ConfigError: A setting is out of range, or the root is unusable.
    """
    log_level: str = ctx.params["log_level"]
    common = {name: ctx.params[name] for name in COMMON_FIELDS}
    setup_logging(log_level)
    log_sources(ctx, ctx.params)
    settings = build_settings(ctx, factory, **common, **fields, log_level=log_level.upper())
    settings = dataclasses.replace(settings, root=check_root(settings.root))
    stop_timeout: float = ctx.params["stop_timeout"]
    build_settings(ctx, lambda seconds: check_interval("stop-timeout", seconds), seconds=stop_timeout)
    return run(lambda: _serve_to_exit(serve, settings), stop_timeout_seconds=stop_timeout, root=settings.root)


async def _serve_to_exit(serve: Callable[[Any], Awaitable[None]], settings: Any) -> int:
    await serve(settings)
    return EXIT_OK


class ConsoleMain(Protocol):
    """A console script's ``main``."""

    def __call__(self, argv: list[str] | None = None) -> int: ...


def console_main(command: click.Command, prog_name: str) -> ConsoleMain:
    """The console script ``main(argv=None) -> int`` of a daemon's click ``command`` (pyproject ``[project.scripts]``).

    ``main``'s argv is the arguments without the program name (default ``sys.argv[1:]``); it
    returns the exit code: 0 after SIGTERM/SIGINT, 64 usage error, 78 config error.
    """

    def main(argv: list[str] | None = None) -> int:
        return run_command(command, argv, prog_name)

    main.__doc__ = f"Console script ``{prog_name}``: the exit code (0 after SIGTERM/SIGINT, 64 usage, 78 config error)."
    return main
