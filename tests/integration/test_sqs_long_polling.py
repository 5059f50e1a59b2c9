"""Long polling, end to end (issue 3; docs/api.md "Long polling").

A receive with ``wait_time_seconds`` waits on a notification, never polls: idle waiters cost
no CPU of the mq process (read from /proc/<pid>/stat), and each is answered as soon as a
message becomes ready: a send (through this daemon or another one on the same root), a
redelivery by mq-mover, a delayed message coming due, a change of visibility to 0. A stopping
mq answers its waiters at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest


@pytest.fixture
def stack(request, shared_stack, stack_factory):
    """The module's shared stack, or a fresh one when parametrized with options (indirect)."""
    if hasattr(request, "param"):
        return stack_factory(**request.param)
    return shared_stack


#: mq alone (no mover, no reaper): its CPU time is all that is measured.
MQ_ONLY = pytest.mark.parametrize("stack", [{"mover": False, "reaper": False}], indirect=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def long_poll(stack, queue: str, seconds: int, extra: str = ""):
    """A receive waiting up to ``seconds``; returns (reply, perf_counter when it arrived)."""
    reply = await stack.request("GET", f"/{queue}/messages?wait_time_seconds={seconds}{extra}")
    return reply, time.perf_counter()


async def started(stack, queue: str, seconds: int, extra: str = "") -> asyncio.Task:
    """Start a long poll and give it time to reach mq and start waiting."""
    task = asyncio.create_task(long_poll(stack, queue, seconds, extra))
    await asyncio.sleep(0.3)
    assert not task.done(), f"the long poll returned at once: {task.result()[0]}"
    return task


@MQ_ONLY
async def test_50_idle_long_pollers_cost_no_cpu_and_each_is_woken_by_its_message(stack, queue):
    """Idle long polls use no CPU; each is answered by the send's wake-up, not by a timer.

    Without a wake-up a waiter would find its message only at the next rescan (10 s by default)
    or when its 20 s wait ends, so an answer within 1 s of its send shows the wake-up did it.
    How fast the wake-up is (p99 8 ms at 1,000 receivers, issue 12's bar 20 ms) is a figure of
    ``bench/run.py --steps longpoll`` (docs/performance.md), not of this test: a 50 ms bound here
    failed only when the machine was loaded (load 16: 184 ms).
    """
    await stack.create_queue(queue)
    pollers = [asyncio.create_task(long_poll(stack, queue, 20)) for _ in range(50)]
    await asyncio.sleep(1.0)  # connected and waiting
    assert not [p for p in pollers if p.done()]

    cpu_before, t_before = cpu_seconds(stack.mq.pid), time.monotonic()
    await asyncio.sleep(2.0)
    cpu_used, elapsed = cpu_seconds(stack.mq.pid) - cpu_before, time.monotonic() - t_before
    assert cpu_used / elapsed <= 0.02, f"50 idle long polls used {cpu_used:.3f} s of CPU in {elapsed:.2f} s"
    assert not [p for p in pollers if p.done()]

    sent_at: dict[str, float] = {}
    for i in range(50):
        before = time.perf_counter()
        message_id = await stack.send(queue, b"job %d" % i)
        sent_at[message_id] = before
        await asyncio.sleep(0.02)
    results = await asyncio.wait_for(asyncio.gather(*pollers), timeout=10)
    latencies = {}
    for reply, arrived in results:
        assert reply.status == 200, (reply.status, reply.body[:200])
        latencies[reply.header("X-Message-Id")] = arrived - sent_at[reply.header("X-Message-Id")]
    assert set(latencies) == set(sent_at)  # each poller got exactly one message, all different
    worst = max(latencies.values())
    assert worst < 1.0, f"slowest delivery {worst * 1000:.1f} ms after its send (sends included)\n{stack.logs()}"


async def test_long_poll_times_out_empty(stack, queue):
    await stack.create_queue(queue)
    start = time.perf_counter()
    (raw, raw_at), (batch, batch_at) = await asyncio.gather(
        long_poll(stack, queue, 1), long_poll(stack, queue, 1, "&max_messages=5")
    )
    assert raw.status == 204 and raw.body == b""
    assert (batch.status, batch.json) == (200, {"messages": []})
    assert 0.9 <= raw_at - start < 3 and 0.9 <= batch_at - start < 3
    reply, _ = await long_poll(stack, queue, 0)  # 0 = short poll: at once
    assert reply.status == 204


async def test_queue_receive_wait_seconds_is_the_default_wait(stack, queue):
    reply = await stack.request("PUT", f"/{queue}", data=json.dumps({"receive_wait_seconds": 1}))
    assert reply.status == 201, reply.body
    start = time.monotonic()
    assert (await stack.receive(queue)).status == 204  # a plain receive waits the queue's 1 s
    assert 0.9 <= time.monotonic() - start < 3
    waiting = asyncio.create_task(stack.receive(queue))
    await asyncio.sleep(0.3)
    message_id = await stack.send(queue, b"for the waiter")
    reply = await asyncio.wait_for(waiting, 5)
    assert reply.status == 200 and reply.header("X-Message-Id") == message_id


async def test_long_poll_wakes_for_a_redelivery(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"retry me")
    first = await stack.request("GET", f"/{queue}/messages?visibility_timeout_seconds=1")
    deadline_ms = int(first.header("X-Visibility-Deadline"))
    waiter = await started(stack, queue, 10)
    reply, _ = await asyncio.wait_for(waiter, 10)
    assert reply.status == 200 and reply.header("X-Message-Id") == message_id, stack.logs()
    assert reply.header("X-Receive-Count") == "2"
    late_ms = time.time_ns() // 1_000_000 - deadline_ms
    assert -50 <= late_ms < 1000, f"answered {late_ms} ms after the lease ended"


async def test_long_poll_wakes_when_a_delayed_message_comes_due(stack, queue):
    await stack.create_queue(queue)
    waiter = await started(stack, queue, 10)
    reply = await stack.request("POST", f"/{queue}/messages", data=b"later", headers={"X-Delay-Seconds": "1"})
    sent = time.perf_counter()
    assert reply.status == 201
    got, arrived = await asyncio.wait_for(waiter, 10)
    assert got.status == 200 and got.body == b"later", stack.logs()
    assert 0.9 <= arrived - sent < 2.0


async def test_long_poll_wakes_when_a_lease_is_released(stack, queue):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"handed back")
    handle = (await stack.receive(queue)).header("X-Receipt-Handle")
    waiter = await started(stack, queue, 10, "&max_messages=10")
    released = time.perf_counter()
    reply = await stack.request(
        "POST",
        f"/{queue}/messages/{message_id}/visibility",
        data=json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": 0}),
    )
    assert reply.status == 200, reply.body
    got, arrived = await asyncio.wait_for(waiter, 10)
    assert [m["message_id"] for m in got.json["messages"]] == [message_id]
    assert arrived - released < 0.5


