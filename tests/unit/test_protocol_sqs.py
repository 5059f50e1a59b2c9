"""SQS semantics in the storage protocol (``mqcore/protocol.py``, ``mqcore/attributes.py``; ``docs/protocol.md`` §15).

Real roots under ``tmp_path``, the real :class:`~mqcore.protocol.Store`; time
is passed in as ``now`` (epoch ms) where a rule depends on it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mqcore.attributes import (
    DEFAULT_MAX_RECEIVE_COUNT,
    QueueAttributes,
    check_changes,
    check_message_attributes,
    effective,
)
from mqcore.errors import (
    InvalidAttribute,
    InvalidReceiptHandle,
    MessageNotFound,
    MessageNotInFlight,
    QueueNameExists,
    StaleReceiptHandle,
)
from mqcore.names import ATTEMPT_WINDOW_MS, QueueName, ReceiptHandle, parse_in_flight_name, ready_name, sent_ms_of
from mqcore.protocol import LeasePolicy, SendEntry, Store, now_ms

Q = QueueName("orders")
DLQ = QueueName("orders-dead")
VT_MS = 30_000


def _h(text: str) -> ReceiptHandle:
    """A receipt handle parsed from its text, as the edges do (the Store takes parsed handles only)."""
    return ReceiptHandle.parse(text)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A Store with queues ``orders`` and ``orders-dead``."""
    s = Store(tmp_path / "root")
    s.create_queue(DLQ)
    s.create_queue(Q)
    return s


def messages(store: Store, sub: str) -> list[str]:
    """Message file names in ``root/sub`` (metadata dot-files left out)."""
    return sorted(n for n in os.listdir(os.path.join(store.layout.root, sub)) if not n.startswith("."))


def receive(store: Store, queue: QueueName = Q, vt_ms: int = VT_MS, now: int | None = None, **kw):
    """Lease the oldest ready message of ``queue`` (what mq's fetcher does), or None."""
    names = messages(store, f"queues/{queue}")
    if not names:
        return None
    return (store if now is None else store.at(now)).lease(queue, names[0], vt_ms, **kw)


# -- attribute rules ------------------------------------------------------------


def test_queue_attribute_rules_follow_sqs() -> None:
    assert check_changes({"visibility_timeout_seconds": 43_200, "delay_seconds": 0}) == {
        "visibility_timeout_seconds": 43_200,
        "delay_seconds": 0,
    }
    for bad in (
        {"visibility_timeout_seconds": 43_201},
        {"delay_seconds": 901},
        {"retention_seconds": 59},
        {"receive_wait_seconds": 21},
        {"max_receive_count": 0},
        {"visibility_timeout_seconds": "30"},
        {"capacity": True},
        {"dead_letter_queue": "../etc"},
        {"no_such_key": 1},
    ):
        with pytest.raises(InvalidAttribute) as info:
            check_changes(bad)
        assert info.value.details["name"] == next(iter(bad))
    with pytest.raises(InvalidAttribute):
        check_changes(["not", "an", "object"])


def test_a_dead_letter_queue_alone_gets_smq_s_five_attempts() -> None:
    attrs = effective({"dead_letter_queue": "dlq"}, QueueAttributes())
    assert attrs.max_receive_count == DEFAULT_MAX_RECEIVE_COUNT == 5
    assert QueueAttributes.from_json({"max_receive_count": 2, "dead_letter_queue": "d"}).max_receive_count == 2


def test_the_daemon_limit_caps_a_queue_s_maximum_message_size() -> None:
    daemon = QueueAttributes(max_message_bytes=1000)
    assert effective({"max_message_bytes": 5000}, daemon).max_message_bytes == 1000
    assert effective({"max_message_bytes": 10}, daemon).max_message_bytes == 10


