"""A root on ext2/ext3/ext4 without a journal: mq, mq-mover and mq-reaper warn at start, and /readyz says so.

docs/protocol.md section 5 requires a filesystem with journaled metadata: on ext4 without a journal
even a file's fsync does not write the bitmaps and group descriptors of what it allocated, so a
power cut can lose acknowledged messages (tests/faults/test_power_cut.py). Each case runs the
three daemons on a real loop-mounted image (``mkfs``, ``mount -o loop``), as the power-cut test
does; without root the test skips locally and FAILS under ``CI=true`` (``fault_unavailable``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqcore.fsinfo import mount_of
from tests.conftest import fault_unavailable
from tests.faults.test_power_cut import run

pytestmark = pytest.mark.faults

#: The warning's fixed words (mqcore.fsinfo.journal_warning).
WARNING = "without a journal"
SECTION = "docs/protocol.md section 5"

#: (filesystem type, mkfs options, has a journal).
IMAGES = {
    "ext4-journal": ("ext4", [], True),
    "ext4-no-journal": ("ext4", ["-O", "^has_journal"], False),
    "ext3": ("ext3", [], True),
    "ext2": ("ext2", [], False),
}


@pytest.fixture(params=list(IMAGES))
def image(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """A mounted loop image of one of IMAGES: (its mount point, whether it has a journal); unmounted at teardown."""
    if os.geteuid() != 0:
        fault_unavailable("mounting a loop device needs root")
    fstype, options, journal = IMAGES[request.param]
    for tool in (f"mkfs.{fstype}", "mount", "umount"):
        if shutil.which(tool) is None:
            fault_unavailable(f"{tool} not found")
    path = tmp_path / "disk.img"
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    run(f"mkfs.{fstype}", "-q", "-F", *options, str(path))
    point = tmp_path / "mnt"
    point.mkdir()
    run("mount", "-t", fstype, "-o", "loop", str(path), str(point))
    try:
        yield point, journal
    finally:
        run("umount", str(point))


async def test_each_daemon_warns_about_a_root_without_a_journal(image, stack_factory, http):
    point, journal = image
    mount = mount_of(point)
    assert mount is not None and mount.journal is journal, mount
    stack = stack_factory(root=point / "root")
    for daemon in (stack.mq, stack.mover, stack.reaper):
        assert daemon is not None
        warned = [line for line in daemon.log.splitlines() if WARNING in line and SECTION in line]
        assert len(warned) == (0 if journal else 1), daemon.log_tail()
    async with http.get(stack.url + "/readyz") as reply:
        body = await reply.json()
    assert reply.status == 200, body  # a warning, not a failed check: sends are still served
    if journal:
        assert "warnings" not in body
    else:
        assert len(body["warnings"]) == 1 and WARNING in body["warnings"][0] and str(point) in body["warnings"][0]
