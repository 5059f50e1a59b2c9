"""mq-reaper's expiry sweep skips unchanged queue directories, and still expires everything in time.

The daemon's coroutine runs on the test's event loop against real files in a
temporary root (``Reaper.expire(now=...)`` judges at a given time, as the
other sweep tests do). A queue's directory mtime is set back by ``os.utime``
where a test needs its stamp to be trusted at once (the reaper lists again a
directory changed in the last two seconds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from daemons._expiry import RELIST_SWEEPS
from mqcore.names import sent_ms_of
from mqcore.protocol import Store, now_ms
from tests.unit import test_mover_reaper
from tests.unit.test_mover_reaper import Q, bare_reaper, old_store, ready_files, removed

#: The fixtures of the other reaper tests: an empty root, and a Store on it with queue ``jobs``.
root = test_mover_reaper.root
store = test_mover_reaper.store


def settle(root: Path, queue: str) -> None:
    """Set the queue directory's mtime 10 s back (its ctime still changes: the stamp is a new one)."""
    qdir = root / "queues" / queue
    then = os.stat(qdir).st_mtime - 10
    os.utime(qdir, (then, then))


async def test_an_unchanged_queue_is_not_listed_until_its_oldest_message_expires(root: Path, store: Store) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    soon = old_store(root, 50_000).send(Q, b"expires 10 s from now")
    fresh = store.send(Q, b"fresh")
    settle(root, Q)
    t = now_ms()

    async with bare_reaper(store) as r:
        first = await r.expire(now=t)
        assert (first.queues, first.listed, first.ready) == (1, 1, 0)
        # Judged before the oldest message's retention ends: the directory is not read again
        # (but on its turn, one sweep in RELIST_SWEEPS).
        again = [await r.expire(now=t + 1_000) for _ in range(RELIST_SWEEPS - 1)]
        assert sum(s.listed for s in again) <= 1, [s.listed for s in again]
        assert all(s.ready == 0 and s.errors == 0 for s in again)
        assert ready_files(root, Q) == sorted([f"{soon}.0", f"{fresh}.0"])

        # Its retention ends: the next sweep lists the directory and moves it, the directory untouched meanwhile.
        due = await r.expire(now=sent_ms_of(soon) + 60_000)
        assert (due.listed, due.ready) == (1, 1)
    assert ready_files(root, Q) == [f"{fresh}.0"]
    assert removed(root) == [f"jobs.{soon}"]


async def test_what_changes_a_queue_directory_gets_it_listed_again(root: Path, store: Store) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    kept = store.send(Q, b"stays")
    settle(root, Q)
    t = now_ms()
    async with bare_reaper(store) as r:
        assert (await r.expire(now=t)).listed == 1

        # A message with an old send time arrives (a redelivery, another host's clock): seen at the next sweep.
        late = old_store(root, 120_000).send(Q, b"old id, arrived after the last listing")
        settle(root, Q)
        sweep = await r.expire(now=t)
        assert (sweep.listed, sweep.ready) == (1, 1)
        assert ready_files(root, Q) == [f"{kept}.0"]

        # A purge writes its marker into the directory: the purged message goes at the next sweep.
        settle(root, Q)
        assert (await r.expire(now=t)).ready == 0
        Path(store.layout.purge_path(Q)).write_text(json.dumps({"purged_before_id": kept, "purged_ms": now_ms()}))
        settle(root, Q)
        sweep = await r.expire(now=t)
        assert (sweep.listed, sweep.ready) == (1, 1)
    assert ready_files(root, Q) == []
    assert removed(root) == sorted([f"jobs.{late}", f"jobs.{kept}"])


async def test_a_restarted_reaper_lists_every_queue_at_its_first_sweep(root: Path, store: Store) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    old = old_store(root, 120_000)
    stale = old.send(Q, b"expired")
    settle(root, Q)
    t = now_ms()
    async with bare_reaper(store) as r:
        assert (await r.expire(now=t)).ready == 1
    # The same directory state again (a crash between the sweep's listing and its moves): nothing is remembered.
    os.rename(store.layout.remove_path(f"jobs.{stale}"), root / "queues" / Q / f"{stale}.0")
    settle(root, Q)
    async with bare_reaper(Store(root)) as r:
        sweep = await r.expire(now=t)
    assert (sweep.listed, sweep.ready) == (1, 1)
    assert ready_files(root, Q) == []
