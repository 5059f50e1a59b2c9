"""Every client behaves the same: one set of scenarios run over three pairs of clients.

- ``http``: two HTTP :class:`Client` instances against a real stack (mq, mq-mover, mq-reaper);
- ``local``: two :class:`LocalClient` instances on a temporary root, no daemon at all;
- ``mixed``: a :class:`LocalClient` on the root of the running stack (``a``) and an HTTP
  :class:`Client` of that stack (``b``): messages sent brokerless are received over HTTP in
  FIFO order and the other way round, a lease taken brokerless is not handed out by the
  daemon, a stale receipt handle stays stale through both, attempt records, purges, peeks and
  redrives are seen by both.

Each scenario uses ``a`` and ``b`` as two independent clients (and, where it matters, in both
directions). The stack is shared by the tests of this module (each test has its own queues).
Real daemons, real files, real HTTP; nothing is mocked; no timing assertions (waits are long
and end as soon as what is waited for happens). Where a daemon learns of a brokerless change
through inotify (its ready index), the test first waits until the daemon's statistics show it,
as a user would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mqcore.client._local import LocalClient
from mqcore.client.api import QueueClient
from mqcore.client.types import BatchEntry, Message
from mqcore.errors import (
    InvalidAttribute,
    InvalidQueueName,
    InvalidReceiptHandle,
    InvalidRequest,
    MessageNotFound,
    MessageNotInFlight,
    MessageTooLarge,
    QueueFull,
    QueueNameExists,
    QueueNotFound,
    RedriveNotRunning,
    StaleReceiptHandle,
)
from mqcore.names import IdGenerator, partition_of

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")


@dataclass
class Pair:
    """Two independent clients of one root (see the module docstring for the three kinds)."""

    kind: str
    a: QueueClient
    b: QueueClient

    def both_ways(self) -> list[tuple[QueueClient, QueueClient]]:
        """(sender, receiver): both directions for ``mixed``; one for the others (both clients are alike)."""
        return [(self.a, self.b), (self.b, self.a)] if self.kind == "mixed" else [(self.a, self.b)]

    def settle(self, queue: str, ready: int) -> None:
        """Wait until both clients see ``ready`` ready messages (a daemon indexes brokerless sends via inotify)."""
        for client in (self.a, self.b):
            eventually(lambda c=client: c.queue_stats(queue)["ready"] == ready, f"{client!r} sees {ready} ready")


def http_client_class() -> type:
    """The HTTP Client (helper H1's mqcore/client/_http.py), or skip while it does not exist."""
    try:
        from mqcore.client._http import Client
    except ImportError as exc:  # pragma: no cover - only until mqcore/client/_http.py lands
        pytest.skip(f"the HTTP Client (mqcore/client/_http.py) is not available yet: {exc}")
    return Client


@pytest.fixture(params=["http", "local", "mixed"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    kind = request.param
    clients: list[QueueClient] = []
    if kind == "local":
        clients = [LocalClient(tmp_path / "root"), LocalClient(tmp_path / "root")]
    else:
        client_class = http_client_class()
        stack = request.getfixturevalue("_module_stack")
        http = [client_class(stack.url, max_retries=1) for _ in range(2 if kind == "http" else 1)]
        clients = http if kind == "http" else [LocalClient(stack.root), *http]
    try:
        yield Pair(kind, *clients)
    finally:
        for client in clients:
            client.close()


def eventually(predicate: Callable[[], T], what: str = "condition", timeout_seconds: float = 20.0) -> T:
    """Poll ``predicate`` until it is truthy; return its value (AssertionError after the timeout)."""
    deadline = time.monotonic() + timeout_seconds
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for: {what}")
        time.sleep(0.02)
    return value


def receive_n(client: QueueClient, queue: str, n: int, **options: Any) -> list[Message]:
    """Receive exactly ``n`` messages (long polls until they have come)."""
    out: list[Message] = []
    while len(out) < n:
        batch = client.receive(queue, max_messages=min(10, n - len(out)), wait_time_seconds=20, **options)
        assert batch, f"no message within 20 s; got {len(out)} of {n}"
        out += batch
    return out


def drain(client: QueueClient, queue: str, **options: Any) -> list[Message]:
    """Receive and delete until a receive returns nothing."""
    out: list[Message] = []
    while batch := client.receive(queue, max_messages=10, **options):
        for message in batch:
            client.ack(message)
        out += batch
    return out


# -- queues --------------------------------------------------------------------------------------


def test_queue_administration(pair: Pair, queue: str) -> None:
    a, b = pair.a, pair.b
    assert a.create_queue(queue) is True
    assert b.create_queue(queue) is False
    assert b.create_queue(queue, {"visibility_timeout_seconds": 30}) is False  # same as the default
    with pytest.raises(QueueNameExists):
        b.create_queue(queue, {"visibility_timeout_seconds": 31})
    assert a.list_queues(queue) == b.list_queues(queue) == [queue]
    changed = b.set_attributes(queue, {"delay_seconds": 5, "capacity": 10})
    assert changed["delay_seconds"] == 5
    assert a.get_attributes(queue) == changed
    eventually(lambda: a.get_attributes(queue) == b.get_attributes(queue) == changed, "same attributes")
    a.send(queue, b"x", delay_seconds=0)
    pair.settle(queue, 1)
    stats = a.queue_stats(queue), b.queue_stats(queue)
    for s in stats:
        assert set(s) >= {"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds", "created_ms"}
        assert (s["queue"], s["in_flight"], s["delayed"], s["attributes"], s["redrive"]) == (
            queue,
            0,
            0,
            changed,
            None,
        )
    assert stats[0]["created_ms"] == stats[1]["created_ms"]
    a.delete_queue(queue)
    for client in (a, b):
        with pytest.raises(QueueNotFound):
            client.receive(queue)
    eventually(lambda: queue not in b.list_queues(queue), "the queue is gone")


def test_same_errors(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue, {"max_message_bytes": 10})
    missing_id = IdGenerator().next_id()
    for client in (pair.a, pair.b):
        with pytest.raises(InvalidQueueName):
            client.receive("bad.name")
        with pytest.raises(QueueNotFound):
            client.receive(queue + "-missing")
        with pytest.raises(InvalidRequest):
            client.receive(queue, max_messages=11)
        with pytest.raises(InvalidRequest):
            client.receive(queue, partition=2, partitions=2)
        with pytest.raises(InvalidAttribute):
            client.send(queue, b"x", attributes={"AWS.x": "1"})
        with pytest.raises(MessageTooLarge):
            client.send(queue, b"01234567890")
        with pytest.raises(InvalidReceiptHandle):
            client.delete(queue, "junk")
        with pytest.raises(MessageNotFound):
            client.delete_by_id(queue, missing_id)
        with pytest.raises(InvalidRequest):
            client.peek(queue, limit=0)
        with pytest.raises(RedriveNotRunning):
            client.cancel_redrive(queue)
        with pytest.raises(InvalidAttribute):
            client.set_attributes(queue, {"capacity": 0})
        client.send(queue, b"x")
        (message,) = receive_n(client, queue, 1)
        client.nack(message)
        with pytest.raises(MessageNotInFlight):
            client.change_visibility(queue, message.receipt_handle, 5)
        client.ack(message)


# -- FIFO -----------------------------------------------------------------------------------------


def test_fifo_both_ways(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for sender, receiver in pair.both_ways():
        sent = [sender.send(queue, f"single {i}") for i in range(3)]
        sent += sender.send_batch(queue, [f"batch {i}" for i in range(12)], batch_size=5)
        sent.append(sender.send(queue, b"last"))
        got = receive_n(receiver, queue, len(sent))
        assert [m.message_id for m in got] == sent
        assert got[0].text() == "single 0" and got[-1].body == b"last"
        assert receiver.delete_batch(queue, [m.receipt_handle for m in got]) == [None] * len(got)


def test_send_json_takes_the_fifo_ids_and_peek_shows_the_group(pair: Pair, queue: str) -> None:
    fifo_queue = f"{queue[:70]}.fifo"
    pair.a.create_queue(fifo_queue)
    pair.a.create_queue(queue)
    for n, (sender, reader) in enumerate(pair.both_ways()):
        first = sender.send_json(fifo_queue, {"n": n}, group_id=f"g{n}", deduplication_id=f"d{n}")
        assert sender.send_json(fifo_queue, {"n": n}, group_id=f"g{n}", deduplication_id=f"d{n}") == first
        plain = sender.send_json(queue, [n])
        (peeked,) = reader.peek_ids(fifo_queue, [first])
        assert (peeked.group_id, peeked.json(), peeked.content_type) == (f"g{n}", {"n": n}, "application/json")
        assert [m.group_id for m in reader.iter_peek(queue) if m.message_id == plain] == [None]
        (received,) = receive_n(reader, fifo_queue, 1)
        assert (received.message_id, received.group_id, received.deduplication_id) == (first, f"g{n}", f"d{n}")
        reader.ack(received)


# -- visibility and receipt handles ----------------------------------------------------------


def test_a_lease_is_not_handed_out_by_the_other_client(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for first, second in pair.both_ways():
        one, two = first.send(queue, b"1"), first.send(queue, b"2")
        (leased,) = receive_n(first, queue, 1, visibility_timeout_seconds=60)
        assert leased.message_id == one
        (other,) = receive_n(second, queue, 1, visibility_timeout_seconds=60)
        assert other.message_id == two  # not the leased one
        assert second.receive(queue, max_messages=10) == []
        first.nack(leased)
        (again,) = receive_n(second, queue, 1)
        assert (again.message_id, again.receive_count) == (one, 2)
        second.ack(again)
        first.ack(other)  # a handle works through the other client too


def test_visibility_timeout_expiry_redelivers(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for first, second in pair.both_ways():
        sent = first.send(queue, b"job")
        (leased,) = receive_n(first, queue, 1, visibility_timeout_seconds=1)
        (again,) = receive_n(second, queue, 1)
        assert (again.message_id, again.receive_count) == (sent, 2)
        assert again.first_receive_ms == leased.first_receive_ms
        second.ack(again)


def test_stale_receipt_handle_stays_stale_through_both(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for first, second in pair.both_ways():
        first.send(queue, b"job")
        (old,) = receive_n(first, queue, 1, visibility_timeout_seconds=1)
        (new,) = receive_n(second, queue, 1, visibility_timeout_seconds=60)
        for client in (first, second):
            with pytest.raises(StaleReceiptHandle):
                client.delete(queue, old.receipt_handle)
            with pytest.raises(StaleReceiptHandle):
                client.change_visibility(queue, old.receipt_handle, 0)
            results = client.delete_batch(queue, [old.receipt_handle])
            assert isinstance(results[0], StaleReceiptHandle)
        deadline = first.change_visibility(queue, new.receipt_handle, 120)  # the newer lease, via the other client
        assert deadline > new.visibility_deadline_ms
        first.ack(new)
        with pytest.raises(MessageNotFound):
            second.delete(queue, new.receipt_handle)


def test_attempt_id_retry_through_the_other_client(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for first, second in pair.both_ways():
        ids = [first.send(queue, str(i)) for i in range(2)]
        pair.settle(queue, 2)
        attempt = f"attempt-{first is pair.a}"
        got = first.receive(queue, max_messages=2, attempt_id=attempt)
        retry = second.receive(queue, max_messages=2, attempt_id=attempt)
        assert [m.message_id for m in got] == [m.message_id for m in retry] == ids
        assert [m.receive_count for m in retry] == [2, 2]
        with pytest.raises(StaleReceiptHandle):
            first.ack(got[0])
        for message in retry:
            first.ack(message)


# -- dead-letter queues, redrive, delays, purge ---------------------------------------------------


def test_dead_letter_after_max_receive_count(pair: Pair, queue: str) -> None:
    a, b = pair.a, pair.b
    dlq = queue + "-dlq"
    a.create_queue(dlq)
    b.create_queue(queue, {"dead_letter_queue": dlq, "max_receive_count": 2})
    released = a.send(queue, b"released")
    (m1,) = receive_n(a, queue, 1)
    a.nack(m1)
    (m2,) = receive_n(b, queue, 1)
    assert (m2.message_id, m2.receive_count) == (released, 2)
    b.nack(m2)
    assert a.receive(queue) == []  # moved to the dead-letter queue instead of delivered
    (dead,) = receive_n(b, dlq, 1)
    assert (dead.message_id, dead.receive_count, dead.body) == (released, 3, b"released")
    b.ack(dead)

    expired = b.send(queue, b"expired")
    receive_n(b, queue, 1, visibility_timeout_seconds=1)
    (e2,) = receive_n(a, queue, 1, visibility_timeout_seconds=1)  # redelivered at its deadline
    assert (e2.message_id, e2.receive_count) == (expired, 2)
    # At the next deadline it is dead-lettered: by mq-mover, or (no daemon) by this receive.
    assert a.receive(queue, wait_time_seconds=2) == []
    (dead,) = receive_n(b, dlq, 1)
    assert (dead.message_id, dead.receive_count) == (expired, 3)
    a.ack(dead)


def test_redrive(pair: Pair, queue: str) -> None:
    a, b = pair.a, pair.b
    dlq = queue + "-dlq"
    a.create_queue(dlq)
    a.create_queue(queue, {"dead_letter_queue": dlq, "max_receive_count": 1})
    ids = [a.send(queue, str(i)) for i in range(3)]
    for message in receive_n(a, queue, 3):
        a.nack(message)
    pair.settle(queue, 3)
    assert b.receive(queue, max_messages=10) == []  # all three dead-lettered
    pair.settle(dlq, 3)
    for starter, watcher in pair.both_ways():
        task = starter.start_redrive(dlq)
        assert (task["source"], task["destination"]) == (dlq, None)
        status = eventually(
            lambda w=watcher, t=task["task_id"]: (
                (s := w.redrive_status(dlq)) and s["task_id"] == t and s["state"] == "completed" and s
            ),
            "the redrive completed",
        )
        assert (status["moved"], status["skipped"]) == (3, 0)
        back = receive_n(watcher, queue, 3)
        assert [m.body for m in back] == [b"0", b"1", b"2"]  # oldest first
        assert [m.receive_count for m in back] == [1, 1, 1]
        assert not {m.message_id for m in back} & set(ids)  # new ids
        for message in back:
            watcher.nack(message)
        pair.settle(queue, 3)
        assert watcher.receive(queue, max_messages=10) == []  # dead-lettered again, for the other direction
        pair.settle(dlq, 3)


def test_delays(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for sender, receiver in pair.both_ways():
        later = sender.send(queue, b"in 15 minutes", delay_seconds=900)
        single = sender.send(queue, b"single", delay_seconds=1)
        (batch,) = sender.send_batch(queue, [BatchEntry(b"batch", delay_seconds=1)])
        got = receive_n(receiver, queue, 2)  # ready when their delay is over (no receive before)
        assert [(m.message_id, m.receive_count) for m in got] == [(single, 1), (batch, 1)]
        assert receiver.receive(queue, max_messages=10) == []  # the 15-minute one stays invisible
        for client in (sender, receiver):
            assert client.queue_stats(queue)["delayed"] == 1
            assert [(m.message_id, m.state) for m in client.peek(queue).messages] == [
                (later, "delayed"),
                (single, "in_flight"),
                (batch, "in_flight"),
            ]
        for message in got:
            receiver.ack(message)
        sender.delete_by_id(queue, later)


def test_purge(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    for first, second in pair.both_ways():
        first.send_batch(queue, [b"1", b"2", b"3"])
        first.send(queue, b"delayed", delay_seconds=60)
        pair.settle(queue, 3)
        assert second.purge(queue) == 4
        after = first.send(queue, b"after")
        (got,) = receive_n(second, queue, 1)
        assert got.message_id == after
        assert first.receive(queue) == []
        second.ack(got)


# -- capacity ------------------------------------------------------------------------------------


def test_capacity(pair: Pair, queue: str) -> None:
    a, b = pair.a, pair.b
    a.create_queue(queue, {"capacity": 2, "capacity_wait_seconds": 0})
    a.send(queue, b"1")
    a.send(queue, b"2")
    pair.settle(queue, 2)
    for client in (a, b):
        with pytest.raises(QueueFull):
            client.send(queue, b"3")
        results = client.send_batch(queue, [b"3", BatchEntry(b"delayed", delay_seconds=60)])
        assert isinstance(results[0], QueueFull) and isinstance(results[1], str)  # delayed: never refused
    b.set_attributes(queue, {"capacity_wait_seconds": 20})
    (one,) = receive_n(a, queue, 1)  # makes room ...
    assert b.send(queue, b"3")  # ... for a send through the other client (it may wait for it)
    pair.settle(queue, 2)
    b.ack(one)


# -- peek and partitions -------------------------------------------------------------------------


def test_peek_gives_both_the_same_view(pair: Pair, queue: str) -> None:
    a, b = pair.a, pair.b
    a.create_queue(queue)
    ids = [a.send(queue, str(i)) for i in range(3)]
    delayed = b.send(queue, b"later", delay_seconds=60)
    (leased,) = receive_n(b, queue, 1)
    views = []
    for client in (a, b):
        page = client.peek(queue, limit=2)
        assert [m.message_id for m in page.messages] == ids[:2] and page.next_after == ids[1]
        views.append(
            [
                (m.message_id, m.state, m.receive_count, m.visibility_deadline_ms, m.body)
                for m in client.iter_peek(queue)
            ]
        )
    assert views[0] == views[1]
    assert [(i, state, count) for i, state, count, _, _ in views[0]] == [
        (ids[0], "in_flight", 1),
        (ids[1], "ready", 0),
        (ids[2], "ready", 0),
        (delayed, "delayed", 0),
    ]
    assert views[0][0][3] == leased.visibility_deadline_ms
    (nxt,) = receive_n(a, queue, 1)
    assert (nxt.message_id, nxt.receive_count) == (ids[1], 1)  # peeking changed nothing


def test_peek_ids_partitioned_peek_and_delete_by_ids(pair: Pair, queue: str) -> None:
    from mqcore.errors import MessageNotFound
    from mqcore.names import partition_of

    a, b = pair.a, pair.b
    a.create_queue(queue)
    ids = a.send_batch(queue, [f"m{i}" for i in range(12)])
    (leased,) = receive_n(b, queue, 1)
    for client in (a, b):
        shares = [[m.message_id for m in client.iter_peek(queue, partition=p, partitions=2)] for p in range(2)]
        assert sorted(shares[0] + shares[1]) == ids
        assert all(partition_of(i, 2) == p for p, share in enumerate(shares) for i in share)
        found = client.peek_ids(queue, [ids[3], leased.message_id, ids[9]])
        assert [(m.message_id, m.state, m.body) for m in found] == [
            (leased.message_id, "in_flight", b"m0"),
            (ids[3], "ready", b"m3"),
            (ids[9], "ready", b"m9"),
        ]
    results = b.delete_by_ids(queue, [ids[3], leased.message_id])
    assert results == [None, None]  # by id, in flight too
    again = a.delete_by_ids(queue, [ids[3], ids[4]])
    assert isinstance(again[0], MessageNotFound) and again[1] is None
    assert a.peek_ids(queue, [ids[3], ids[4], leased.message_id]) == []
    assert len(list(b.iter_peek(queue))) == 9


def test_partitions_cover_every_message_exactly_once(pair: Pair, queue: str) -> None:
    pair.a.create_queue(queue)
    ids = pair.a.send_batch(queue, [str(i) for i in range(40)])
    assert all(isinstance(i, str) for i in ids)
    pair.settle(queue, 40)
    seen: list[str] = []
    for p in range(3):
        consumer = pair.a if p % 2 else pair.b
        got = [m.message_id for m in drain(consumer, queue, partition=p, partitions=3)]
        assert got == sorted(got) and all(partition_of(i, 3) == p for i in got)
        seen += got
    assert sorted(seen) == sorted(ids) and len(set(seen)) == len(ids)  # type: ignore[type-var]


# -- bulk leases (issue 17) -------------------------------------------------------------------------


def test_bulk_lease_replays_its_key_and_delete_bulk_deletes_exactly_its_messages(pair: Pair) -> None:
    """A bulk lease made through one client is replayed and deleted through the other (mixed: HTTP <-> brokerless)."""
    queue = f"bulk-{pair.kind}"
    pair.a.create_queue(queue)
    sent = pair.a.send_batch(queue, [f"m{i}" for i in range(14)])
    pair.settle(queue, 14)

    first = pair.a.lease_bulk(queue, "c:7:0", max_messages=12, visibility_timeout_seconds=60)
    assert [m.message_id for m in first] == sent[:12]  # oldest first
    assert [m.body for m in first] == [f"m{i}".encode() for i in range(12)]
    replay = pair.b.lease_bulk(queue, "c:7:0", max_messages=12)  # a retried task, on the other client
    assert [(m.message_id, m.body, m.receive_count) for m in replay] == [(m.message_id, m.body, 2) for m in first]
    with pytest.raises(StaleReceiptHandle):  # leased again under the key: the first handles are stale
        pair.a.delete(queue, first[0].receipt_handle)
    rest = pair.b.lease_bulk(queue, "c:7:1", max_messages=12, visibility_timeout_seconds=60)
    assert [m.message_id for m in rest] == sent[12:]
    assert pair.b.receive(queue, max_messages=10) == []  # everything is leased

    assert pair.b.delete_bulk(queue, "c:7:0") == 12
    assert pair.a.delete_bulk(queue, "c:7:0") == 0  # idempotent: the record is gone
    stats = pair.a.queue_stats(queue)
    assert (stats["ready"], stats["in_flight"]) == (0, 2)
    assert pair.a.delete_bulk(queue, "c:7:1") == 2
    for client in (pair.a, pair.b):
        with pytest.raises(InvalidRequest) as info:
            client.lease_bulk(queue, "../escape")
        assert info.value.details["parameter"] == "key"
