"""The storage protocol (``mqcore/protocol.py``, ``mqcore/model.py``; ``docs/protocol.md`` sections 4, 6, 8).

Every test works on a real root under ``tmp_path`` through the real
:class:`~mqcore.protocol.Store` and checks the files each transition leaves.
Concurrency tests run several Stores on one root from threads and from separate
processes: a rename is the compare-and-swap, so every message is leased exactly
once. Disk-full tests mount a tiny tmpfs (root needed; ``faults`` marker).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqcore import model
from mqcore.errors import InvalidQueueName, MessageNotFound, QueueNotFound, StorageUnavailable
from mqcore.model import CorruptMessage, ReceivedMessage
from mqcore.names import (
    REMOVED_QUEUE_SUFFIX,
    IdGenerator,
    MessageId,
    QueueName,
    in_flight_name,
    new_name,
    parse_in_flight_name,
    ready_name,
    removed_name,
    sent_ms_of,
)
from mqcore.protocol import Store, iter_due, now_ms

REPO = Path(__file__).resolve().parents[2]
Q = QueueName("orders")
#: Visibility timeout used by the lease tests, in ms.
VT_MS = 30_000
#: A fixed "now" for leases, epoch ms.
T0 = 1_790_000_000_000
#: Messages in the concurrency tests.
CONCURRENT_MESSAGES = 2_000
REMOVED_QUEUE_RE = re.compile(r"orders\.[0-9a-f]{32}\.queue")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A Store on a fresh root with queue ``orders`` created."""
    s = Store(tmp_path / "root")
    assert s.create_queue(Q) is True
    return s


def ls(store: Store, sub: str) -> list[str]:
    """Sorted names in ``ROOT/<sub>``, without a queue directory's metadata files (``.attributes``, ...)."""
    return sorted(n for n in os.listdir(os.path.join(store.layout.root, sub)) if not n.startswith("."))


def messages_in(path: str | os.PathLike[str]) -> list[str]:
    """Sorted names in a queue directory, without its metadata files (``.attributes``, ``.purge``, ...)."""
    return sorted(n for n in os.listdir(path) if not n.startswith("."))


def read(path: str | os.PathLike[str]) -> tuple[dict, bytes]:
    with open(path, "rb") as f:
        return model.decode(f.read())


# -- message file format (section 4) -------------------------------------------

content_types = st.none() | st.sampled_from(["text/plain", "application/json; charset=utf-8"]) | st.text(max_size=40)


@given(st.binary(max_size=4096), content_types)
def test_encode_decode_round_trip(body: bytes, content_type: str | None) -> None:
    data = model.encode(body, content_type)
    assert data.startswith(model.MAGIC)
    header, decoded = model.decode(data)
    assert decoded == body
    assert header["body_bytes"] == len(body)
    assert header.get("content_type") == (content_type or None)


def test_encode_layout_matches_the_documented_format() -> None:
    assert model.encode(b"hello", "text/plain") == b'MQ1 {"body_bytes":5,"content_type":"text/plain"}\nhello'
    assert model.encode(b"") == b'MQ1 {"body_bytes":0}\n'
    assert model.decode(b'MQ1 {"body_bytes":0}\n') == ({"body_bytes": 0}, b"")
    # Bodies that look like headers, newlines and NULs are kept byte for byte.
    body = b"MQ1 {}\n\x00\r\n\xff"
    assert model.decode(model.encode(body))[1] == body


def test_decode_ignores_unknown_header_keys() -> None:
    header, body = model.decode(b'MQ1 {"body_bytes":2,"future":{"x":1},"content_type":"a/b"}\nhi')
    assert body == b"hi"
    assert header["content_type"] == "a/b"


@given(st.binary(max_size=512), content_types, st.data())
def test_any_truncation_is_corrupt(body: bytes, content_type: str | None, data: st.DataObject) -> None:
    encoded = model.encode(body, content_type)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(CorruptMessage):
        model.decode(encoded[:cut])


@given(st.binary(max_size=512), content_types, st.binary(min_size=1, max_size=64))
def test_extra_bytes_are_corrupt(body: bytes, content_type: str | None, extra: bytes) -> None:
    with pytest.raises(CorruptMessage):
        model.decode(model.encode(body, content_type) + extra)


