"""Which filesystem a root is on, and whether other hosts may share it (docs/protocol.md section 13).

On a shared filesystem (GlusterFS through FUSE, NFS, CephFS, ...) inotify sees only the changes
made through the local kernel, so a daemon must look for other hosts' sends, leases and deletes
itself; and the durability of a 201 depends on the server's options, which a client cannot
always read. This module reads ``/proc/mounts`` (Linux, ``proc(5)``) to tell which case a root
is in. No I/O beyond that file and one ``stat``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: Filesystem types (``/proc/mounts`` third field) whose files other hosts may change behind the
#: local kernel's back. Any ``fuse.*`` type counts: a FUSE daemon may serve a network filesystem.
SHARED_TYPES = frozenset({"nfs", "nfs4", "ceph", "cifs", "smb3", "9p", "lustre", "gpfs", "ocfs2", "gfs2", "afs"})
#: Filesystem types of local disks and memory: one kernel's, whose ``rename(2)`` returns 0 only after it
#: renamed and whose ``fsync`` never waits for another host. Anything else (shared, FUSE, unknown) is
#: treated as possibly remote by the rules that need "local" (a lease's rename check, docs/protocol.md
#: 13.5; lone operations on mq's loop thread, ``daemons._inline``).
LOCAL_TYPES = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "f2fs", "bcachefs", "jfs", "reiserfs", "zfs", "overlay"}
)


@dataclass(frozen=True)
class MountInfo:
    """One line of ``/proc/mounts``: the filesystem a path is on.

    Attributes:
        source: What was mounted, e.g. ``127.0.0.2:/mqvol`` or ``/dev/vda``.
        mount_point: Where, e.g. ``/mnt/mq``.
        fstype: The type, e.g. ``fuse.glusterfs``, ``nfs4``, ``ext4``.
        journal: For ext2/ext3/ext4 (:func:`ext_journal`): True if the filesystem has a journal, False
            if it has none (ext2 never has; docs/protocol.md section 5 requires journaled metadata), None
            if that cannot be told, or for any other type.
    """

    source: str
    mount_point: str
    fstype: str
    journal: bool | None = None

    @property
    def shared(self) -> bool:
        """True if other hosts may share this filesystem (network or FUSE)."""
        return self.fstype in SHARED_TYPES or self.fstype == "fuse" or self.fstype.startswith("fuse.")

    @property
    def local(self) -> bool:
        """True for a local disk or memory filesystem (:data:`LOCAL_TYPES`); False for any other type."""
        return self.fstype in LOCAL_TYPES

    @property
    def glusterfs(self) -> bool:
        """True for a GlusterFS FUSE mount."""
        return self.fstype == "fuse.glusterfs"


def _unescape(field: str) -> str:
    """Undo ``/proc/mounts``' octal escapes (``\\040`` is a space)."""
    if "\\" not in field:
        return field
    return field.encode("latin-1").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def mount_of(
    path: str | os.PathLike[str], mounts_file: str = "/proc/mounts", proc: str = "/proc", sys: str = "/sys"
) -> MountInfo | None:
    """The mount that ``path`` is on: the longest mount point that contains its real path.

    Args:
        path: Any existing path (the root).
        mounts_file: The mount table to read (``/proc/mounts``; a test may pass another).
        proc, sys: Where procfs and sysfs are mounted, for :attr:`MountInfo.journal` (:func:`ext_journal`).
    Returns:
        The mount, or None if the table cannot be read (not Linux) or has no match.
    """
    real = os.path.realpath(path)
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: MountInfo | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = MountInfo(_unescape(fields[0]), point, fields[2])
    if best is not None and best.fstype in EXT_TYPES:
        best = MountInfo(best.source, best.mount_point, best.fstype, ext_journal(real, best.fstype, proc, sys))
    return best


#: The ext family's types: whether one has a journal is told by :func:`ext_journal`.
EXT_TYPES = frozenset({"ext2", "ext3", "ext4"})


