"""mq-reaper's log stays readable under load (issue 10): every unlink at DEBUG, and at most one INFO
summary a minute with the files and bytes reaped since the last one (the rest when it stops).

The Reaper runs in-process on a real root (no inotify: driven by ``rescan`` and ``reap_pending``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from daemons.reaper import Reaper
from mqcore.names import QueueName
from mqcore.protocol import Store

Q = QueueName("jobs")


def summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "reaped" in r.getMessage()]


async def test_reaping_logs_debug_lines_and_one_info_summary_a_minute(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="mq")
    store = Store(tmp_path / "root")
    store.create_queue(Q)
    ids = [store.send(Q, b"x" * 100) for _ in range(30)]
    reaper = Reaper(store, new_grace_seconds=300, rescan_interval_seconds=60, watcher=None)
    try:
        for message_id in ids[:10]:
            store.delete(Q, message_id)
        await reaper.rescan()
        assert await reaper.reap_pending() == 10
        first = summaries(caplog)
        assert len(first) == 1 and first[0].startswith("reaped files=10 bytes="), first
        assert int(first[0].split("bytes=")[1].split()[0]) >= 10 * 100  # the bodies at least
        for message_id in ids[10:]:
            store.delete(Q, message_id)
        await reaper.rescan()
        assert await reaper.reap_pending() == 20
        assert summaries(caplog) == first  # within the minute: no second INFO line yet
        debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.getMessage().startswith("reaped name=")]
        assert len(debug) == 30
    finally:
        reaper.close()  # stopping logs what was not summarized yet
        store.close()
    last = summaries(caplog)
    assert len(last) == 2 and last[1].startswith("reaped files=20 bytes="), last
    assert not list((tmp_path / "root" / "remove").iterdir())
