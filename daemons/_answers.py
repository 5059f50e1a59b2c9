"""Preformatted JSON answers of the receive and delete routes (``daemons/_http.py``).

A batch receive answered through ``web.json_response`` built a dict per
message and then had ``json.dumps`` scan every character of the bodies'
base64 text for characters to escape, about 15 µs per 1 KiB message on this
machine, the largest Python cost of a batch receive on the event loop
(docs/performance.md, "Receive side: batches and receive+delete CPU"). Most
fields of a received message cannot need escaping: ids are UUIDs, a receipt
handle is a ``delay/`` name (digits, a checked queue name, hex), base64 text
and numbers are plain ASCII. So the answer is put together from those as they
are, and only the free-form fields (the content type, the attributes) go
through the JSON encoder. The bytes are the same as ``json.dumps`` of the
dicts gives (tests/unit/test_answers.py).
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from mqcore.model import ReceivedMessage

__all__ = ["batch_ids_text", "received_json", "received_messages_text"]

#: ``json.dumps`` of one string (quoted, escaped as ASCII: the encoder's own C function).
_json_string = json.encoder.encode_basestring_ascii


def received_json(message: ReceivedMessage, fifo_fields: dict[str, str]) -> str:
    """``json.dumps`` of one received message's item of ``GET /<queue>/messages?max_messages=N`` (docs/api.md).

    Args:
        message: The message.
        fifo_fields: ``group_id``, ``sequence_number``, ``deduplication_id`` of a FIFO queue's
            message (:func:`mqcore.service.fifo.native_fields`), {} for others.
    Returns:
        The JSON object as text: the keys and values, in order, of the dict the route used to
        serialize, with the default separators.
    """
    body = binascii.b2a_base64(message.body, newline=False).decode("ascii")
    attributes = json.dumps(message.attributes) if message.attributes else "{}"
    types = json.dumps(message.attribute_types) if message.attribute_types else "{}"
    text = (
        f'{{"message_id": "{message.message_id}", "receipt_handle": "{message.in_flight_name}", '
        f'"body_base64": "{body}", "content_type": {_json_string(message.content_type)}, '
        f'"attributes": {attributes}, "attribute_types": {types}, "sent_timestamp_ms": {message.sent_ms}, '
        f'"receive_count": {message.receive_count}, "first_receive_timestamp_ms": {message.first_receive_ms}, '
        f'"visibility_deadline_ms": {message.deadline_ms}'
    )
    if fifo_fields:
        return f"{text}, {json.dumps(fifo_fields)[1:]}"
    return text + "}"


def received_messages_text(items: list[str]) -> str:
    """``{"messages": [...]}`` of items made by :func:`received_json` (the JSON receive's 200 body, as text)."""
    return f'{{"messages": [{", ".join(items)}]}}'


def batch_ids_text(ok_ids: list[str], failed: list[dict[str, Any]]) -> str:
    """``{"successful": [{"id"}], "failed": [...]}`` of a batch whose successes carry only their id, as text.

    Args:
        ok_ids: The ids of the entries that succeeded, in order: 1-80 characters of ``[A-Za-z0-9_-]``
            (checked by ``daemons._http.batch_entries``), so they need no escaping.
        failed: The ``failed`` items (``daemons._http.failed_entry``), in order.
    """
    ok = ", ".join([f'{{"id": "{entry_id}"}}' for entry_id in ok_ids])
    return f'{{"successful": [{ok}], "failed": {json.dumps(failed) if failed else "[]"}}}'
