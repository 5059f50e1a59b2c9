"""Which filesystem a root is on (mqcore.fsinfo): the warnings mq logs at start (shared, no journal); dirty data."""

from __future__ import annotations

import os
import time

import pytest

from mqcore.fsinfo import (
    SETTLE_NS,
    DirtyMeter,
    MountInfo,
    dir_stamp,
    ext_journal,
    journal_warning,
    mount_of,
    read_dirty,
    settled_dir_stamp,
    shared_warning,
)

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
127.0.0.2:/mqvol /mnt/gluster fuse.glusterfs rw,relatime,user_id=0 0 0
srv:/export /mnt/with\\040space nfs4 rw 0 0
tmpfs /mnt/gluster/inner tmpfs rw 0 0
"""


def table(tmp_path):
    path = tmp_path / "mounts"
    path.write_text(MOUNTS)
    return str(path)


def test_the_longest_mount_point_containing_the_path_wins(tmp_path):
    mounts = table(tmp_path)
    assert mount_of("/mnt/gluster/root", mounts).fstype == "fuse.glusterfs"
    assert mount_of("/mnt/gluster/inner/x", mounts).fstype == "tmpfs"
    assert mount_of("/mnt/glusterish", mounts).fstype == "ext4"  # a prefix of a name is not a parent
    assert mount_of("/mnt/with space/q", mounts).fstype == "nfs4"  # /proc/mounts escapes spaces as \040


def test_mq_warns_once_on_glusterfs_naming_the_volume_and_its_required_options(tmp_path):
    mounts = table(tmp_path)
    warning = shared_warning("/mnt/gluster/root", mount_of("/mnt/gluster/root", mounts))
    assert warning and "gluster volume get mqvol all" in warning and "performance.write-behind off" in warning
    assert "durability depends" in shared_warning("/mnt/with space/q", mount_of("/mnt/with space/q", mounts))
    assert shared_warning("/srv", mount_of("/srv", mounts)) is None  # ext4: nothing to say
    assert shared_warning("/x", None) is None


def test_a_directory_stamp_changes_with_every_entry_added_or_removed(tmp_path):
    before = dir_stamp(tmp_path)
    time.sleep(0.05)  # mtimes come from the kernel's coarse clock: a few ms apart at least
    (tmp_path / "a").write_bytes(b"")
    added = dir_stamp(tmp_path)
    time.sleep(0.05)
    os.rename(tmp_path / "a", tmp_path / "b")
    renamed = dir_stamp(tmp_path)
    assert len({before, added, renamed}) == 3


def test_a_stamp_is_settled_only_once_its_mtime_is_older_than_the_settle_margin(tmp_path):
    """A cache keyed by a directory's stamp may be kept only if a later change cannot leave the stamp equal."""
    before = time.time_ns()
    (tmp_path / "a").write_bytes(b"")
    stamp, settled = settled_dir_stamp(tmp_path)
    assert stamp == dir_stamp(tmp_path)
    if time.time_ns() - before < SETTLE_NS:  # not preempted for the whole margin on a loaded machine
        assert not settled  # changed just now: a change in the same clock tick would leave the stamp equal

    now = time.time_ns()
    os.utime(tmp_path, ns=(now, now - 2 * SETTLE_NS))
    assert settled_dir_stamp(tmp_path)[1]

    os.utime(tmp_path, ns=(now, now + 60 * 10**9))  # set by a host whose clock is a minute ahead
    assert not settled_dir_stamp(tmp_path)[1]

    with pytest.raises(FileNotFoundError):
        settled_dir_stamp(tmp_path / "gone")


def test_a_lease_checks_its_rename_only_where_a_rename_may_report_success_without_renaming(tmp_path):
    """docs/protocol.md 13.5: GlusterFS's FUSE client (and any network or FUSE filesystem) may answer 0 for a
    rename that did nothing; a local filesystem's rename(2) may not, so a lease skips its lstat there."""
    from mqcore.protocol import Store
    from mqcore.protocol._base import renames_may_lie

    mounts = table(tmp_path)
    assert renames_may_lie("/mnt/gluster/root", mounts)
    assert renames_may_lie("/mnt/with space/q", mounts)  # nfs4
    assert not renames_may_lie("/srv", mounts)  # ext4
    assert not renames_may_lie("/mnt/gluster/inner/x", mounts)  # tmpfs inside the volume's mount point
    assert renames_may_lie("/srv", str(tmp_path / "no-such-table"))  # cannot tell: check
    store = Store(tmp_path / "root")
    assert store.renames_may_lie == renames_may_lie(str(tmp_path / "root"))
    assert store.at(1).renames_may_lie == store.renames_may_lie


