"""Directory watching with inotify, as a plain file descriptor.

The daemons attach :meth:`DirWatcher.fileno` to their event loop; anything
else can ``select`` on it. inotify sees only changes made through this
kernel: on NFS and other shared filesystems, changes from other hosts are
found by the periodic rescans the daemons also run (``rescan_interval``).
Where inotify is unavailable :func:`open_watcher` returns None and the
rescans do all the work.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

try:  # pragma: no cover - import guard
    from inotify_simple import INotify
    from inotify_simple import flags as _flags
except ImportError:  # pragma: no cover
    INotify = None
    _flags = None


@dataclass(frozen=True, slots=True)
class DirEvent:
    """One change in a watched directory.

    Attributes:
        tag: What the caller registered the directory as (e.g. a queue name).
        name: The entry's file name ("" for events about the directory itself).
        arrived: A file was created in, or renamed into, the directory.
        left: A file was unlinked from, or renamed out of, the directory.
        dir_gone: The watched directory itself was deleted or moved.
        overflow: Events were lost; rescan everything.
    """

    tag: str
    name: str
    arrived: bool = False
    left: bool = False
    dir_gone: bool = False
    overflow: bool = False


class DirWatcher:
    """inotify watches on several directories, each with a caller-chosen tag."""

    def __init__(self) -> None:
        assert INotify is not None
        self._ino = INotify(nonblocking=True)
        self._tags: dict[int, str] = {}
        self._wds: dict[str, int] = {}
        self._mask = (
            _flags.MOVED_TO
            | _flags.CREATE
            | _flags.MOVED_FROM
            | _flags.DELETE
            | _flags.DELETE_SELF
            | _flags.MOVE_SELF
            | _flags.ONLYDIR
        )

    def fileno(self) -> int:
        """The inotify descriptor: readable when events are waiting."""
        return int(self._ino.fileno())

    def watch(self, path: str, tag: str) -> bool:
        """Watch ``path`` under ``tag``; False if the kernel refused (missing dir, no watches left)."""
        if tag in self._wds:
            return True
        try:
            wd = self._ino.add_watch(path, self._mask)
        except FileNotFoundError:
            logger.debug("not watched path=%s (does not exist)", path)  # e.g. a request for a missing queue
            return False
        except OSError as exc:
            logger.warning("inotify watch failed path=%s error=%s", path, exc)
            return False
        self._tags[wd] = tag
        self._wds[tag] = wd
        return True

    def unwatch(self, tag: str) -> None:
        """Stop watching the directory registered under ``tag`` (no error if gone)."""
        wd = self._wds.pop(tag, None)
        if wd is not None:
            self._tags.pop(wd, None)
            try:
                self._ino.rm_watch(wd)
            except OSError:
                pass

    def watching(self, tag: str) -> bool:
        """True while ``tag``'s directory is watched."""
        return tag in self._wds

    def read(self) -> list[DirEvent]:
        """Return the events waiting now (never blocks)."""
        out: list[DirEvent] = []
        try:
            raw = self._ino.read(timeout=0)
        except BlockingIOError:
            return out
        for ev in raw:
            if ev.mask & _flags.Q_OVERFLOW:
                out.append(DirEvent(tag="", name="", overflow=True))
                continue
            tag = self._tags.get(ev.wd)
            if tag is None:
                continue
            if ev.mask & (_flags.DELETE_SELF | _flags.MOVE_SELF | _flags.IGNORED):
                self._wds.pop(tag, None)
                self._tags.pop(ev.wd, None)
                out.append(DirEvent(tag=tag, name="", dir_gone=True))
                continue
            out.append(
                DirEvent(
                    tag=tag,
                    name=ev.name,
                    arrived=bool(ev.mask & (_flags.MOVED_TO | _flags.CREATE)),
                    left=bool(ev.mask & (_flags.MOVED_FROM | _flags.DELETE)),
                )
            )
        return out

    def close(self) -> None:
        """Close the descriptor."""
        self._ino.close()


def open_watcher() -> DirWatcher | None:
    """A new :class:`DirWatcher`, or None where inotify is missing or disabled.

    Setting the environment variable ``MQ_NO_INOTIFY=1`` disables it (to test
    or run the rescan-only path that shared filesystems rely on).
    """
    if INotify is None or os.environ.get("MQ_NO_INOTIFY") == "1":
        return None
    try:
        return DirWatcher()
    except OSError as exc:
        logger.warning("inotify unavailable, relying on rescans error=%s", exc)
        return None
