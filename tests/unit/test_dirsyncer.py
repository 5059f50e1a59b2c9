"""DirSyncer (``mqcore/protocol.py``): group-committed directory fsyncs (``docs/protocol.md`` 6.2).

Real directories under ``tmp_path``; real ``fsync(2)`` calls. What a test can
observe without tracing the kernel: every caller returns (no lost wake-up, no
deadlock), each caller of a failed round gets the error, a failure is not
sticky, and no directory descriptor outlives a call (so a directory deleted and
re-created under the same name is the one that gets synced).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mqcore.protocol import DirSyncer

#: Seconds a thread may take to finish its calls before the test calls it hung.
JOIN_TIMEOUT_SECONDS = 30.0


def open_descriptors_to(path: Path) -> list[str]:
    """The descriptors of this process that refer to ``path`` (from ``/proc/self/fd``)."""
    target = os.path.realpath(path)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, already closed
    return found


def run_threads(n: int, target: Callable[..., object], *args: object) -> list[OSError | None]:
    """Run ``target(i, *args)`` on ``n`` threads started together; return each one's OSError or None.

    Any other exception escapes its thread, which pytest turns into a failure (filterwarnings=error).
    """
    barrier = threading.Barrier(n)
    outcomes: list[OSError | None] = [None] * n
    finished = [False] * n

    def work(i: int) -> None:
        barrier.wait()
        try:
            target(i, *args)
        except OSError as exc:
            outcomes[i] = exc
        finally:
            finished[i] = True

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT_SECONDS)
    assert all(finished), f"threads still waiting in sync(): {[i for i, f in enumerate(finished) if not f]}"
    return outcomes


def test_sync_of_an_existing_directory_returns(tmp_path: Path) -> None:
    syncer = DirSyncer()
    syncer.sync(str(tmp_path))
    syncer.sync(str(tmp_path))


def test_many_threads_syncing_one_directory_all_return(tmp_path: Path) -> None:
    syncer = DirSyncer()
    directory = tmp_path / "queue"
    directory.mkdir()

    def work(i: int) -> None:
        for j in range(40):
            # A rename into the directory, then the sync that must cover it (as publish does).
            src = tmp_path / f"f.{i}.{j}"
            src.write_bytes(b"x")
            os.rename(src, directory / src.name)
            syncer.sync(str(directory))

    assert run_threads(16, work) == [None] * 16
    assert len(os.listdir(directory)) == 16 * 40
    assert open_descriptors_to(directory) == []


def test_threads_syncing_several_directories_all_return(tmp_path: Path) -> None:
    syncer = DirSyncer()
    dirs = [tmp_path / f"d{k}" for k in range(4)]
    for d in dirs:
        d.mkdir()

    def work(i: int) -> None:
        for j in range(30):
            syncer.sync(str(dirs[(i + j) % len(dirs)]))

    assert run_threads(12, work) == [None] * 12


def test_sync_of_a_missing_directory_raises_file_not_found(tmp_path: Path) -> None:
    syncer = DirSyncer()
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError):
        syncer.sync(str(missing))
    # Every later caller gets its own error too (not a stale success, not a hang).
    with pytest.raises(FileNotFoundError):
        syncer.sync(str(missing))


def test_every_concurrent_caller_on_a_missing_directory_gets_the_error(tmp_path: Path) -> None:
    syncer = DirSyncer()
    missing = str(tmp_path / "missing")

    def work(i: int) -> None:
        for _ in range(20):
            syncer.sync(missing)

    outcomes = run_threads(8, work)
    for exc in outcomes:
        assert isinstance(exc, FileNotFoundError), outcomes
        assert exc.errno == errno.ENOENT


def test_sync_of_a_file_raises_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        DirSyncer().sync(str(path))


def test_a_failure_is_not_sticky(tmp_path: Path) -> None:
    syncer = DirSyncer()
    directory = tmp_path / "later"
    with pytest.raises(FileNotFoundError):
        syncer.sync(str(directory))
    directory.mkdir()
    syncer.sync(str(directory))
    syncer.sync(str(directory))


def test_a_deleted_and_recreated_directory_is_synced_afresh(tmp_path: Path) -> None:
    """No cached descriptor: after rmdir + mkdir the new directory is opened and fsynced."""
    syncer = DirSyncer()
    directory = tmp_path / "orders"
    directory.mkdir()
    syncer.sync(str(directory))
    assert open_descriptors_to(directory) == []

    (directory / "old").write_bytes(b"")
    os.unlink(directory / "old")
    directory.rmdir()
    with pytest.raises(FileNotFoundError):  # nothing holds the old inode open to sync
        syncer.sync(str(directory))

    directory.mkdir()
    (tmp_path / "msg").write_bytes(b"x")
    os.rename(tmp_path / "msg", directory / "msg")
    syncer.sync(str(directory))
    assert open_descriptors_to(directory) == []
    assert os.listdir(directory) == ["msg"]


def test_recreated_directory_under_concurrent_syncs(tmp_path: Path) -> None:
    """Callers racing an rmdir + mkdir either succeed or get ENOENT; once it exists again, all succeed."""
    syncer = DirSyncer()
    directory = tmp_path / "q"
    directory.mkdir()
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        while not stop.is_set():
            try:
                directory.rmdir()
                directory.mkdir()
            except OSError as exc:  # pragma: no cover - would fail the test below
                errors.append(exc)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()

    def work(i: int) -> None:
        for _ in range(50):
            try:
                syncer.sync(str(directory))
            except FileNotFoundError:
                pass

    try:
        assert run_threads(6, work) == [None] * 6
    finally:
        stop.set()
        churner.join(timeout=JOIN_TIMEOUT_SECONDS)
    assert errors == []
    directory.mkdir(exist_ok=True)
    assert run_threads(6, lambda i: syncer.sync(str(directory))) == [None] * 6
    assert open_descriptors_to(directory) == []


def test_sync_later_calls_back_every_caller_once(tmp_path: Path) -> None:
    """sync_later (the send savers' group commit): callers that find a round running leave their callback
    and return at once; the leader runs rounds until none is left, so every callback comes exactly once."""
    syncer = DirSyncer()
    directory = tmp_path / "queue"
    directory.mkdir()
    calls: dict[tuple[int, int], list[OSError | None]] = {}
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(40):
            src = tmp_path / f"f.{i}.{j}"
            src.write_bytes(b"x")
            os.rename(src, directory / src.name)

            def done(error: OSError | None, key: tuple[int, int] = (i, j)) -> None:
                with lock:
                    calls.setdefault(key, []).append(error)

            syncer.sync_later(str(directory), done)

    assert run_threads(16, work) == [None] * 16
    # A caller that left its callback returned before the leader's last round ended: wait for the leader.
    deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        with lock:
            if len(calls) == 16 * 40:
                break
        time.sleep(0.05)
    assert sorted(calls) == [(i, j) for i in range(16) for j in range(40)]
    assert all(outcomes == [None] for outcomes in calls.values())
    assert open_descriptors_to(directory) == []


def test_sync_later_gives_a_failed_round_to_its_callers_and_is_not_sticky(tmp_path: Path) -> None:
    syncer = DirSyncer()
    missing = tmp_path / "gone"
    outcomes: list[OSError | None] = []
    syncer.sync_later(str(missing), outcomes.append)  # nobody leads: this caller runs the round itself
    assert len(outcomes) == 1 and isinstance(outcomes[0], OSError) and outcomes[0].errno == errno.ENOENT
    missing.mkdir()
    syncer.sync_later(str(missing), outcomes.append)
    assert outcomes[1:] == [None]
