"""Faults of a real cluster: a host's whole stack killed, a brick killed, a host's FUSE mount lost.

Each test runs load through the hosts of one shared root (three full stacks on the session's
GlusterFS volume), makes the fault, and then checks as a user would: every acknowledged message is
delivered intact (lost = 0), none is handed to two consumers inside its visibility timeout, and the
HTTP answers during the fault are 503 with ``Retry-After`` (the client retries), never 500. After a
killed brick is started again, the test waits for self-heal (``gluster volume heal VOL info``: 0 entries
on every brick) and reads the bricks' own copies: the healed brick holds exactly the others' messages.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from cluster_load import Ledger, check, consume, produce, start_load
from conftest import Gluster, Host, start_hosts

from mqcore import model
from mqcore.client import connect
from tests.conftest import PLAIN_HTTP, Daemons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

#: Visibility timeout of the faults' receives, seconds.
VISIBILITY = 3


@pytest.fixture(scope="module")
def hosts(gluster: Gluster) -> Iterator[list[Host]]:
    """Three full stacks on one root of the volume, shared by this module's tests (own queues each)."""
    daemons = Daemons()
    try:
        yield start_hosts(daemons, gluster, "faults", visibility_timeout=VISIBILITY)
    finally:
        daemons.stop_all()


def drain(target: str, queue: str, ledger: Ledger, until: set[str], timeout: float = 90) -> None:
    """Consume ``queue`` through ``target`` until every id in ``until`` was delivered (or ``timeout``)."""
    stop = threading.Event()
    worker = threading.Thread(
        daemon=True, target=consume, args=(target, [queue], "drain", ledger, stop), kwargs={"visibility_timeout": 30}
    )
    worker.start()
    deadline = time.monotonic() + timeout
    while until - ledger.delivered_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    worker.join(60)


def test_a_host_killed_whole_under_load_loses_nothing_and_its_leases_come_back_through_another_host(hosts):
    a, b = hosts[0], hosts[1]
    queue = "hostkill"
    with connect(b.stack.url) as client:
        client.create_queue(queue)
    ledger = Ledger()
    producer = threading.Thread(daemon=True, target=produce, args=(b.stack.url, queue, "k", 120, ledger))
    producer.start()
    # A's consumer takes messages and never deletes them: A holds their leases when it dies.
    held = Ledger()
    stop = threading.Event()
    holder = threading.Thread(
        daemon=True,
        target=consume,
        args=(a.stack.url, [queue], "a", held, stop),
        kwargs={"visibility_timeout": VISIBILITY, "delete": False},
    )
    holder.start()
    deadline = time.monotonic() + 60
    while len(held.deliveries) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    holder.join(30)
    assert len(held.deliveries) >= 10, a.stack.logs()
    for daemon in a.stack.daemons():
        daemon.kill(signal.SIGKILL)
    producer.join(120)
    drain(b.stack.url, queue, ledger, set(ledger.sent))
    ledger.deliveries[:0] = held.deliveries
    counts = check(ledger, VISIBILITY)
    # Each lease A held when it died comes back through B as the next receive (A's consumer may have taken a
    # message twice, when a slow machine let its 3 s lease end before the kill).
    held_counts = {d.message_id: d.receive_count for d in sorted(held.deliveries, key=lambda d: d.receive_count)}
    again = {(d.message_id, d.receive_count) for d in ledger.deliveries if d.consumer == "drain"}
    assert {(i, n + 1) for i, n in held_counts.items()} <= again, "A's leases were redelivered through B"
    assert counts["acknowledged"] == 120, (counts, ledger.errors[:5])
    # A comes back (same root, same mount) and serves again.
    for daemon in a.stack.daemons():
        daemon.start()
    with connect(a.stack.url) as client:
        message_id = client.send(queue, b"after the restart")
        [got] = client.receive(queue, wait_time_seconds=10)
        assert got.message_id == message_id and got.body == b"after the restart"
        client.delete(queue, got.receipt_handle)