@given(st.binary(max_size=256), st.binary(min_size=4, max_size=4).filter(lambda m: m != model.MAGIC))
def test_bad_magic_is_corrupt(body: bytes, magic: bytes) -> None:
    with pytest.raises(CorruptMessage):
        model.decode(magic + model.encode(body)[4:])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"MQ1",
        b"MQ2 " + model.encode(b"x")[4:],  # a future version is not read as v1
        b"MQ1 {}\n",
        b"MQ1 []\n",
        b"MQ1 null\n",
        b"MQ1 5\n",
        b'MQ1 "body_bytes"\n',
        b'MQ1 {"body_bytes":"x"}\n',
        b'MQ1 {"body_bytes":null}\n',
        b'MQ1 {"body_bytes":NaN}\n',
        b'MQ1 {"body_bytes":-1}\n',
        b'MQ1 {"body_bytes":1}',  # header not terminated
        b'MQ1 {"body_bytes":1\n}x',
        b'MQ1 {"body_bytes":1}\n\xff\xfe',
        b'MQ1 {"body_bytes":1,"content_type":"\xff"}\nx',  # not UTF-8
    ],
)
def test_malformed_files_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptMessage):
        model.decode(data)


@pytest.mark.parametrize(
    "data",
    [b'MQ1 {"body_bytes":Infinity}\n', b'MQ1 {"body_bytes":-Infinity}\n', b'MQ1 {"body_bytes":1e999}\n'],
    ids=["infinity", "minus-infinity", "1e999"],
)
def test_headers_that_overflow_int_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptMessage):
        model.decode(data)


def test_a_deeply_nested_header_is_corrupt() -> None:
    with pytest.raises(CorruptMessage):
        model.decode(b"MQ1 " + b"[" * 100_000 + b"\n")


@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_raises_only_corrupt_message(data: bytes) -> None:
    for candidate in (data, model.MAGIC + data):
        try:
            header, body = model.decode(candidate)
        except CorruptMessage:
            continue
        assert len(body) == int(header["body_bytes"])


# -- queues (6.1, 6.6) --------------------------------------------------------------


def test_store_creates_the_tree_on_a_new_root(tmp_path: Path) -> None:
    s = Store(tmp_path / "a" / "b")
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["attempts", "delay", "new", "queues", "remove"]
    assert s.list_queues() == []
    Store(tmp_path / "a" / "b")  # an existing root is fine


def test_create_queue_is_idempotent(tmp_path: Path) -> None:
    s = Store(tmp_path)
    assert s.create_queue(QueueName("b")) is True
    assert s.create_queue(QueueName("b")) is False
    assert s.create_queue(QueueName("a-1_Z")) is True
    assert s.queue_exists(QueueName("b"))
    assert not s.queue_exists(QueueName("c"))
    assert s.list_queues() == ["a-1_Z", "b"]
    assert os.path.isdir(tmp_path / "queues" / "b")


def test_create_queue_rejects_bad_names(tmp_path: Path) -> None:
    s = Store(tmp_path)
    for name in ("..", "a/b", "", "a.b", "x" * 81):
        with pytest.raises(InvalidQueueName):
            s.create_queue(QueueName(name))
    assert os.listdir(tmp_path / "queues") == []


def test_list_queues_ignores_files_and_invalid_directories(tmp_path: Path) -> None:
    s = Store(tmp_path)
    s.create_queue(QueueName("real"))
    (tmp_path / "queues" / "a.file").write_bytes(b"")
    (tmp_path / "queues" / "file").write_bytes(b"")
    (tmp_path / "queues" / "bad.name").mkdir()
    os.symlink(tmp_path / "queues" / "real", tmp_path / "queues" / "link")
    assert s.list_queues() == ["real"]


# -- send (6.2) -------------------------------------------------------------------


def test_send_puts_the_file_in_the_queue_and_leaves_nothing_in_new(store: Store) -> None:
    before = now_ms()
    mid = store.send(Q, b"hello", "text/plain")
    assert before <= sent_ms_of(mid) <= now_ms()
    assert ls(store, "new") == []
    assert ls(store, f"queues/{Q}") == [ready_name(mid, 0)]
    header, body = read(store.layout.ready_path(Q, mid, 0))
    assert body == b"hello"
    assert header["content_type"] == "text/plain"
    assert store.scan_ready(Q) == [f"{mid}.0"]


def test_write_new_then_publish(store: Store) -> None:
    pending = store.write_new(Q, b"x" * 70_000)
    assert ls(store, "new") == [new_name(Q, pending.message_id)]
    assert ls(store, f"queues/{Q}") == []  # not ready before publish
    assert read(pending.path)[1] == b"x" * 70_000
    store.publish(pending)
    assert ls(store, "new") == []
    assert ls(store, f"queues/{Q}") == [ready_name(pending.message_id, 0)]


