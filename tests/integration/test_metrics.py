"""``GET /metrics`` of mq and ``--metrics-port`` of mq-mover and mq-reaper, scraped after a known workload.

Every scrape is parsed with prometheus-client's own parser (so the exposition
is valid Prometheus text), and the counts are exact: 100 sent, 60 received,
50 deleted, 10 left to expire into the dead-letter queue, redriven back, and the
queue purged.
The same counts hold with two mq daemons on one root (each counts what it
did; their sum is the workload), and the per-queue gauges of both agree.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from http_checks import mq_in_process
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from mqcore.protocol import Store

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    """Every sample of ``url`` parsed by prometheus_client.parser: ``{(name, labels): value}``."""
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` (0 when absent: a counter that never counted)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def send_many(stack: Any, queue: str, n: int) -> None:
    """Send ``n`` messages in batches of 10."""
    for start in range(0, n, 10):
        entries = [{"id": str(i), "body": f"m{start + i}"} for i in range(min(10, n - start))]
        reply = await stack.request("POST", f"/{queue}/messages/batch", data=json.dumps({"messages": entries}))
        assert reply.status == 200 and not reply.json["failed"], reply.body


async def receive_many(stack: Any, queue: str, n: int, visibility_timeout: int) -> list[dict[str, Any]]:
    """Receive exactly ``n`` messages, 10 at a time."""
    got: list[dict[str, Any]] = []
    while len(got) < n:
        want = min(10, n - len(got))
        reply = await stack.request(
            "GET", f"/{queue}/messages?max_messages={want}&visibility_timeout_seconds={visibility_timeout}"
        )
        assert reply.status == 200, reply.body
        got += reply.json["messages"]
    assert len(got) == n
    return got


async def workload(stacks: list[Any], queue: str, dlq: str) -> None:
    """Send 100 (split over ``stacks``), receive 60, delete 50, let 10 dead-letter, purge the DLQ."""
    first = stacks[0]
    await first.create_queue(dlq)
    reply = await first.request("PUT", f"/{queue}", data=json.dumps({"dead_letter_queue": dlq, "max_receive_count": 1}))
    assert reply.status == 201, reply.body
    share = 100 // len(stacks)
    for stack in stacks:
        await send_many(stack, queue, share)
    deleted = 0
    for stack in stacks:
        for message in await receive_many(stack, queue, 50 // len(stacks), 300):
            reply = await stack.request("DELETE", f"/{queue}/messages/{message['message_id']}")
            assert reply.status == 200, reply.body
            deleted += 1
    assert deleted == 50
    await receive_many(first, queue, 10, 1)  # not deleted: dead-lettered by mq-mover after 1 s


async def test_counts_after_a_known_workload(stack_factory, http, wait) -> None:
    mover_port = free_port()
    stack = stack_factory(mover_args=["--metrics-port", str(mover_port)])
    queue, dlq = "work", "work-dlq"
    await workload([stack], queue, dlq)

    async def dead_lettered() -> Samples | None:
        samples = await scrape(http, stack.url + "/metrics")
        return samples if value(samples, "mq_queue_messages_ready", queue=dlq) == 10 else None

    samples = await wait(dead_lettered, timeout=30, message=stack.logs)
    assert value(samples, "mq_messages_sent_total", queue=queue) == 100
    assert value(samples, "mq_messages_received_total", queue=queue) == 60
    assert value(samples, "mq_messages_deleted_total", queue=queue) == 50
    assert value(samples, "mq_queue_messages_ready", queue=queue) == 40
    assert value(samples, "mq_queue_messages_in_flight", queue=queue) == 0
    assert value(samples, "mq_queue_messages_delayed", queue=queue) == 0
    assert value(samples, "mq_queue_oldest_message_age_seconds", queue=queue) > 0
    assert value(samples, "mq_messages_sent_total", queue=dlq) == 0

    mover = await scrape(http, f"http://127.0.0.1:{mover_port}/metrics")
    assert value(mover, "mq_messages_dead_lettered_total", queue=queue) == 10
    assert value(mover, "mq_messages_redelivered_total", queue=queue) == 0
    assert value(mover, "mq_mover_redelivery_lag_seconds_count") == 10
    assert value(mover, "process_open_fds") > 0

    # Redrive the 10 back (progress in the DLQ's gauges), then purge the 50 now ready in the queue.
    reply = await stack.request("POST", f"/{dlq}/redrive")
    assert reply.status == 202, reply.body

    async def redriven() -> Samples | None:
        samples = await scrape(http, stack.url + "/metrics")
        done = value(samples, "mq_redrive_moved_messages", queue=dlq) == 10
        return samples if done and value(samples, "mq_redrive_running", queue=dlq) == 0 else None

    samples = await wait(redriven, timeout=20, message=stack.logs)
    assert value(samples, "mq_queue_messages_ready", queue=dlq) == 0
    reply = await stack.request("POST", f"/{queue}/purge")
    assert reply.status == 200, reply.body
    assert (await stack.request("GET", "/no/such/route/here")).status == 404
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_http_request_duration_seconds_count", route="unmatched", method="GET", status="404") == 1
    assert value(samples, "mq_messages_purged_total", queue=queue) == 50
    assert value(samples, "mq_queue_messages_ready", queue=queue) == 0
    assert value(samples, "mq_messages_sent_total", queue=queue) == 100  # a redrive is not a send
    # requests by route and status; storage; process
    assert (
        value(
            samples,
            "mq_http_request_duration_seconds_count",
            route="/{queue}/messages/batch",
            method="POST",
            status="200",
        )
        == 10
    )
    assert (
        value(
            samples,
            "mq_http_request_duration_seconds_count",
            route="/{queue}/messages/{message_id}",
            method="DELETE",
            status="200",
        )
        == 50
    )
    assert value(samples, "mq_storage_fsync_duration_seconds_count", kind="file") >= 100
    assert value(samples, "mq_storage_group_commit_batch_size_sum") >= 10
    assert value(samples, "mq_storage_free_bytes") > 0
    assert value(samples, "mq_storage_free_inodes") > 0
    assert value(samples, "process_resident_memory_bytes") > 0


async def test_two_mq_daemons_on_one_root(stack_factory, daemons, http, wait) -> None:
    stack = stack_factory()
    second = daemons.start("mq", "--root", stack.root, "--port", "0", "--visibility-timeout", "30")
    other = type(stack)(root=stack.root, mq=second, mover=None, reaper=None, session=http)
    queue, dlq = "shared", "shared-dlq"
    await workload([stack, other], queue, dlq)

    async def settled() -> list[Samples] | None:
        both = [await scrape(http, s.url + "/metrics") for s in (stack, other)]
        if all(value(s, "mq_queue_messages_ready", queue=dlq) == 10 for s in both) and all(
            value(s, "mq_queue_messages_ready", queue=queue) == 40 for s in both
        ):
            return both
        return None

    both = await wait(settled, timeout=30, message=stack.logs)
    for name, total in (
        ("mq_messages_sent_total", 100),
        ("mq_messages_received_total", 60),
        ("mq_messages_deleted_total", 50),
    ):
        assert sum(value(s, name, queue=queue) for s in both) == total, name
    assert [value(s, "mq_messages_sent_total", queue=queue) for s in both] == [50, 50]
    assert all(value(s, "mq_queue_messages_in_flight", queue=queue) == 0 for s in both)


@pytest.mark.parametrize("stack", [{"mq_args": ["--metrics-max-queues", "2"], "mover": False}], indirect=True)
async def test_queue_labels_are_bounded(stack, http) -> None:
    for name in ("a1", "a2", "a3", "a4"):
        await stack.create_queue(name)
        await stack.send(name, b"x")
    samples = await scrape(http, stack.url + "/metrics")
    labels = {dict(key[1]).get("queue") for key in samples if key[0] == "mq_queue_messages_ready"}
    assert labels == {"a1", "a2", "_other"}
    assert value(samples, "mq_queue_messages_ready", queue="_other") == 2
    assert value(samples, "mq_messages_sent_total", queue="_other") == 2


async def test_scrape_shows_what_a_brokerless_client_changed_since_the_last_one(stack_factory, http) -> None:
    # mq reuses what it read of a directory while the directory's stamp is unchanged (daemons._metrics.ScrapeCache);
    # a stamp younger than 2 s is never reused, so the first scrapes here come after 2.5 s of quiet.
    stack = stack_factory(mover=False, reaper=False)
    store = Store(stack.root)
    queue = "behind"
    store.create_queue(queue)
    for i in range(3):
        store.send(queue, f"m{i}".encode())
    await asyncio.sleep(2.5)
    for _ in range(2):  # the second scrape answers from what the first read
        samples = await scrape(http, stack.url + "/metrics")
        assert value(samples, "mq_queue_messages_ready", queue=queue) == 3
        assert value(samples, "mq_queue_messages_in_flight", queue=queue) == 0
        assert ("mq_redrive_moved_messages", frozenset({("queue", queue)})) not in samples

    store.send(queue, b"m3")
    store.send(queue, b"m4")
    first = sorted(n for n in os.listdir(Path(stack.root) / "queues" / queue) if not n.startswith("."))[0]
    assert store.lease(queue, first, 300_000) is not None
    store.write_redrive_status(queue, {"state": "done", "moved": 7, "skipped": 1, "updated_ms": 0})
    store.create_queue("later")
    store.send("later", b"x")
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_queue_messages_ready", queue="later") == 1
    assert value(samples, "mq_queue_messages_ready", queue=queue) == 4
    assert value(samples, "mq_queue_messages_in_flight", queue=queue) == 1
    assert value(samples, "mq_redrive_moved_messages", queue=queue) == 7
    assert value(samples, "mq_redrive_running", queue=queue) == 0


async def test_reaper_metrics_count_reaped_files(stack_factory, http, wait, tmp_path: Path) -> None:
    port = free_port()
    stack = stack_factory(mover=False, reaper_args=["--metrics-port", str(port)])
    await stack.create_queue("r")
    ids = [await stack.send("r", b"12345") for _ in range(3)]
    for message_id in ids:
        assert (await stack.delete("r", message_id)).status == 200

    async def reaped() -> Samples | None:
        samples = await scrape(http, f"http://127.0.0.1:{port}/metrics")
        return samples if value(samples, "mq_reaper_reaped_files_total") == 3 else None

    samples = await wait(reaped, timeout=20, message=stack.logs)
    assert value(samples, "mq_reaper_reaped_bytes_total") >= 15


async def test_healthz_and_readyz_answer(stack_factory) -> None:
    stack = stack_factory(mover=False, reaper=False)
    reply = await stack.request("GET", "/healthz")
    assert reply.status == 200 and reply.json == {"status": "ok"}
    reply = await stack.request("GET", "/readyz")
    assert reply.status == 200, reply.body
    assert reply.json["status"] == "ready"
    assert {name for name, check in reply.json["checks"].items() if check["ok"]} == {"writable", "probe", "free_space"}
    assert not [p for p in os.listdir(stack.root) if p.startswith(".mq-readyz")], "the probe file was left behind"


async def index(stack: Any, queue: str, sends: int) -> None:
    """Create ``queue`` through mq, send ``sends`` messages and receive one (mq indexes and watches the queue)."""
    await stack.create_queue(queue)
    for i in range(sends):
        await stack.send(queue, f"m{i}".encode())
    assert (await stack.receive(queue)).status == 200


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "no-inotify"])
async def test_scrape_shows_what_a_brokerless_client_did_to_a_queue_mq_indexed(
    stack_factory, http, wait, inotify
) -> None:
    # With inotify mq reads again only the indexed queues whose directory had an event since the last scrape
    # (daemons._scrape), and its index has every change at once. Without inotify (MQ_NO_INOTIFY; another host's
    # changes on a shared filesystem) delay/ and .redrive are read at every scrape, and the index (ready count,
    # oldest age) catches up at the next rescan (--rescan-interval; every 50 ms on a shared filesystem).
    env = None if inotify else {"MQ_NO_INOTIFY": "1"}
    stack = stack_factory(mover=False, reaper=False, env=env, mq_args=["--rescan-interval", "1"])
    await index(stack, "seen", 3)
    await index(stack, "quiet", 2)
    for _ in range(2):  # the second scrape answers from what the first read
        samples = await scrape(http, stack.url + "/metrics")
        assert value(samples, "mq_queue_messages_ready", queue="seen") == 2
        assert value(samples, "mq_queue_messages_in_flight", queue="seen") == 1
        assert value(samples, "mq_queue_messages_ready", queue="quiet") == 1

    store = Store(stack.root)
    store.send("seen", b"m3")
    store.send("seen", b"m4")
    first = sorted(n for n in os.listdir(Path(stack.root) / "queues" / "seen") if not n.startswith("."))[0]
    assert store.lease("seen", first, 300_000) is not None
    store.write_redrive_status("seen", {"state": "running", "moved": 7, "skipped": 1, "updated_ms": store.clock()})
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_queue_messages_in_flight", queue="seen") == 2
    assert value(samples, "mq_redrive_moved_messages", queue="seen") == 7
    assert value(samples, "mq_redrive_running", queue="seen") == 1
    assert value(samples, "mq_queue_messages_ready", queue="quiet") == 1
    assert value(samples, "mq_queue_oldest_message_age_seconds", queue="quiet") > 0
    if inotify:
        assert value(samples, "mq_queue_messages_ready", queue="seen") == 3
    else:

        async def caught_up() -> bool:
            samples = await scrape(http, stack.url + "/metrics")
            return value(samples, "mq_queue_messages_ready", queue="seen") == 3

        await wait(caught_up, timeout=10, message=stack.logs)


async def test_a_queue_deleted_and_created_again_between_two_scrapes(stack_factory, http) -> None:
    stack = stack_factory(mover=False, reaper=False)
    await index(stack, "again", 3)
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_queue_messages_ready", queue="again") == 2

    store = Store(stack.root)
    store.delete_queue("again")
    store.create_queue("again")
    store.send("again", b"new")
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_queue_messages_ready", queue="again") == 1

    store.delete_queue("again")
    samples = await scrape(http, stack.url + "/metrics")
    assert ("mq_queue_messages_ready", frozenset({("queue", "again")})) not in samples


async def test_scrape_after_an_inotify_queue_overflow(stack_factory, http, wait) -> None:
    # mq is stopped (SIGSTOP) while a brokerless client renames more messages into an indexed queue than the
    # kernel's inotify queue holds (/proc/sys/fs/inotify/max_queued_events): the events are lost, IN_Q_OVERFLOW
    # makes mq rescan, and the scrapes must come to the real count (not stay at what the index held).
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    stack = stack_factory(mover=False, reaper=False)
    await index(stack, "flood", 1)
    await index(stack, "calm", 2)
    samples = await scrape(http, stack.url + "/metrics")
    assert value(samples, "mq_queue_messages_ready", queue="flood") == 0

    store = Store(stack.root, fsync=False)
    n = limit + 100
    os.kill(stack.mq.pid, signal.SIGSTOP)
    try:
        for _ in range(n):
            store.send("flood", b"x")
    finally:
        os.kill(stack.mq.pid, signal.SIGCONT)

    async def counted() -> Samples | None:
        samples = await scrape(http, stack.url + "/metrics")
        return samples if value(samples, "mq_queue_messages_ready", queue="flood") == n else None

    samples = await wait(counted, timeout=30, message=stack.logs)
    assert value(samples, "mq_queue_messages_ready", queue="calm") == 1
    assert "inotify queue overflowed" in stack.logs()


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"], ids=["text", "openmetrics"])
async def test_the_exposition_is_the_encoders_own(tmp_path: Path, http, accept) -> None:
    # GET /metrics writes the per-queue families' lines itself (daemons._scrape.Lines); they must be what
    # prometheus-client's encoder writes for the same registry, in the same order, with the _other label.
    async with mq_in_process(tmp_path / "root", metrics_max_queues=2) as (broker, _, url):
        for name in ("a1", "a2", "a3", "a4"):
            reply = await http.put(f"{url}/{name}")
            assert reply.status == 201
            for i in range(3):
                assert (await http.post(f"{url}/{name}/messages", data=f"m{i}")).status == 201
        assert (await http.get(f"{url}/a1/messages")).status == 200
        assert (await http.get(f"{url}/a3/messages")).status == 200
        store = Store(str(tmp_path / "root"))
        store.write_redrive_status("a2", {"state": "done", "moved": 3, "skipped": 0, "updated_ms": 0})
        store.write_redrive_status("a4", {"state": "running", "moved": 5, "skipped": 1, "updated_ms": store.clock()})
        for _ in range(2):
            async with http.get(f"{url}/metrics", headers={"Accept": accept}) as resp:
                served = await resp.text()
                content_type = resp.headers["Content-Type"]
            encoder, expected_type = choose_encoder(accept)
            expected = encoder(broker.metrics.registry).decode()
            assert content_type == expected_type
            assert comparable(served) == comparable(expected)
            assert 'mq_queue_messages_ready{queue="_other"} 5.0' in served
            assert 'mq_redrive_moved_messages{queue="_other"} 5.0' in served

        # _other's sum and oldest age follow its queues' changes (kept as running values between scrapes).
        assert (await http.post(f"{url}/a3/messages", data="more")).status == 201
        samples = await scrape(http, f"{url}/metrics")
        assert value(samples, "mq_queue_messages_ready", queue="_other") == 6
        assert value(samples, "mq_queue_oldest_message_age_seconds", queue="_other") > 0
        for name, left in (("a3", 3), ("a4", 3)):
            for _ in range(left):
                assert (await http.get(f"{url}/{name}/messages")).status == 200
        samples = await scrape(http, f"{url}/metrics")
        assert value(samples, "mq_queue_messages_ready", queue="_other") == 0
        assert value(samples, "mq_queue_messages_in_flight", queue="_other") == 7
        assert ("mq_queue_oldest_message_age_seconds", frozenset({("queue", "_other")})) in samples
        assert value(samples, "mq_queue_oldest_message_age_seconds", queue="_other") == 0


#: Families whose values move between a scrape and the encoding that follows it (time, the scrape's own request,
#: a garbage collection in between: the collector's counts, stop 27's CI).
MOVING = (
    "process_",
    "python_gc_",
    "mq_gc_pause_seconds",
    "mq_http_request_duration_seconds",
    "mq_queue_oldest_message_age_seconds",
    "mq_storage_free",
)


def comparable(text: str) -> list[str]:
    """The exposition's lines without the samples of :data:`MOVING` families (their headers stay)."""
    return [line for line in text.splitlines() if line.startswith("#") or not line.startswith(MOVING)]
