"""Which filesystem a root is on, and whether other hosts may share it (docs/protocol.md section 13).

On a shared filesystem (GlusterFS through FUSE, NFS, CephFS, ...) inotify sees only the changes
made through the local kernel, so a daemon must look for other hosts' sends, leases and deletes
itself; and the durability of a 201 depends on the server's options, which a client cannot
always read. This module reads ``/proc/mounts`` (Linux, ``proc(5)``) to tell which case a root
is in. No I/O beyond that file and one ``stat``.
"""

from __future__ import annotations

import os
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
    """

    source: str
    mount_point: str
    fstype: str

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


def mount_of(path: str | os.PathLike[str], mounts_file: str = "/proc/mounts") -> MountInfo | None:
    """The mount that ``path`` is on: the longest mount point that contains its real path.

    Args:
        path: Any existing path (the root).
        mounts_file: The mount table to read (``/proc/mounts``; a test may pass another).
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
    return best


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