def ext_journal(path: str, fstype: str, proc: str = "/proc", sys: str = "/sys") -> bool | None:
    """Whether the ext2/ext3/ext4 filesystem that ``path`` is on has a journal (Linux; no privilege needed).

    ext2 never has one. For ext3/ext4 the kernel's name of the device (``vda``, ``loop0``, ``dm-0``:
    the target of ``<sys>/dev/block/MAJOR:MINOR`` of ``path``'s ``st_dev``) is looked up in
    ``<sys>/fs/ext4/<name>/journal_task`` (recent kernels: ``<none>`` without a journal, else the pid
    of its jbd2 thread, an internal or an external journal alike); on an older kernel, in
    ``<proc>/fs/jbd2/``, which has ``<name>-<journal inode>`` (e.g. ``vda-8``) for each mounted
    filesystem with an internal journal, and the journal device's own name for an external one (so
    a missing entry means "no journal" only when no external journal is mounted at all).

    Args:
        path: An existing path on the filesystem (its real path).
        fstype: Its type in ``/proc/mounts``.
        proc, sys: Where procfs and sysfs are mounted (a test may pass a tree of its own).
    Returns:
        True (journal), False (none), or None: not an ext type, or it cannot be told.
    """
    if fstype == "ext2":
        return False
    if fstype not in EXT_TYPES:
        return None
    try:
        dev = os.stat(path).st_dev
        name = os.path.basename(os.readlink(os.path.join(sys, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}")))
    except OSError:
        return None
    try:
        with open(os.path.join(sys, "fs", "ext4", name, "journal_task"), encoding="ascii", errors="replace") as f:
            task = f.read().strip()
        if task:
            return task != "<none>"
    except OSError:
        pass
    try:
        entries = os.listdir(os.path.join(proc, "fs", "jbd2"))
    except OSError:
        return None
    if any(entry.rpartition("-")[0] == name and entry.rpartition("-")[2].isdigit() for entry in entries):
        return True
    external = any(not entry.rpartition("-")[2].isdigit() for entry in entries)
    return None if external or not os.path.isdir(os.path.join(sys, "fs", "ext4", name)) else False


def journal_warning(root: str, mount: MountInfo | None) -> str | None:
    """The one warning line a daemon logs at start when ``root`` is on an ext filesystem without a journal, or None.

    On ext4 without a journal even a file's ``fsync`` does not write the block bitmaps and group
    descriptors of what it allocated: a power cut can lose acknowledged messages (docs/performance.md,
    the power-cut test of stop 19; docs/protocol.md section 5 requires journaled metadata).
    """
    if mount is None or mount.journal is not False:
        return None
    return (
        f"root {root} is on {mount.fstype} without a journal ({mount.source} at {mount.mount_point}): a power cut "
        "can lose acknowledged messages, even fsynced ones; docs/protocol.md section 5 requires a filesystem "
        "with journaled metadata (ext4 with its default has_journal, xfs, btrfs)"
    )


def dir_stamp(path: str | os.PathLike[str]) -> tuple[int, int, int]:
    """A cheap change stamp of a directory: ``(st_ino, st_mtime_ns, st_ctime_ns)`` from one ``stat``.

    A create, rename into or out of, or unlink in the directory, through any host, changes its
    ``mtime`` (POSIX: a directory's mtime is updated when an entry is added or removed); on
    GlusterFS with the kernel attribute cache off another mount sees the new value within
    ~10-80 ms (docs/cluster.md). A different ``st_ino`` means the directory was replaced.

    Raises:
        OSError: ``stat`` failed (``ENOENT``: the directory is gone).
    """
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


#: A directory stamp is trusted only if its mtime is at least this many ns older than the clock reading taken just
#: before its ``stat``: the kernel's coarse clock ticks every few ms, so a change in the same tick as the stamp may
#: leave it equal, and on a shared filesystem the host that made the change may have a clock this far ahead of ours
#: (docs/protocol.md 13.4).
SETTLE_NS = 200_000_000


def settled_dir_stamp(path: str | os.PathLike[str]) -> tuple[tuple[int, int, int], bool]:
    """(:func:`dir_stamp` of ``path``, whether it is settled: its mtime at least :data:`SETTLE_NS` older than now).

    A cache kept against a directory's stamp may be reused while the stamp is unchanged only if it was
    settled when read: otherwise a change in the same clock tick (or made by a host whose clock is ahead,
    within :data:`SETTLE_NS`) could leave the stamp equal. An mtime in the future of this host's clock is
    never settled. The one rule of every such cache in mq (queue listings, ``GET /``, ``GET /metrics``).

    Raises:
        OSError: ``stat`` failed (``ENOENT``: the directory is gone).
    """
    taken = time.time_ns()
    stamp = dir_stamp(path)
    return stamp, stamp[1] < taken - SETTLE_NS


#: Volume options a GlusterFS volume needs for "every 201 survives a brick crash" (docs/protocol.md 13.1).
GLUSTER_REQUIRED_OPTIONS = (
    "performance.write-behind off",
    "performance.flush-behind off",
    "cluster.ensure-durability on",
    "cluster.quorum-type auto",
)


def shared_warning(root: str, mount: MountInfo | None) -> str | None:
    """The one warning line ``mq`` logs at start when ``root`` is on a shared filesystem, or None.

    A client cannot read a GlusterFS volume's options through its mount (``gluster volume get``
    needs the servers' glusterd), so the line names the options to check and where.
    """
    if mount is None or not mount.shared:
        return None
    text = (
        f"root {root} is on a shared filesystem ({mount.fstype} {mount.source} at {mount.mount_point}): "
        "other hosts' changes are found by directory checks and rescans, not inotify; "
    )
    if mount.glusterfs:
        volume = mount.source.rpartition(":/")[2] or "VOLUME"
        return text + (
            f"a 201 survives a brick crash only with volume options {', '.join(GLUSTER_REQUIRED_OPTIONS)} "
            f"and replica >= 3 (check on a server: gluster volume get {volume} all; docs/cluster.md)"
        )
    return text + "durability depends on the server's options (docs/cluster.md)"


#: How long a :class:`DirtyMeter` keeps a reading of ``/proc/meminfo``, in seconds (a read costs ~30 us here).
DIRTY_REFRESH_SECONDS = 0.05


class DirtyMeter:
    """The machine's dirty page cache (``/proc/meminfo`` ``Dirty:`` + ``Writeback:``), read at most every ``refresh`` s.

    What a ``syncfs`` of a filesystem may have to write back before it returns (the counts are the
    whole machine's: an over-estimate for one filesystem). Thread-safe: concurrent callers may each
    read the file once; the last reading wins.

    Args:
        meminfo: The file to read (``/proc/meminfo``; a test may pass another).
        refresh: Seconds a reading is kept (:data:`DIRTY_REFRESH_SECONDS`).
    """

    def __init__(self, meminfo: str = "/proc/meminfo", refresh: float = DIRTY_REFRESH_SECONDS) -> None:
        self.meminfo = meminfo
        self.refresh = refresh
        #: (monotonic time of the next read, the last reading).
        self._reading: tuple[float, int | None] = (0.0, None)

    def dirty_bytes(self) -> int | None:
        """Dirty + under-writeback bytes at the last reading (re-read when older than ``refresh``); None: unreadable."""
        now = time.monotonic()
        due, value = self._reading
        if now < due:
            return value
        value = read_dirty(self.meminfo)
        self._reading = (now + self.refresh, value)
        return value


def read_dirty(meminfo: str = "/proc/meminfo") -> int | None:
    """``Dirty:`` + ``Writeback:`` of ``meminfo`` in bytes, or None if it cannot be read or has neither line."""
    try:
        fd = os.open(meminfo, os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 16384)
        finally:
            os.close(fd)
    except OSError:
        return None
    total = 0
    try:
        for key in (b"\nDirty:", b"\nWriteback:"):
            start = text.index(key) + len(key)
            total += int(text[start : text.index(b" kB", start)]) * 1024
    except ValueError:
        return None
    return total