def test_send_to_a_missing_queue_writes_nothing(store: Store) -> None:
    with pytest.raises(QueueNotFound) as info:
        store.send(QueueName("nope"), b"x")
    assert info.value.code == "queue_not_found"
    assert ls(store, "new") == []
    assert ls(store, "queues") == [Q]


def test_publish_after_the_queue_was_deleted_raises_and_cleans_new(store: Store) -> None:
    pending = store.write_new(Q, b"x")
    store.delete_queue(Q)
    with pytest.raises(QueueNotFound):
        store.publish(pending)
    assert ls(store, "new") == []


def test_send_with_fsync_off_behaves_the_same(tmp_path: Path) -> None:
    s = Store(tmp_path, fsync=False)
    s.create_queue(Q)
    mid = s.send(Q, b"")
    assert s.lease(Q, ready_name(mid, 0), VT_MS).body == b""


# -- receive (6.3) -----------------------------------------------------------------


def test_lease_renames_into_delay_with_the_deadline(store: Store) -> None:
    mid = store.send(Q, b"\x00\x01binary\xff", "application/x-thing")
    got = store.at(T0).lease(Q, ready_name(mid, 0), VT_MS)
    assert isinstance(got, ReceivedMessage)
    # Protocol v2: DL.Q.ID.RC.LT, the lease token LT unique to this receive (17-32 hex digits).
    prefix = f"{T0 + VT_MS:013d}.{Q}.{mid}.1."
    assert got.in_flight_name.startswith(prefix)
    assert re.fullmatch(r"[0-9a-f]{17,32}", got.in_flight_name[len(prefix) :])
    expected_name = got.in_flight_name
    assert got == ReceivedMessage(
        queue=Q,
        message_id=mid,
        body=b"\x00\x01binary\xff",
        content_type="application/x-thing",
        receive_count=1,
        deadline_ms=T0 + VT_MS,
        in_flight_name=expected_name,
        attributes={},
        first_receive_ms=T0,
        source_queue=Q,
    )
    assert got.sent_ms == sent_ms_of(mid)
    assert got.receipt_handle == expected_name
    assert ls(store, "delay") == [expected_name]
    assert ls(store, f"queues/{Q}") == []
    assert read(store.layout.delay_path(expected_name))[1] == b"\x00\x01binary\xff"


def test_lease_defaults_the_content_type_and_uses_the_wall_clock(store: Store) -> None:
    mid = store.send(Q, b"x")
    before = now_ms()
    got = store.lease(Q, ready_name(mid, 0), VT_MS)
    assert got.content_type == model.DEFAULT_CONTENT_TYPE
    assert before + VT_MS <= got.deadline_ms <= now_ms() + VT_MS


def test_second_lease_of_the_same_name_gets_none(store: Store) -> None:
    mid = store.send(Q, b"x")
    assert store.lease(Q, ready_name(mid, 0), VT_MS) is not None
    assert store.lease(Q, ready_name(mid, 0), VT_MS) is None
    assert len(ls(store, "delay")) == 1


def test_lease_of_a_removed_file_gets_none(store: Store) -> None:
    mid = store.send(Q, b"x")
    os.unlink(store.layout.ready_path(Q, mid, 0))
    assert store.lease(Q, ready_name(mid, 0), VT_MS) is None
    assert ls(store, "delay") == []


def test_lease_of_a_foreign_name_or_missing_queue_gets_none(store: Store) -> None:
    (Path(store.layout.queue_dir(Q)) / "foreign").write_bytes(model.encode(b"x"))
    assert store.lease(Q, "foreign", VT_MS) is None
    mid = store.ids.next_id()
    assert store.lease(QueueName("gone"), ready_name(mid, 0), VT_MS) is None
    assert ls(store, "delay") == []
    assert ls(store, f"queues/{Q}") == ["foreign"]


@pytest.mark.parametrize(
    "content",
    [b"", b"MQ1 ", model.encode(b"hello")[:-1], model.encode(b"hello") + b"!", b"XYZ " + model.encode(b"x")[4:]],
    ids=["empty", "magic-only", "truncated", "extra-bytes", "bad-magic"],
)
def test_a_torn_file_is_removed_not_delivered(store: Store, content: bytes) -> None:
    mid = store.ids.next_id()
    Path(store.layout.ready_path(Q, mid, 0)).write_bytes(content)
    good = store.send(Q, b"good")
    assert store.lease(Q, ready_name(mid, 0), VT_MS) is None
    assert ls(store, "remove") == [removed_name(Q, mid)]
    assert ls(store, "delay") == []
    # The next message is delivered normally.
    assert store.lease(Q, ready_name(good, 0), VT_MS).body == b"good"