def test_message_attribute_rules_follow_sqs() -> None:
    assert check_message_attributes({"trace.id": "abc", "n": ""}) == {"trace.id": "abc", "n": ""}
    assert check_message_attributes(None) == {}
    for bad in (
        {"AWS.x": "1"},
        {"amazon.x": "1"},
        {".x": "1"},
        {"x.": "1"},
        {"a..b": "1"},
        {"sp ace": "1"},
        {"n": 1},
        {f"k{i}": "v" for i in range(11)},
        {"lone": "\ud800"},
        {"nul": "\x00"},
        {"big": "x" * 8_000},
        "not an object",
    ):
        with pytest.raises(InvalidAttribute):
            check_message_attributes(bad)


# -- queues with attributes -----------------------------------------------------------


def test_create_queue_stores_its_attributes_atomically(store: Store) -> None:
    assert store.at(1234).create_queue(QueueName("jobs"), {"visibility_timeout_seconds": 5, "capacity": 10})
    assert store.get_attributes(QueueName("jobs")) == {"visibility_timeout_seconds": 5, "capacity": 10}
    assert store.queue_created_ms(QueueName("jobs")) == 1234
    assert not [n for n in os.listdir(store.layout.queues) if n.startswith(".")], "no staging directory left"
    # Idempotent with the same (or no) attributes; other values are a conflict (SQS: QueueNameExists).
    assert store.create_queue(QueueName("jobs"), {"capacity": 10}) is False
    assert store.create_queue(QueueName("jobs")) is False
    with pytest.raises(QueueNameExists):
        store.create_queue(QueueName("jobs"), {"capacity": 11})


def test_a_dead_letter_queue_must_exist_and_differ(store: Store) -> None:
    with pytest.raises(InvalidAttribute):
        store.create_queue(QueueName("jobs"), {"dead_letter_queue": "missing"})
    assert not store.queue_exists(QueueName("jobs"))
    with pytest.raises(InvalidAttribute):
        store.set_attributes(Q, {"dead_letter_queue": Q})


def test_set_attributes_merges_and_none_restores_the_default(store: Store) -> None:
    assert store.set_attributes(Q, {"delay_seconds": 3, "capacity": 7}) == {"delay_seconds": 3, "capacity": 7}
    assert store.set_attributes(Q, {"capacity": None}) == {"delay_seconds": 3}
    assert Store(store.layout.root).get_attributes(Q) == {"delay_seconds": 3}  # persisted


def test_a_protocol_v1_queue_has_default_attributes(store: Store) -> None:
    os.mkdir(store.layout.queue_dir(QueueName("old")))
    assert store.get_attributes(QueueName("old")) == {}
    assert store.queue_created_ms(QueueName("old")) is None
    assert store.list_queues() == ["old", "orders", "orders-dead"]
    assert store.list_queues(prefix="orders-") == ["orders-dead"]


# -- delay and batches --------------------------------------------------------------


def test_a_delayed_send_waits_in_delay_with_receive_count_zero(store: Store) -> None:
    before = now_ms()
    mid = store.send(Q, b"later", delay_ms=5_000)
    [name] = messages(store, "delay")
    item = parse_in_flight_name(name)
    assert item is not None and item.message_id == mid and item.receive_count == 0
    assert before + 5_000 <= item.deadline_ms <= now_ms() + 5_000
    assert messages(store, f"queues/{Q}") == []
    assert store.count_delay() == {Q: (0, 1)}
    assert store.redeliver(item) == "redelivered"  # mq-mover, once due
    assert messages(store, f"queues/{Q}") == [ready_name(mid, 0)]


def test_send_batch_returns_one_result_per_entry_in_order(store: Store) -> None:
    results = store.send_batch(
        Q, [SendEntry(b"a"), SendEntry(b"b", "text/plain", {"k": "v"}), SendEntry(b"c", delay_ms=60_000)]
    )
    assert all(isinstance(r, str) for r in results)
    assert results == sorted(results)
    a, b, _delayed = results
    assert messages(store, f"queues/{Q}") == [ready_name(a, 0), ready_name(b, 0)]
    assert store.count_delay(Q) == {Q: (0, 1)}
    first, second = receive(store), receive(store)
    assert (first.body, second.body, second.content_type, second.attributes) == (b"a", b"b", "text/plain", {"k": "v"})
    assert messages(store, "new") == []


