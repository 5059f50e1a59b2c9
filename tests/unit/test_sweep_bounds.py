"""mq-reaper's expiry sweep of a queue decides by two string bounds before it parses a name (issue 12).

The sweep of a queue of 1,000,000 ready messages parsed every name; it now parses only names at or
below the bounds of :func:`mqcore.protocol.sweeps.gone_bounds`. These tests pin the edges: a message
whose send time plus the retention is exactly now is gone, one a millisecond younger stays; the
message at the purge marker is gone, the next one stays; metadata and foreign names are untouched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mqcore.names import MessageId, QueueName, sent_ms_of
from mqcore.protocol import LeasePolicy, Store
from mqcore.protocol.sweeps import gone_bounds

Q = QueueName("jobs")


def names_in(root: Path, where: str) -> list[str]:
    return sorted(os.listdir(root / where))


def test_retention_edge_by_the_millisecond(tmp_path: Path) -> None:
    store = Store(tmp_path, fsync=False)
    store.create_queue(Q)
    store.set_attributes(Q, {"retention_seconds": 60})
    first = store.send(Q, b"first")
    second = store.send(Q, b"second")
    while sent_ms_of(second) == sent_ms_of(first):  # two send times a millisecond or more apart
        os.unlink(tmp_path / "queues" / Q / f"{second}.0")
        second = store.send(Q, b"second")
    (tmp_path / "queues" / Q / "not-a-message").write_text("foreign")

    # One millisecond before the first message's retention ends: nothing is gone.
    assert store.at(sent_ms_of(first) + 60_000 - 1).expire_queue(Q) == 0
    # At the very millisecond: the first is gone, the second (sent later) stays.
    assert store.at(sent_ms_of(first) + 60_000).expire_queue(Q) == 1
    assert names_in(tmp_path, "remove") == [f"{Q}.{first}"]
    assert f"{second}.0" in names_in(tmp_path, f"queues/{Q}")
    assert store.at(sent_ms_of(second) + 60_000).expire_queue(Q) == 1
    assert [n for n in names_in(tmp_path, f"queues/{Q}") if not n.startswith(".")] == ["not-a-message"]


def test_purge_edge_is_the_marker_id(tmp_path: Path) -> None:
    store = Store(tmp_path, fsync=False)
    store.create_queue(Q)
    ids = [store.send(Q, f"m{i}".encode()) for i in range(5)]
    marker = tmp_path / "queues" / Q / ".purge"
    marker.write_text(json.dumps({"purged_before_id": ids[2], "purged_ms": sent_ms_of(ids[4])}))

    assert store.expire_queue(Q) == 3
    assert names_in(tmp_path, "remove") == sorted(f"{Q}.{i}" for i in ids[:3])
    assert [n for n in names_in(tmp_path, f"queues/{Q}") if not n.startswith(".")] == [f"{i}.0" for i in ids[3:]]


def test_bounds_sort_like_the_ids() -> None:
    sent = 0x0123456789AB
    message_id = MessageId("01234567-89ab-7def-8123-456789abcdef")
    assert sent_ms_of(message_id) == sent
    sent_bound, purge_bound = gone_bounds(LeasePolicy(retention_ms=1000), sent + 1000)
    assert (sent_bound, purge_bound) == ("01234567-89ab", "")
    assert message_id[:13] <= sent_bound
    assert gone_bounds(LeasePolicy(retention_ms=1000), sent + 999)[0] < message_id[:13]
    # No retention, or a retention longer than the clock: nothing is gone by age.
    assert gone_bounds(LeasePolicy(), sent)[0] == ""
    assert gone_bounds(LeasePolicy(retention_ms=sent + 1), sent)[0] == ""
