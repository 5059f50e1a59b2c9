"""The service rules written once (``mqcore/service/``): ranges, attempts, capacity, handles, receive, redrive.

The pure rules are checked directly; the rules over the Store run on a real
root under ``tmp_path`` (no mocks). The daemon and the brokerless client are
checked end to end by tests/integration, tests/sqs and tests/client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mqcore.attributes import QueueAttributes
from mqcore.errors import (
    InvalidAttribute,
    InvalidReceiptHandle,
    InvalidRequest,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    RedriveInProgress,
    RedriveNotRunning,
)
from mqcore.model import ReceivedMessage
from mqcore.names import QueueName, ReceiptHandle, ready_name
from mqcore.protocol import Store, now_ms
from mqcore.service import attempts, capacity, handles, plans, queues, receive, redrive, requests
from mqcore.service.requests import (
    DELAY_SECONDS,
    MAX_MESSAGES,
    VISIBILITY_TIMEOUT_SECONDS,
    WAIT_TIME_SECONDS,
    ReceiveArgs,
    check_receive,
)

Q = QueueName("orders")
DLQ = QueueName("orders-dlq")
VT_MS = 30_000


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A Store on a fresh root with queues ``orders`` and ``orders-dlq``."""
    s = Store(tmp_path / "root")
    s.create_queue(Q)
    s.create_queue(DLQ)
    return s


def _h(text: str) -> ReceiptHandle:
    """A receipt handle parsed from its text, as the edges do (the Store takes parsed handles only)."""
    return ReceiptHandle.parse(text)


# -- request ranges -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "low", "high"),
    [
        (MAX_MESSAGES, 1, 10),
        (WAIT_TIME_SECONDS, 0, 20),
        (VISIBILITY_TIMEOUT_SECONDS, 0, 43_200),
        (DELAY_SECONDS, 0, 900),
    ],
)
def test_sqs_ranges_are_the_documented_ones(limit: requests.Limit, low: int, high: int) -> None:
    assert (limit.low, limit.high) == (low, high)
    assert limit.check(low) == low and limit.check(high) == high
    for bad in (low - 1, high + 1, True, 1.0, "5", None):
        with pytest.raises(InvalidRequest) as caught:
            limit.check(bad)
        assert caught.value.details == {"parameter": limit.name}


def test_limit_names_json_fields_with_their_place() -> None:
    with pytest.raises(InvalidRequest) as caught:
        DELAY_SECONDS.check(901, key="field", where="entries[2].")
    assert caught.value.details == {"field": "entries[2].delay_seconds"}
    assert "entries[2].delay_seconds must be an integer 0-900, got 901" in caught.value.message


def test_limit_from_text_takes_digits_only() -> None:
    assert WAIT_TIME_SECONDS.from_text(None) is None
    assert WAIT_TIME_SECONDS.from_text("20") == 20
    for bad in ("21", "-1", "+1", " 1", "1.0", "", "99999999999"):
        with pytest.raises(InvalidRequest) as caught:
            WAIT_TIME_SECONDS.from_text(bad)
        assert caught.value.details == {"parameter": "wait_time_seconds"}
    with pytest.raises(InvalidRequest) as caught:
        DELAY_SECONDS.from_text("x", name="X-Delay-Seconds")
    assert caught.value.details == {"parameter": "X-Delay-Seconds"}


def test_check_receive_then_resolve_fills_the_queue_defaults() -> None:
    attrs = QueueAttributes(visibility_timeout_seconds=45, receive_wait_seconds=7)
    args = check_receive(3, attempt_id="a-1", partition=1, partitions=4)
    assert args == ReceiveArgs(3, None, None, "a-1", (1, 4))
    request = args.resolve(Q, attrs)
    assert (request.visibility_timeout_ms, request.wait_time_seconds, request.max_messages) == (45_000, 7, 3)
    assert check_receive(1, 0, 0).resolve(Q, attrs).visibility_timeout_ms == 0
    with pytest.raises(InvalidRequest, match="attempt_id"):
        check_receive(attempt_id="has space")
    with pytest.raises(InvalidRequest) as caught:
        check_receive(partition=1)
    assert caught.value.details == {"parameter": "partitions"}


