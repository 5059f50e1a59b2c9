"""daemons._idorder: a send through one worker takes its id only after the newest millisecond any worker
acknowledged, so sequential sends through different workers keep their order (docs/api.md)."""

from __future__ import annotations

import time
from pathlib import Path

from daemons import _idorder
from mqcore.names import IdGenerator, sent_ms_of


def id_at(ms: int) -> str:
    """A version 7 id whose millisecond is ``ms`` (docs/protocol.md section 3)."""
    text = f"{ms:012x}"
    return f"{text[:8]}-{text[8:]}-7000-8000-000000000000"


async def test_a_send_waits_out_the_millisecond_another_worker_acknowledged(tmp_path: Path) -> None:
    path = str(tmp_path / "acked")
    _idorder.create(path, 2)
    first, second = _idorder.AckedIds(path, 2, 0), _idorder.AckedIds(path, 2, 1)
    assert second.newest() == 0
    ahead = time.time_ns() // 1_000_000 + 30  # as if worker 0's clock had run 30 ms ahead
    first.acknowledged([id_at(ahead - 5), id_at(ahead)])
    assert second.newest() == ahead
    await second.before_ids()
    assert time.time_ns() // 1_000_000 > ahead
    assert sent_ms_of(IdGenerator().next_id()) > ahead  # the next id sorts after the acknowledged one


async def test_an_older_acknowledgment_never_lowers_a_workers_slot(tmp_path: Path) -> None:
    path = str(tmp_path / "acked")
    _idorder.create(path, 3)
    worker = _idorder.AckedIds(path, 3, 2)
    worker.acknowledged([id_at(2_000)])
    worker.acknowledged([id_at(1_000)])  # a send that overlapped acknowledged later
    assert _idorder.AckedIds(path, 3, 0).newest() == 2_000


async def test_a_worker_does_not_wait_for_its_own_acknowledgment(tmp_path: Path) -> None:
    # One process's ids strictly increase (docs/protocol.md section 3), so a client that sends through
    # the same worker again needs no wait: only the other workers' slots count.
    path = str(tmp_path / "acked")
    _idorder.create(path, 2)
    first, second = _idorder.AckedIds(path, 2, 0), _idorder.AckedIds(path, 2, 1)
    ahead = time.time_ns() // 1_000_000 + 60_000  # a minute ahead: any wait for it would not return in time
    first.acknowledged([id_at(ahead)])
    assert first.newest() == ahead and first.newest_elsewhere() == 0
    assert second.newest_elsewhere() == ahead
    await first.before_ids()
    assert time.time_ns() // 1_000_000 < ahead


async def test_a_restarted_worker_waits_for_what_its_earlier_incarnation_acknowledged(tmp_path: Path) -> None:
    # The restarted process has a new id generator: the old one's ids are another process's to it.
    path = str(tmp_path / "acked")
    _idorder.create(path, 2)
    ahead = time.time_ns() // 1_000_000 + 30
    _idorder.AckedIds(path, 2, 1).acknowledged([id_at(ahead)])
    again = _idorder.AckedIds(path, 2, 1)
    assert again.newest_elsewhere() == ahead
    await again.before_ids()
    assert time.time_ns() // 1_000_000 > ahead
    again.acknowledged([id_at(ahead - 10)])  # never lowers the slot it inherited
    assert _idorder.AckedIds(path, 2, 0).newest_elsewhere() == ahead
