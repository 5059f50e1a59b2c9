"""Which filesystem a root is on (mqcore.fsinfo): the warning mq logs at start on a shared filesystem."""

from __future__ import annotations

import os
import time

from mqcore.fsinfo import dir_stamp, mount_of, shared_warning

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