def test_receive_query_and_python_arguments_agree() -> None:
    args, as_json = requests.receive_args_from_query(
        {"max_messages": "2", "wait_time_seconds": "0", "partition": "0", "partitions": "3"}
    )
    assert as_json and args == check_receive(2, 0, partition=0, partitions=3)
    args, as_json = requests.receive_args_from_query({})
    assert not as_json and args == ReceiveArgs()
    with pytest.raises(InvalidRequest) as caught:
        requests.receive_args_from_query({"partition": "3", "partitions": "3"})
    assert caught.value.details == {"parameter": "partition"}


def test_send_entry_checks_and_defaults() -> None:
    attrs = QueueAttributes(delay_seconds=5)
    entry = requests.send_entry(b"x", "text/plain", {"k": "v"}, None, attrs)
    assert (entry.content_type, entry.attributes, entry.delay_ms) == ("text/plain", {"k": "v"}, 5_000)
    assert requests.send_entry(b"x", None, None, 0, attrs).delay_ms == 0
    with pytest.raises(InvalidRequest) as caught:
        requests.send_entry(b"x", "\x00", None, None, attrs, where="entries[0].")
    assert caught.value.details == {"field": "entries[0].content_type"}
    with pytest.raises(InvalidAttribute):
        requests.send_entry(b"x", None, {"": "v"}, None, attrs)
    requests.check_message_size(requests.entry_size(entry), attrs)
    with pytest.raises(MessageTooLarge):
        requests.check_message_size(attrs.max_message_bytes + 1, attrs)


def test_prefix_after_and_attempt_id() -> None:
    assert requests.check_prefix("") == ""
    with pytest.raises(InvalidRequest):
        requests.check_prefix("a.b")
    assert requests.check_after(None) is None
    with pytest.raises(InvalidRequest) as caught:
        requests.check_after("nope")
    assert caught.value.details == {"parameter": "after"}
    assert requests.check_attempt_id(None) is None
    with pytest.raises(InvalidRequest):
        requests.check_attempt_id("x" * 129)


# -- capacity -------------------------------------------------------------------------


def test_admit_counts_ready_and_sends_in_progress() -> None:
    assert capacity.admit(None, 10**6, 10**6, 7) == 7
    assert capacity.admit(5, 3, 1, 4) == 1
    assert capacity.admit(5, 5, 0, 1) == 0
    assert capacity.admit(5, 9, 0, 1) == 0  # over capacity (lowered meanwhile): none, never negative


def test_send_reservations_never_give_the_last_room_twice() -> None:
    reservations = capacity.SendReservations()
    taken: list[int] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait()
        taken.append(reservations.reserve(Q, 3, 0, 1))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [0] * 5 + [1] * 3 and reservations.sending(Q) == 3
    reservations.release(Q, 3)
    assert reservations.sending(Q) == 0


def test_queue_full_names_the_capacity() -> None:
    error = capacity.queue_full(Q, QueueAttributes(capacity=4, capacity_wait_seconds=2))
    assert isinstance(error, QueueFull) and error.details["capacity"] == 4 and "within 2 s" in error.message


# -- attempt locks and records ---------------------------------------------------------


def test_keyed_locks_serialize_one_key_and_forget_it() -> None:
    locks: attempts.KeyedLocks[threading.Lock] = attempts.KeyedLocks(threading.Lock)
    inside = 0
    most = 0

    def one() -> None:
        nonlocal inside, most
        with locks.holding((Q, "a")):
            inside += 1
            most = max(most, inside)
            time.sleep(0.01)
            inside -= 1

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1 and len(locks) == 0


def test_keyed_locks_async() -> None:
    async def main() -> list[str]:
        locks: attempts.KeyedLocks[asyncio.Lock] = attempts.KeyedLocks(asyncio.Lock)
        order: list[str] = []

        async def one(name: str) -> None:
            async with locks.holding_async("k"):
                order.append(f"{name}+")
                await asyncio.sleep(0.01)
                order.append(f"{name}-")

        await asyncio.gather(one("a"), one("b"))
        assert len(locks) == 0
        return order

    assert asyncio.run(main()) == ["a+", "a-", "b+", "b-"]


