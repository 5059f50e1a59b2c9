"""Every lease has a name of its own (protocol v2, issue 18), and handles act on exactly their lease.

Two hosts on one GlusterFS root once handed one message to two consumers:
both leased the same ready file in the same millisecond, computed the same
``delay/DL.Q.ID.RC`` target, and GlusterFS accepted the loser's rename as a
rename onto the file that already had that name. Since protocol v2 the
target carries a lease token unique to its receive (``DL.Q.ID.RC.LT``), so
no two receives aim at one name and a stale handle never names a newer lease.

The tests here need no shared filesystem: real processes (``fork``, as
brokerless clients and multiprocessing workers are made) leasing real files
with the clock frozen to one millisecond, and real files in the v1 form for
the upgrade.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqcore.errors import StaleReceiptHandle
from mqcore.names import (
    InFlightName,
    MessageId,
    QueueName,
    ReceiptHandle,
    in_flight_name,
    lease_key_of,
    new_lease_token,
    parse_in_flight_name,
    parse_receipt_handle,
    ready_name,
)
from mqcore.protocol import Store

Q = QueueName("jobs")
FROZEN_MS = 1_790_000_000_000  # every receive in these tests happens in this one millisecond
VT_MS = 30_000
TOKEN_RE = re.compile(r"[0-9a-f]{17,32}")
ROUNDS = 300  # races between the two processes


def _h(text: str) -> ReceiptHandle:
    """A receipt handle parsed from its text, as the edges do (the Store takes parsed handles only)."""
    return ReceiptHandle.parse(text)


def delay(store: Store) -> list[str]:
    return sorted(os.listdir(store.layout.delay))


def undo_lease(store: Store, handle: str) -> None:
    """What a power cut does to a lease (never fsynced): the file is back under its ready name."""
    item = parse_in_flight_name(handle)
    assert item is not None
    os.rename(store.layout.delay_path(handle), store.layout.ready_path(Q, item.message_id, item.receive_count - 1))


# -- the token --------------------------------------------------------------------------


def test_lease_tokens_are_unique_short_hex_and_parse_back() -> None:
    tokens = [new_lease_token() for _ in range(10_000)]
    assert len(set(tokens)) == len(tokens)
    assert all(TOKEN_RE.fullmatch(t) for t in tokens)
    assert len({t[:16] for t in tokens}) == 1, "one random prefix per process, then a counter"
    assert all(t[16] != "0" or len(t) == 17 for t in tokens), "the counter has no leading zeros"
    mid = MessageId("01a2057d-70fe-7000-85ca-97d74bc01b55")
    name = in_flight_name(FROZEN_MS, Q, mid, 3, tokens[0])
    assert name == f"{FROZEN_MS}.jobs.{mid}.3.{tokens[0]}"
    assert parse_in_flight_name(name) == InFlightName(FROZEN_MS, Q, mid, 3, tokens[0])
    assert lease_key_of(name) == f"jobs.{mid}.3.{tokens[0]}"
    assert parse_receipt_handle(name).token == tokens[0]
    for bad in ("", "0" * 16, "A" * 20, "g" * 20, "1" * 33):
        assert parse_in_flight_name(f"{FROZEN_MS}.jobs.{mid}.3.{bad}") is None, bad


@settings(max_examples=50)
@given(
    st.integers(min_value=0, max_value=10**13 - 1),
    st.text(alphabet="abcXYZ019_-", min_size=1, max_size=80),
    st.integers(min_value=0, max_value=999_999_999),
    st.text(alphabet="0123456789abcdef", min_size=17, max_size=32),
)
def test_v2_names_round_trip_and_keep_their_key(dl: int, queue: str, rc: int, token: str) -> None:
    mid = MessageId("01a2057d-70fe-7000-85ca-97d74bc01b55")
    name = in_flight_name(dl, QueueName(queue), mid, rc, token)
    item = parse_in_flight_name(name)
    assert item == InFlightName(dl, QueueName(queue), mid, rc, token) and item.filename == name
    assert item.lease_key == f"{queue}.{mid}.{rc}.{token}" == name[14:]
    legacy = parse_in_flight_name(in_flight_name(dl, QueueName(queue), mid, rc))
    assert legacy.is_legacy and legacy.lease_key != item.lease_key


def _child_tokens(conn) -> None:  # runs in a forked child
    conn.send([new_lease_token() for _ in range(3)])
    conn.close()


def test_a_forked_child_never_repeats_its_parents_tokens() -> None:
    """Brokerless clients and multiprocessing workers are forked: each draws its own random prefix."""
    context = multiprocessing.get_context("fork")
    mine = new_lease_token()
    seen = {mine[:16]}
    for _ in range(3):
        parent, child = context.Pipe()
        proc = context.Process(target=_child_tokens, args=(child,))
        proc.start()
        theirs = parent.recv()
        proc.join(10)
        assert proc.exitcode == 0
        assert len({t[:16] for t in theirs}) == 1
        assert theirs[0][:16] not in seen, "a child reused a prefix"
        seen.add(theirs[0][:16])
    assert new_lease_token()[:16] == mine[:16], "the parent keeps its own"


# -- two processes, one millisecond ------------------------------------------------------


def _consumer(root: str, conn, barrier) -> None:  # runs in a forked child: a Store of its own
    store = Store(root, fsync=False)
    while (command := conn.recv()) is not None:
        op, filename = command
        if op == "race":
            barrier.wait(10)
        got = store.at(FROZEN_MS).lease(Q, filename, VT_MS)
        conn.send(got.receipt_handle if got is not None else None)
    conn.close()


@pytest.fixture
def two_consumers(tmp_path: Path):
    """Two processes, each with its own Store on one root, leasing what they are told at FROZEN_MS."""
    context = multiprocessing.get_context("fork")
    root = str(tmp_path / "root")
    store = Store(root, fsync=False)
    store.create_queue(Q)
    barrier = context.Barrier(2)
    pipes, procs = [], []
    for _ in range(2):
        parent, child = context.Pipe()
        proc = context.Process(target=_consumer, args=(root, child, barrier), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    yield store, pipes
    for pipe in pipes:
        pipe.send(None)
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0


def test_two_processes_leasing_one_message_in_one_millisecond_one_wins(two_consumers) -> None:
    store, pipes = two_consumers
    ids = [store.send(Q, f"m{i}".encode()) for i in range(ROUNDS)]
    winners = []
    for mid in ids:
        for pipe in pipes:
            pipe.send(("race", ready_name(mid, 0)))
        results = [pipe.recv() for pipe in pipes]
        won = [h for h in results if h is not None]
        assert len(won) == 1, f"{mid}: {results}"
        item = parse_in_flight_name(won[0])
        assert (item.deadline_ms, item.message_id, item.receive_count) == (FROZEN_MS + VT_MS, mid, 1)
        winners.append(won[0])
    assert delay(store) == sorted(winners), "one lease file per message, named by its winner"
    assert store.scan_ready(Q) == []


def test_a_lease_made_again_in_the_same_millisecond_by_another_process_has_another_name(two_consumers) -> None:
    """The v1 failure without a shared filesystem: the second lease got the first one's name.

    After a power cut undoes a lease (leases are not fsynced), the message is
    received again with the same receive count; here by another process, in
    the same millisecond, so with the same deadline. Under v1 both receives
    had the same handle and the first consumer's delete removed the second
    consumer's lease. Now the first handle is stale and touches nothing.
    """
    store, (first, second) = two_consumers
    for i in range(20):
        mid = store.send(Q, f"m{i}".encode())
        first.send(("lease", ready_name(mid, 0)))
        old = first.recv()
        undo_lease(store, old)
        second.send(("lease", ready_name(mid, 0)))
        new = second.recv()
        assert new is not None and new != old
        assert parse_in_flight_name(new).deadline_ms == parse_in_flight_name(old).deadline_ms
        with pytest.raises(StaleReceiptHandle):
            store.delete_by_handle(Q, _h(old))
        with pytest.raises(StaleReceiptHandle):
            store.at(FROZEN_MS).change_visibility(Q, _h(old), 60_000)
        with pytest.raises(StaleReceiptHandle):
            store.at(FROZEN_MS).change_visibility(Q, _h(old), 0)
        assert store.at(FROZEN_MS).relet(Q, _h(old), VT_MS) is None
        assert store.find_lease(Q, _h(old)) is None
        assert new in delay(store), "the newer lease is untouched"
        assert store.delete_by_handle(Q, _h(new)) == "in_flight"
    assert delay(store) == []


# -- one process: a handle names one lease, whatever the deadlines ------------------------------


def test_a_handle_never_acts_on_a_later_lease_with_the_same_deadline(tmp_path: Path) -> None:
    store = Store(tmp_path / "root", fsync=False)
    store.create_queue(Q)
    mid = store.send(Q, b"x")
    old = store.at(FROZEN_MS).lease(Q, ready_name(mid, 0), VT_MS).receipt_handle
    undo_lease(store, old)
    new = store.at(FROZEN_MS).lease(Q, ready_name(mid, 0), VT_MS).receipt_handle
    assert new != old
    # The old handle, even passing the new lease's name as its hint (a confused cache), is stale.
    with pytest.raises(StaleReceiptHandle):
        store.delete_by_handle(Q, _h(old), hint=new)
    with pytest.raises(StaleReceiptHandle):
        store.at(FROZEN_MS).change_visibility(Q, _h(old), 5_000, hint=new)
    assert store.find_leases(Q, [_h(old)], {old: new}) == {}
    assert delay(store) == [new]
    # The new handle keeps naming its lease through changes of visibility (same key, new deadline).
    moved = store.at(FROZEN_MS).change_visibility(Q, _h(new), 5_000)
    assert lease_key_of(moved) == lease_key_of(new) and moved != new
    assert store.find_lease(Q, _h(new)) == moved
    assert store.delete_by_handle(Q, _h(new)) == "in_flight"
    assert delay(store) == []


def test_change_of_visibility_keeps_the_token_and_delayed_sends_get_one(tmp_path: Path) -> None:
    store = Store(tmp_path / "root", fsync=False)
    store.create_queue(Q)
    delayed = store.send(Q, b"later", delay_ms=60_000)
    [name] = delay(store)
    item = parse_in_flight_name(name)
    assert (item.message_id, item.receive_count) == (delayed, 0) and TOKEN_RE.fullmatch(item.token)
    mid = store.send(Q, b"now")
    handle = store.at(FROZEN_MS).lease(Q, ready_name(mid, 0), VT_MS).receipt_handle
    again = store.at(FROZEN_MS + 5).change_visibility(Q, _h(handle), 1_000)
    assert parse_in_flight_name(again) == InFlightName(FROZEN_MS + 1_005, Q, mid, 1, parse_in_flight_name(handle).token)


# -- upgrade: files of protocol v1 still on disk ------------------------------------------------


def v1_lease(store: Store, mid: MessageId, deadline_ms: int, count: int = 0) -> str:
    """Lease ``queues/Q/ID.count`` as protocol v1 did: ``delay/DL.Q.ID.count+1``, no token; return the handle."""
    handle = f"{deadline_ms:013d}.{Q}.{mid}.{count + 1}"
    os.rename(store.layout.ready_path(Q, mid, count), store.layout.delay_path(handle))
    return handle


def v1_delayed_send(store: Store, body: bytes, deadline_ms: int) -> tuple[MessageId, str]:
    """A delayed send as protocol v1 made it: ``new/Q.ID`` renamed to ``delay/DL.Q.ID.0``."""
    pending = store.write_new(Q, body)
    name = f"{deadline_ms:013d}.{Q}.{pending.message_id}.0"
    os.rename(pending.path, store.layout.delay_path(name))
    return pending.message_id, name


def test_v1_files_are_counted_peeked_and_moved_when_due(tmp_path: Path) -> None:
    store = Store(tmp_path / "root", fsync=False)
    store.create_queue(Q)
    leased, waiting = store.send(Q, b"leased"), store.send(Q, b"waiting")
    due = v1_lease(store, leased, FROZEN_MS)
    v1_lease(store, waiting, FROZEN_MS + VT_MS)
    delayed, _ = v1_delayed_send(store, b"delayed", FROZEN_MS)
    assert store.count_delay(Q) == {Q: (2, 1)}
    assert sorted((i.message_id, i.receive_count, i.token) for i in store.scan_in_flight()) == sorted(
        [(leased, 1, ""), (waiting, 1, ""), (delayed, 0, "")]
    )
    page, _ = store.at(FROZEN_MS).peek(Q)
    assert {(p.message_id, p.state, p.receive_count) for p in page} == {
        (leased, "in_flight", 1),
        (waiting, "in_flight", 1),
        (delayed, "delayed", 0),
    }
    policy = store.policy(Q)
    for item in store.scan_in_flight():
        if item.deadline_ms <= FROZEN_MS:
            assert store.at(FROZEN_MS).move_due(item, policy) == "redelivered"
    assert sorted(store.scan_ready(Q)) == sorted([ready_name(leased, 1), ready_name(delayed, 0)])
    got = store.at(FROZEN_MS).lease(Q, ready_name(leased, 1), VT_MS)
    assert got.receive_count == 2 and TOKEN_RE.fullmatch(parse_in_flight_name(got.receipt_handle).token)
    with pytest.raises(StaleReceiptHandle):  # the v1 handle of the redelivered lease
        store.delete_by_handle(Q, _h(due))
    assert got.receipt_handle in delay(store)


def test_v1_handles_delete_change_and_relet_exactly_their_lease(tmp_path: Path) -> None:
    store = Store(tmp_path / "root", fsync=False)
    store.create_queue(Q)
    a, b, c, d = (store.send(Q, f"{i}".encode()) for i in range(4))
    handle_a = v1_lease(store, a, FROZEN_MS + VT_MS)
    assert store.delete_by_handle(Q, _h(handle_a)) == "in_flight"
    # A change of visibility of a v1 lease keeps its v1 key; the old handle goes on working.
    handle_b = v1_lease(store, b, FROZEN_MS + VT_MS)
    moved = store.at(FROZEN_MS).change_visibility(Q, _h(handle_b), 1_000)
    assert moved == f"{FROZEN_MS + 1_000:013d}.{Q}.{b}.1" and delay(store) == [moved]
    assert store.find_lease(Q, _h(handle_b)) == moved
    assert store.delete_by_handle(Q, _h(handle_b)) == "in_flight"
    # A retried receive attempt recorded by v1 re-lets its message under a v2 name.
    handle_c = v1_lease(store, c, FROZEN_MS + VT_MS)
    again = store.at(FROZEN_MS).relet(Q, _h(handle_c), VT_MS)
    assert again is not None and again.receive_count == 2 and not parse_in_flight_name(again.receipt_handle).is_legacy
    with pytest.raises(StaleReceiptHandle):
        store.delete_by_handle(Q, _h(handle_c))
    # Delete by id keeps its any-state meaning for v1 files.
    v1_lease(store, d, FROZEN_MS + VT_MS)
    assert store.delete(Q, d) == "in_flight"
    assert delay(store) == [again.receipt_handle]
