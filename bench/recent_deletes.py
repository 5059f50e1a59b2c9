"""The cost of creating a file right after many deletes on a journal-less ext4 (issue 12, stop 24).

ext4 without a journal does not hand out an inode deleted in the last minute (six while its
inode-table block is still dirty) if the group has another free one: ``find_inode_bit`` tests
each free bit of the group from its start with ``recently_deleted()`` (a buffer-cache lookup
per bit), and takes a recently deleted inode only when no other is free in the group. So
after a few thousand deletes in a group every create there scans them all: on this machine
~1.5 ms of kernel CPU per create, the "slow mode" of stop 23's sends (docs/performance.md,
"Sends at 64 clients: the round hand-back's slow mode").

This script measures it without mq: the system CPU per ``open(O_CREAT|O_EXCL)`` + ``close`` of
``--files`` empty files in a fresh directory, first as the machine left the filesystem, then
right after ``--deleted`` files were created and unlinked in another directory, then in the
same one, then there again after ``--wait`` seconds. Whether a phase pays depends on where
the group's recently deleted inodes sit (the scan stops at the first free inode not recently
deleted): another process's deletes can make the first phase the slow one::

    .venv/bin/python bench/recent_deletes.py --root /var/tmp/<you>-deletes [--deleted 20000]

Prints one JSON object: microseconds of system (and user) CPU per create for each phase.
The root is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time


def creates(directory: str, count: int, prefix: str = "f") -> dict[str, float]:
    """Create ``count`` empty files ``<prefix><n>`` in ``directory`` (made if missing): CPU microseconds per create.

    Raises:
        OSError: A create fails (e.g. the file exists).
    """
    os.makedirs(directory, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    before = os.times()
    started = time.perf_counter()
    for i in range(count):
        os.close(os.open(os.path.join(directory, f"{prefix}{i:07d}"), flags, 0o644))
    after = os.times()
    return {
        "sys_us_per_create": round((after.system - before.system) * 1e6 / count, 1),
        "user_us_per_create": round((after.user - before.user) * 1e6 / count, 1),
        "wall_us_per_create": round((time.perf_counter() - started) * 1e6 / count, 1),
    }


def main() -> None:
    """Parse the arguments, run the three phases, print the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="a new directory on the filesystem to test (removed at the end)")
    p.add_argument("--files", type=int, default=2000, help="files created per phase (default 2000)")
    p.add_argument("--deleted", type=int, default=20000, help="files created and unlinked before phase 2")
    p.add_argument("--wait", type=float, default=0.0, help="seconds before phase 3 (0: no phase 3)")
    args = p.parse_args()
    os.makedirs(args.root)
    try:
        result: dict[str, object] = {"files": args.files, "deleted": args.deleted}
        result["first"] = creates(os.path.join(args.root, "first"), args.files)
        doomed = os.path.join(args.root, "doomed")
        creates(doomed, args.deleted)
        shutil.rmtree(doomed)  # another directory: its inodes may be in another group
        result["after_deletes_elsewhere"] = creates(os.path.join(args.root, "after"), args.files)
        here = os.path.join(args.root, "here")
        creates(here, args.deleted)
        for name in os.listdir(here):  # the same directory, so the same group as the next creates
            os.unlink(os.path.join(here, name))
        result["after_deletes_here"] = creates(here, args.files, "g")
        if args.wait > 0:
            time.sleep(args.wait)
            result[f"after_{args.wait:g}_s"] = creates(here, args.files, "h")
        print(json.dumps(result))
    finally:
        shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