def test_attempt_record_relets_the_same_messages(store: Store) -> None:
    for body in (b"1", b"2", b"3"):
        store.send(Q, body)
    request = check_receive(2, attempt_id="try-1").resolve(Q, QueueAttributes())
    policy = receive.lease_policy(QueueAttributes(), None)
    assert attempts.load_attempt(store, request) is None
    first = receive.lease_names(store, Q, sorted(store.scan_ready(Q)), VT_MS, policy, wanted=2)
    assert [m.body for m in first.messages] == [b"1", b"2"] and len(first.untried) == 1
    attempts.record_attempt(store, request, first.messages, None)

    attempt = attempts.load_attempt(store, request)
    assert attempt is not None and attempt.handles == [m.receipt_handle for m in first.messages]
    # A record is text read from disk: a malformed handle in it is left out, the others received again.
    again = attempts.relet(store, request, ["garbage", *attempt.handles], policy)
    assert [m.message_id for m in again] == [m.message_id for m in first.messages]
    assert all(m.receive_count == 2 for m in again)
    attempts.record_attempt(store, request, again, attempt)
    later = attempts.load_attempt(store, request)
    assert later is not None and later.created_ms == attempt.created_ms
    assert later.handles == [m.receipt_handle for m in again]

    smaller = check_receive(1, attempt_id="try-1").resolve(Q, QueueAttributes())
    split = attempts.load_attempt(store, smaller)
    assert split is not None and len(split.handles) == 1 and len(split.rest) == 1


# -- receive ------------------------------------------------------------------------------


def test_lease_policy_dead_letters_at_receive(store: Store) -> None:
    attrs = QueueAttributes(max_receive_count=1, dead_letter_queue=DLQ)
    policy = receive.lease_policy(attrs, None)
    store.send(Q, b"poison")
    (message,) = receive.lease_names(store, Q, store.scan_ready(Q), 0, policy).messages
    store.change_visibility(Q, _h(message.receipt_handle), 0)
    outcome = receive.lease_names(store, Q, store.scan_ready(Q), VT_MS, policy)
    assert outcome.messages == [] and outcome.error is None
    assert [n.partition(".")[0] for n in store.scan_ready(DLQ)] == [message.message_id]


def test_redeliver_due_moves_expired_leases_back(store: Store) -> None:
    policy = receive.lease_policy(QueueAttributes(), None)
    store.send(Q, b"a")
    store.send(Q, b"b")
    names = sorted(store.scan_ready(Q))
    leased = receive.lease_names(store, Q, names[:1], 1, policy).messages
    receive.lease_names(store, Q, names[1:], 60_000, policy)
    done = receive.redeliver_due(store, Q, now_ms() + 10, policy)
    assert store.scan_ready(Q) == [ready_name(leased[0].message_id, 1)]
    assert done.next_due_ms is not None and done.removed == []


def test_in_partition_and_lease_outcome_rule(store: Store) -> None:
    assert receive.in_partition("anything", None)
    outcome = receive.LeaseOutcome(error=QueueNotFound("gone"))
    with pytest.raises(QueueNotFound):
        outcome.check(Q)
    outcome.check(Q, leased_before=1)  # logged, not raised: the receive keeps what it leased


# -- receipt handles ---------------------------------------------------------------------


def test_check_handle_and_lease_memory(store: Store) -> None:
    store.send(Q, b"x")
    policy = receive.lease_policy(QueueAttributes(), None)
    (message,) = receive.lease_names(store, Q, store.scan_ready(Q), VT_MS, policy).messages
    handle = handles.check_handle(message.receipt_handle, Q, message.message_id)
    with pytest.raises(InvalidReceiptHandle):
        handles.check_handle(message.receipt_handle, DLQ)
    with pytest.raises(InvalidReceiptHandle):
        handles.check_handle(42, Q)
    memory = handles.LeaseMemory(limit=10)
    memory.received(message)
    assert memory.current(handle) == message.in_flight_name
    current = store.change_visibility(Q, handle, 60_000, hint=memory.current(handle))
    memory.moved(handle, current)
    newer = ReceiptHandle.parse(current, Q)
    assert memory.current(handle) == memory.current(newer) == current
    assert memory.hints([handle.text, "other"]) == {handle.text: current}
    assert memory.pop_message(Q, message.message_id) == current
    assert len(memory) == 0  # a delete by id forgets both handles
    memory.released(handle)
    assert memory.current(handle) is None and memory.current(newer) is None


def test_lease_memory_forgets_a_message_deleted_by_id() -> None:
    memory = handles.LeaseMemory(limit=10)
    first = ReceiptHandle.parse(f"1790000000000.orders.{_id(1)}.1.{'0' * 17}", Q)
    memory.moved(first, f"1790000060000.orders.{_id(1)}.1.{'1' * 17}")
    assert len(memory) == 2
    assert memory.pop_message(Q, _id(1)) == f"1790000060000.orders.{_id(1)}.1.{'1' * 17}"
    assert len(memory) == 0 and memory.current(first) is None
    assert memory.pop_message(Q, _id(1)) is None


