"""The brokerless clients (mqcore.client._local*) on temporary roots, with no daemon running.

Every behaviour the daemons provide in the background must happen here on the call that
needs it: redelivery after a visibility timeout and dead-lettering (mq-mover's job), the
ready timer of delayed messages, reaping of deleted files (mq-reaper's job), long polls woken
by inotify. Other clients are real: threads with their own LocalClient, and subprocesses
with theirs on the same root. Real files under ``tmp_path``; nothing is mocked; no timing
assertions (waits are long and end as soon as what is waited for happens).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqcore.client import AsyncLocalClient, LocalClient
from mqcore.client.types import TEXT_CONTENT_TYPE, BatchEntry, Message
from mqcore.errors import (
    InvalidAttribute,
    InvalidMessageId,
    InvalidQueueName,
    InvalidReceiptHandle,
    InvalidRequest,
    MessageNotFound,
    MessageNotInFlight,
    MessageTooLarge,
    MQError,
    QueueFull,
    QueueNameExists,
    QueueNotFound,
    RedriveNotRunning,
    StaleReceiptHandle,
)
from mqcore.names import partition_of

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def client(root: Path) -> Iterator[LocalClient]:
    with LocalClient(root) as c:
        yield c


@pytest.fixture
def queue(client: LocalClient) -> str:
    client.create_queue("jobs")
    return "jobs"


def drain(client: LocalClient, queue: str, **options: object) -> list[Message]:
    """Receive (and delete) until a receive returns nothing."""
    out: list[Message] = []
    while batch := client.receive(queue, max_messages=10, **options):  # type: ignore[arg-type]
        for message in batch:
            client.ack(message)
        out += batch
    return out


def files(root: Path, sub: str) -> list[str]:
    """Message file names in ``root/sub`` (metadata files starting with "." left out)."""
    return sorted(n for n in os.listdir(root / sub) if not n.startswith("."))


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` in the repository (its own LocalClient: another process)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


# -- queues ---------------------------------------------------------------------------------------


def test_queue_administration(client: LocalClient, root: Path) -> None:
    assert client.create_queue("jobs-dlq") is True
    assert client.create_queue("jobs", {"dead_letter_queue": "jobs-dlq", "visibility_timeout_seconds": 60}) is True
    assert client.create_queue("jobs") is False  # idempotent
    with pytest.raises(QueueNameExists):
        client.create_queue("jobs", {"visibility_timeout_seconds": 5})
    assert client.list_queues() == ["jobs", "jobs-dlq"]
    assert client.list_queues("jobs-") == ["jobs-dlq"]

    attrs = client.get_attributes("jobs")
    assert attrs["visibility_timeout_seconds"] == 60
    assert attrs["max_receive_count"] == 5  # a dead-letter queue alone gets SMQ's 5
    assert client.set_attributes("jobs", {"capacity": 100, "visibility_timeout_seconds": None}) == {
        **attrs,
        "capacity": 100,
        "visibility_timeout_seconds": 30,
    }

    client.send("jobs", b"x")
    stats = client.queue_stats("jobs")
    assert (stats["queue"], stats["ready"], stats["in_flight"], stats["delayed"]) == ("jobs", 1, 0, 0)
    assert stats["oldest_ready_age_seconds"] >= 0
    assert stats["attributes"]["capacity"] == 100
    assert stats["redrive"] is None

    client.delete_queue("jobs")
    assert client.list_queues() == ["jobs-dlq"]
    with pytest.raises(QueueNotFound):
        client.queue_stats("jobs")
    assert files(root, "remove") == []  # the deleted queue's directory was removed at once


def test_errors_are_the_http_apis(client: LocalClient, queue: str) -> None:
    with pytest.raises(InvalidQueueName):
        client.send("no/slash", b"x")
    with pytest.raises(QueueNotFound):
        client.receive("missing")
    with pytest.raises(InvalidRequest) as info:
        client.receive(queue, max_messages=11)
    assert info.value.details == {"parameter": "max_messages"}
    for bad in ({"wait_time_seconds": 21}, {"visibility_timeout_seconds": -1}, {"attempt_id": "has space"}):
        with pytest.raises(InvalidRequest):
            client.receive(queue, **bad)  # type: ignore[arg-type]
    for bad in ({"partition": 1}, {"partitions": 3}, {"partition": 3, "partitions": 3}):
        with pytest.raises(InvalidRequest):
            client.receive(queue, **bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        client.send(queue, b"x", delay_seconds=901)
    with pytest.raises(InvalidAttribute):
        client.send(queue, b"x", attributes={"AWS.reserved": "x"})
    with pytest.raises(InvalidAttribute):
        client.create_queue("other", {"no_such_attribute": 1})
    with pytest.raises(InvalidAttribute):
        client.set_attributes(queue, {"dead_letter_queue": "missing"})
    with pytest.raises(InvalidReceiptHandle):
        client.delete(queue, "not-a-handle")
    with pytest.raises(InvalidMessageId):
        client.delete_by_id(queue, "not-an-id")
    with pytest.raises(InvalidRequest):
        client.peek(queue, after="not-an-id")
    with pytest.raises(InvalidRequest):
        client.list_queues("bad prefix")
    with pytest.raises(TypeError):
        client.send(queue, 42)  # type: ignore[arg-type]

    client.set_attributes(queue, {"max_message_bytes": 10})
    client.send(queue, b"0123456789")
    with pytest.raises(MessageTooLarge) as too_large:
        client.send(queue, b"0123456789", attributes={"a": "b"})  # attributes count towards the size
    assert too_large.value.details == {"size_bytes": 12, "max_bytes": 10}


def test_send_forms_and_what_a_receive_returns(client: LocalClient, queue: str) -> None:
    text_id = client.send(queue, "héllo", attributes={"tenant": "acme"})
    raw_id = client.send(queue, b"\x00\xff", content_type="application/x-thing")
    json_id = client.send_json(queue, {"n": [1, 2]})
    messages = client.receive(queue, max_messages=10)
    assert [m.message_id for m in messages] == [text_id, raw_id, json_id]
    text, raw, doc = messages
    assert (text.text(), text.content_type, dict(text.attributes)) == ("héllo", TEXT_CONTENT_TYPE, {"tenant": "acme"})
    assert (raw.body, raw.content_type, dict(raw.attributes)) == (b"\x00\xff", "application/x-thing", {})
    assert (doc.json(), doc.content_type) == ({"n": [1, 2]}, "application/json")
    for m in messages:
        assert m.queue == queue
        assert m.receive_count == 1
        assert m.sent_ms <= m.first_receive_ms < m.visibility_deadline_ms


# -- FIFO -------------------------------------------------------------------------------------------


def test_fifo_across_single_and_batch_sends_and_two_clients(client: LocalClient, root: Path, queue: str) -> None:
    other = LocalClient(root)
    sent = [client.send(queue, "a"), other.send(queue, "b")]
    results = client.send_batch(queue, ["c", b"d", BatchEntry("e", attributes={"k": "v"})] * 5, batch_size=4)
    assert all(isinstance(r, str) for r in results)
    sent += results  # type: ignore[arg-type]
    sent.append(other.send(queue, "z"))
    got = []
    while batch := other.receive(queue, max_messages=3):
        got += batch
    assert [m.message_id for m in got] == sent
    assert [m.body for m in got[:5]] == [b"a", b"b", b"c", b"d", b"e"]
    other.close()


def test_send_batch_results_per_entry(client: LocalClient, queue: str) -> None:
    client.set_attributes(queue, {"max_message_bytes": 100})
    results = client.send_batch(
        queue,
        [
            b"ok",
            BatchEntry(b"bad attribute", attributes={"..": "x"}),
            BatchEntry(b"bad delay", delay_seconds=901),
            b"x" * 101,  # too large alone
            b"y" * 60,
            b"z" * 60,  # fits alone, not with y: the chunk is split
        ],
    )
    assert isinstance(results[0], str)
    assert isinstance(results[1], InvalidAttribute)
    assert isinstance(results[2], InvalidRequest)
    assert isinstance(results[3], MessageTooLarge)
    assert isinstance(results[4], str) and isinstance(results[5], str)
    assert [m.body[:1] for m in client.receive(queue, max_messages=10)] == [b"o", b"y", b"z"]
    assert client.send_batch(queue, []) == []


# -- visibility, receipt handles, nack -------------------------------------------------------


def test_visibility_timeout_expiry_redelivers_with_no_mover(client: LocalClient, queue: str) -> None:
    sent = client.send(queue, b"job")
    (first,) = client.receive(queue, visibility_timeout_seconds=1)
    assert client.receive(queue) == []  # in flight: nobody else gets it
    # Long polling wakes at the lease's deadline (the timer for the queue's next due file).
    (again,) = client.receive(queue, wait_time_seconds=20)
    assert (again.message_id, again.receive_count) == (sent, 2)
    assert again.first_receive_ms == first.first_receive_ms
    assert again.receipt_handle != first.receipt_handle


def test_stale_receipt_handle(client: LocalClient, root: Path, queue: str) -> None:
    client.send(queue, b"job")
    (old,) = client.receive(queue, visibility_timeout_seconds=1)
    (new,) = client.receive(queue, wait_time_seconds=20, visibility_timeout_seconds=60)
    other = LocalClient(root)  # another client (no shared memory) sees the same
    for c in (client, other):
        with pytest.raises(StaleReceiptHandle):
            c.delete(queue, old.receipt_handle)
        with pytest.raises(StaleReceiptHandle):
            c.change_visibility(queue, old.receipt_handle, 0)
    (peeked,) = client.peek(queue).messages
    assert (peeked.state, peeked.receive_count) == ("in_flight", 2)  # the newer lease is untouched
    other.ack(new)
    with pytest.raises(MessageNotFound):
        client.delete(queue, new.receipt_handle)
    assert files(root, "remove") == []  # the delete unlinked the file at once (no mq-reaper)
    other.close()


def test_a_released_message_is_deleted_by_its_handle_until_received_again(client: LocalClient, queue: str) -> None:
    client.send(queue, b"job")
    (message,) = client.receive(queue)
    client.nack(message)  # ready again, nobody received it since: the handle is still the latest
    client.delete(queue, message.receipt_handle)
    assert client.receive(queue) == []


def test_change_visibility_and_nack(client: LocalClient, root: Path, queue: str) -> None:
    client.send(queue, b"job")
    (message,) = client.receive(queue, visibility_timeout_seconds=1)
    deadline = client.change_visibility(queue, message.receipt_handle, 600)
    assert deadline > message.visibility_deadline_ms
    other = LocalClient(root)
    assert other.receive(queue, wait_time_seconds=2) == []  # extended: not redelivered at the old deadline
    # The handle keeps working after the change, in this client and in another one.
    other.change_visibility(queue, message.receipt_handle, 300)
    client.nack(message)
    with pytest.raises(MessageNotInFlight):
        client.change_visibility(queue, message.receipt_handle, 10)
    (again,) = other.receive(queue, visibility_timeout_seconds=60)
    assert again.receive_count == 2
    other.nack(again, delay_seconds=1)  # retry after a delay
    assert client.receive(queue) == []
    (third,) = client.receive(queue, wait_time_seconds=20)
    assert third.receive_count == 3
    results = client.change_visibility_batch(
        queue, [(third.receipt_handle, 60), ("junk", 5), (third.receipt_handle, -1)]
    )
    assert isinstance(results[0], int) and results[0] > third.visibility_deadline_ms
    assert isinstance(results[1], InvalidReceiptHandle) and isinstance(results[2], InvalidRequest)
    results = client.delete_batch(queue, [third.receipt_handle, third.receipt_handle])
    assert results[0] is None and isinstance(results[1], MessageNotFound)
    other.close()


def test_delete_batch_and_delete_by_id(client: LocalClient, root: Path, queue: str) -> None:
    ids = [client.send(queue, str(i)) for i in range(4)]
    delayed = client.send(queue, b"later", delay_seconds=900)
    messages = client.receive(queue, max_messages=2)
    results = client.delete_batch(queue, [m.receipt_handle for m in messages] + ["junk"])
    assert results[:2] == [None, None] and isinstance(results[2], InvalidReceiptHandle)
    for message_id in (ids[2], delayed):  # ready, delayed: wherever it is
        client.delete_by_id(queue, message_id)
    with pytest.raises(MessageNotFound):
        client.delete_by_id(queue, ids[2])
    assert [m.message_id for m in client.receive(queue, max_messages=10)] == [ids[3]]
    assert files(root, "remove") == []
    with pytest.raises(QueueNotFound):
        client.delete_batch("missing", ["junk"])


def test_attempt_id_retry_receives_the_same_messages(client: LocalClient, root: Path, queue: str) -> None:
    ids = [client.send(queue, str(i)) for i in range(3)]
    first = client.receive(queue, max_messages=2, attempt_id="try-1")
    other = LocalClient(root)  # the record is on disk: a retry through another client works too
    retry = other.receive(queue, max_messages=2, attempt_id="try-1")
    assert [m.message_id for m in retry] == [m.message_id for m in first] == ids[:2]
    assert [m.receive_count for m in retry] == [2, 2]
    with pytest.raises(StaleReceiptHandle):
        client.ack(first[0])
    assert [m.message_id for m in client.receive(queue, max_messages=10, attempt_id="try-2")] == [ids[2]]
    other.close()


# -- dead-letter queues and redrive ---------------------------------------------------------------


def test_dead_letter_after_max_receive_count_with_no_mover(client: LocalClient, root: Path) -> None:
    client.create_queue("jobs-dlq")
    client.create_queue("jobs", {"dead_letter_queue": "jobs-dlq", "max_receive_count": 2})
    released = client.send("jobs", b"released")
    expired = client.send("jobs", b"expired")
    a, b = client.receive("jobs", max_messages=2, visibility_timeout_seconds=1)
    assert [a.message_id, b.message_id] == [released, expired]
    client.nack(a)
    (a2,) = client.receive("jobs", visibility_timeout_seconds=60)
    assert (a2.message_id, a2.receive_count) == (released, 2)
    client.nack(a2)  # ready, received twice: the next receive dead-letters it instead of delivering it
    # The expired one comes back at its deadline (no mq-mover: this receive redelivers it) ...
    (b2,) = client.receive("jobs", wait_time_seconds=20, visibility_timeout_seconds=1)
    assert (b2.message_id, b2.receive_count) == (expired, 2)
    # ... and at its next deadline goes to the dead-letter queue (Store.move_due, as mq-mover).
    assert client.receive("jobs", wait_time_seconds=3) == []
    stats = client.queue_stats("jobs")
    assert (stats["ready"], stats["in_flight"]) == (0, 0)
    dead = client.receive("jobs-dlq", max_messages=10)
    assert sorted((m.message_id, m.receive_count) for m in dead) == sorted([(released, 3), (expired, 3)])
    assert {m.body for m in dead} == {b"released", b"expired"}
    assert files(root, "remove") == []


def test_redrive_runs_to_the_end(client: LocalClient, queue: str) -> None:
    client.create_queue("dlq")
    client.set_attributes(queue, {"dead_letter_queue": "dlq", "max_receive_count": 1})
    ids = [client.send(queue, str(i)) for i in range(5)]
    for message in client.receive(queue, max_messages=10):
        client.nack(message)
    assert client.receive(queue, max_messages=10) == []  # all dead-lettered
    client.send("dlq", b"sent to the dlq itself: no source, skipped")
    assert client.redrive_status("dlq") is None
    with pytest.raises(RedriveNotRunning):
        client.cancel_redrive("dlq")

    status = client.start_redrive("dlq")
    assert (status["state"], status["moved"], status["skipped"], status["to_move"]) == ("completed", 5, 1, 6)
    assert client.redrive_status("dlq") == status
    assert client.queue_stats("dlq")["redrive"] == status
    back = client.receive(queue, max_messages=10)
    assert [m.body for m in back] == [b"0", b"1", b"2", b"3", b"4"]  # oldest first
    assert not {m.message_id for m in back} & set(ids)  # new ids
    assert {m.receive_count for m in back} == {1}  # count starts again

    client.create_queue("elsewhere")
    assert client.start_redrive("dlq", destination="elsewhere", max_messages_per_second=100)["moved"] == 1
    assert [m.body for m in client.receive("elsewhere")] == [b"sent to the dlq itself: no source, skipped"]
    with pytest.raises(InvalidRequest):
        client.start_redrive("dlq", destination="dlq")
    with pytest.raises(QueueNotFound):
        client.start_redrive("dlq", destination="missing")


def test_a_running_redrive_is_paced_and_cancelled_from_another_client(client: LocalClient, root: Path) -> None:
    client.create_queue("dlq")
    client.create_queue("back")
    client.send_batch("dlq", [str(i) for i in range(20)])
    result: list[dict[str, object]] = []
    runner = threading.Thread(
        target=lambda: result.append(client.start_redrive("dlq", destination="back", max_messages_per_second=4))
    )
    runner.start()
    with LocalClient(root) as other:
        while (status := other.redrive_status("dlq")) is None or status["moved"] == 0:
            assert runner.is_alive(), result
            runner.join(0.05)
        assert status["state"] == "running"
        assert other.cancel_redrive("dlq")["state"] == "cancelled"
    runner.join()
    (final,) = result
    assert final["state"] == "cancelled" and "cancel_requested_ms" in final
    moved = final["moved"]
    assert isinstance(moved, int) and 0 < moved < 20  # 4 per second: far from done when the cancel came
    assert client.queue_stats("back")["ready"] == moved
    assert client.queue_stats("dlq")["ready"] == 20 - moved
    assert client.redrive_status("dlq") == final


# -- delays -----------------------------------------------------------------------------------------


def test_delays_with_no_mover(client: LocalClient, queue: str) -> None:
    delayed = client.send(queue, b"later", delay_seconds=1)
    batch = client.send_batch(queue, [BatchEntry(b"later too", delay_seconds=1)])
    stats = client.queue_stats(queue)
    assert (stats["ready"], stats["delayed"]) == (0, 2)
    assert client.receive(queue) == []
    got = client.receive(queue, max_messages=10, wait_time_seconds=20)
    while len(got) < 2:
        got += client.receive(queue, max_messages=10, wait_time_seconds=20)
    assert [(m.message_id, m.receive_count) for m in got] == [(delayed, 1), (batch[0], 1)]

    client.set_attributes(queue, {"delay_seconds": 900})  # the queue's default delay
    client.send(queue, b"queue delay")
    now = client.send(queue, b"no delay", delay_seconds=0)
    assert [m.message_id for m in client.receive(queue, max_messages=10)] == [now]
    assert client.queue_stats(queue)["delayed"] == 1


# -- long polling ------------------------------------------------------------------------------------


def test_long_poll_woken_by_a_send_from_another_process(client: LocalClient, root: Path, queue: str) -> None:
    sender = run_python(
        """
        import sys, time
        from mqcore.client._local import LocalClient
        time.sleep(0.5)
        print(LocalClient(sys.argv[1]).send(sys.argv[2], b"from another process"))
        """,
        str(root),
        queue,
    )
    messages = client.receive(queue, wait_time_seconds=20)
    sent = finish(sender).strip()
    assert [(m.message_id, m.body) for m in messages] == [(sent, b"from another process")]


def test_long_poll_woken_by_another_thread_and_several_waiters(client: LocalClient, root: Path, queue: str) -> None:
    got: list[list[Message]] = [[] for _ in range(3)]

    def wait(i: int) -> None:
        got[i] = client.receive(queue, wait_time_seconds=20)  # one client shared by three threads

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    with LocalClient(root) as other:
        ids = [other.send(queue, str(i)) for i in range(3)]
    for t in threads:
        t.join()
    assert sorted(m.message_id for batch in got for m in batch) == sorted(ids)
    assert all(len(batch) == 1 for batch in got)


def test_close_ends_a_long_poll(root: Path) -> None:
    client = LocalClient(root)
    client.create_queue("idle")
    result: list[list[Message]] = []
    thread = threading.Thread(target=lambda: result.append(client.receive("idle", wait_time_seconds=20)))
    thread.start()
    client.close()
    thread.join()
    assert result == [[]]


def test_long_poll_on_a_deleted_queue(client: LocalClient, root: Path, queue: str) -> None:
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            client.receive(queue, wait_time_seconds=20)
        except MQError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    with LocalClient(root) as other:
        other.send(queue, b"x", delay_seconds=900)  # something in delay/ wakes nobody: not due
        other.delete_queue(queue)
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], QueueNotFound)


# -- capacity ----------------------------------------------------------------------------------------


def test_capacity_waits_for_room_then_raises_queue_full(client: LocalClient, root: Path, queue: str) -> None:
    client.set_attributes(queue, {"capacity": 2, "capacity_wait_seconds": 20})
    client.send(queue, b"1")
    client.send(queue, b"2")
    outcome: list[str | BaseException] = []

    def send_third() -> None:
        try:
            outcome.append(LocalClient(root).send(queue, b"3"))
        except MQError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send_third)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), outcome  # the send waits for room (20 s at most) ...
    client.receive(queue)  # ... which this receive makes
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], str)

    assert client.send(queue, b"delayed", delay_seconds=5)  # capacity counts ready messages only
    client.set_attributes(queue, {"capacity_wait_seconds": 0})
    with pytest.raises(QueueFull):
        client.send(queue, b"4")
    client.set_attributes(queue, {"capacity_wait_seconds": 1})
    with pytest.raises(QueueFull):
        client.send(queue, b"4")
    client.receive(queue)
    results = client.send_batch(queue, [b"a", b"b", BatchEntry(b"c", delay_seconds=1)])
    assert isinstance(results[0], str) and isinstance(results[1], QueueFull) and isinstance(results[2], str)


# -- purge -------------------------------------------------------------------------------------------


def test_purge(client: LocalClient, root: Path, queue: str) -> None:
    client.send_batch(queue, [b"1", b"2", b"3"])
    client.send(queue, b"delayed", delay_seconds=60)
    (in_flight,) = client.receive(queue)
    assert client.purge(queue) == 4
    after = client.send(queue, b"after")
    assert [m.message_id for m in client.receive(queue, max_messages=10)] == [after]
    with pytest.raises(MessageNotFound):
        client.ack(in_flight)
    assert client.queue_stats(queue)["delayed"] == 0
    assert files(root, "remove") == []


# -- peek --------------------------------------------------------------------------------------------


def test_peek_changes_nothing_and_pages(client: LocalClient, queue: str) -> None:
    ids = [client.send(queue, str(i)) for i in range(5)]
    delayed = client.send(queue, b"later", delay_seconds=60)
    (leased,) = client.receive(queue)
    page = client.peek(queue, limit=2)
    assert [(m.message_id, m.state, m.receive_count) for m in page.messages] == [
        (ids[0], "in_flight", 1),
        (ids[1], "ready", 0),
    ]
    assert page.messages[0].visibility_deadline_ms == leased.visibility_deadline_ms
    assert page.messages[1].visibility_deadline_ms is None and page.next_after == ids[1]
    everything = list(client.iter_peek(queue, page_size=2))
    assert [m.message_id for m in everything] == [*ids, delayed]
    assert everything[-1].state == "delayed" and everything[-1].source_queue == queue
    assert client.peek(queue, after=delayed).messages == []
    # Nothing changed: the next receive gets the next message, first time received.
    (next_one,) = client.receive(queue)
    assert (next_one.message_id, next_one.receive_count) == (ids[1], 1)


# -- partitions --------------------------------------------------------------------------------------


def test_partitions_cover_every_message_exactly_once(client: LocalClient, queue: str) -> None:
    ids = [r for r in client.send_batch(queue, [str(i) for i in range(60)], batch_size=20) if isinstance(r, str)]
    assert len(ids) == 60
    seen: dict[int, list[str]] = {}
    for p in range(4):
        seen[p] = [m.message_id for m in drain(client, queue, partition=p, partitions=4)]
        assert seen[p] == sorted(seen[p])  # FIFO within a partition
        assert all(partition_of(i, 4) == p for i in seen[p])
    everything = [i for p in range(4) for i in seen[p]]
    assert sorted(everything) == sorted(ids) and len(set(everything)) == 60


# -- several processes on one root -------------------------------------------------------------------


def test_concurrent_brokerless_consumers_get_each_message_once(client: LocalClient, root: Path, queue: str) -> None:
    ids = [r for r in client.send_batch(queue, [str(i) for i in range(150)]) if isinstance(r, str)]
    consumer = """
        import json, sys
        from mqcore.client._local import LocalClient
        c = LocalClient(sys.argv[1])
        got = []
        while batch := c.receive(sys.argv[2], max_messages=7, visibility_timeout_seconds=300):
            for m in batch:
                c.ack(m)
                got.append(m.message_id)
        print(json.dumps(got))
    """
    procs = [run_python(consumer, str(root), queue) for _ in range(3)]
    here = [m.message_id for m in drain(client, queue, visibility_timeout_seconds=300)]
    batches = [json.loads(finish(p)) for p in procs] + [here]
    everything = [i for batch in batches for i in batch]
    assert sorted(everything) == sorted(ids) and len(everything) == len(set(everything))
    for batch in batches:
        assert batch == sorted(batch)  # each consumer saw FIFO order
    assert files(root, "delay") == [] and files(root, "remove") == []


# -- asyncio ------------------------------------------------------------------------------------------


async def test_async_client(root: Path) -> None:
    async with AsyncLocalClient(root) as client:
        assert await client.create_queue("jobs")
        first = await client.send("jobs", "one")
        (batch,) = await client.send_batch("jobs", [b"two"])
        (message,) = await client.receive("jobs")
        assert (message.message_id, message.text()) == (first, "one")
        await client.ack(message)
        (message,) = await client.receive("jobs", visibility_timeout_seconds=1)
        assert message.message_id == batch
        (again,) = await client.receive("jobs", wait_time_seconds=20)  # redelivered at the deadline
        assert (again.message_id, again.receive_count) == (batch, 2)
        with pytest.raises(StaleReceiptHandle):
            await client.ack(message)
        await client.nack(again)
        assert [m.message_id async for m in client.iter_peek("jobs")] == [batch]
        assert (await client.queue_stats("jobs"))["ready"] == 1
        assert await client.purge("jobs") == 1


async def test_async_long_polls_do_not_hold_threads(root: Path) -> None:
    """More long polls than the default thread pool has threads, then sends: every poll gets one.

    Were the waits parked in worker threads, the sends (which need a thread) would only run after
    the polls timed out empty.
    """
    async with AsyncLocalClient(root) as client:
        await client.create_queue("jobs")
        polls = [asyncio.create_task(client.receive("jobs", wait_time_seconds=20)) for _ in range(40)]
        await asyncio.sleep(0.2)
        ids = [await client.send("jobs", str(i)) for i in range(40)]
        got = await asyncio.gather(*polls)
    assert sorted(m.message_id for batch in got for m in batch) == sorted(ids)


async def test_async_capacity_wait_is_awaited(root: Path) -> None:
    async with AsyncLocalClient(root) as client:
        await client.create_queue("jobs", {"capacity": 1, "capacity_wait_seconds": 20})
        await client.send("jobs", b"1")
        blocked = asyncio.create_task(client.send("jobs", b"2"))
        await asyncio.sleep(0.2)
        assert not blocked.done()
        (message,) = await client.receive("jobs")  # runs while the send waits: the loop is free
        await client.ack(message)
        second = await blocked
        assert [m.message_id for m in await client.receive("jobs")] == [second]
        await client.set_attributes("jobs", {"capacity_wait_seconds": 0})
        await client.send("jobs", b"3")
        with pytest.raises(QueueFull):
            await client.send("jobs", b"4")
        results = await client.send_batch("jobs", [b"5", BatchEntry(b"6", delay_seconds=1)])
        assert isinstance(results[0], QueueFull) and isinstance(results[1], str)


async def test_async_cancelled_waits_leave_nothing_behind(root: Path) -> None:
    """A cancelled send waiting for room gives its place back; a cancelled long poll leases nothing."""
    async with AsyncLocalClient(root) as client:
        await client.create_queue("jobs", {"capacity": 1, "capacity_wait_seconds": 20})
        await client.create_queue("idle")
        await client.send("jobs", b"1")
        blocked = asyncio.create_task(client.send("jobs", b"2"))
        poll = asyncio.create_task(client.receive("idle", wait_time_seconds=20))
        await asyncio.sleep(0.2)
        for task in (blocked, poll):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await client.set_attributes("jobs", {"capacity_wait_seconds": 0})
        (first,) = await client.receive("jobs")
        assert first.body == b"1"
        await client.send("jobs", b"3")  # the cancelled send holds no room
        sent = await client.send("idle", b"x")
        assert [m.message_id for m in await client.receive("idle")] == [sent]  # the cancelled poll leased nothing


async def test_async_attempt_retry_waits_for_the_first_try(root: Path) -> None:
    """A retry sent while the first try still long-polls waits for it, then receives the same message."""
    async with AsyncLocalClient(root) as client:
        await client.create_queue("jobs")
        tries = [asyncio.create_task(client.receive("jobs", wait_time_seconds=20, attempt_id="a")) for _ in range(2)]
        await asyncio.sleep(0.2)
        sent = await client.send("jobs", b"x")  # a thread is free for it while both tries wait
        got = await asyncio.gather(*tries)
    assert [[m.message_id for m in batch] for batch in got] == [[sent], [sent]]
    assert sorted(m.receive_count for batch in got for m in batch) == [1, 2]
