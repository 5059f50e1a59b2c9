"""The lean inotify reader of mq-mover and mq-reaper (``DirWatcher.read_changes``), on real directories.

Real files under ``tmp_path``, real renames and unlinks, the kernel's own events.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mqcore.watch import ARRIVED, DIR_GONE, LEFT, DirWatcher, open_watcher


@pytest.fixture
def watcher(monkeypatch: pytest.MonkeyPatch) -> DirWatcher:
    monkeypatch.delenv("MQ_NO_INOTIFY", raising=False)
    w = open_watcher()
    if w is None:  # pragma: no cover - inotify is part of every Linux CI machine
        pytest.skip("inotify unavailable")
    return w


def test_changes_come_in_the_kernels_order_with_departures(tmp_path: Path, watcher: DirWatcher) -> None:
    watched, outside = tmp_path / "delay", tmp_path / "queues"
    watched.mkdir()
    outside.mkdir()
    try:
        assert watcher.watch(str(watched), "delay")
        assert watcher.read_changes().names == []
        (outside / "a").write_bytes(b"x")
        os.rename(outside / "a", watched / "1700000000000.q.a.1")  # a lease
        (watched / "b").write_bytes(b"y")  # a delayed send is created in place
        os.rename(watched / "1700000000000.q.a.1", outside / "a")  # redelivered
        os.unlink(watched / "b")
        changes = watcher.read_changes()
        assert changes.names == [
            ("1700000000000.q.a.1", True),
            ("b", True),
            ("1700000000000.q.a.1", False),
            ("b", False),
        ]
        assert not changes.overflow and changes.gone == []
        assert watcher.read_changes().names == [], "every event was read at once"
    finally:
        watcher.close()


def test_a_watch_without_departures_reports_arrivals_only(tmp_path: Path, watcher: DirWatcher) -> None:
    watched = tmp_path / "remove"
    watched.mkdir()
    try:
        assert watcher.watch(str(watched), "remove", departures=False)
        for i in range(3):
            (watched / f"q.{i}").write_bytes(b"x")
        for i in range(3):
            os.unlink(watched / f"q.{i}")
        assert watcher.read_changes().names == [(f"q.{i}", True) for i in range(3)]
    finally:
        watcher.close()


def test_a_removed_directory_is_reported_gone_and_unwatched(tmp_path: Path, watcher: DirWatcher) -> None:
    watched = tmp_path / "remove"
    watched.mkdir()
    try:
        assert watcher.watch(str(watched), "remove")
        watched.rmdir()
        changes = watcher.read_changes()
        assert changes.gone == ["remove"]
        assert not watcher.watching("remove")
    finally:
        watcher.close()


def test_thousands_of_events_are_read_in_one_call(tmp_path: Path, watcher: DirWatcher) -> None:
    # ~96 KiB of events, more than one read(2) of 64 KiB: every event comes back, none twice.
    watched = tmp_path / "delay"
    watched.mkdir()
    names = [f"{1_700_000_000_000 + i}.jobs.{i:036d}.1.token{i}" for i in range(1000)]
    try:
        assert watcher.watch(str(watched), "delay", departures=False)
        for name in names:
            (watched / name).touch()
        changes = watcher.read_changes()
        assert [name for name, _ in changes.names] == names
        assert not changes.overflow
    finally:
        watcher.close()


def test_tagged_events_name_their_directory_as_read_did(tmp_path: Path, watcher: DirWatcher) -> None:
    # The mq daemon's reader (read_tagged): several queue directories, each event with its tag, in order.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    try:
        assert watcher.watch(str(a), "qa") and watcher.watch(str(b), "qb")
        (a / "m.0").write_bytes(b"x")
        os.rename(a / "m.0", b / "m.0")
        os.unlink(b / "m.0")
        b.rmdir()
        assert watcher.read_tagged() == [
            ("qa", "m.0", ARRIVED),
            ("qa", "m.0", LEFT),
            ("qb", "m.0", ARRIVED),
            ("qb", "m.0", LEFT),
            ("qb", "", DIR_GONE),
        ]
        assert not watcher.watching("qb") and watcher.watching("qa")
        assert watcher.read_tagged() == []
    finally:
        watcher.close()