# -- receive: system attributes ----------------------------------------------------------


def test_first_receive_time_is_kept_across_receives(store: Store) -> None:
    t1 = now_ms() + 1_000
    mid = store.send(Q, b"x", attributes={"origin": "test"})
    first = receive(store, now=t1)
    assert (first.first_receive_ms, first.receive_count, first.attributes) == (t1, 1, {"origin": "test"})
    assert first.source_queue == Q and first.sent_ms == sent_ms_of(mid)
    [item] = store.scan_in_flight()
    store.redeliver(item)
    second = receive(store, now=t1 + 50_000)
    assert (second.first_receive_ms, second.receive_count) == (t1, 2)


# -- receipt handles ------------------------------------------------------------------


def test_a_stale_handle_never_touches_the_newer_lease(store: Store) -> None:
    store.send(Q, b"x")
    old = receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    store.redeliver(item)  # its timeout expired
    new = receive(store)
    assert new.receive_count == 2
    with pytest.raises(StaleReceiptHandle):
        store.delete_by_handle(Q, _h(old.receipt_handle))
    with pytest.raises(StaleReceiptHandle):
        store.change_visibility(Q, _h(old.receipt_handle), 0)
    assert messages(store, "delay") == [new.receipt_handle]
    assert store.delete_by_handle(Q, _h(new.receipt_handle)) == "in_flight"
    assert messages(store, "delay") == []


def test_change_visibility_extends_and_the_old_handle_keeps_working(store: Store) -> None:
    store.send(Q, b"x")
    got = receive(store, now=1_000_000)
    current = store.at(2_000_000).change_visibility(Q, _h(got.receipt_handle), 90_000)
    assert current != got.receipt_handle
    assert parse_in_flight_name(current).deadline_ms == 2_090_000
    assert messages(store, "delay") == [current]
    assert store.find_lease(Q, _h(got.receipt_handle)) == current  # found by queue, id and receive count
    again = store.at(2_000_000).change_visibility(Q, _h(got.receipt_handle), 10_000)
    assert parse_in_flight_name(again).deadline_ms == 2_010_000
    assert store.delete_by_handle(Q, _h(got.receipt_handle)) == "in_flight"


def test_change_visibility_zero_releases_at_once(store: Store) -> None:
    mid = store.send(Q, b"x")
    got = receive(store)
    store.change_visibility(Q, _h(got.receipt_handle), 0)
    assert messages(store, f"queues/{Q}") == [ready_name(mid, 1)]
    with pytest.raises(MessageNotInFlight):
        store.change_visibility(Q, _h(got.receipt_handle), 5_000)
    # Not received since: the handle is still the latest, so it may delete the message.
    assert store.delete_by_handle(Q, _h(got.receipt_handle)) == "ready"
    with pytest.raises(MessageNotFound):
        store.delete_by_handle(Q, _h(got.receipt_handle))


def test_handles_of_other_queues_or_malformed_are_rejected(store: Store) -> None:
    store.send(Q, b"x")
    got = receive(store)
    for bad in ("", "garbage", got.receipt_handle.replace(".1", ".0"), "../" + got.receipt_handle):
        with pytest.raises(InvalidReceiptHandle):
            store.delete_by_handle(Q, _h(bad))
    with pytest.raises(InvalidReceiptHandle):
        store.delete_by_handle(DLQ, _h(got.receipt_handle))
    assert messages(store, "delay") == [got.receipt_handle]


