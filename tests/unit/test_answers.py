"""daemons._answers: the preformatted receive and batch-delete answers are the JSON the routes documented."""

from __future__ import annotations

import base64
import json

import pytest

from daemons._answers import batch_ids_text, received_json, received_messages_text
from mqcore.model import ReceivedMessage
from mqcore.names import MessageId, QueueName

_ID = MessageId("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")


def _message(**fields: object) -> ReceivedMessage:
    base: dict[str, object] = {
        "queue": QueueName("orders"),
        "message_id": _ID,
        "body": bytes(range(256)) * 3,
        "content_type": "application/octet-stream",
        "receive_count": 2,
        "deadline_ms": 1_800_000_000_123,
        "in_flight_name": f"1800000000123.orders.{_ID}.2.a1b2c3d4e5f60718293",
        "first_receive_ms": 1_700_000_000_000,
    }
    base.update(fields)
    return ReceivedMessage(**base)  # type: ignore[arg-type]


def _as_dict(message: ReceivedMessage, fifo: dict[str, str]) -> dict[str, object]:
    """The item of docs/api.md's receive answer, key by key, as json.dumps serialized it before."""
    return {
        "message_id": message.message_id,
        "receipt_handle": message.receipt_handle,
        "body_base64": base64.b64encode(message.body).decode("ascii"),
        "content_type": message.content_type,
        "attributes": message.attributes,
        "attribute_types": message.attribute_types,
        "sent_timestamp_ms": message.sent_ms,
        "receive_count": message.receive_count,
        "first_receive_timestamp_ms": message.first_receive_ms,
        "visibility_deadline_ms": message.deadline_ms,
        **fifo,
    }


@pytest.mark.parametrize(
    ("fields", "fifo"),
    [
        ({}, {}),
        ({"body": b""}, {}),
        (
            {
                "content_type": 'text/plain; charset="ü\\x"',
                "attributes": {"clé": 'va"l\n', "n": "1"},
                "attribute_types": {"n": "Number"},
            },
            {},
        ),
        ({}, {"group_id": "g-1", "sequence_number": "00000000000000000001"}),
        ({}, {"group_id": "g", "sequence_number": "1", "deduplication_id": 'd"\u2028'}),
    ],
)
def test_a_received_item_is_byte_for_byte_the_json_of_its_fields(fields, fifo):
    message = _message(**fields)
    assert received_json(message, fifo) == json.dumps(_as_dict(message, fifo))


def test_the_answers_parse_as_the_documented_objects():
    items = [received_json(_message(), {}), received_json(_message(receive_count=1), {})]
    answer = received_messages_text(items)
    assert json.loads(answer) == {"messages": [json.loads(item) for item in items]}
    assert json.loads(received_messages_text([])) == {"messages": []}
    failed = [{"id": "b", "error": "not_found", "message": "gone", "sender_fault": True}]
    assert batch_ids_text(["a", "c-_9"], []) == json.dumps({"successful": [{"id": "a"}, {"id": "c-_9"}], "failed": []})
    answer = batch_ids_text(["a", "c-_9"], failed)
    assert answer == json.dumps({"successful": [{"id": "a"}, {"id": "c-_9"}], "failed": failed})
