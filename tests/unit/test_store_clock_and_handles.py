"""The Store's clock is given once, at construction, and its handle methods take a parsed ReceiptHandle.

Real roots under ``tmp_path``; the clock is a plain function the test moves
(time passed in, not mocked).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mqcore.errors import InvalidReceiptHandle, StaleReceiptHandle
from mqcore.names import QueueName, ReceiptHandle, parse_in_flight_name, ready_name
from mqcore.protocol import Store

Q = QueueName("jobs")
OTHER = QueueName("other")
T0 = 1_790_000_000_000


def _h(text: str) -> ReceiptHandle:
    """A receipt handle parsed from its text, as the edges do (the Store takes parsed handles only)."""
    return ReceiptHandle.parse(text)


class Clock:
    """A clock the test sets: epoch ms."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Store:
    s = Store(tmp_path / "root", fsync=False, clock=clock)
    s.create_queue(Q)
    s.create_queue(OTHER)
    return s


def test_every_transition_reads_the_clock_given_at_construction(store: Store, clock: Clock) -> None:
    meta = json.loads(Path(store.layout.attributes_path(Q)).read_text())
    assert meta["created_ms"] == T0
    mid = store.send(Q, b"x")
    got = store.lease(Q, ready_name(mid, 0), 30_000)
    assert got is not None and got.deadline_ms == T0 + 30_000 and got.first_receive_ms == T0
    clock.ms = T0 + 1_000
    moved = store.change_visibility(Q, _h(got.receipt_handle), 5_000)
    assert parse_in_flight_name(moved).deadline_ms == T0 + 6_000
    store.save_attempt(Q, "a", [moved])
    assert store.load_attempt_record(Q, "a") == ([moved], T0 + 1_000)
    clock.ms = T0 + 1_000 + 300_000  # SQS: an attempt id is remembered for 5 minutes
    assert store.load_attempt(Q, "a") is None


def test_at_stops_the_clock_for_its_copy_only(store: Store, clock: Clock) -> None:
    stopped = store.at(T0 + 42)
    clock.ms = T0 + 99
    assert (stopped.clock(), store.clock()) == (T0 + 42, T0 + 99)
    assert stopped.layout is store.layout and stopped.ids is store.ids and stopped.disk is store.disk


def test_handle_methods_take_a_parsed_receipt_handle(store: Store) -> None:
    first, second = store.send(Q, b"1"), store.send(Q, b"2")
    got = store.lease(Q, ready_name(first, 0), 30_000)
    assert got is not None
    handle = ReceiptHandle.parse(got.receipt_handle, Q)
    assert store.find_lease(Q, handle) == got.receipt_handle
    moved = store.change_visibility(Q, handle, 60_000)
    assert store.find_leases(Q, [handle]) == {handle.text: moved}
    again = store.relet(Q, handle, 30_000)
    assert again is not None and again.receive_count == 2
    with pytest.raises(StaleReceiptHandle):
        store.delete_by_handle(Q, handle)
    assert store.delete_by_handle(Q, ReceiptHandle.parse(again.receipt_handle, Q)) == "in_flight"
    other = store.lease(Q, ready_name(second, 0), 30_000)
    assert other is not None
    assert store.delete_by_handle(Q, _h(other.receipt_handle)) == "in_flight"  # parsed without a queue: checked here
    assert os.listdir(store.layout.delay) == []


def test_a_parsed_handle_of_another_queue_is_refused(store: Store) -> None:
    mid = store.send(Q, b"x")
    got = store.lease(Q, ready_name(mid, 0), 30_000)
    assert got is not None
    handle = ReceiptHandle.parse(got.receipt_handle, Q)
    for act in (
        lambda: store.change_visibility(OTHER, handle, 0),
        lambda: store.delete_by_handle(OTHER, handle),
        lambda: store.relet(OTHER, handle, 1_000),
        lambda: store.find_lease(OTHER, handle),
    ):
        with pytest.raises(InvalidReceiptHandle, match="belongs to queue 'jobs', not 'other'"):
            act()
    assert store.find_leases(OTHER, [handle]) == {}
    assert os.listdir(store.layout.delay) == [got.receipt_handle]  # nothing moved