async def test_long_poll_wakes_for_a_send_through_another_daemon(stack, queue, daemons, http):
    """inotify on the queue directory: a file published by another process wakes the waiter."""
    await stack.create_queue(queue)
    other = daemons.start("mq", "--root", stack.root, "--port", "0")
    waiter = await started(stack, queue, 10)
    sent = time.perf_counter()
    async with http.post(f"{other.url}/{queue}/messages", data=b"from the other daemon") as resp:
        assert resp.status == 201
        message_id = resp.headers["X-Message-Id"]
    got, arrived = await asyncio.wait_for(waiter, 10)
    assert got.status == 200 and got.header("X-Message-Id") == message_id
    assert arrived - sent < 0.5, f"{arrived - sent:.3f} s"


async def test_long_poll_on_a_deleted_queue_answers_404(stack, queue):
    await stack.create_queue(queue)
    waiter = await started(stack, queue, 10)
    assert (await stack.request("DELETE", f"/{queue}")).status == 200
    reply, _ = await asyncio.wait_for(waiter, 5)
    assert reply.status == 404 and reply.json["error"] == "queue_not_found"


@MQ_ONLY
async def test_stopping_mq_answers_waiting_receives_and_senders_at_once(stack, queue, http):
    await stack.create_queue(queue)
    full = f"{queue}-full"
    reply = await stack.request("PUT", f"/{full}", data=json.dumps({"capacity": 1, "capacity_wait_seconds": 20}))
    assert reply.status == 201, reply.body
    await stack.send(full, b"fills it")
    pollers = [asyncio.create_task(long_poll(stack, queue, 20)) for _ in range(5)]
    url = stack.url
    blocked = asyncio.create_task(http.post(f"{url}/{full}/messages", data=b"waits for room"))
    await asyncio.sleep(0.5)
    assert not [p for p in pollers if p.done()] and not blocked.done()
    start = time.monotonic()
    assert await asyncio.to_thread(stack.mq.stop) == 0
    results = await asyncio.wait_for(asyncio.gather(*pollers), 5)
    assert [reply.status for reply, _ in results] == [204] * 5
    resp = await asyncio.wait_for(blocked, 5)
    async with resp:
        assert resp.status == 429 and (await resp.json())["error"] == "queue_full"
    assert time.monotonic() - start < 3, stack.mq.log_tail()
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(f"{url}/{queue}")


NO_INOTIFY = pytest.mark.parametrize(
    "stack",
    [{"env": {"MQ_NO_INOTIFY": "1"}, "mq_args": ["--rescan-interval", "0.5"], "mover": False, "reaper": False}],
    indirect=True,
)


@NO_INOTIFY
async def test_without_inotify_a_rescan_wakes_the_waiter(stack, queue, daemons, http):
    """What a shared filesystem gets: a message published by another host is found by the next rescan."""
    await stack.create_queue(queue)
    other = daemons.start("mq", "--root", stack.root, "--port", "0", env={"MQ_NO_INOTIFY": "1"})
    waiter = await started(stack, queue, 10)
    sent = time.perf_counter()
    async with http.post(f"{other.url}/{queue}/messages", data=b"over nfs") as resp:
        assert resp.status == 201
    got, arrived = await asyncio.wait_for(waiter, 10)
    assert got.status == 200 and got.body == b"over nfs"
    assert arrived - sent < 2.0, f"{arrived - sent:.2f} s with a 0.5 s rescan interval"
    async with http.put(f"{other.url}/{queue}/attributes", json={"receive_wait_seconds": 1}) as resp:
        assert resp.status == 200
    await asyncio.sleep(1.2)  # the next rescan re-reads the attributes too
    reply = await stack.request("GET", f"/{queue}/attributes")
    assert reply.json["attributes"]["receive_wait_seconds"] == 1
