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
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

try:  # pragma: no cover - import guard
    from inotify_simple import INotify
    from inotify_simple import flags as _flags
except ImportError:  # pragma: no cover
    INotify = None
    _flags = None

#: ``struct inotify_event`` without its name: wd, mask, cookie, len (inotify(7)).
_EVENT_HEADER = struct.Struct("iIII")
#: Bytes asked for per read(2) of the descriptor; a read returns whole events only.
_READ_BYTES = 1 << 16
#: Event bits (inotify(7)), as the kernel defines them.
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_ARRIVED = _IN_MOVED_TO | _IN_CREATE
_LEFT = _IN_MOVED_FROM | _IN_DELETE
_SELF_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
#: Kinds of the events of :meth:`DirWatcher.read_tagged` (0: any other event, nothing to do).
ARRIVED, LEFT, DIR_GONE, OVERFLOW = 1, 2, 3, 4

_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()


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


@dataclass(slots=True)
class Changes:
    """What one :meth:`DirWatcher.read_changes` found, in the kernel's order.

    Attributes:
        names: ``(name, arrived)`` per entry event: ``arrived`` is True when the
            entry was created in, or renamed into, a watched directory, False when
            it was unlinked from, or renamed out of, one (only for watches made
            with ``departures=True``).
        overflow: Events were lost (``IN_Q_OVERFLOW``); rescan everything.
        gone: Tags whose directory was deleted or moved; their watch is dropped.
    """

    names: list[tuple[str, bool]] = field(default_factory=list)
    overflow: bool = False
    gone: list[str] = field(default_factory=list)


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

    def watch(self, path: str, tag: str, *, departures: bool = True) -> bool:
        """Watch ``path`` under ``tag``; False if the kernel refused (missing dir, no watches left).

        Args:
            path: The directory.
            tag: What events on it are reported as (:attr:`DirEvent.tag`).
            departures: Also report entries leaving the directory (unlink, rename out). A daemon
                that only acts on arrivals (mq-reaper) leaves them out: half the events.
        """
        if tag in self._wds:
            return True
        mask = self._mask if departures else self._mask & ~_LEFT
        try:
            wd = self._ino.add_watch(path, mask)
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

    def read_changes(self) -> Changes:
        """Read every event waiting now (never blocks), lean: one tuple per entry event.

        The same events as :meth:`read` without an object per event, for
        daemons that see thousands a second (mq-mover, mq-reaper). It reads
        the descriptor directly until it is empty.
        """
        changes = Changes()
        append = changes.names.append
        tags = self._tags
        for wd, mask, data, pos, size in self._events():
            if wd not in tags and not mask & _IN_Q_OVERFLOW:
                continue  # unwatched meanwhile
            if mask & _ARRIVED:
                append((data[pos - size : pos].rstrip(b"\0").decode(_FS_ENCODING, _FS_ERRORS), True))
            elif mask & _LEFT:
                append((data[pos - size : pos].rstrip(b"\0").decode(_FS_ENCODING, _FS_ERRORS), False))
            elif mask & _IN_Q_OVERFLOW:
                changes.overflow = True
            elif mask & _SELF_GONE:
                tag = tags.pop(wd, None)
                if tag is not None:
                    self._wds.pop(tag, None)
                    changes.gone.append(tag)
        return changes

    def read_tagged(self) -> list[tuple[str, str, int]]:
        """Every event waiting now (never blocks) as ``(tag, name, kind)``, in the kernel's order.

        :meth:`read`'s events without an object each (the ``mq`` daemon reads one per
        message it leases): ``kind`` is :data:`ARRIVED` or :data:`LEFT` for an entry,
        :data:`DIR_GONE` (name "") when the watched directory went (its watch is
        dropped), :data:`OVERFLOW` (tag and name "") when events were lost.
        """
        out: list[tuple[str, str, int]] = []
        append = out.append
        tags = self._tags
        for wd, mask, data, pos, size in self._events():
            if mask & _IN_Q_OVERFLOW:
                append(("", "", OVERFLOW))
                continue
            tag = tags.get(wd)
            if tag is None:
                continue  # unwatched meanwhile
            if mask & _SELF_GONE:
                del tags[wd]
                self._wds.pop(tag, None)
                append((tag, "", DIR_GONE))
                continue
            kind = ARRIVED if mask & _ARRIVED else LEFT if mask & _LEFT else 0
            append((tag, data[pos - size : pos].rstrip(b"\0").decode(_FS_ENCODING, _FS_ERRORS), kind))
        return out

    def _events(self) -> Iterator[tuple[int, int, bytes, int, int]]:
        """Every event waiting now (never blocks) as ``(wd, mask, buffer, end, size)``: the name is
        ``buffer[end - size : end]`` (NUL-padded), sliced only by the readers that want it.

        Reads the descriptor, up to 64 KiB at a time, until no event waits.
        """
        fd = self.fileno()
        unpack = _EVENT_HEADER.unpack_from
        header = _EVENT_HEADER.size
        while True:
            try:
                data = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                return
            end = len(data)
            pos = 0
            while pos < end:
                wd, mask, _cookie, size = unpack(data, pos)
                pos += header + size
                yield wd, mask, data, pos, size
            if end < _READ_BYTES - 4096:
                return  # short read: the queue was drained (saves the EAGAIN read)

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
