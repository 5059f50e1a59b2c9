"""FIFO deduplication across hosts: one deduplication id sent through three hosts' mq at the same instant.

docs/protocol.md 19.2: the record ``queues/Q/.dedup.HASH`` is written under a temporary name and
published with ``link``, so another host never sees it incomplete (on GlusterFS another mount's
view of a file's content can lag its name by up to a second). What a user checks: in every round
all three hosts answer the same message id, exactly one message is stored and delivered, and no
send is answered 500 (a 503 is allowed: the client retries with the same deduplication id and must
get that same id).

Each round is released by a barrier in three threads, each with its own HTTP connection to its own
host's mq, so the three sends meet within a few milliseconds at the volume.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from conftest import Gluster, Host, start_hosts

from mqcore.client import connect
from tests.conftest import PLAIN_HTTP, Daemons

logger = logging.getLogger(__name__)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

#: Rounds, each with a fresh deduplication id.
ROUNDS = 40
#: Sends a client makes for one message before the test fails (503s retried after :data:`RETRY_DELAY`).
ATTEMPTS = 20
#: Seconds between a 503 and the retry (mq answers Retry-After; this test retries sooner, as a busy client may).
RETRY_DELAY = 0.05
QUEUE = "dedup.fifo"


@pytest.fixture(scope="module")
def hosts(gluster: Gluster) -> Iterator[list[Host]]:
    """Three full stacks on one root of the volume."""
    daemons = Daemons()
    try:
        yield start_hosts(daemons, gluster, "cluster-fifo")
    finally:
        daemons.stop_all()


def _send(client: httpx.Client, dedup_id: str, group: str, body: bytes, statuses: Counter[int]) -> str:
    """Send until 201 (503 retried with the same deduplication id); return the message id answered."""
    for _ in range(ATTEMPTS):
        reply = client.post(
            f"/{QUEUE}/messages",
            content=body,
            headers={"X-Message-Group-Id": group, "X-Message-Deduplication-Id": dedup_id},
        )
        statuses[reply.status_code] += 1
        if reply.status_code == 201:
            return reply.headers["X-Message-Id"]
        assert reply.status_code == 503, f"{reply.status_code} {reply.text[:300]}"
        time.sleep(RETRY_DELAY)
    raise AssertionError(f"still 503 after {ATTEMPTS} sends of {dedup_id}")


def test_one_deduplication_id_sent_through_three_hosts_at_once_is_stored_and_delivered_once(hosts):
    with connect(hosts[0].stack.url) as admin:
        admin.create_queue(QUEUE)
    rounds = [(f"r{i}-{uuid.uuid4().hex}", f"g{i}") for i in range(ROUNDS)]
    barrier = threading.Barrier(len(hosts))
    answers: list[list[str | None]] = [[None] * ROUNDS for _ in hosts]
    statuses: list[Counter[int]] = [Counter() for _ in hosts]
    errors: list[BaseException] = []

    def host_sends(h: int) -> None:
        try:
            with httpx.Client(base_url=hosts[h].stack.url, timeout=30, verify=PLAIN_HTTP) as client:
                client.get("/").raise_for_status()  # the connection is open before the first race
                for i, (dedup_id, group) in enumerate(rounds):
                    barrier.wait(60)
                    answers[h][i] = _send(client, dedup_id, group, f"round {i} via host {h}".encode(), statuses[h])
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=host_sends, args=(h,)) for h in range(len(hosts))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    elapsed = time.monotonic() - started
    assert not errors, errors[0]
    per_round = [{answers[h][i] for h in range(len(hosts))} for i in range(ROUNDS)]
    split = [(i, ids) for i, ids in enumerate(per_round) if len(ids) != 1]
    assert not split, f"rounds answered with more than one message id: {split}"
    answered = [ids.pop() for ids in per_round]
    assert len(set(answered)) == ROUNDS

    # Exactly one message stored per round, and delivered once: receive everything through another host.
    delivered: list[str] = []
    with connect(hosts[1].stack.url) as client:
        deadline = time.monotonic() + 60
        while len(delivered) < ROUNDS and time.monotonic() < deadline:
            got = client.receive(QUEUE, max_messages=10, wait_time_seconds=1)
            delivered += [m.message_id for m in got]
            if got:
                assert client.delete_batch(QUEUE, [m.receipt_handle for m in got]) == [None] * len(got)
        assert client.receive(QUEUE, max_messages=10, wait_time_seconds=1) == []
        stats = client.queue_stats(QUEUE)
    assert sorted(delivered) == sorted(answered), "each round's one message delivered once, nothing else"
    assert stats["ready"] == 0, stats
    total = sum(statuses, Counter())
    logger.info("%d rounds of one deduplication id through 3 hosts in %.1f s: statuses %s", ROUNDS, elapsed, total)
    assert set(total) <= {201, 503}, total
