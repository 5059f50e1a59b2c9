"""FsSyncer (``mqcore/protocol/_fs.py``): the group commit of ``syncfs(2)`` (``docs/protocol.md`` 6.2).

Real files under ``tmp_path`` and real ``syncfs`` calls: every caller's callback runs exactly once,
with None (no lost wake-up when callers arrive while a round runs), and the syncer holds one
descriptor of the root, whatever the number of rounds.
"""

from __future__ import annotations

import os
import threading

from mqcore.protocol._fs import FsSyncer
from tests.unit.test_dirsyncer import JOIN_TIMEOUT_SECONDS, open_descriptors_to


def test_every_caller_of_concurrent_rounds_is_called_back_once_with_success(tmp_path):
    syncer = FsSyncer(str(tmp_path))
    calls: dict[tuple[int, int], list[OSError | None]] = {}
    lock = threading.Lock()

    def caller(t: int) -> None:
        for k in range(40):
            epoch = syncer.epoch()
            with open(tmp_path / f"f{t}.{k}", "wb") as f:
                f.write(b"x" * 100)

            def done(error: OSError | None, key: tuple[int, int] = (t, k)) -> None:
                with lock:
                    calls.setdefault(key, []).append(error)

            syncer.sync_later(done, epoch)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_SECONDS)
        assert not thread.is_alive(), "a caller hung"
    try:
        assert len(calls) == 8 * 40  # every callback ran (the last leader drained the rounds before returning)
        assert all(outcomes == [None] for outcomes in calls.values())
        assert len(open_descriptors_to(tmp_path)) == 1  # one descriptor of the root, kept for the errseq reports
    finally:
        syncer.close()
    assert open_descriptors_to(tmp_path) == []
    assert os.listdir(tmp_path)