def test_a_file_whose_header_overflows_is_removed_not_raised(store: Store) -> None:
    mid = store.ids.next_id()
    Path(store.layout.ready_path(Q, mid, 0)).write_bytes(b'MQ1 {"body_bytes":1e999}\n')
    assert store.lease(Q, ready_name(mid, 0), VT_MS) is None
    assert ls(store, "remove") == [removed_name(Q, mid)]


def test_fifo_sorted_names_lease_in_send_order(store: Store) -> None:
    sent = [store.send(Q, f"m{i}".encode()) for i in range(200)]
    names = sorted(store.scan_ready(Q))
    got = [store.lease(Q, name, VT_MS) for name in names]
    assert [m.message_id for m in got] == sent
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(200)]
    assert store.scan_ready(Q) == []


def test_scan_ready_ignores_foreign_names_and_raises_for_a_missing_queue(store: Store) -> None:
    mid = store.send(Q, b"x")
    qdir = Path(store.layout.queue_dir(Q))
    for foreign in (f"{mid}.01", f"{mid}.\u00b2", ".nfs0001", f"{mid}.tmp", "x"):
        (qdir / foreign).write_bytes(b"")
    assert store.scan_ready(Q) == [ready_name(mid, 0)]
    with pytest.raises(QueueNotFound):
        store.scan_ready(QueueName("missing"))


# -- redeliver (6.4) --------------------------------------------------------------


def test_redeliver_puts_it_back_with_the_receive_count(store: Store) -> None:
    mid = store.send(Q, b"again")
    first = store.at(T0).lease(Q, ready_name(mid, 0), VT_MS)
    [item] = store.scan_in_flight()
    assert item.filename == first.in_flight_name
    assert (item.deadline_ms, item.queue, item.message_id, item.receive_count) == (T0 + VT_MS, Q, mid, 1)
    assert list(iter_due([item], T0 + VT_MS - 1)) == []
    assert list(iter_due([item], T0 + VT_MS)) == [item]
    assert store.redeliver(item) == "redelivered"
    assert ls(store, f"queues/{Q}") == [ready_name(mid, 1)]
    assert ls(store, "delay") == []
    second = store.at(T0 + 1).lease(Q, ready_name(mid, 1), VT_MS)
    assert second.receive_count == 2
    assert second.body == b"again"
    token = parse_in_flight_name(second.in_flight_name).token  # protocol v2: the receive's own lease token
    assert ls(store, "delay") == [in_flight_name(T0 + 1 + VT_MS, Q, mid, 2, token)]


def test_redeliver_of_a_vanished_file_is_gone(store: Store) -> None:
    mid = store.send(Q, b"x")
    store.lease(Q, ready_name(mid, 0), VT_MS)
    [item] = store.scan_in_flight()
    assert store.redeliver(item) == "redelivered"
    assert store.redeliver(item) == "gone"  # a second mover
    store.lease(Q, ready_name(mid, 1), VT_MS)
    [item2] = store.scan_in_flight()
    store.delete(Q, mid)
    assert store.redeliver(item2) == "gone"
    assert ls(store, f"queues/{Q}") == []


def test_redeliver_into_a_deleted_queue_is_orphaned(store: Store) -> None:
    mid = store.send(Q, b"x")
    store.lease(Q, ready_name(mid, 0), VT_MS)
    [item] = store.scan_in_flight()
    shutil.rmtree(store.layout.queue_dir(Q))  # another process deleted the queue
    assert store.redeliver(item) == "orphaned"
    assert ls(store, "remove") == [removed_name(Q, mid)]
    assert ls(store, "delay") == []
    assert ls(store, "queues") == []


def test_scan_in_flight_ignores_foreign_names(store: Store) -> None:
    mid = store.send(Q, b"x")
    got = store.at(T0).lease(Q, ready_name(mid, 0), VT_MS)
    delay = Path(store.layout.delay)
    for foreign in (
        "foreign",
        ".nfs000123",
        f"{T0}.{Q}.{mid}.\u00b2",
        f"{T0}.{Q}.{mid}.01",
        f"179000000000\u0663.{Q}.{mid}.1",
        f"{T0}.bad.name.{mid}.1",
        f"{T0}.{Q}.{mid}",
    ):
        (delay / foreign).write_bytes(b"")
    assert [i.filename for i in store.scan_in_flight()] == [got.in_flight_name]


