"""FIFO queues below the daemons: the ``.fifo`` name forms, the deduplication records and their recovery.

docs/protocol.md 19. The names of standard queues must parse exactly as before (the protocol is
a public contract); a FIFO queue's name, with its one ".", must never be mistaken for another
queue's in any form. The crash states of a FIFO send are made by running its real steps up to
the crash point, then a second send is checked to recover them.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemons import reaper
from mqcore.attributes import QueueAttributes
from mqcore.errors import InvalidQueueName, InvalidRequest, StorageUnavailable
from mqcore.names import (
    QueueName,
    ReceiptHandle,
    check_queue_name,
    in_flight_name,
    is_fifo_queue,
    is_queue_prefix,
    lease_key_of,
    new_lease_token,
    new_name,
    parse_in_flight_name,
    parse_new_name,
    parse_receipt_handle,
    removed_entry_queue,
    removed_name,
    sent_ms_of,
)
from mqcore.protocol import SendEntry, Store
from mqcore.protocol import fifo as disk
from mqcore.service import fifo
from mqcore.service.receive import LeaseOutcome, lease_names, lease_policy

MID = "01a1fe4f-1bbf-7000-ac36-adce7281dd16"
DL = 1795267959745
base = st.text(alphabet="abcXYZ019_-", min_size=1, max_size=75)


def test_fifo_queue_names() -> None:
    for name in ("a.fifo", "x" * 75 + ".fifo", "jobs-1_A.fifo"):
        assert check_queue_name(name) == name and is_fifo_queue(name)
    for bad in (".fifo", "a.b.fifo", "a.fifo.fifo", "x" * 76 + ".fifo", "a.FIFO", "a.fif", "a.", "fifo.a"):
        with pytest.raises(InvalidQueueName):
            check_queue_name(bad)
    assert not is_fifo_queue("fifo") and not is_fifo_queue("a_fifo")
    assert all(is_queue_prefix(p) for p in ("", "a", "a.", "a.f", "a.fif", "a.fifo"))
    assert not any(is_queue_prefix(p) for p in (".", "a.x", "a.fifox", "a.b.f"))


@given(base, st.integers(0, 10**9 - 1), st.booleans())
def test_every_form_round_trips_for_both_kinds_of_queue(stem: str, count: int, fifo_queue: bool) -> None:
    queue = QueueName(stem + ".fifo" if fifo_queue else stem)
    token = new_lease_token()
    name = in_flight_name(DL, queue, MID, count, token)
    parsed = parse_in_flight_name(name)
    assert parsed is not None and parsed.filename == name
    assert (parsed.queue, parsed.message_id, parsed.receive_count, parsed.token) == (queue, MID, count, token)
    assert lease_key_of(name) == f"{queue}.{MID}.{count}.{token}"
    assert parse_new_name(new_name(queue, MID)) == (queue, MID)
    assert removed_entry_queue(removed_name(queue, MID)) == queue
    assert removed_entry_queue(f"{queue}.{'0' * 32}.queue") == queue


def test_standard_names_parse_exactly_as_before() -> None:
    assert parse_in_flight_name(f"{DL}.orders.{MID}.1.9f86d081884c7d651").queue == "orders"  # type: ignore[union-attr]
    legacy = parse_in_flight_name(f"{DL}.orders.{MID}.1")  # protocol version 1
    assert legacy is not None and legacy.queue == "orders" and legacy.is_legacy
    assert parse_new_name(f"orders.{MID}") == ("orders", MID)
    # A FIFO queue exists only in version 2: the v1 form of a .fifo name is not a name.
    assert parse_in_flight_name(f"{DL}.a.fifo.{MID}.1") is None
    assert parse_in_flight_name(f"{DL}.a.b.{MID}.1.9f86d081884c7d651") is None
    assert parse_new_name(f"a.b.{MID}") is None
    # Queue "a" and FIFO queue "a.fifo" never take each other's entries.
    assert removed_entry_queue(f"a.fifo.{MID}") == "a.fifo" and removed_entry_queue(f"a.{MID}") == "a"
    handle = parse_receipt_handle(f"{DL}.a.fifo.{MID}.2.9f86d081884c7d651")
    assert (handle.queue, handle.receive_count) == ("a.fifo", 2)
    assert f".a.{MID}." not in in_flight_name(DL, QueueName("a.fifo"), MID, 1, "9f86d081884c7d651")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "root")
    s.create_queue(QueueName("q.fifo"))
    return s


Q = QueueName("q.fifo")


def message(body: bytes, group: str = "g", dedup: str = "d") -> disk.FifoSend:
    return disk.FifoSend(body, group, dedup)


def test_a_send_that_died_after_its_record_is_rolled_forward_by_the_retry(store: Store) -> None:
    # The crash point: new/Q.ID written and fsynced, the record created, no rename (steps 2-3, not 4).
    pending = disk._write_new(store, Q, message(b"half"))
    record = os.path.join(store.layout.queue_dir(Q), disk.DEDUP_PREFIX + disk.dedup_hash("d"))
    store.disk.write_file(record, json.dumps({"message_id": pending.message_id, "at_ms": store.clock()}).encode())
    assert store.scan_ready(Q) == []
    message_id, duplicate = disk.send_fifo(store, Q, message(b"half"))  # the client's retry
    assert (message_id, duplicate) == (pending.message_id, True)
    assert store.scan_ready(Q) == [f"{message_id}.0"] and os.listdir(store.layout.new) == []
    assert disk.send_fifo(store, Q, message(b"half")) == (message_id, True)  # and never twice


def test_an_expired_or_torn_record_is_replaced(store: Store) -> None:
    first, _ = disk.send_fifo(store, Q, message(b"one"))
    record = os.path.join(store.layout.queue_dir(Q), disk.DEDUP_PREFIX + disk.dedup_hash("d"))
    later = store.at(store.clock() + disk.DEDUP_WINDOW_MS)
    second, duplicate = disk.send_fifo(later, Q, message(b"two"))
    assert not duplicate and second != first
    with open(record, "wb") as f:
        f.write(b'{"message_id": "tor')  # being written by another sender, or torn by a crash
    with pytest.raises(StorageUnavailable):  # young: another send of the id is in progress (retriable)
        disk.send_fifo(store, Q, message(b"three"))
    _, duplicate = disk.send_fifo(store.at(store.clock() + disk.TORN_RECORD_MS), Q, message(b"three"))
    assert not duplicate and len(store.scan_ready(Q)) == 3  # old: torn by a crash, replaced
    leftovers = [n for n in os.listdir(store.layout.queue_dir(Q)) if n.startswith(disk.DEDUP_PREFIX)]
    assert leftovers == [os.path.basename(record)]  # the retired records were unlinked
    old = store.clock() - disk.DEDUP_WINDOW_MS - 1000
    os.utime(record, ns=(old * 1_000_000, old * 1_000_000))
    assert disk.sweep_dedup(store, Q) == 1


#: Senders (each its own Store on the root, as separate processes would be) and rounds of the race below.
RACERS, RACE_ROUNDS = 6, 30


def test_senders_racing_one_deduplication_id_store_one_message_and_a_reader_never_sees_a_torn_record(
    store: Store,
) -> None:
    """docs/protocol.md 19.2 step 4: the record is linked into place complete, never created empty and then written."""
    root = store.layout.root
    qdir = store.layout.queue_dir(Q)
    barrier = threading.Barrier(RACERS)
    answers: list[list[str]] = [[] for _ in range(RACERS)]
    failures: list[BaseException] = []
    current = [""]  # the record path of the round in progress
    torn: list[bytes] = []
    reads = [0]
    done = threading.Event()

    def sender(k: int) -> None:
        mine = Store(root)
        try:
            for i in range(RACE_ROUNDS):
                barrier.wait(30)
                if k == 0:
                    current[0] = os.path.join(qdir, disk.DEDUP_PREFIX + disk.dedup_hash(f"id-{i}"))
                barrier.wait(30)
                answers[k].append(disk.send_fifo(mine, Q, message(b"m%d" % i, dedup=f"id-{i}"))[0])
        except BaseException as exc:  # noqa: BLE001 - StorageUnavailable too: no send of this race may need a retry
            failures.append(exc)
            barrier.abort()

    def reader() -> None:  # opens and reads the round's record as fast as it can, as a duplicate's step 1 does
        while not done.is_set():
            try:
                with open(current[0], "rb") as f:
                    data = f.read()
            except OSError:
                continue
            reads[0] += 1
            try:
                json.loads(data)["message_id"]
            except ValueError:
                torn.append(data)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(RACERS)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    watcher.join(10)
    assert not failures, failures[0]
    assert torn == [], f"{len(torn)} of {reads[0]} reads saw a record incomplete"
    assert reads[0] > 0
    for i in range(RACE_ROUNDS):
        assert len({answers[k][i] for k in range(RACERS)}) == 1, f"round {i}: {[a[i] for a in answers]}"
    stored = sorted(n.split(".")[0] for n in store.scan_ready(Q))
    assert stored == sorted(answers[0]), "one message per round, the one every sender was answered"
    assert os.listdir(store.layout.new) == []
    assert not [n for n in os.listdir(qdir) if n.endswith((disk.TMP_SUFFIX, ".old"))]  # no temporary left


def test_a_send_that_died_around_its_records_link_leaves_a_temporary_that_is_swept(store: Store) -> None:
    record = os.path.join(store.layout.queue_dir(Q), disk.DEDUP_PREFIX + disk.dedup_hash("d"))
    body = json.dumps({"message_id": MID, "at_ms": store.clock()}).encode()
    # Died before the link: the temporary only; the id is free and the resend stores the message.
    store.disk.write_file(f"{record}.{'a' * 32}{disk.TMP_SUFFIX}", body)
    first, duplicate = disk.send_fifo(store, Q, message(b"one"))
    assert not duplicate and first != MID and store.scan_ready(Q) == [f"{first}.0"]
    # Died after the link, before unlinking the temporary: one file under two names; the record stands.
    pending = disk._write_new(store, Q, message(b"two", dedup="e"))
    second = os.path.join(store.layout.queue_dir(Q), disk.DEDUP_PREFIX + disk.dedup_hash("e"))
    tmp = f"{second}.{'b' * 32}{disk.TMP_SUFFIX}"
    store.disk.write_file(tmp, json.dumps({"message_id": pending.message_id, "at_ms": store.clock()}).encode())
    os.link(tmp, second)
    assert disk.send_fifo(store, Q, message(b"two", dedup="e")) == (pending.message_id, True)  # rolled forward
    assert len(records(store)) == 4  # two records, two temporaries
    assert disk.sweep_dedup(store, Q) == 0  # young: kept
    later = store.clock() + disk.DEDUP_WINDOW_MS + 1
    assert disk.sweep_dedup(store, Q, now_ms=later) == 4
    assert records(store) == [] and sorted(store.scan_ready(Q)) == sorted([f"{first}.0", f"{pending.message_id}.0"])


def records(store: Store, queue: QueueName = Q) -> list[str]:
    return sorted(n for n in os.listdir(store.layout.queue_dir(queue)) if n.startswith(disk.DEDUP_PREFIX))


def age(store: Store, dedup_id: str, ms: int, queue: QueueName = Q) -> None:
    """Make the record of ``dedup_id`` look written ``ms`` ago (its mtime, which the sweeps judge by)."""
    path = os.path.join(store.layout.queue_dir(queue), disk.DEDUP_PREFIX + disk.dedup_hash(dedup_id))
    then = (store.clock() - ms) * 1_000_000
    os.utime(path, ns=(then, then))


async def test_mq_reaper_sweeps_records_older_than_the_window_and_a_minute(store: Store) -> None:
    plain = QueueName("plain")
    store.create_queue(plain)
    for dedup_id in ("old", "expired", "live"):
        disk.send_fifo(store, Q, message(dedup_id.encode(), dedup=dedup_id))
    age(store, "old", disk.DEDUP_WINDOW_MS + 61_000)
    age(store, "expired", disk.DEDUP_WINDOW_MS + 1000)  # no longer live, but within the reaper's margin
    not_a_record = os.path.join(store.layout.queue_dir(plain), disk.DEDUP_PREFIX + "x")
    with open(not_a_record, "wb") as f:  # a standard queue's "." names are foreign: the reaper leaves them
        f.write(b"{}")
    os.utime(not_a_record, ns=(0, 0))
    r = reaper.Reaper(store, new_grace_seconds=300, rescan_interval_seconds=60, watcher=None)
    try:
        sweep = await r.expire()
    finally:
        r.close()
    assert (sweep.dedup, sweep.errors) == (1, 0)
    assert records(store) == sorted(disk.DEDUP_PREFIX + disk.dedup_hash(d) for d in ("expired", "live"))
    assert os.path.exists(not_a_record)
    assert disk.send_fifo(store, Q, message(b"again", dedup="live"))[1]  # still a duplicate
    assert not disk.send_fifo(store, Q, message(b"again", dedup="old"))[1]  # swept: a new message


def test_a_record_replaced_while_a_sweep_judged_it_is_put_back(store: Store) -> None:
    """A sender retires an expired record and writes a new one between a sweep's stat and its rename.

    The sweep has judged the name old (``cutoff_ns`` in the future stands for that first stat); what
    it renames is the new record, which it finds young and links back under its name.
    """
    first, _ = disk.send_fifo(store, Q, message(b"one"))
    path = os.path.join(store.layout.queue_dir(Q), disk.DEDUP_PREFIX + disk.dedup_hash("d"))
    with open(path, "rb") as f:
        content = f.read()
    assert not disk._sweep_record(path, cutoff_ns=0)  # young, whatever it was judged: kept
    with open(path, "rb") as f:
        assert f.read() == content
    assert records(store) == [os.path.basename(path)]  # no .old left behind
    assert disk.send_fifo(store, Q, message(b"one")) == (first, True)
    assert disk._sweep_record(path, cutoff_ns=(store.clock() + 1000) * 1_000_000)  # old: unlinked
    assert records(store) == []
    with pytest.raises(ValueError):  # no caller may sweep live records
        disk.sweep_dedup(store, Q, min_age_ms=disk.DEDUP_WINDOW_MS - 1)


def test_sends_and_receives_of_the_service_layer(store: Store) -> None:
    entries = [SendEntry(b"a1", group_id="A", dedup_id="1"), SendEntry(b"b1", group_id="B", dedup_id="2")]
    entries += [SendEntry(b"a2", group_id="A", dedup_id="3"), SendEntry(b"x", dedup_id="4")]
    entries += [SendEntry(b"late", group_id="A", dedup_id="5", delay_ms=1000)]
    results = fifo.send_entries(store, Q, entries)
    assert [type(r).__name__ for r in results[3:]] == ["InvalidRequest", "InvalidRequest"]
    policy = lease_policy(store_attrs(), None)
    got = lease_names(store, Q, sorted(store.scan_ready(Q)), 30_000, policy)
    assert [m.body for m in got.messages] == [b"a1", b"b1", b"a2"]
    assert [m.group_id for m in got.messages] == ["A", "B", "A"]
    assert lease_names(store, Q, sorted(store.scan_ready(Q)), 30_000, policy).messages == []


def store_attrs() -> QueueAttributes:
    return QueueAttributes()


def test_a_receive_that_raced_another_for_a_group_gives_its_lease_back(store: Store, tmp_path: Path) -> None:
    fifo.send_entries(store, Q, [SendEntry(b"m1", group_id="g", dedup_id="1")])
    fifo.send_entries(store, Q, [SendEntry(b"m2", group_id="g", dedup_id="2")])
    other = Store(tmp_path / "root")  # a second process on the root
    names = sorted(store.scan_ready(Q))
    policy = lease_policy(store_attrs(), None)
    theirs = other.lease(Q, names[0], 30_000, policy=policy)  # leased by a consumer this receive did not see
    ours = store.lease(Q, names[1], 30_000, policy=policy)
    assert theirs is not None and ours is not None
    outcome = LeaseOutcome(messages=[ours])
    fifo._yield_raced(store, Q, {"g": [ours]}, outcome)
    assert outcome.messages == []  # given back: visible again at once
    assert [n.split(".")[0] for n in store.scan_ready(Q)] == [ours.message_id]


def send_one_by_one(store: Store, messages: list[tuple[bytes, str]]) -> list[str]:
    """Send ``(body, group)`` pairs to Q in order (deduplication ids 0, 1, ...); their ready names in that order."""
    for i, (body, group) in enumerate(messages):
        fifo.send_entries(store, Q, [SendEntry(body, group_id=group, dedup_id=str(i))])
    return sorted(store.scan_ready(Q))


def test_a_receive_whose_names_missed_an_earlier_message_given_back_meanwhile_gives_its_group_back(
    store: Store, tmp_path: Path
) -> None:
    # docs/protocol.md 19.3, step 4: this receive listed the queue while another consumer held m1;
    # that consumer gave m1 back before this receive's step 1, so steps 1-3 see nothing of the group in flight.
    first, *later = send_one_by_one(store, [(b"m1", "g"), (b"m2", "g"), (b"m3", "g")])
    other = Store(tmp_path / "root")  # a second process on the root
    policy = lease_policy(store_attrs(), None)
    theirs = other.lease(Q, first, 30_000, policy=policy)
    assert theirs is not None
    other.change_visibility(Q, ReceiptHandle.parse(theirs.receipt_handle, Q), 0)  # ready again, after our listing
    without = lease_names(store, Q, later, 30_000, policy, 1, relist=False)  # step 4 left to an index
    assert [m.body for m in without.messages] == [b"m2"]  # overtakes m1: what step 4 exists for
    store.change_visibility(Q, ReceiptHandle.parse(without.messages[0].receipt_handle, Q), 0)
    stale = sorted(n for n in store.scan_ready(Q) if n[:36] != theirs.message_id)  # m2 and m3, not m1
    outcome = lease_names(store, Q, stale, 30_000, policy, 1)
    assert outcome.messages == []  # m2 went back: m1 is ready before it
    got = lease_names(store, Q, sorted(store.scan_ready(Q)), 30_000, policy, 1)
    assert [m.body for m in got.messages] == [b"m1"]


def test_a_name_an_earlier_round_set_aside_keeps_its_group_blocked(store: Store) -> None:
    # docs/protocol.md 19.3 step 2: round 1 set m1 aside (its group was in flight); the group is free
    # by round 2, which found only m2 new in the index: leasing m2 would overtake m1.
    m1, m2, x = send_one_by_one(store, [(b"m1", "g"), (b"m2", "g"), (b"x", "h")])
    policy = lease_policy(store_attrs(), None)
    outcome = lease_names(store, Q, [m2, x], 30_000, policy, held=[m1])
    assert [m.body for m in outcome.messages] == [b"x"]
    assert outcome.held == [m2] and outcome.group_blocked


def test_step_4_counts_a_message_of_unknown_group_as_one_of_any_group(store: Store) -> None:
    a, b, c = send_one_by_one(store, [(b"a", "A"), (b"b", "B"), (b"c", "C")])
    policy = lease_policy(store_attrs(), None)
    kept = lease_names(store, Q, [b, c], 30_000, policy, relist=False)
    assert [m.group_id for m in kept.messages] == ["B", "C"]
    fifo.yield_overtaken(store, Q, kept, [(b[:36], None)])  # b itself: not below B's first lease
    assert [m.group_id for m in kept.messages] == ["B", "C"]
    fifo.yield_overtaken(store, Q, kept, [(a[:36], a)])  # group A: neither B nor C
    assert [m.group_id for m in kept.messages] == ["B", "C"]
    fifo.yield_overtaken(store, Q, kept, [("00000000-0000-7000-8000-000000000000", None)])  # gone, group unknown
    assert kept.messages == []
    assert sorted(n[:36] for n in store.scan_ready(Q)) == sorted(n[:36] for n in (a, b, c))


def test_deduplication_per_message_group_names_its_records_by_group_and_id(store: Store) -> None:
    store.set_attributes(Q, {"deduplication_scope": "message_group"})
    entries = [SendEntry(b"a", group_id="A", dedup_id="d"), SendEntry(b"b", group_id="B", dedup_id="d")]
    entries += [SendEntry(b"a again", group_id="A", dedup_id="d")]
    a, b, again = fifo.send_entries(store, Q, entries)
    assert a != b and again == a
    names = {f for f in os.listdir(store.layout.queue_dir(Q)) if f.startswith(disk.DEDUP_PREFIX)}
    assert names == {disk.DEDUP_PREFIX + disk.dedup_hash(f"{g}\nd") for g in "AB"}  # docs/protocol.md 19.2
    store.set_attributes(Q, {"deduplication_scope": None})  # back to the queue: fresh records
    c, d = fifo.send_entries(
        store, Q, [SendEntry(b"c", group_id="C", dedup_id="d"), SendEntry(b"d", group_id="D", dedup_id="d")]
    )
    assert c == d and c not in (a, b)


def test_a_queue_delay_holds_every_message_at_receive_and_a_change_holds_for_sent_ones(store: Store) -> None:
    store.set_attributes(Q, {"delay_seconds": 10})
    queue_delay = SendEntry(b"m1", group_id="A", dedup_id="1", delay_ms=10_000)  # the queue's default, filled in
    own_delay = SendEntry(b"m2", group_id="B", dedup_id="2", delay_ms=5_000)
    sent, refused = fifo.send_entries(store, Q, [queue_delay, own_delay])
    assert isinstance(refused, InvalidRequest) and not isinstance(sent, InvalidRequest)
    assert store.scan_ready(Q)  # stored ready: the delay is the receive's rule
    now = sent_ms_of(sent)
    policy = lease_policy(QueueAttributes.from_json({"delay_seconds": 10}), None)
    early = lease_names(store.at(now + 9_999), Q, sorted(store.scan_ready(Q)), 30_000, policy)
    assert early.messages == [] and early.next_due_ms == now + 10_000 and len(early.held) == 1
    due = lease_names(store.at(now + 10_000), Q, sorted(store.scan_ready(Q)), 30_000, policy)
    assert [m.body for m in due.messages] == [b"m1"] and due.next_due_ms is None
    fifo.send_entries(store, Q, [SendEntry(b"m3", group_id="C", dedup_id="3")])
    shorter = lease_policy(QueueAttributes.from_json({"delay_seconds": 0}), None)  # retroactive (SQS)
    got = lease_names(store, Q, sorted(store.scan_ready(Q)), 30_000, shorter)
    assert [m.body for m in got.messages] == [b"m3"]