def test_lease_memory_is_bounded() -> None:
    memory = handles.LeaseMemory(limit=3)
    for i in range(5):
        memory.moved(ReceiptHandle.parse(f"1790000000000.orders.{_id(i)}.1.{'0' * 17}", Q), f"n{i}")
    assert len(memory) == 3


def _id(i: int) -> str:
    return f"0192f000-0000-7000-8000-{i:012x}"


# -- queue stats ------------------------------------------------------------------------


def test_queue_stats_shape() -> None:
    now = 1_790_000_010_000
    stats = queues.queue_stats(
        Q,
        ready=1,
        oldest_ready=None,
        in_flight=2,
        delayed=3,
        created_ms=None,
        attrs=QueueAttributes(),
        redrive={"state": "running", "updated_ms": now - 11_000},
        now=now,
    )
    assert stats["oldest_ready_age_seconds"] is None and stats["redrive"]["state"] == "failed"
    assert set(stats) == {
        "queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds", "created_ms", "attributes", "redrive",
    }  # fmt: skip


# -- redrive ------------------------------------------------------------------------------


def test_redrive_pacer_keeps_the_rate() -> None:
    pacer = redrive.RedrivePacer(rate=10, started=100.0)
    assert pacer.allowance(100.0) == 1 and pacer.wait_seconds(100.0) <= 0
    pacer.tried = 1
    assert pacer.wait_seconds(100.0) == pytest.approx(0.1)
    assert pacer.allowance(101.0) == 10  # a second's worth
    assert pacer.allowance(1_000.0) == redrive.REDRIVE_CHUNK
    assert not pacer.status_due(100.4) and pacer.status_due(100.5)
    pacer.wrote(100.5)
    assert not pacer.status_due(100.9)


def test_redrive_task_over_the_store(store: Store) -> None:
    other = QueueName("other")
    store.create_queue(other)
    with pytest.raises(InvalidRequest):
        redrive.check_redrive_queues(store, DLQ, DLQ)
    with pytest.raises(QueueNotFound):
        redrive.check_redrive_queues(store, DLQ, QueueName("missing"))
    store.send(DLQ, b"back")
    now = now_ms()
    status = redrive.begin_redrive(store, DLQ, other, 100, 1, now)
    assert status["state"] == "running" and status["to_move"] == 1
    with pytest.raises(RedriveInProgress):
        redrive.begin_redrive(store, DLQ, other, 100, 1, now)
    assert redrive.stop_reason(store, DLQ, status) is None
    skipped: set[str] = set()
    moves = redrive.move_names(store, DLQ, store.scan_ready(DLQ), other)
    redrive.tally(status, moves, skipped)
    assert status["moved"] == 1 and not skipped and len(store.scan_ready(other)) == 1

    shown = redrive.request_cancel(store, DLQ, now_ms())
    assert shown["state"] == "cancelled" and "cancel_requested_ms" in shown
    assert redrive.stop_reason(store, DLQ, status) == "cancelled"
    redrive.finish(status)
    redrive.write_status(store, DLQ, status, now_ms())
    assert redrive.read_status(store, DLQ, now_ms())["state"] == "cancelled"  # type: ignore[index]
    with pytest.raises(RedriveNotRunning):
        redrive.request_cancel(store, DLQ, now_ms())
    assert redrive.stop_reason(store, DLQ, {"task_id": "another"}) == "replaced"


# -- plans: the same rule run by a synchronous driver (the daemon runs them with run_async) -----------


def test_run_sync_throws_an_operations_error_into_the_plan() -> None:
    def plan() -> plans.Plan[str]:
        try:
            yield "explode"
        except ValueError as exc:
            text = f"caught {exc}"
            got = yield plans.Blocking(lambda: text)
            return str(got)
        return "not reached"

    def handle(op: object) -> object:
        raise ValueError(op)

    assert plans.run_sync(plan(), handle) == "caught explode"