# -- delete (6.5) ------------------------------------------------------------------


def assert_removed(store: Store, mid: MessageId, body: bytes) -> None:
    assert ls(store, "remove") == [removed_name(Q, mid)]
    assert read(store.layout.remove_path(removed_name(Q, mid)))[1] == body
    assert ls(store, "new") == []
    assert ls(store, f"queues/{Q}") == []
    assert ls(store, "delay") == []


def test_delete_finds_a_message_in_new(store: Store) -> None:
    pending = store.write_new(Q, b"writing")
    assert store.delete(Q, pending.message_id) == "new"
    assert_removed(store, pending.message_id, b"writing")
    with pytest.raises(StorageUnavailable):  # the sender's publish then fails: no 201
        store.publish(pending)
    assert ls(store, f"queues/{Q}") == []


@pytest.mark.parametrize("hinted", [False, True])
def test_delete_finds_a_ready_message(store: Store, hinted: bool) -> None:
    mid = store.send(Q, b"ready")
    hints = {"ready_hint": [ready_name(mid, 0)], "list_ready": False} if hinted else {}
    assert store.delete(Q, mid, **hints) == "ready"
    assert_removed(store, mid, b"ready")


@pytest.mark.parametrize("hinted", [False, True])
def test_delete_finds_a_ready_message_received_before(store: Store, hinted: bool) -> None:
    mid = store.send(Q, b"ready again")
    for _ in range(3):  # three receives, three redeliveries: ID.3
        store.lease(Q, store.scan_ready(Q)[0], VT_MS)
        [item] = store.scan_in_flight()
        store.redeliver(item)
    assert store.scan_ready(Q) == [ready_name(mid, 3)]
    if hinted:  # a stale hint first (as the front end sends ID.0), then the indexed name
        where = store.delete(Q, mid, ready_hint=[ready_name(mid, 0), ready_name(mid, 3)], list_ready=False)
    else:
        where = store.delete(Q, mid, ready_hint=[ready_name(mid, 0)])
    assert where == "ready"
    assert_removed(store, mid, b"ready again")


@pytest.mark.parametrize("hinted", [False, True])
def test_delete_finds_an_in_flight_message(store: Store, hinted: bool) -> None:
    mid = store.send(Q, b"leased")
    other = store.send(Q, b"other")
    got = store.lease(Q, ready_name(mid, 0), VT_MS)
    store.lease(Q, ready_name(other, 0), VT_MS)
    hint = [got.in_flight_name] if hinted else []
    assert store.delete(Q, mid, ready_hint=[ready_name(mid, 0)], in_flight_hint=hint) == "in_flight"
    assert ls(store, "remove") == [removed_name(Q, mid)]
    assert read(store.layout.remove_path(removed_name(Q, mid)))[1] == b"leased"
    assert [i.message_id for i in store.scan_in_flight()] == [other]  # the other lease is untouched


def test_delete_of_an_unknown_id_or_queue(store: Store) -> None:
    store.send(Q, b"x")
    with pytest.raises(MessageNotFound) as info:
        store.delete(Q, store.ids.next_id())
    assert info.value.code == "message_not_found"
    with pytest.raises(QueueNotFound):
        store.delete(QueueName("missing"), store.ids.next_id())
    assert ls(store, "remove") == []


def test_a_repeated_delete_is_message_not_found(store: Store) -> None:
    mid = store.send(Q, b"x")
    assert store.delete(Q, mid) == "ready"
    with pytest.raises(MessageNotFound):
        store.delete(Q, mid)


def test_delete_does_not_touch_the_same_id_in_another_queue(store: Store) -> None:
    other = QueueName("orders2")
    store.create_queue(other)
    mid = store.ids.next_id()
    for q in (Q, other):
        Path(store.layout.ready_path(q, mid, 0)).write_bytes(model.encode(q.encode()))
    store.lease(other, ready_name(mid, 0), VT_MS)
    assert store.delete(Q, mid) == "ready"
    assert [(i.queue, i.message_id) for i in store.scan_in_flight()] == [(other, mid)]


# -- delete queue (6.6) ----------------------------------------------------------------


