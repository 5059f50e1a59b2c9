"""Three hosts, each a full stack (mq, mq-mover, mq-reaper) on its own FUSE mount of one GlusterFS volume.

What a user of a cluster checks (issue 14; docs/cluster.md): producers and consumers on every
host, HTTP on some and brokerless on another, lose no acknowledged message and never hand one
message to two consumers inside its visibility timeout; a receipt handle from one host works on
another; a message sent through one host is delivered through another within a bounded delay
although inotify sees only its own mount. Issue 18's race: two hosts racing for the head of one
queue (``--peers 0``) under load never both get the same message, and their collisions show in
``mq_storage_races_lost_total`` (docs/protocol.md 13.3) with no request answered 500.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from cluster_load import Ledger, check, consume, finish_load, produce
from conftest import Gluster, Host, start_hosts
from prometheus_client.parser import text_string_to_metric_families

from mqcore.client import connect
from tests.conftest import PLAIN_HTTP, Daemons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

#: Visibility timeout of the load tests' receives, seconds.
VISIBILITY = 10


@pytest.fixture(scope="module")
def hosts(gluster: Gluster) -> Iterator[list[Host]]:
    """Three full stacks on one root of the volume, shared by this module's tests (own queues each)."""
    daemons = Daemons()
    try:
        yield start_hosts(daemons, gluster, "cluster", visibility_timeout=VISIBILITY)
    finally:
        daemons.stop_all()


def run_threads(*threads: threading.Thread) -> None:
    for t in threads:
        t.start()


def test_producers_and_consumers_on_every_host_lose_nothing_and_never_share_a_lease(hosts):
    """HTTP on hosts 0 and 2, brokerless on host 1; three queues; everything sent everywhere."""
    queues = ["mixed-a", "mixed-b", "mixed-c"]
    targets = [hosts[0].stack.url, str(hosts[1].root), hosts[2].stack.url]
    with connect(targets[0]) as client:
        for q in queues:
            client.create_queue(q)
    ledger = Ledger()
    stop = threading.Event()
    producers = [
        threading.Thread(
            daemon=True, target=produce, args=(target, q, f"h{i}-{q}", 40, ledger), kwargs={"batch": 1 + i % 2 * 4}
        )
        for i, target in enumerate(targets)
        for q in queues
    ]
    consumers = [
        threading.Thread(
            target=consume, args=(target, queues, f"c{i}.{j}", ledger, stop), kwargs={"visibility_timeout": VISIBILITY}
        )
        for i, target in enumerate(targets)
        for j in range(2)
    ]
    run_threads(*producers, *consumers)
    finish_load(ledger, producers, consumers, stop)
    counts = check(ledger, VISIBILITY)
    assert counts["acknowledged"] == len(producers) * 40, (counts, ledger.errors[:10])
    by_host = {d.consumer.split(".")[0] for d in ledger.deliveries}
    assert by_host == {"c0", "c1", "c2"}, "every host's consumers received messages"
    for q in queues:
        stats = httpx.get(f"{hosts[1].stack.url}/{q}", verify=PLAIN_HTTP).json()
        assert (stats["ready"], stats["in_flight"]) == (0, 0), stats


def test_a_receipt_handle_from_one_host_is_honoured_on_the_others(hosts):
    a, b, c = (h.stack.url for h in hosts)
    with httpx.Client(timeout=30, verify=PLAIN_HTTP) as http:
        http.put(f"{a}/handles")
        sent = [http.post(f"{a}/handles/messages", content=b"m%d" % i).headers["X-Message-Id"] for i in range(3)]
        # One consumer on B, after every send was acknowledged: FIFO (docs/protocol.md section 10).
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            r = http.get(f"{b}/handles/messages?visibility_timeout_seconds=30")
            if r.status_code == 200:
                got.append(r)
        assert [r.headers["X-Message-Id"] for r in got] == sent
        first, second, third = got
        # C extends B's lease of the first, A deletes it; C releases the second at once and A receives it.
        handle = first.headers["X-Receipt-Handle"]
        mid = first.headers["X-Message-Id"]
        body = json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": 60})
        assert http.post(f"{c}/handles/messages/{mid}/visibility", content=body).status_code == 200
        assert http.delete(f"{a}/handles/messages/{mid}", params={"receipt_handle": handle}).status_code == 200
        mid2, handle2 = second.headers["X-Message-Id"], second.headers["X-Receipt-Handle"]
        body = json.dumps({"receipt_handle": handle2, "visibility_timeout_seconds": 0})
        assert http.post(f"{c}/handles/messages/{mid2}/visibility", content=body).status_code == 200
        again = None
        deadline = time.monotonic() + 10
        while again is None and time.monotonic() < deadline:
            r = http.get(f"{a}/handles/messages")
            again = r if r.status_code == 200 else None
        assert again is not None and again.headers["X-Message-Id"] == mid2
        assert again.headers["X-Receive-Count"] == "2"
        stale = http.delete(f"{b}/handles/messages/{mid2}", params={"receipt_handle": handle2})
        assert stale.status_code == 410, stale.text
        for r in (again, third):
            params = {"receipt_handle": r.headers["X-Receipt-Handle"]}
            assert http.delete(f"{c}/handles/messages/{r.headers['X-Message-Id']}", params=params).status_code == 200