def _sysfs(tmp_path, *, task: str | None, jbd2: list[str] | None, ext4_dir: bool = True) -> tuple[str, str]:
    """A /proc- and /sys-like tree for the filesystem of ``tmp_path`` as device ``fake0``: (proc, sys)."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    dev = os.stat(tmp_path).st_dev
    (sys / "dev" / "block").mkdir(parents=True)
    os.symlink("../../devices/virtual/block/fake0", sys / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}")
    if ext4_dir:
        (sys / "fs" / "ext4" / "fake0").mkdir(parents=True)
        if task is not None:
            (sys / "fs" / "ext4" / "fake0" / "journal_task").write_text(task + "\n")
    if jbd2 is not None:
        (proc / "fs" / "jbd2").mkdir(parents=True)
        for name in jbd2:
            (proc / "fs" / "jbd2" / name).mkdir()
    return str(proc), str(sys)


@pytest.mark.parametrize(
    ("task", "jbd2", "ext4_dir", "journal"),
    [
        ("<none>", [], True, False),  # journal_task (recent kernels) says no journal
        ("4242", [], True, True),  # the pid of its jbd2 thread
        (None, ["other1-8", "fake0-8"], True, True),  # older kernels: the internal journal's jbd2 entry
        (None, ["other1-8"], True, False),  # none for it, and no external journal anywhere
        (None, ["other1-8", "sdb1"], True, None),  # an external journal exists: it may be this one's
        (None, None, True, None),  # no /proc/fs/jbd2 to look at
        (None, [], False, None),  # not a device the ext4 driver has mounted: the name is not known
    ],
)
def test_ext_journal_reads_sysfs_then_jbd2(tmp_path, task, jbd2, ext4_dir, journal):
    proc, sys = _sysfs(tmp_path, task=task, jbd2=jbd2, ext4_dir=ext4_dir)
    assert ext_journal(str(tmp_path), "ext4", proc, sys) is journal
    assert ext_journal(str(tmp_path), "ext3", proc, sys) is journal
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/fake0 {tmp_path} ext4 rw 0 0\n")
    assert mount_of(tmp_path, str(mounts), proc, sys) == MountInfo("/dev/fake0", str(tmp_path), "ext4", journal)
    assert (journal_warning("/r", mount_of(tmp_path, str(mounts), proc, sys)) is not None) == (journal is False)


def test_ext_journal_of_other_types(tmp_path):
    proc, sys = _sysfs(tmp_path, task="4242", jbd2=["fake0-8"])
    assert ext_journal(str(tmp_path), "ext2", proc, sys) is False  # never: even an ext3 image mounted as ext2
    assert ext_journal(str(tmp_path), "xfs", proc, sys) is None
    assert ext_journal(str(tmp_path / "missing"), "ext4", proc, sys) is None  # no stat
    assert journal_warning("/r", None) is None


def test_dirty_meter_reads_dirty_and_writeback(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683656 kB\nDirty:              8116 kB\nWriteback:           100 kB\n")
    meter = DirtyMeter(str(meminfo), refresh=3600)
    assert meter.dirty_bytes() == (8116 + 100) * 1024
    meminfo.write_text("MemTotal:       24683656 kB\nDirty:            999999 kB\nWriteback:             0 kB\n")
    assert meter.dirty_bytes() == (8116 + 100) * 1024  # kept for ``refresh`` seconds
    assert DirtyMeter(str(meminfo), refresh=0).dirty_bytes() == 999999 * 1024
    meminfo.write_text("MemTotal:       24683656 kB\n")
    assert read_dirty(str(meminfo)) is None
    assert read_dirty(str(tmp_path / "missing")) is None
    assert isinstance(read_dirty(), int)  # this machine's /proc/meminfo
