"""Typed message attributes on disk (docs/protocol.md 15.13): the header key, old files, the Store round trip."""

from __future__ import annotations

from pathlib import Path

from mqcore import model
from mqcore.names import QueueName
from mqcore.protocol import SendEntry, Store


def test_untyped_messages_are_written_exactly_as_before() -> None:
    data = model.encode(b"body", "text/plain", {"a": "1"}, "q", {"a": "String"})
    assert data == b'MQ1 {"body_bytes":4,"content_type":"text/plain","attributes":{"a":"1"},"queue":"q"}\nbody'


def test_typed_attributes_round_trip_and_old_headers_read_as_strings() -> None:
    header, body = model.decode(model.encode(b"x", None, {"n": "7", "b": "AAE="}, "q", {"n": "Number", "b": "Binary"}))
    assert body == b"x"
    assert model.header_attributes(header) == {"n": "7", "b": "AAE="}
    assert model.header_attribute_types(header) == {"n": "Number", "b": "Binary"}
    old, _ = model.decode(b'MQ1 {"body_bytes":1,"attributes":{"n":"7"}}\nx')
    assert model.header_attribute_types(old) == {}
    bad, _ = model.decode(b'MQ1 {"body_bytes":1,"attributes":{"n":"7"},"attribute_types":[1]}\nx')
    assert model.header_attribute_types(bad) == {}


def test_store_keeps_types_through_send_batch_receive_and_peek(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    queue = QueueName("typed")
    store.create_queue(queue)
    store.send(queue, b"one", None, {"n": "1"}, 0, {"n": "Number.int"})
    store.send_batch(queue, [SendEntry(b"two", None, {"b": "AA=="}, 0, {"b": "Binary"}), SendEntry(b"three")])
    peeked = {m.body: m.attribute_types for m in store.peek(queue, None, 10)[0]}
    assert peeked == {b"one": {"n": "Number.int"}, b"two": {"b": "Binary"}, b"three": {}}
    store.replace_sqs_meta(queue, {"tags": {"k": "v"}})
    assert store.read_sqs_meta(queue) == {"tags": {"k": "v"}}
    assert not [n for n in (tmp_path / "queues" / "typed").iterdir() if n.name.endswith(".tmp")]
