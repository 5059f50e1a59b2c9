"""Clock skew between hosts: host A's daemons run 2 s ahead, host C's 2 s behind (libfaketime), B's on time.

What happens (docs/cluster.md, "Clocks"; docs/protocol.md section 11), as a user sees it:

- ids carry the sender's clock: a message sent through the slow host sorts before one sent
  earlier through the fast host, so FIFO across hosts is off by the skew;
- deadlines are the receiver's clock, compared with each mover's: a lease taken through B is
  redelivered by A's mover (2 s ahead) up to 2 s early, never earlier than that;
- nothing acknowledged is lost under load through all three hosts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
from cluster_load import Ledger, check, finish_load, start_load
from conftest import Gluster, Host, cluster_unavailable, start_hosts

from tests.conftest import PLAIN_HTTP, Daemons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#: Each host's offset, seconds.
SKEW = (2, 0, -2)


def faketime(offset: int) -> dict[str, str] | None:
    """Environment that runs a process with its wall clock ``offset`` seconds off (monotonic clock untouched)."""
    if offset == 0:
        return None
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": f"{offset:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.fixture(scope="module")
def hosts(gluster: Gluster) -> Iterator[list[Host]]:
    if not os.path.exists(LIBFAKETIME):
        cluster_unavailable("libfaketime not found (apt-get install faketime)")
    daemons = Daemons()
    try:
        yield start_hosts(daemons, gluster, "skew", visibility_timeout=10, envs=[faketime(s) for s in SKEW])
    finally:
        daemons.stop_all()


def test_ids_carry_the_senders_clock_so_fifo_across_hosts_is_off_by_the_skew(hosts):
    a, b, c = (h.stack.url for h in hosts)
    httpx.put(f"{b}/skew-fifo", verify=PLAIN_HTTP)
    first = httpx.post(f"{a}/skew-fifo/messages", content=b"sent first, through the fast host", verify=PLAIN_HTTP)
    second = httpx.post(f"{c}/skew-fifo/messages", content=b"sent second, through the slow host", verify=PLAIN_HTTP)
    assert first.status_code == second.status_code == 201
    assert second.headers["X-Message-Id"] < first.headers["X-Message-Id"]  # 4 s of skew between them
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < deadline:
        r = httpx.get(f"{b}/skew-fifo/messages?wait_time_seconds=1", verify=PLAIN_HTTP)
        if r.status_code == 200:
            got.append(r.headers["X-Message-Id"])
    assert got == [second.headers["X-Message-Id"], first.headers["X-Message-Id"]]


def test_a_mover_whose_clock_is_ahead_redelivers_early_by_at_most_its_skew(hosts):
    b = hosts[1].stack.url
    httpx.put(f"{b}/skew-deadline", verify=PLAIN_HTTP)
    httpx.post(f"{b}/skew-deadline/messages", content=b"leased through B", verify=PLAIN_HTTP)
    visibility = 6
    taken = time.monotonic()
    r = httpx.get(f"{b}/skew-deadline/messages?visibility_timeout_seconds={visibility}", verify=PLAIN_HTTP)
    assert r.status_code == 200
    again = httpx.get(f"{b}/skew-deadline/messages?wait_time_seconds=20", timeout=30, verify=PLAIN_HTTP)
    back_after = time.monotonic() - taken
    assert again.status_code == 200 and again.headers["X-Receive-Count"] == "2"
    # B's own mover would redeliver at 6 s; A's, 2 s ahead, may do it from 4 s on; nothing may before that.
    assert back_after >= visibility - SKEW[0] - 0.2, back_after


def test_nothing_acknowledged_is_lost_with_skewed_hosts_under_load(hosts):
    queue = "skew-load"
    httpx.put(f"{hosts[1].stack.url}/{queue}", verify=PLAIN_HTTP)
    ledger = Ledger()
    producers, consumers, stop = start_load(
        queue,
        ledger,
        producers=[(h.stack.url, f"s{h.index}") for h in hosts],
        count=40,
        consumers=[(h.stack.url, f"c{h.index}") for h in hosts],
        visibility_timeout=10,
    )
    finish_load(ledger, producers, consumers, stop)
    # A mover 2 s ahead may redeliver a lease 2 s early: a double delivery is one inside (timeout - skew).
    counts = check(ledger, 10 - 2 * max(SKEW))
    assert counts["acknowledged"] == 120, (counts, ledger.errors[:5])