def test_delete_queue_moves_the_directory_and_its_in_flight_files(store: Store) -> None:
    ready = [store.send(Q, f"r{i}".encode()) for i in range(3)]
    leased = store.lease(Q, ready_name(ready[0], 0), VT_MS)
    other = QueueName("other")
    store.create_queue(other)
    other_mid = store.send(other, b"o")
    other_lease = store.lease(other, ready_name(other_mid, 0), VT_MS)
    deleted_at = now_ms() + 1
    # An in-flight file of a queue of the same name re-created after the delete: its id is newer.
    newer = IdGenerator().next_id(now_ms=deleted_at + 5_000)
    newer_name = in_flight_name(deleted_at + VT_MS, Q, newer, 1)
    Path(store.layout.delay_path(newer_name)).write_bytes(model.encode(b"new incarnation"))

    store.at(deleted_at).delete_queue(Q)

    assert not store.queue_exists(Q)
    assert store.list_queues() == [other]
    removed = ls(store, "remove")
    assert removed_name(Q, leased.message_id) in removed
    [queue_dir] = [n for n in removed if n.endswith(".queue")]
    assert REMOVED_QUEUE_RE.fullmatch(queue_dir)
    assert messages_in(store.layout.remove_path(queue_dir)) == [ready_name(m, 0) for m in ready[1:]]
    assert len(removed) == 2
    assert sorted(ls(store, "delay")) == sorted([newer_name, other_lease.in_flight_name])
    with pytest.raises(QueueNotFound):
        store.delete_queue(Q)


def test_a_deleted_queue_can_be_created_again_empty(store: Store) -> None:
    store.send(Q, b"old")
    store.delete_queue(Q)
    assert store.create_queue(Q) is True
    assert store.scan_ready(Q) == []
    mid = store.send(Q, b"new")
    assert store.scan_ready(Q) == [ready_name(mid, 0)]


# -- reap and sweep (6.7, 6.8) -------------------------------------------------------------


def test_reap_removes_files_and_removed_queue_directories(store: Store) -> None:
    mid = store.send(Q, b"x")
    store.delete(Q, mid)
    for i in range(3):
        store.send(Q, f"{i}".encode())
    (Path(store.layout.queue_dir(Q)) / "sub").mkdir()  # a nested tree goes too
    (Path(store.layout.queue_dir(Q)) / "sub" / "f").write_bytes(b"")
    store.delete_queue(Q)
    names = store.scan_removed()
    assert len(names) == 2
    for name in names:
        assert store.reap(name) is True
    assert ls(store, "remove") == []
    for name in names:
        assert store.reap(name) is False


def test_reap_only_touches_remove(store: Store) -> None:
    mid = store.send(Q, b"x")
    with pytest.raises(ValueError, match="not a name inside remove/"):
        store.reap(f"../queues/{Q}/{ready_name(mid, 0)}")
    assert ls(store, f"queues/{Q}") == [ready_name(mid, 0)]


@pytest.mark.parametrize("name", ["..", "", "."])
def test_reap_never_removes_anything_outside_remove(store: Store, name: str) -> None:
    mid = store.send(Q, b"keep me")
    (Path(store.layout.remove) / "garbage").write_bytes(b"")
    with contextlib.suppress(ValueError):  # refusing the name is fine too
        store.reap(name)
    assert os.path.isfile(store.layout.ready_path(Q, mid, 0))
    assert os.path.isdir(store.layout.remove)


def test_reap_many_removes_like_reap_and_tells_each_file_size(store: Store) -> None:
    """mq-reaper's batch: files and a removed queue directory go, sizes come with the files, bad names stay errors."""
    mid = store.send(Q, b"x" * 100)
    store.delete(Q, mid)
    keep = store.send(Q, b"keep")
    store.delete_queue(Q)
    names = sorted(store.scan_removed())
    assert len(names) == 2
    sizes = {name: os.lstat(os.path.join(store.layout.remove, name)).st_size for name in names}
    results = store.reap_many([*names, "..", "gone"])
    assert [(name, removed) for name, removed, _ in results[:2]] == [(name, True) for name in names]
    for name, _, size in results[:2]:
        assert size == (0 if name.endswith(REMOVED_QUEUE_SUFFIX) else sizes[name])
    assert isinstance(results[2][1], ValueError) and results[3][1:] == (False, 0)
    assert ls(store, "remove") == []
    assert store.reap_many(names) == [(name, False, 0) for name in names]
    assert not os.path.exists(store.layout.ready_path(Q, keep, 0))