def test_a_brick_killed_under_load_then_restarted_and_healed_loses_nothing_and_corrupts_nothing(hosts, gluster):
    queue = "brickkill"
    with connect(hosts[0].stack.url) as client:
        client.create_queue(queue)
    ledger = Ledger()
    producers, consumers, stop = start_load(
        queue,
        ledger,
        producers=[(h.stack.url, f"b{h.index}") for h in hosts],
        count=60,
        consumers=[(h.stack.url, f"c{h.index}") for h in hosts[:2]],
        visibility_timeout=30,
        drain=False,
    )
    while len(ledger.sent) < 40:
        time.sleep(0.05)
    os.kill(gluster.brick_pid(2), signal.SIGKILL)
    sent_at_kill = len(ledger.sent)
    deadline = time.monotonic() + 60
    while len(ledger.sent) < sent_at_kill + 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ledger.sent) >= sent_at_kill + 20, f"sends stopped with one brick of three down: {ledger.errors[-5:]}"
    gluster.start_force()
    for t in producers:
        t.join(120)
    stop.set()  # the consumers stop at once: what is left stays in the queue for the brick check
    for t in consumers:
        t.join(60)
    gluster.wait_healed()
    _assert_bricks_agree(gluster, ledger, queue)
    drain(hosts[0].stack.url, queue, ledger, set(ledger.sent))
    counts = check(ledger, 30)
    assert counts["acknowledged"] == 180, (counts, ledger.errors[:5])


def _brick_copies(gluster: Gluster, brick: int, queue: str) -> dict[str, bytes]:
    """The message files of ``queue`` (ready and in flight) on brick ``brick`` itself: relative path -> bytes."""
    copies = {}
    for where, keep in (
        (("faults", "queues", queue), lambda name: not name.startswith(".")),
        (("faults", "delay"), lambda name: f".{queue}." in name),
    ):
        directory = gluster.brick_path(brick, *where)
        for name in filter(keep, os.listdir(directory)):
            try:
                copies[os.path.join(*where, name)] = (directory / name).read_bytes()
            except FileNotFoundError:  # moved meanwhile (the next look sees it)
                pass
    return copies


def _assert_bricks_agree(gluster: Gluster, ledger: Ledger, queue: str) -> None:
    """After self-heal, the killed brick (2) holds exactly what bricks 1 and 3 hold, and each copy is intact."""
    deadline = time.monotonic() + 30
    while True:  # the hosts' movers and reapers still run: look again until one look finds the bricks still
        copies = [_brick_copies(gluster, b, queue) for b in (1, 2, 3)]
        if copies[0] == copies[1] == copies[2]:
            break
        assert time.monotonic() < deadline, {
            f"b{b}": sorted(set(c) ^ set(copies[0])) or "same names, other bytes"
            for b, c in ((2, copies[1]), (3, copies[2]))
        }
        time.sleep(0.5)
    assert copies[1], "messages were left in the queue for the check"
    sent_bodies = set(ledger.sent.values()) | set(ledger.unacknowledged)
    for path, data in copies[1].items():
        assert model.decode(data)[1] in sent_bodies, f"{path} on the healed brick is not a message that was sent"


def _status_and_retry_after(url: str, method: str, path: str, **kwargs) -> tuple[int, str | None]:
    r = httpx.request(method, url + path, timeout=30, **kwargs, verify=PLAIN_HTTP)
    return r.status_code, r.headers.get("Retry-After")


def test_a_host_whose_mount_is_lost_answers_503_and_recovers_when_it_comes_back(hosts, gluster):
    host = hosts[2]
    queue = "mountlost"
    url = host.stack.url
    assert httpx.put(f"{url}/{queue}", verify=PLAIN_HTTP).status_code == 201
    sent = httpx.post(f"{url}/{queue}/messages", content=b"before", verify=PLAIN_HTTP).headers["X-Message-Id"]
    os.kill(gluster.fuse_pid(2), signal.SIGKILL)
    with pytest.raises(OSError) as lost:
        os.stat(host.root)
    assert lost.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)  # the kernel says which: both mean "lost"
    answers = {
        "send": _status_and_retry_after(url, "POST", f"/{queue}/messages", content=b"during"),
        "receive": _status_and_retry_after(url, "GET", f"/{queue}/messages"),
        "stats": _status_and_retry_after(url, "GET", f"/{queue}"),
        "delete": _status_and_retry_after(url, "DELETE", f"/{queue}/messages/{sent}"),
        "create": _status_and_retry_after(url, "PUT", f"/{queue}-2"),
    }
    assert all(status == 503 and retry for status, retry in answers.values()), answers
    subprocess.run(["umount", "-l", str(gluster.mounts[2])], check=True, timeout=60)
    gluster.mount(2)
    # The same mq, not restarted: it serves again once its root is back.
    deadline = time.monotonic() + 30
    while httpx.post(f"{url}/{queue}/messages", content=b"after", verify=PLAIN_HTTP).status_code != 201:
        assert time.monotonic() < deadline, host.stack.logs()
        time.sleep(0.5)
    with connect(url) as client:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += client.receive(queue, max_messages=10, wait_time_seconds=1)
        assert sorted(m.body for m in got) == [b"after", b"before"]
    assert host.stack.mq.running
    assert " 500 " not in host.stack.mq.log and "Traceback" not in host.stack.mq.log, host.stack.mq.log_tail()
