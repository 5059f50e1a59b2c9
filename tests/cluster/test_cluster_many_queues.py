"""Many indexed queues on a shared filesystem: the change checks take turns, and still find another host's sends.

mq on host 0 indexes more queues than one change check looks at (``CHANGE_CHECK_BATCH``); a
brokerless client writes through host 1's own mount, which inotify on host 0 never sees. A user
checks (docs/api.md, docs/cluster.md): a long poll waiting on any of those queues gets the other
host's message; a queue nobody waits on counts it in ``GET /{queue}`` and in ``GET /metrics``
within the stated bound (the gap of a quiet queue's checks); a short poll or a count on a quiet
queue sees it at the first try (they check the queue themselves); nothing is lost or counted twice.
The waits below are generous multiples of the stated bounds (a tick of 50 ms; ``QUIET_CHECK_SECONDS``);
mq's periodic rescan (``--rescan-interval 30``) lists only a thirtieth of the queues.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import Gluster, Host, start_hosts
from prometheus_client.parser import text_string_to_metric_families

from daemons._turns import CHANGE_CHECK_BATCH
from mqcore.names import QueueName
from mqcore.protocol import Store
from tests.conftest import PLAIN_HTTP, Daemons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

#: Many times one tick's batch: an idle queue waits for its turn.
QUEUES = 20 * CHANGE_CHECK_BATCH + 50
#: Seconds a queue nobody waits on may take to count another host's send in ``GET /metrics``: the stated bound
#: here is QUIET_CHECK_SECONDS (250 quiet queues are under the batch's 1,600) or ceil(QUEUES / CHANGE_CHECK_BATCH)
#: ticks of 50 ms or more (1.25 s; ~2 s with stats of ~2 ms), plus the volume's delay.
UNWAITED_WITHIN = 30.0
#: Seconds between another host's send and the short poll or count that must see it at the first try: more than
#: a tick (a change check just before the send does not stand for the receive's own) plus the volume's delay, and
#: far less than QUIET_CHECK_SECONDS (the ticks alone would rarely have checked the queue by then).
AFTER_THE_SEND = 0.25
#: The root's name on the volume.
ROOT = "manyqueues"


@pytest.fixture(scope="module")
def host(gluster: Gluster) -> Iterator[tuple[Host, Store, list[str]]]:
    """mq on host 0 with QUEUES queues indexed; a brokerless Store on the same root through host 1's mount."""
    other = Store(gluster.roots(ROOT, hosts=2)[1])
    names = [f"many-{i:04d}" for i in range(QUEUES)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda q: other.create_queue(QueueName(q)), names))
    daemons = Daemons()
    try:
        (h,) = start_hosts(daemons, gluster, ROOT, hosts=1)
        with httpx.Client(timeout=30, verify=PLAIN_HTTP) as http:
            for q in names:
                assert http.get(f"{h.stack.url}/{q}/messages").status_code == 204  # indexed, empty
        yield h, other, names
    finally:
        daemons.stop_all()


def gauges(url: str, name: str = "mq_queue_messages_ready") -> dict[str, float]:
    """queue -> value of the per-queue family ``name`` in mq's ``GET /metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=30, verify=PLAIN_HTTP).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["queue"]: s.value for s in family.samples}
    return {}


def test_a_long_poll_on_any_of_many_queues_gets_another_hosts_send(host):
    h, other, names = host
    rng = random.Random(12)
    with httpx.Client(timeout=60, verify=PLAIN_HTTP) as http:
        for q in rng.sample(names, 5):
            got: list[httpx.Response] = []
            poll = threading.Thread(
                target=lambda q=q, got=got: got.append(http.get(f"{h.stack.url}/{q}/messages?wait_time_seconds=20"))
            )
            poll.start()
            time.sleep(1)  # the poll waits
            mid = other.send(QueueName(q), b"from host 1")
            poll.join()
            r = got[0]
            assert r.status_code == 200 and r.headers["X-Message-Id"] == mid, h.stack.logs()
            assert http.delete(
                f"{h.stack.url}/{q}/messages/{mid}", params={"receipt_handle": r.headers["X-Receipt-Handle"]}
            ).status_code in (200, 204)


def test_idle_queues_nobody_waits_on_count_another_hosts_sends_within_a_round(host):
    h, other, names = host
    rng = random.Random(15)
    chosen = rng.sample(names, 20)
    for q in chosen:
        other.send(QueueName(q), b"a")
        other.send(QueueName(q), b"b")
    deadline = time.monotonic() + UNWAITED_WITHIN
    with httpx.Client(timeout=30, verify=PLAIN_HTTP) as http:
        for q in chosen:
            while (ready := http.get(f"{h.stack.url}/{q}").json()["ready"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ready == 2, (q, ready, h.stack.logs())
        ready = gauges(h.stack.url)
        assert all(ready[q] == 2 for q in chosen), {q: ready.get(q) for q in chosen}
        # Both messages of each, once each: the turns neither lose nor repeat a name.
        for q in chosen:
            r = http.get(f"{h.stack.url}/{q}/messages?max_messages=10")
            assert sorted(m["body_base64"] for m in r.json()["messages"]) == ["YQ==", "Yg=="], r.text
        assert gauges(h.stack.url).get(chosen[0]) == 0


def test_a_redrive_status_written_by_another_host_shows_in_the_scrape_within_a_round(host):
    """The scrape takes the change checks' stamp of an indexed queue instead of its own ``stat``: a
    ``.redrive`` replaced by another host (a change of the directory) still shows within their bound."""
    h, other, names = host
    queue = names[-7]
    assert queue not in gauges(h.stack.url, "mq_redrive_moved_messages")
    other.write_redrive_status(QueueName(queue), {"state": "done", "moved": 7, "skipped": 1, "updated_ms": 0})
    deadline = time.monotonic() + UNWAITED_WITHIN
    while (moved := gauges(h.stack.url, "mq_redrive_moved_messages").get(queue)) is None:
        assert time.monotonic() < deadline, h.stack.logs()
        time.sleep(0.1)
    assert moved == 7


def test_a_short_poll_or_a_count_on_a_quiet_queue_sees_another_hosts_send_at_the_first_try(host):
    """The ticks check a queue nobody waits on less and less often while it stays unchanged (up to every
    QUIET_CHECK_SECONDS); a receive that finds it empty and ``GET /{queue}`` check its directory themselves
    (docs/api.md, "Long polling"): a consumer's first short poll after another host's send gets the message."""
    h, other, names = host
    rng = random.Random(27)
    quiet = rng.sample(names, 8)
    time.sleep(2)  # their checks found nothing for a while: gaps of a second or more
    with httpx.Client(timeout=30, verify=PLAIN_HTTP) as http:
        for q in quiet[:4]:
            mid = other.send(QueueName(q), b"poll me")
            time.sleep(AFTER_THE_SEND)
            r = http.get(f"{h.stack.url}/{q}/messages")
            assert r.status_code == 200 and r.headers["X-Message-Id"] == mid, (q, r.status_code, h.stack.logs())
            assert http.delete(
                f"{h.stack.url}/{q}/messages/{mid}", params={"receipt_handle": r.headers["X-Receipt-Handle"]}
            ).status_code in (200, 204)
        for q in quiet[4:]:
            other.send(QueueName(q), b"count me")
            time.sleep(AFTER_THE_SEND)
            assert http.get(f"{h.stack.url}/{q}").json()["ready"] == 1, (q, h.stack.logs())
            assert http.get(f"{h.stack.url}/{q}/messages").status_code == 200
