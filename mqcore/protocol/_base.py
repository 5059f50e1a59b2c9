"""What every part of the :class:`~mqcore.protocol.Store` stands on: the root, the id generator, the clock, the disk."""

from __future__ import annotations

import copy
import os
import stat
import time
from collections.abc import Callable
from typing import Self

from mqcore.errors import QueueNotFound
from mqcore.fsinfo import mount_of
from mqcore.names import IdGenerator, Layout, QueueName
from mqcore.protocol._fs import Disk, rename_if_present, storage_error

#: A clock: the current time in epoch milliseconds (UTC).
Clock = Callable[[], int]


def renames_may_lie(root: str, mounts_file: str = "/proc/mounts") -> bool:
    """True unless ``root`` is on a local filesystem, whose ``rename(2)`` returns 0 only when it renamed.

    Any other filesystem (:attr:`mqcore.fsinfo.MountInfo.local` False: network, FUSE such as
    GlusterFS's client, docs/protocol.md 13.5, or a type not known as local), or one that cannot be
    told (no mount table), may answer 0 for a rename that did nothing; a lease checks its new name there.

    Args:
        root: The store's root (an existing directory).
        mounts_file: The mount table to read (a test may pass another).
    """
    mount = mount_of(root, mounts_file)
    return mount is None or not mount.local


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (deadlines on disk use this clock)."""
    return time.time_ns() // 1_000_000


class StoreBase:
    """The root, the id generator, the clock and the disk that every concern of a store works on.

    The arguments are :class:`~mqcore.protocol.Store`'s.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        ids: IdGenerator | None = None,
        fsync: bool = True,
        clock: Clock = now_ms,
    ) -> None:
        self.layout = Layout(root)
        self.layout.create()
        self.ids = ids or IdGenerator()
        self.clock = clock
        self.disk = Disk(fsync)
        #: Whether a lease must check that its rename happened (:func:`renames_may_lie`, docs/protocol.md 13.5).
        self.renames_may_lie = renames_may_lie(self.layout.root)
        if fsync:
            self.disk.syncer.sync(self.layout.root)

    def at(self, now: int) -> Self:
        """This store with its clock stopped at ``now`` (epoch ms): one instant for several transitions.

        The copy shares the root, the id generator and the group commit of
        directory fsyncs; only its clock differs. Used where several steps must
        agree on the time (mq-reaper's sweep judged at a given time, a test's fixed instant).
        """
        stopped = copy.copy(self)
        stopped.clock = lambda: now
        return stopped

    def _now(self, now: int | None) -> int:
        """``now`` if the caller gave one (an override kept for callers that still pass it), else the clock."""
        return self.clock() if now is None else now

    def queue_exists(self, queue: QueueName) -> bool:
        """True if ``queues/<queue>`` is a directory.

        Raises:
            StorageUnavailable: The ``stat`` failed other than with ENOENT/ENOTDIR (e.g. ENOTCONN on a lost
                FUSE mount, EIO): whether the queue exists is unknown, so it must not be answered as missing.
        """
        try:
            return stat.S_ISDIR(os.stat(self.layout.queue_dir(queue)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise storage_error("stat of the queue directory", exc) from exc

    @staticmethod
    def _not_found(queue: QueueName) -> QueueNotFound:
        """The error for a queue that does not exist."""
        return QueueNotFound(f"queue {queue!r} does not exist", queue=queue)

    def _require_queue(self, queue: QueueName) -> None:
        """Raise :class:`QueueNotFound` unless ``queues/<queue>`` is a directory."""
        if not self.queue_exists(queue):
            raise self._not_found(queue)

    def _move_to_remove(self, src: str, name: str) -> bool:
        """Rename ``src`` to ``remove/<name>``; False if ``src`` is gone (somebody moved it first).

        Raises:
            StorageUnavailable: Any other rename failure.
        """
        return rename_if_present(src, self.layout.remove_path(name), "rename into remove/")

    def close(self) -> None:
        """Nothing to release today; kept so callers can treat a Store as a resource."""