def test_a_message_sent_through_one_host_is_delivered_through_another_long_before_a_rescan(hosts):
    """inotify sees only its own mount: the other host finds the send by its directory change check.

    The hosts' mq rescan every 30 s (CLUSTER_MQ_ARGS); a long poll of 10 s on B that gets A's message
    proves B found it without a rescan (bench/cluster.py measures the delay).
    """
    a, b = hosts[0].stack.url, hosts[1].stack.url
    httpx.put(f"{a}/crosshost", verify=PLAIN_HTTP)
    with httpx.Client(timeout=30, verify=PLAIN_HTTP) as http:
        for i in range(5):
            assert http.get(f"{b}/crosshost/messages?wait_time_seconds=0").status_code == 204  # indexed on B
            mid = http.post(f"{a}/crosshost/messages", content=b"x%d" % i).headers["X-Message-Id"]
            r = http.get(f"{b}/crosshost/messages?wait_time_seconds=10")
            assert r.status_code == 200 and r.headers["X-Message-Id"] == mid, hosts[1].stack.logs()
            http.delete(f"{b}/crosshost/messages/{mid}", params={"receipt_handle": r.headers["X-Receipt-Handle"]})


#: Receives of the race test: issue 18 asks for at least 5,000 (MQ_RACE_RECEIVES=5000). The suite's default is
#: smaller because every receive here costs several round trips to three bricks: on the shared 2-core machine
#: of this project, loaded by other runs, MQ_RACE_RECEIVES=5000 passed in 454 s (500: about 45 s).
RACE_RECEIVES = int(os.environ.get("MQ_RACE_RECEIVES", "500"))
#: Seconds the race test waits for its receives: a safety net against a hang, not a speed claim (speed lives in
#: bench/). The loop is bound by GlusterFS's own work (~100 brick lookups per delivery, 1.6 cores: docs/performance.md
#: "The test suite's wall time and the race test (stop 24)"): 500 took ~30 s alone and 85-100 s inside the whole
#: suite, against a deadline of 100 s until stop 24.
RACE_DEADLINE = RACE_RECEIVES // 2


@pytest.mark.timeout(120 + RACE_DEADLINE)
def test_two_hosts_racing_for_the_head_of_one_queue_never_share_a_message(hosts):
    """Issue 18 on a real shared filesystem: ``--peers 0``, two consumers on each of hosts 0 and 1, racing for
    the head of one queue whose messages are never deleted, so each comes back to the head again and again
    (the movers of all three hosts redeliver it after its 2 s visibility timeout). Nothing is handed to two
    consumers inside its visibility timeout, and every message is still there at the end.
    """
    visibility = 2
    with connect(hosts[0].stack.url) as client:
        client.create_queue("race")
    ledger = Ledger()
    produce(str(hosts[2].root), "race", "p", 200, ledger, batch=10)
    stop = threading.Event()
    consumers = [
        threading.Thread(
            daemon=True,
            target=consume,
            args=(hosts[i].stack.url, ["race"], f"c{i}.{j}", ledger, stop),
            kwargs={"visibility_timeout": visibility, "delete": False},
        )
        for i in range(2)
        for j in range(2)
    ]
    run_threads(*consumers)
    deadline = time.monotonic() + RACE_DEADLINE
    while len(ledger.deliveries) < RACE_RECEIVES and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in consumers:
        t.join(60)
    counts = check(ledger, visibility, all_delivered=False)
    assert counts["deliveries"] >= RACE_RECEIVES, counts
    # The collisions were real, and handled as docs/protocol.md 13.3 says: a receive that found its message moved by
    # the other host (ENOENT, or ESTALE) took the next one; no request answered 500.
    metrics = [_metrics(hosts[i].stack.url) for i in range(2)]
    lost = sum(value for m in metrics for name, _, value in m if name == "mq_storage_races_lost_total")
    assert lost > 0, "the hosts never collided"
    statuses = {labels["status"] for m in metrics for _, labels, _ in m if "status" in labels}
    assert "500" not in statuses, statuses
    per_host = {f"c{i}": sum(d.consumer.startswith(f"c{i}.") for d in ledger.deliveries) for i in range(2)}
    assert min(per_host.values()) > RACE_RECEIVES // 10, f"both hosts raced for the head: {per_host}"
    # Nothing lost: every message is still in the queue, ready or in flight (peek lists both).
    with connect(str(hosts[1].root)) as local:
        on_disk: set[str] = set()
        for _ in range(20):  # a listing can miss a file the movers move between its two directories
            on_disk = {m.message_id for m in local.iter_peek("race")}
            if on_disk == set(ledger.sent):
                break
            time.sleep(0.5)
    assert on_disk == set(ledger.sent), f"missing {len(set(ledger.sent) - on_disk)}"


def _metrics(url: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``GET /metrics``: ``(name, labels, value)``."""
    text = httpx.get(f"{url}/metrics", timeout=30, verify=PLAIN_HTTP).text
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