def test_relet_gives_the_same_message_with_a_fresh_handle(store: Store) -> None:
    store.send(Q, b"x")
    got = receive(store)
    again = store.relet(Q, _h(got.receipt_handle), VT_MS)
    assert (again.message_id, again.body, again.receive_count) == (got.message_id, b"x", 2)
    assert again.receipt_handle != got.receipt_handle
    with pytest.raises(StaleReceiptHandle):
        store.delete_by_handle(Q, _h(got.receipt_handle))
    store.delete_by_handle(Q, _h(again.receipt_handle))
    assert store.relet(Q, _h(again.receipt_handle), VT_MS) is None


def test_attempt_records_last_five_minutes(store: Store) -> None:
    store.at(10_000).save_attempt(Q, "try-1", ["h1", "h2"])
    assert store.at(10_000 + ATTEMPT_WINDOW_MS - 1).load_attempt(Q, "try-1") == ["h1", "h2"]
    assert store.at(10_000 + ATTEMPT_WINDOW_MS).load_attempt(Q, "try-1") is None
    assert store.at(10_000).load_attempt(Q, "try-2") is None
    assert store.at(10_000).load_attempt(DLQ, "try-1") is None
    store.at(20_000).save_attempt(Q, "try-1", ["h3"], created_ms=10_000)  # a retry keeps the window
    assert store.attempt_created_ms(Q, "try-1") == 10_000
    assert store.at(now_ms() + ATTEMPT_WINDOW_MS + 1).sweep_attempts() == 1
    assert os.listdir(store.layout.attempts) == []


# -- purge ----------------------------------------------------------------------------------


def test_purge_removes_ready_in_flight_and_delayed_messages(store: Store) -> None:
    for body in (b"a", b"b", b"c"):
        store.send(Q, body)
    store.send(Q, b"d", delay_ms=60_000)
    receive(store)
    late = store.write_new(Q, b"sent before the purge, published after")
    assert store.purge(Q) == 4
    store.publish(late)
    kept = store.send(Q, b"after")
    assert store.purged_before(Q) is not None
    got = receive(store, policy=store.policy(Q))
    assert got is None, "a message sent before the purge is never delivered"
    got = receive(store, policy=store.policy(Q))
    assert got.message_id == kept and got.body == b"after"
    assert store.count_delay(Q) == {Q: (1, 0)}


# -- dead-letter queues and redrive -------------------------------------------------------


def test_a_message_received_max_times_moves_to_the_dead_letter_queue(store: Store) -> None:
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 2})
    mid = store.send(Q, b"poison", "application/json", {"k": "v"})
    policy = store.policy(Q)
    for _ in range(2):
        assert receive(store, vt_ms=0, policy=policy) is not None
        [item] = store.scan_in_flight()
        store.redeliver(item)
    assert receive(store, policy=policy) is None
    assert messages(store, f"queues/{DLQ}") == [ready_name(mid, 2)]
    dead = receive(store, DLQ)
    assert (dead.body, dead.content_type, dead.attributes, dead.receive_count) == (
        b"poison",
        "application/json",
        {"k": "v"},
        3,
    )
    assert dead.source_queue == Q


def test_dead_letter_at_redelivery_keeps_id_and_receive_count(store: Store) -> None:
    mid = store.send(Q, b"x")
    receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    assert store.dead_letter(item, DLQ)
    assert messages(store, f"queues/{DLQ}") == [ready_name(mid, 1)]
    assert not store.dead_letter(item, DLQ)  # gone


def test_redrive_sends_back_to_the_source_with_a_fresh_id_and_receive_count(store: Store) -> None:
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 1})
    mid = store.send(Q, b"x", attributes={"k": "v"})
    receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    store.dead_letter(item, DLQ)
    dest, name = store.redrive_one(DLQ, ready_name(mid, 1))
    assert dest == Q and messages(store, f"queues/{Q}") == [name]
    new_id, count = name.split(".")
    assert new_id > mid and count == "0"
    back = receive(store)
    assert (back.body, back.attributes, back.receive_count) == (b"x", {"k": "v"}, 1)
    assert store.redrive_one(DLQ, ready_name(mid, 1)) is None  # already moved
    other = store.send(DLQ, b"sent straight to the DLQ")
    assert store.redrive_one(DLQ, ready_name(other, 0)) is None  # no source queue to go back to
    assert store.redrive_one(DLQ, ready_name(other, 0), destination=Q)[0] == Q