def test_sweep_new_removes_old_files_and_keeps_fresh_ones(store: Store) -> None:
    """Files older than the grace period go, foreign names included; fresh ones stay, foreign included.

    Foreign names get the grace period too: a writer of a newer protocol version may be using them
    (``Store.sweep_new``'s docstring).
    """
    fresh = store.write_new(Q, b"fresh")
    old = store.write_new(Q, b"old")
    new_dir = Path(store.layout.new)
    gone_queue_old = new_name(QueueName("deleted"), store.ids.next_id())
    fresh_foreign = f"{Q}.{fresh.message_id}.tmp"
    for name in (gone_queue_old, "old-foreign", fresh_foreign):
        (new_dir / name).write_bytes(b"")
    past = time.time() - 3600
    for name in (os.path.basename(old.path), gone_queue_old, "old-foreign"):
        os.utime(new_dir / name, (past, past))

    removed = store.sweep_new(older_than_ms=300_000)

    assert sorted(removed) == sorted([os.path.basename(old.path), gone_queue_old, "old-foreign"])
    assert ls(store, "new") == sorted([os.path.basename(fresh.path), fresh_foreign])
    assert store.sweep_new(older_than_ms=300_000) == []
    # With "now" past the grace period, the fresh files are old too.
    later = store.at(now_ms() + 301_000).sweep_new(older_than_ms=300_000)
    assert sorted(later) == sorted([os.path.basename(fresh.path), fresh_foreign])
    assert ls(store, "new") == []
    # The writer of a swept file gets no 201: its publish fails.
    with pytest.raises(StorageUnavailable):
        store.publish(fresh)
    assert ls(store, f"queues/{Q}") == []


# -- concurrency (section 8) ----------------------------------------------------------------


def fill_queue(root: Path, n: int) -> dict[MessageId, bytes]:
    """Send ``n`` messages to ``orders`` (fsync off: only the renames matter here)."""
    s = Store(root, fsync=False)
    s.create_queue(Q)
    sent = {}
    for i in range(n):
        body = f"message {i}".encode()
        sent[s.send(Q, body)] = body
    return sent


def check_leased_exactly_once(root: Path, sent: dict[MessageId, bytes], leased: list[tuple[str, bytes]]) -> None:
    counts = collections.Counter(mid for mid, _ in leased)
    duplicates = {mid: c for mid, c in counts.items() if c > 1}
    assert duplicates == {}
    assert set(counts) == set(sent)
    for mid, body in leased:
        assert body == sent[mid]
    assert messages_in(root / "queues" / Q) == []
    delay = os.listdir(root / "delay")
    assert len(delay) == len(sent)
    assert {parse_in_flight_name(n).message_id for n in delay} == set(sent)


def test_threads_with_their_own_stores_lease_each_message_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sent = fill_queue(root, CONCURRENT_MESSAGES)
    workers = 8
    results: list[list[tuple[str, bytes]]] = [[] for _ in range(workers)]
    lost: list[int] = [0] * workers
    barrier = threading.Barrier(workers)

    def consume(i: int) -> None:
        s = Store(root)  # one Store per thread, like separate processes
        names = sorted(s.scan_ready(Q))
        barrier.wait()
        for name in names:  # everyone goes for the oldest first: maximal contention
            got = s.lease(Q, name, VT_MS)
            if got is None:
                lost[i] += 1
            else:
                results[i].append((got.message_id, got.body))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    check_leased_exactly_once(root, sent, [r for out in results for r in out])
    assert sum(lost) == (workers - 1) * CONCURRENT_MESSAGES


_LEASE_SCRIPT = """
import json, os, sys, time
from mqcore.protocol import Store
root, queue, ready_file, go_file = sys.argv[1:5]
store = Store(root)
names = sorted(store.scan_ready(queue))
open(ready_file, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go_file):
    if time.monotonic() > deadline:
        sys.exit("no go signal")
    time.sleep(0.001)
out = []
for name in names:
    got = store.lease(queue, name, 30000)
    if got is not None:
        out.append([got.message_id, got.body.decode()])
json.dump(out, sys.stdout)
"""