def test_attempted_receive_plan(store: Store) -> None:
    store.send(Q, b"1")
    policy = receive.lease_policy(QueueAttributes(), None)
    request = check_receive(1, attempt_id="plan").resolve(Q, QueueAttributes())

    def handle(op: attempts.ReceiveNew | attempts.Relet) -> list[ReceivedMessage]:
        if isinstance(op, attempts.Relet):
            return attempts.relet(store, op.request, op.handles, policy)
        return receive.lease_names(store, Q, store.scan_ready(Q), VT_MS, policy, wanted=1).messages

    first = plans.run_sync(attempts.attempted_receive(store, request), handle)
    again = plans.run_sync(attempts.attempted_receive(store, request), handle)
    assert [m.message_id for m in again] == [m.message_id for m in first] and again[0].receive_count == 2


def _sync_redrive_ops(store: Store, now: list[float]) -> Callable[[object], object]:
    """A brokerless-style handler of the redrive plan's operations, on a clock the test moves."""

    def handle(op: object) -> object:
        if isinstance(op, redrive.Pause):
            now[0] += op.seconds
            return None
        if isinstance(op, redrive.MoveOldest):
            names = sorted(n for n in store.scan_ready(op.source) if n not in op.skipped)[: op.wanted]
            return redrive.move_names(store, op.source, names, op.destination)
        assert isinstance(op, redrive.AnyLeft)
        return any(n not in op.skipped for n in store.scan_ready(op.source))

    return handle


def test_redrive_task_plan_completes_at_its_pace(store: Store) -> None:
    other = QueueName("other")
    store.create_queue(other)
    for i in range(5):
        store.send(DLQ, b"%d" % i)
    now = [0.0]
    status = redrive.begin_redrive(store, DLQ, other, 2, 5, now_ms())
    plan = redrive.redrive_task(store, status, lambda: now[0])
    assert plans.run_sync(plan, _sync_redrive_ops(store, now)) is None
    assert (status["state"], status["moved"], status["skipped"]) == ("completed", 5, 0)
    assert 2.0 <= now[0] <= 2.5  # 5 messages at 2 per second
    assert redrive.read_status(store, DLQ, now_ms())["state"] == "completed"  # type: ignore[index]
    assert len(store.scan_ready(other)) == 5 and store.scan_ready(DLQ) == []


def test_redrive_task_plan_yields_to_another_task_and_records_failures(store: Store) -> None:
    store.send(DLQ, b"x")
    store.send(DLQ, b"y")
    now = [0.0]
    status = redrive.begin_redrive(store, DLQ, Q, 1, 2, now_ms())
    store.write_redrive_status(DLQ, redrive.new_status(DLQ, Q, 1, 2, now_ms(), task_id="the-other-one"))
    plan = redrive.redrive_task(store, status, lambda: now[0])
    assert plans.run_sync(plan, _sync_redrive_ops(store, now)) == "replaced"
    assert redrive.read_status(store, DLQ, now_ms())["task_id"] == "the-other-one"  # type: ignore[index]

    store.write_redrive_status(DLQ, {**status, "state": "completed"})
    status = redrive.begin_redrive(store, DLQ, Q, 1, 1, now_ms())

    def broken(op: object) -> object:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        plans.run_sync(redrive.redrive_task(store, status, lambda: now[0]), broken)
    shown = redrive.read_status(store, DLQ, now_ms())
    assert shown is not None and shown["state"] == "failed" and shown["error"] == "disk on fire"


def test_run_sync_throws_ctrl_c_into_the_plan_so_its_cleanup_runs_then_reraises() -> None:
    """A KeyboardInterrupt in a blocking step reaches the plan (as run_async does with a cancellation):
    its ``finally`` still gets to do file work, then the interrupt leaves run_sync."""
    done: list[str] = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    def plan() -> plans.Plan[None]:
        try:
            yield plans.Blocking(interrupted)
        finally:
            yield plans.Blocking(lambda: done.append("status written"))

    with pytest.raises(KeyboardInterrupt):
        plans.run_sync(plan())
    assert done == ["status written"]


def test_every_name_the_service_package_exports_resolves_to_its_modules_object() -> None:
    """``mqcore.service`` imports its parts on first use (PEP 562): every name of ``__all__`` has a home module,
    resolves to that module's object, and no name outside ``__all__`` is served."""
    import importlib

    import mqcore.service as service

    assert set(service._HOMES) == set(service.__all__)
    for name in service.__all__:
        home = importlib.import_module(f"mqcore.service.{service._HOMES[name]}")
        assert getattr(service, name) is getattr(home, name), name
    with pytest.raises(AttributeError):
        service.not_a_service_name  # noqa: B018