# -- retention and sweeps ---------------------------------------------------------------------


def test_retention_expiry_of_ready_and_in_flight_messages(store: Store) -> None:
    store.set_attributes(Q, {"retention_seconds": 60})
    first = store.send(Q, b"a")
    store.send(Q, b"b")
    receive(store)
    later = now_ms() + 60_001
    assert receive(store, now=later, policy=store.policy(Q)) is None
    assert store.at(later).expire_queue(Q) == 0  # the receive above already removed it
    assert store.at(later).expire_in_flight() == 1
    assert messages(store, "delay") == [] and messages(store, f"queues/{Q}") == []
    assert f"{Q}.{first}" in messages(store, "remove")
    kept = store.send(Q, b"c")
    assert store.at(sent_ms_of(kept) + 59_000).expire_queue(Q) == 0
    assert store.at(sent_ms_of(kept) + 60_000).expire_queue(Q) == 1


def test_sweep_staging_removes_directories_of_creators_that_died(store: Store) -> None:
    staging = os.path.join(store.layout.queues, ".jobs.0123.creating")
    os.mkdir(staging)
    assert store.sweep_staging(300_000) == 0
    assert store.at(now_ms() + 300_001).sweep_staging(300_000) == 1
    assert not os.path.exists(staging)
    assert store.list_queues() == ["orders", "orders-dead"]


def test_lease_policy_rules() -> None:
    policy = LeasePolicy(max_receive_count=3, dead_letter_queue=DLQ, retention_ms=1000, purged_before=None)
    assert policy.dead_letter_for(2) is None and policy.dead_letter_for(3) == DLQ
    assert LeasePolicy().dead_letter_for(100) is None


def test_messages_moved_into_a_queue_purged_after_their_send_are_kept(store: Store) -> None:
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 1})
    mid = store.send(Q, b"poison")
    store.purge(DLQ)  # the dead-letter queue was purged after the message was sent
    receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    assert store.dead_letter(item, DLQ)
    dead = receive(store, DLQ, vt_ms=0, policy=store.policy(DLQ))
    assert dead is not None and dead.body == b"poison"
    assert dead.message_id > mid  # a fresh id, after the purge point
    [item] = store.scan_in_flight()
    store.redeliver(item)
    store.purge(Q)  # and the source queue was purged before the redrive
    [name] = messages(store, f"queues/{DLQ}")
    assert store.redrive_one(DLQ, name)[0] == Q
    back = receive(store, policy=store.policy(Q))
    assert back is not None and back.body == b"poison"


def test_max_receive_count_needs_a_dead_letter_queue(store: Store) -> None:
    with pytest.raises(InvalidAttribute) as info:
        store.create_queue(QueueName("jobs"), {"max_receive_count": 3})
    assert info.value.details["name"] == "max_receive_count"
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 3})
    with pytest.raises(InvalidAttribute):
        store.set_attributes(Q, {"dead_letter_queue": None})
    assert store.set_attributes(Q, {"dead_letter_queue": None, "max_receive_count": None}) == {}


def test_create_compares_given_attributes_with_effective_values(store: Store) -> None:
    assert store.create_queue(Q, {"delay_seconds": 0}) is False  # the default: no conflict
    daemon = QueueAttributes(visibility_timeout_seconds=45)
    assert store.create_queue(Q, {"visibility_timeout_seconds": 45}, defaults=daemon) is False
    with pytest.raises(QueueNameExists):
        store.create_queue(Q, {"visibility_timeout_seconds": 30}, defaults=daemon)