def test_processes_lease_each_message_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sent = fill_queue(root, CONCURRENT_MESSAGES)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LEASE_SCRIPT, str(root), Q, str(tmp_path / f"ready.{i}"), str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready.{i}").exists() for i in range(4)):
            assert time.monotonic() < deadline, "consumer processes did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.005)
        go.touch()
        leased = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            leased.extend((mid, body.encode()) for mid, body in json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    check_leased_exactly_once(root, sent, leased)


def test_concurrent_lease_and_delete_have_one_winner(tmp_path: Path) -> None:
    """A delete racing leases: each message ends up either deleted or leased, never both."""
    root = tmp_path / "root"
    sent = fill_queue(root, 500)
    leaser, deleter = Store(root), Store(root)
    leased: list[str] = []
    deleted: list[str] = []
    barrier = threading.Barrier(2)

    def lease_all() -> None:
        barrier.wait()
        for name in sorted(leaser.scan_ready(Q)):
            got = leaser.lease(Q, name, VT_MS)
            if got is not None:
                leased.append(got.message_id)

    def delete_all() -> None:
        barrier.wait()
        for mid in sorted(sent):
            deleter.delete(Q, mid, ready_hint=[ready_name(mid, 0)])
            deleted.append(mid)

    threads = [threading.Thread(target=lease_all), threading.Thread(target=delete_all)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert sorted(deleted) == sorted(sent)  # every delete found its message (ready or in flight)
    assert len(set(leased)) == len(leased)
    assert ls(Store(root), "delay") == []
    assert len(ls(Store(root), "remove")) == len(sent)


# -- storage errors (fault-testing.md: a real ENOSPC from a small tmpfs) ----------------------


@pytest.fixture
def tiny_fs(request: pytest.FixtureRequest, tmp_path: Path, mount_tmpfs) -> Path:
    """A tmpfs mounted at ``tmp_path / "fs"`` with the options of ``request.param`` (default 64 KiB)."""
    return mount_tmpfs(tmp_path / "fs", getattr(request, "param", "size=64k"))


@pytest.mark.faults
def test_write_new_on_a_full_filesystem_leaves_no_partial_file(tiny_fs: Path) -> None:
    s = Store(tiny_fs)
    s.create_queue(Q)
    with pytest.raises(StorageUnavailable) as info:
        s.write_new(Q, b"x" * (128 * 1024))
    assert info.value.code == "storage_unavailable"
    assert info.value.retriable
    assert info.value.details["errno"] == "ENOSPC"
    assert os.listdir(s.layout.new) == []
    assert messages_in(s.layout.queue_dir(Q)) == []
    # The space was given back: a message that fits is stored.
    mid = s.send(Q, b"fits")
    assert s.lease(Q, ready_name(mid, 0), VT_MS).body == b"fits"


@pytest.mark.faults
def test_filling_the_disk_keeps_every_stored_message_whole(tiny_fs: Path) -> None:
    s = Store(tiny_fs)
    s.create_queue(Q)
    stored: dict[MessageId, bytes] = {}
    with pytest.raises(StorageUnavailable):
        for i in range(1_000):
            body = bytes([i % 256]) * 5_000
            stored[s.send(Q, body)] = body
    assert stored, "nothing fitted on the filesystem"
    assert os.listdir(s.layout.new) == []
    assert sorted(s.scan_ready(Q)) == sorted(ready_name(mid, 0) for mid in stored)
    for mid, body in stored.items():
        assert read(s.layout.ready_path(Q, mid, 0))[1] == body


@pytest.mark.faults
@pytest.mark.parametrize("tiny_fs", ["size=1m,nr_inodes=12"], indirect=True)
def test_out_of_inodes_fails_create_and_mkdir_cleanly(tiny_fs: Path) -> None:
    s = Store(tiny_fs)
    s.create_queue(Q)
    stored = []
    with pytest.raises(StorageUnavailable) as info:
        for _ in range(50):
            stored.append(s.send(Q, b"x"))
    assert info.value.details["errno"] == "ENOSPC"
    assert os.listdir(s.layout.new) == []
    assert sorted(s.scan_ready(Q)) == sorted(ready_name(mid, 0) for mid in stored)
    with pytest.raises(StorageUnavailable):
        s.create_queue(QueueName("another"))
    assert s.list_queues() == [Q]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048), content_types)
def test_send_then_lease_returns_what_was_sent(store: Store, body: bytes, content_type: str | None) -> None:
    mid = store.send(Q, body, content_type)
    got = store.lease(Q, ready_name(mid, 0), VT_MS)
    assert got.body == body
    assert got.content_type == (content_type or model.DEFAULT_CONTENT_TYPE)
    assert store.delete(Q, mid, in_flight_hint=[got.in_flight_name]) == "in_flight"
