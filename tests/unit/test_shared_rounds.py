"""Shared ``syncfs`` rounds (``mqcore/protocol/_rounds.py``): several processes, one sequence of rounds.

Real processes (``python -c``: record locks belong to a process, so threads of one process would not
exclude each other) on a real file under ``tmp_path``, and real ``syncfs`` calls where ``FsSyncer``
makes them. A process whose files were closed before another process's round started takes that
round's outcome and makes no ``syncfs``; a failed round in one process fails, in another, every
caller whose epoch was read before it ended (docs/protocol.md 6.2, the epoch rule).
"""

from __future__ import annotations

import errno
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqcore.protocol import _rounds
from mqcore.protocol._fs import FsSyncer
from mqcore.protocol._rounds import SharedRounds
from tests.conftest import REPO

#: ``fcntl``'s system call number as /proc/PID/syscall shows it (a process waiting in ``lockf``).
FCNTL = {"x86_64": 72, "aarch64": 25}
#: Seconds a child may take to start and reach its lock.
START_SECONDS = 30.0

#: A child process: one round on the shared file, a sync that says it ran; prints "ran" and the outcome.
CHILD = """
import sys
from mqcore.protocol._rounds import SharedRounds
rounds = SharedRounds(sys.argv[1])
code = int(sys.argv[2])
def sync():
    print("ran", flush=True)
    return code
print(*rounds.round(sync), flush=True)
"""


def child(path: Path, code: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(code)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def waiting_in_fcntl(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/syscall").read_text()
    except OSError:
        return False
    return text.split()[0] == str(FCNTL[platform.machine()])


@pytest.mark.skipif(platform.machine() not in FCNTL, reason="system call numbers known for x86_64 and aarch64")
def test_of_two_processes_waiting_for_a_round_one_syncs_and_the_other_takes_its_outcome(tmp_path):
    path = tmp_path / "rounds"
    _rounds.create(str(path))
    shared = SharedRounds(str(path))
    running, release = threading.Event(), threading.Event()
    outcome: list[tuple[int, bool]] = []

    def first_sync() -> int:
        running.set()
        release.wait(START_SECONDS)
        return 0

    leader = threading.Thread(target=lambda: outcome.append(shared.round(first_sync)))
    leader.start()
    assert running.wait(START_SECONDS)
    # Both children read ``started`` (= 1: this round runs) and wait for the round lock; the first to get
    # it after this round ends runs round 2, which started after the other read ``started``.
    children = [child(path), child(path)]
    try:
        deadline = time.monotonic() + START_SECONDS
        while not all(waiting_in_fcntl(c.pid) for c in children):
            assert time.monotonic() < deadline, "a child never waited for the round lock"
            time.sleep(0.02)
        release.set()
        leader.join(START_SECONDS)
        outputs = [c.communicate(timeout=START_SECONDS)[0].split("\n") for c in children]
    finally:
        release.set()
        for c in children:
            c.kill()
            c.wait()
    assert outcome == [(0, False)]
    results = sorted(out[-2] for out in outputs)
    assert results == ["0 False", "0 True"], outputs  # one round of its own, one borrowed
    assert sum(out.count("ran") for out in outputs) == 1  # so exactly one syncfs was made by the children
    shared.close()


def test_a_round_that_failed_in_another_process_fails_the_older_epochs_of_this_one(tmp_path):
    path = tmp_path / "rounds"
    _rounds.create(str(path))
    root = tmp_path / "root"
    root.mkdir()
    syncer = FsSyncer(str(root), SharedRounds(str(path)))
    try:
        before = syncer.epoch()
        (root / "written-before").write_bytes(b"x")
        failed = child(path, errno.EIO)  # another process's round fails (its syncfs reported EIO)
        assert failed.communicate(timeout=START_SECONDS)[0].split("\n")[-2] == f"{errno.EIO} False"
        after = syncer.epoch()
        assert after == before + 1  # the failure is every process's epoch

        got: dict[str, OSError | None] = {}
        syncer.sync_later(lambda error: got.setdefault("old", error), before)
        syncer.sync_later(lambda error: got.setdefault("new", error), after)
        old = got["old"]
        assert isinstance(old, OSError) and old.errno == errno.EIO  # its own round succeeded: the epoch rule
        assert "reported to a round that ended after this send began" in str(old)
        assert got["new"] is None
    finally:
        syncer.close()


def test_a_process_alone_runs_every_round_itself(tmp_path):
    path = tmp_path / "rounds"
    _rounds.create(str(path))
    shared = SharedRounds(str(path))
    calls: list[int] = []

    def sync() -> int:
        calls.append(os.getpid())
        return 0

    assert [shared.round(sync) for _ in range(3)] == [(0, False)] * 3
    assert len(calls) == 3
    assert shared.failures() == 0
    shared.close()