def test_a_redrive_cancel_request_is_a_file_of_its_own(store: Store) -> None:
    assert store.redrive_cancel_request(DLQ) is None
    store.write_redrive_status(DLQ, {"task_id": "t1", "state": "running"})
    store.at(5).request_redrive_cancel(DLQ, "t1")
    store.write_redrive_status(DLQ, {"task_id": "t1", "state": "running", "moved": 3})  # the task's next write
    assert store.redrive_cancel_request(DLQ) == {"task_id": "t1", "requested_ms": 5}
    assert store.read_redrive_status(DLQ) == {"task_id": "t1", "state": "running", "moved": 3}


def test_a_batch_written_by_parallel_threads_keeps_its_order(store: Store) -> None:
    ids = [store.ids.next_id() for _ in range(20)]
    with ThreadPoolExecutor(8) as pool:
        pending = list(pool.map(lambda i: store.write_new(Q, b"%d" % i, message_id=ids[i]), reversed(range(20))))
    assert store.publish_many([(p, 0) for p in pending]) == [None] * 20
    assert [receive(store).body for _ in range(20)] == [b"%d" % i for i in range(20)]


def test_a_handle_from_before_a_dead_letter_and_redrive_never_touches_the_new_lease(store: Store) -> None:
    """No ABA: the redriven message has a new id, so the old handle's name never comes back."""
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 1})
    store.send(Q, b"x")
    old = receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    store.dead_letter(item, DLQ)
    [name] = messages(store, f"queues/{DLQ}")
    store.redrive_one(DLQ, name)
    new = receive(store)
    assert new.receive_count == old.receive_count == 1
    with pytest.raises(MessageNotFound):
        store.delete_by_handle(Q, _h(old.receipt_handle))
    with pytest.raises(MessageNotFound):
        store.change_visibility(Q, _h(old.receipt_handle), 0)
    assert store.relet(Q, _h(old.receipt_handle), VT_MS) is None
    assert messages(store, "delay") == [new.receipt_handle]


def test_an_identical_create_is_idempotent_even_above_the_daemon_limit(store: Store) -> None:
    daemon = QueueAttributes(max_message_bytes=1000)
    assert store.create_queue(QueueName("jobs"), {"max_message_bytes": 5000}, defaults=daemon)
    assert store.create_queue(QueueName("jobs"), {"max_message_bytes": 5000}, defaults=daemon) is False


def test_relet_takes_the_ready_file_when_the_lease_expired(store: Store) -> None:
    store.send(Q, b"x")
    got = receive(store, vt_ms=0)
    [item] = store.scan_in_flight()
    store.redeliver(item)  # mq-mover got there first
    again = store.relet(Q, _h(got.receipt_handle), VT_MS)
    assert again is not None and again.receive_count == 2


def test_attempt_record_is_read_in_one_go(store: Store) -> None:
    store.at(1_000).save_attempt(Q, "a", ["h"])
    assert store.at(2_000).load_attempt_record(Q, "a") == (["h"], 1_000)


def test_find_leases_finds_moved_leases_with_one_listing(store: Store) -> None:
    for body in (b"a", b"b", b"c"):
        store.send(Q, body)
    got = [receive(store) for _ in range(3)]
    moved = store.change_visibility(Q, _h(got[0].receipt_handle), 60_000)  # no longer at the handle's name
    store.delete_by_handle(Q, _h(got[2].receipt_handle))
    found = store.find_leases(Q, [_h(m.receipt_handle) for m in got])
    assert found == {got[0].receipt_handle: moved, got[1].receipt_handle: got[1].receipt_handle}
    again = store.relet(Q, _h(got[0].receipt_handle), VT_MS, hint=found[got[0].receipt_handle], search=False)
    assert again is not None and again.body == b"a"


