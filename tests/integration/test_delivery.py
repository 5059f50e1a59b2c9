"""Delivery guarantees end to end: FIFO, visibility timeout and redelivery, delete, concurrency.

Real mq + mq-mover + mq-reaper subprocesses on a temporary root, driven over real HTTP
(issue 2, "Tests"; team contract, "HTTP API").
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

#: How long a redelivery may take after its deadline before a test gives up, in seconds (generous).
REDELIVERY_WAIT_SECONDS = 10.0

ONE_SECOND_VISIBILITY = pytest.mark.parametrize("stack", [{"visibility_timeout": 1}], indirect=True)


@pytest.fixture
def stack(request, module_stacks, http):
    """The module's stack for the test's options (defaults, or the indirect parameter): tests asking
    for the same options share one stack (each uses its own queue), so each set starts once."""
    return module_stacks.get(getattr(request, "param", None) or {}, http)


async def receive_200(stack, queue):
    """One receive; the reply if it was 200, else None (for polling)."""
    reply = await stack.receive(queue)
    return reply if reply.status == 200 else None


async def test_fifo_of_100_sequential_sends(stack, queue):  # mq's default --peers 0: strict FIFO
    await stack.create_queue(queue)
    sent = [await stack.send(queue, b"message %03d" % i) for i in range(100)]
    received = []
    for i in range(100):
        reply = await stack.receive(queue)
        assert reply.status == 200, f"receive #{i}: {reply.status}\n{stack.logs()}"
        assert reply.body == b"message %03d" % i, f"receive #{i} out of order: {reply.body!r}"
        received.append(reply.header("X-Message-Id"))
    assert received == sent
    assert sorted(sent) == sent, "message ids must sort in send order"
    assert (await stack.receive(queue)).status == 204


@ONE_SECOND_VISIBILITY
async def test_redelivery_after_visibility_timeout(stack, queue, wait):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"come back")
    leased_at = time.time()
    first = await stack.receive(queue)
    assert (first.status, first.header("X-Receive-Count")) == (200, "1")

    # Invisible for the whole timeout: only 204s until ~1 s after the receive.
    while time.time() < leased_at + 0.8:
        reply = await stack.receive(queue)
        assert reply.status == 204, (
            f"redelivered {time.time() - leased_at:.3f} s after the receive, before the 1 s timeout"
        )
        await asyncio.sleep(0.05)

    second = await wait(
        lambda: receive_200(stack, queue),
        timeout=REDELIVERY_WAIT_SECONDS,
        message=lambda: f"no redelivery\ndelay/={stack.files('delay')}\n{stack.logs()}",
    )
    # The deadline is the server's receive time + 1 s, and the server received after `leased_at`.
    assert time.time() >= leased_at + 1.0 - 0.01
    assert second.header("X-Message-Id") == message_id
    assert second.header("X-Receive-Count") == "2"
    assert second.body == b"come back"

    third = await wait(lambda: receive_200(stack, queue), timeout=REDELIVERY_WAIT_SECONDS)
    assert third.header("X-Receive-Count") == "3"
    assert (await stack.delete(queue, message_id)).status == 200


@ONE_SECOND_VISIBILITY
async def test_delete_stops_redelivery(stack, queue, wait):
    await stack.create_queue(queue)
    message_id = await stack.send(queue, b"delete me")
    keep_id = await stack.send(queue, b"keep me")  # received, not deleted: proves redelivery works here
    first = await stack.receive(queue)
    kept = await stack.receive(queue)
    assert first.header("X-Message-Id") == message_id and kept.header("X-Message-Id") == keep_id
    reply = await stack.delete(queue, message_id)
    assert reply.status == 200, reply.body

    back = await wait(lambda: receive_200(stack, queue), timeout=REDELIVERY_WAIT_SECONDS)
    assert back.header("X-Message-Id") == keep_id
    assert (await stack.delete(queue, keep_id)).status == 200
    # Well past the deleted message's deadline (1 s) and the redelivery of its sibling: nothing comes back.
    end = time.time() + 2.0
    while time.time() < end:
        reply = await stack.receive(queue)
        assert reply.status == 204, f"deleted message came back: {reply.headers}"
        await asyncio.sleep(0.1)
    assert (await stack.delete(queue, message_id)).status == 404
    await wait(lambda: not stack.files("remove"), message=lambda: f"remove/={stack.files('remove')}\n{stack.logs()}")
    assert stack.files("delay") == []


async def test_delete_of_ready_message(stack, queue, wait):
    await stack.create_queue(queue)
    first = await stack.send(queue, b"first, never received")
    second = await stack.send(queue, b"second")
    reply = await stack.delete(queue, first)
    assert reply.status == 200, reply.body
    got = await stack.receive(queue)
    assert got.header("X-Message-Id") == second
    assert (await stack.receive(queue)).status == 204
    assert stack.files(f"queues/{queue}") == []
    await wait(lambda: not stack.files("remove"), message=lambda: f"remove/={stack.files('remove')}\n{stack.logs()}")


@dataclass
class Ledger:
    """What producers and consumers saw (Jepsen's total-queue checker, fault-testing.md)."""

    acked: dict[str, bytes] = field(default_factory=dict)  # id -> body, for every 201
    # (id, monotonic time the receive request started, time its reply arrived, X-Receive-Count, body)
    receives: list[tuple[str, float, float, int, bytes]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    deleted_ids: set[str] = field(default_factory=set)
    producers_done: bool = False

    def record(self, message_id: str, started: float, count: int, body: bytes) -> None:
        self.receives.append((message_id, started, time.monotonic(), count, body))
        self.seen.add(message_id)

    def complete(self) -> bool:
        return self.producers_done and self.seen >= self.acked.keys()


async def run_load(stack, queue, *, producers: int, per_producer: int, consumers: int, timeout: float = 90.0):
    """Send ``producers * per_producer`` messages concurrently while ``consumers`` receive and delete."""
    ledger = Ledger()

    async def produce(p: int) -> None:
        for i in range(per_producer):
            body = b"producer %d message %d " % (p, i) + bytes([p, i % 256]) * 16
            message_id = await stack.send(queue, body)
            assert message_id not in ledger.acked, f"duplicate message id {message_id}"
            ledger.acked[message_id] = body

    async def consume() -> None:
        while not ledger.complete():
            started = time.monotonic()
            reply = await stack.receive(queue)
            if reply.status == 204:
                await asyncio.sleep(0.01)
                continue
            message_id = reply.header("X-Message-Id")
            ledger.record(message_id, started, int(reply.header("X-Receive-Count")), reply.body)
            deleted = await stack.delete(queue, message_id)
            assert deleted.status == 200, f"delete {message_id}: {deleted.status} {deleted.body!r}"

    async def producers_then_done() -> None:
        await asyncio.gather(*(produce(p) for p in range(producers)))
        ledger.producers_done = True

    try:
        await asyncio.wait_for(
            asyncio.gather(producers_then_done(), *(consume() for _ in range(consumers))), timeout=timeout
        )
    except TimeoutError:
        missing = ledger.acked.keys() - ledger.seen
        pytest.fail(f"not all acknowledged messages received in {timeout} s: {len(missing)} missing\n{stack.logs()}")
    return ledger


def check_leases_never_overlap(ledger: Ledger, visibility_timeout: float) -> None:
    """A message is received again only after the previous receive's visibility timeout ran out.

    The server starts a lease after the receive request started and the next receive's reply
    arrives after that lease's deadline, so the gap between them is at least the timeout.
    """
    by_id: dict[str, list[tuple[float, float]]] = {}
    for message_id, started, replied, *_ in ledger.receives:
        by_id.setdefault(message_id, []).append((started, replied))
    for message_id, times in by_id.items():
        times.sort()
        for (started, _), (_, replied) in itertools.pairwise(times):
            gap = replied - started
            assert gap >= visibility_timeout - 0.01, (
                f"{message_id} handed out twice {gap:.3f} s apart, inside its {visibility_timeout} s visibility timeout"
            )


def check_exactly_once(ledger: Ledger, expected: int) -> None:
    """Every acknowledged message received exactly once, intact, on its first receive."""
    assert len(ledger.acked) == expected
    counts = Counter(message_id for message_id, *_ in ledger.receives)
    lost = ledger.acked.keys() - counts.keys()
    unknown = counts.keys() - ledger.acked.keys()
    duplicates = {m: c for m, c in counts.items() if c > 1}
    assert not lost, f"{len(lost)} acknowledged messages lost"
    assert not unknown, f"{len(unknown)} received messages were never sent: {sorted(unknown)[:5]}"
    # Visibility timeout 30 s >> test length: any second receive is a lease handed to two consumers.
    assert not duplicates, f"{len(duplicates)} messages received more than once: {list(duplicates.items())[:5]}"
    for message_id, _started, _replied, count, body in ledger.receives:
        assert body == ledger.acked[message_id], f"body of {message_id} changed"
        assert count == 1, f"{message_id} received with X-Receive-Count {count}"


async def test_concurrent_producers_and_consumers(stack, queue):
    await stack.create_queue(queue)
    ledger = await run_load(stack, queue, producers=8, per_producer=150, consumers=8)
    check_leases_never_overlap(ledger, 30)
    check_exactly_once(ledger, 8 * 150)
    assert (await stack.receive(queue)).status == 204


@pytest.mark.parametrize("stack", [{"visibility_timeout": 30, "peers": 2}], indirect=True)
async def test_peers_2_delivers_everything_exactly_once(stack, queue):
    await stack.create_queue(queue)
    ledger = await run_load(stack, queue, producers=4, per_producer=100, consumers=6)
    check_leases_never_overlap(ledger, 30)
    check_exactly_once(ledger, 4 * 100)
    assert (await stack.receive(queue)).status == 204


async def test_two_front_ends_on_one_root_share_the_queue(stack, daemons, queue):
    """Two mq daemons on one root (as on a shared filesystem): each message goes to exactly one consumer."""
    second = daemons.start("mq", "--root", stack.root, "--port", "0", "--visibility-timeout", "30", "--peers", "2")
    await stack.create_queue(queue)
    ids = {await stack.send(queue, b"%d" % i): b"%d" % i for i in range(200)}
    other = type(stack)(root=stack.root, mq=second, mover=None, reaper=None, session=stack.session)
    seen: Counter[str] = Counter()

    async def consume(front) -> None:
        idle_since = time.monotonic()
        while seen.keys() < ids.keys() and time.monotonic() - idle_since < 15:
            reply = await front.receive(queue)
            if reply.status == 204:
                await asyncio.sleep(0.02)
                continue
            idle_since = time.monotonic()
            message_id = reply.header("X-Message-Id")
            assert reply.body == ids[message_id]
            seen[message_id] += 1
            assert (await front.delete(queue, message_id)).status == 200

    await asyncio.gather(*(consume(f) for f in (stack, other, stack, other)))
    assert seen.keys() == ids.keys(), f"{len(ids.keys() - seen.keys())} lost\n{stack.logs()}\n{second.log_tail()}"
    assert [m for m, c in seen.items() if c > 1] == []


@pytest.mark.parametrize("stack", [{"visibility_timeout": 2, "peers": 0}], indirect=True)
async def test_redelivered_messages_never_overlap_their_previous_lease(stack, queue):
    """Consumers leave some messages undeleted: those come back, but only after their 2 s lease ended."""
    await stack.create_queue(queue)
    ledger = Ledger()
    skipped: set[str] = set()
    ids = [await stack.send(queue, b"lease %d" % i) for i in range(60)]
    ledger.acked = {m: b"lease %d" % i for i, m in enumerate(ids)}
    ledger.producers_done = True
    skip = set(ids[::4])

    async def consume() -> None:
        while not (ledger.complete() and skipped == skip and all(m in ledger.deleted_ids for m in skip)):
            started = time.monotonic()
            reply = await stack.receive(queue)
            if reply.status == 204:
                await asyncio.sleep(0.02)
                continue
            message_id = reply.header("X-Message-Id")
            ledger.record(message_id, started, int(reply.header("X-Receive-Count")), reply.body)
            if message_id in skip and message_id not in skipped:
                skipped.add(message_id)  # left in flight: must come back after its lease
                continue
            assert (await stack.delete(queue, message_id)).status == 200
            ledger.deleted_ids.add(message_id)

    await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(4))), timeout=60)
    check_leases_never_overlap(ledger, 2)
    counts = Counter(message_id for message_id, *_ in ledger.receives)
    assert {m for m, c in counts.items() if c == 2} == skip
    assert all(counts[m] == 1 for m in ids if m not in skip)
    for message_id, _started, _replied, _count, body in ledger.receives:
        assert body == ledger.acked[message_id]
    receive_counts = {}
    for message_id, _started, _replied, count, _body in ledger.receives:
        receive_counts.setdefault(message_id, []).append(count)
    for message_id, seen_counts in receive_counts.items():
        assert seen_counts == ([1, 2] if message_id in skip else [1]), (message_id, seen_counts)
