"""mq-reaper: unlinks deleted messages and queues, and drops unacknowledged writes.

Deleting is a rename into ``remove/`` (``docs/protocol.md``, "Delete" and
"Delete queue"); this daemon makes the space free again:

- every entry of ``remove/`` is unlinked; a deleted queue's directory
  (``remove/Q.TOKEN.queue``) is removed with everything in it. Entries are
  found by a scan at start-up (what was there before it started), by inotify
  on ``remove/`` as they arrive, and by a full rescan every
  ``--rescan-interval`` seconds (NFS, lost events, no inotify);
- at start-up and on every rescan, files in ``new/`` older than
  ``--new-grace`` seconds are unlinked (``Store.sweep_new``): a sender answers
  201 only after its file has left ``new/``, so such a file belongs to a
  writer that died before acknowledging it, and it must never be delivered.

All unlinks run in a worker thread in batches, so a flood of deletes (or one
huge queue directory) never blocks the event loop; arrivals during a batch
simply join the next one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from dataclasses import dataclass

import click

from daemons._runtime import (
    check_interval,
    check_log_level,
    check_root_value,
    config_option,
    log_level_option,
    root_option,
    run_command,
)
from daemons._watched import WatchedDirDaemon, run_cli, serve_daemon
from mqcore.names import REMOVED_QUEUE_SUFFIX
from mqcore.protocol import Store
from mqcore.watch import DirWatcher, open_watcher

logger = logging.getLogger("mq.reaper")

#: Default age after which a file in ``new/`` counts as abandoned, in seconds.
DEFAULT_NEW_GRACE_SECONDS = 300.0
#: Default interval between full rescans of ``remove/`` and sweeps of ``new/``, in seconds.
DEFAULT_RESCAN_INTERVAL_SECONDS = 60.0
#: Most entries of ``remove/`` removed in one worker-thread call.
REAP_BATCH = 1024
#: Watch tag of ``remove/``.
_REMOVE_TAG = "remove"


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
    log_level: str = "INFO"
    """Logging level name (``--log-level``, ``MQ_LOG_LEVEL``)."""

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            ConfigError: A value is out of range; ``details["key"]`` names the option.
        """
        check_root_value(self.root)
        check_interval("new-grace", self.new_grace_seconds)
        check_interval("rescan-interval", self.rescan_interval_seconds)
        check_log_level(self.log_level)


class Reaper(WatchedDirDaemon):
    """Removes what was moved into ``remove/`` of one root, and sweeps ``new/``.

    Args:
        store: The protocol on the root.
        new_grace_seconds: Age in seconds after which a ``new/`` file is abandoned.
        rescan_interval_seconds: Seconds between rescans and sweeps.
        watcher: inotify watcher to use for ``remove/``, or None to rely on rescans.
    """

    log = logger
    dir_label = "remove/"
    watch_tag = _REMOVE_TAG

    def __init__(
        self,
        store: Store,
        *,
        new_grace_seconds: float,
        rescan_interval_seconds: float,
        watcher: DirWatcher | None,
    ) -> None:
        super().__init__(store, rescan_interval_seconds=rescan_interval_seconds, watcher=watcher)
        self.new_grace_seconds = new_grace_seconds
        self.new_grace_ms = math.ceil(new_grace_seconds * 1000)
        #: Names in ``remove/`` to remove (a dict as an ordered set: oldest arrival first).
        self._pending: dict[str, None] = {}

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
        """inotify: the entry left ``remove/``."""
        self._pending.pop(name, None)

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
        return swept

    def _reap_batch(self, names: list[str]) -> list[tuple[str, bool | OSError]]:
        """Worker thread: remove each entry; an OSError is returned, not raised."""
        out: list[tuple[str, bool | OSError]] = []
        for name in names:
            try:
                out.append((name, self.store.reap(name)))
            except OSError as exc:
                out.append((name, exc))
        return out

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
            files = queues = 0
            for name, result in await asyncio.to_thread(self._reap_batch, batch):
                if isinstance(result, OSError):
                    # Not re-queued (that could spin); the next rescan finds it again.
                    logger.error("reap failed name=%s error=%s (retried at next rescan)", name, result)
                elif not result:
                    logger.debug("already gone name=%s", name)
                elif name.endswith(REMOVED_QUEUE_SUFFIX):
                    queues += 1
                    logger.info("removed deleted queue directory name=%s", name)
                else:
                    files += 1
                    logger.debug("reaped name=%s", name)
            if files or queues:
                logger.info("reaped files=%d queues=%d", files, queues)
            removed += files + queues
        return removed

    async def work(self, stop: asyncio.Event) -> None:
        await self.reap_pending(stop)

    def _more_work(self) -> bool:
        return bool(self._pending)

    def log_start_up(self) -> None:
        logger.info(
            "start-up scan removed=%d inotify=%s new_grace_seconds=%s rescan_interval_seconds=%s",
            len(self),
            "yes" if self.watching else "no",
            self.new_grace_seconds,
            self.rescan_interval_seconds,
        )


async def serve(settings: ReaperSettings, *, shutdown_trigger: asyncio.Event | None = None) -> None:
    """Run mq-reaper until ``shutdown_trigger`` is set (or SIGTERM/SIGINT without one).

    Logs ``mq-reaper ready root=...`` and notifies systemd (``READY=1``) once
    the start-up scan of ``remove/``, the sweep of ``new/`` and the watch are done.

    Args:
        settings: The daemon's settings.
        shutdown_trigger: Set it to stop; when None, SIGTERM and SIGINT set an
            internal one. The current batch of unlinks is finished first.
    """
    await serve_daemon(
        "mq-reaper",
        logger,
        settings.root,
        lambda store: Reaper(
            store,
            new_grace_seconds=settings.new_grace_seconds,
            rescan_interval_seconds=settings.rescan_interval_seconds,
            watcher=open_watcher(),
        ),
        shutdown_trigger,
    )


@click.command(name="mq-reaper", help="Unlink deleted messages and queues; drop abandoned writes from new/.")
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
@log_level_option
@click.pass_context
def cli(ctx: click.Context, root: str, new_grace: float, rescan_interval: float, log_level: str) -> int:
    return run_cli(
        ctx,
        ReaperSettings,
        serve,
        root=root,
        new_grace_seconds=new_grace,
        rescan_interval_seconds=rescan_interval,
        log_level=log_level,
    )


def main(argv: list[str] | None = None) -> int:
    """Console script ``mq-reaper``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).
    Returns:
        Exit code: 0 after SIGTERM/SIGINT, 64 usage error, 78 config error.
    """
    return run_command(cli, argv, "mq-reaper")


if __name__ == "__main__":
    sys.exit(main())