# -- partitions, peek and move_due (issue 4) -------------------------------------


def test_partition_of_is_the_id_tail_modulo_and_spreads_evenly() -> None:
    from mqcore.names import IdGenerator, partition_of

    ids = [IdGenerator().next_id() for _ in range(3000)]
    assert all(partition_of(i, 3) == int(i[-8:], 16) % 3 for i in ids)
    counts = [sum(partition_of(i, 3) == p for i in ids) for p in range(3)]
    assert min(counts) > 800  # random bits: about 1,000 each
    with pytest.raises(ValueError, match="partitions"):
        partition_of(ids[0], 0)


def test_peek_reads_every_state_in_id_order_and_changes_nothing(store: Store) -> None:
    now = now_ms()
    ids = [store.send(Q, f"m{i}".encode(), attributes={"n": str(i)}) for i in range(5)]
    delayed = store.send(Q, b"later", delay_ms=60_000)
    leased = receive(store, now=now)
    assert leased is not None and leased.message_id == ids[0]
    before = messages(store, f"queues/{Q}"), messages(store, "delay")

    page, next_after = store.peek(Q, limit=3)
    assert [m.message_id for m in page] == ids[:3]
    assert next_after == ids[2]
    assert (page[0].state, page[0].receive_count, page[0].visibility_deadline_ms) == ("in_flight", 1, now + VT_MS)
    assert (page[1].state, page[1].body, page[1].attributes, page[1].visibility_deadline_ms) == (
        "ready",
        b"m1",
        {"n": "1"},
        None,
    )
    assert page[1].source_queue == Q
    rest, end = store.peek(Q, after=next_after, limit=3)
    assert [m.message_id for m in rest] == [*ids[3:], delayed]
    assert end is None
    assert (rest[-1].state, rest[-1].receive_count) == ("delayed", 0)
    assert (messages(store, f"queues/{Q}"), messages(store, "delay")) == before


def test_peek_leaves_out_purged_messages_and_checks_its_arguments(store: Store) -> None:
    from mqcore.errors import QueueNotFound

    store.send(Q, b"old")
    store.purge(Q)
    kept = store.send(Q, b"new")
    page, _ = store.peek(Q)
    assert [m.message_id for m in page] == [kept]
    with pytest.raises(QueueNotFound):
        store.peek(QueueName("nope"))
    with pytest.raises(ValueError, match="limit"):
        store.peek(Q, limit=0)


def test_move_due_redelivers_dead_letters_and_keeps_without_a_dead_letter_queue(store: Store) -> None:
    store.set_attributes(Q, {"dead_letter_queue": DLQ, "max_receive_count": 2})
    first = store.send(Q, b"a")
    now = now_ms()
    m = receive(store, vt_ms=0, now=now)
    assert m is not None
    item = parse_in_flight_name(m.in_flight_name)
    assert store.at(now).move_due(item, store.policy(Q)) == "redelivered"
    assert messages(store, f"queues/{Q}") == [ready_name(first, 1)]
    m = receive(store, vt_ms=0, now=now)
    item = parse_in_flight_name(m.in_flight_name)
    assert store.at(now).move_due(item, store.policy(Q)) == "dead_lettered"
    assert messages(store, f"queues/{DLQ}") == [ready_name(first, 2)]
    assert store.at(now).move_due(item, store.policy(Q)) == "gone"

    second = store.send(Q, b"b")
    for _ in range(2):
        m = receive(store, vt_ms=0, now=now)
        item = parse_in_flight_name(m.in_flight_name)
        policy = store.policy(Q)
        if m.receive_count == 2:
            store.delete_queue(DLQ)
            policy = store.policy(Q)  # still names the deleted dead-letter queue
            assert store.at(now).move_due(item, policy) == "kept"
        else:
            assert store.at(now).move_due(item, policy) == "redelivered"
    assert messages(store, f"queues/{Q}") == [ready_name(second, 2)]
