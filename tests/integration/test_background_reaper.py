"""mq-reaper end to end: retention expiry and the other sweeps by the real daemon.

The reaper runs as a subprocess with a short ``--expire-interval``. Messages
"sent long ago" are written through a :class:`mqcore.protocol.Store` whose id
generator stamps an old send time (the id carries the send time, from which
retention counts), since the shortest retention period is 60 s.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mqcore.names import IdGenerator, MessageId, QueueName, parse_in_flight_name
from mqcore.protocol import Store, now_ms

Q = QueueName("jobs")


class OldIds(IdGenerator):
    """Ids stamped with a fixed send time (epoch ms)."""

    def __init__(self, sent_ms: int) -> None:
        super().__init__()
        self.sent_ms = sent_ms

    def next_id(self, now_ms: int | None = None) -> MessageId:
        return super().next_id(now_ms=self.sent_ms)


def ready(root: Path, queue: str) -> list[str]:
    """Message file names in ``queues/<queue>/`` (names starting with "." are metadata)."""
    return sorted(n for n in os.listdir(root / "queues" / queue) if not n.startswith("."))


def in_flight_ids(root: Path) -> list[str]:
    return sorted(item.message_id for n in os.listdir(root / "delay") if (item := parse_in_flight_name(n)))


async def test_reaper_removes_messages_past_retention_ready_in_flight_and_delayed(
    tmp_path: Path, daemons, wait
) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q, {"retention_seconds": 60})
    store.create_queue(QueueName("other"))  # default retention (4 days)
    old = Store(root, ids=OldIds(now_ms() - 90_000))
    old_ready = old.send(Q, b"90 s old, ready")
    old_leased = old.send(Q, b"90 s old, in flight")
    old_delayed = old.send(Q, b"90 s old, delayed", delay_ms=600_000)
    other_old = old.send(QueueName("other"), b"90 s old, long retention")
    fresh = store.send(Q, b"fresh")
    fresh_leased = store.send(Q, b"fresh, in flight")
    for message_id in (old_leased, fresh_leased):
        assert store.lease(Q, f"{message_id}.0", 600_000) is not None

    reaper = daemons.start("mq-reaper", "--root", root, "--expire-interval", "0.3")

    def swept() -> bool:
        return ready(root, Q) == [f"{fresh}.0"] and in_flight_ids(root) == [fresh_leased]

    await wait(swept, message=lambda: f"{ready(root, Q)} {in_flight_ids(root)}\n{reaper.log_tail()}")
    await wait(lambda: not os.listdir(root / "remove"), message=lambda: reaper.log_tail())
    assert ready(root, QueueName("other")) == [f"{other_old}.0"]
    await wait(
        lambda: "expiry sweep queues=2 ready_removed=1 in_flight_removed=2" in reaper.log, message=reaper.log_tail
    )
    log = reaper.log
    assert "expired ready messages queue=jobs removed=1" in log, log

    # While it runs: a message that expires is gone within a few sweeps.
    later = old.send(Q, b"90 s old, sent while the reaper runs")
    started = time.monotonic()
    await wait(lambda: f"{later}.0" not in ready(root, Q), message=lambda: reaper.log_tail())
    assert time.monotonic() - started < 2.0
    assert ready(root, Q) == [f"{fresh}.0"]
    assert sorted(os.listdir(root / "remove")) in ([], [f"jobs.{later}"])  # reaped soon after
    assert old_ready not in log and old_delayed not in log, "expired messages are counted, not logged one by one"


async def test_reaper_sweeps_old_attempt_records_and_abandoned_queue_creations(tmp_path: Path, daemons, wait) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q)
    long_ago = time.time() - 600
    store.save_attempt(Q, "crashed-consumer", ["1795267959745.jobs.x.1"])
    [record] = os.listdir(root / "attempts")
    os.utime(root / "attempts" / record, (long_ago, long_ago))
    store.save_attempt(Q, "recent-consumer", ["1795267959745.jobs.y.1"])
    abandoned = root / "queues" / f".half.{'c' * 32}.creating"
    abandoned.mkdir()
    os.utime(abandoned, (long_ago, long_ago))

    reaper = daemons.start("mq-reaper", "--root", root, "--expire-interval", "0.3", "--new-grace", "300")

    await wait(lambda: not abandoned.exists() and len(os.listdir(root / "attempts")) == 1, message=reaper.log_tail)
    assert store.load_attempt(Q, "recent-consumer") == ["1795267959745.jobs.y.1"]
    assert store.load_attempt(Q, "crashed-consumer") is None
    assert store.list_queues() == [Q]
    await wait(lambda: "attempts_removed=1 staging_removed=1" in reaper.log, message=reaper.log_tail)
