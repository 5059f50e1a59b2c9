"""The usual send's message header (no content type, no attributes) is preformatted: the general form's bytes."""

from __future__ import annotations

import json

import pytest

from mqcore import model


def general_form(body_bytes: int, queue: str) -> bytes:
    """What ``encode_header`` wrote for every message before the preformatted path (docs/protocol.md 4)."""
    return model.MAGIC + json.dumps({"body_bytes": body_bytes, "queue": queue}, separators=(",", ":")).encode() + b"\n"


@pytest.mark.parametrize("queue", ["q", "bench_queue", "a-b_c", "orders.fifo", "x" * 80])
@pytest.mark.parametrize("body_bytes", [0, 1, 1024, 1 << 20])
def test_the_usual_header_is_the_general_forms_bytes(queue: str, body_bytes: int) -> None:
    assert model.encode_header(body_bytes, None, None, queue) == general_form(body_bytes, queue)
    assert model.encode_header(body_bytes, "", {}, queue) == general_form(body_bytes, queue)  # empty = absent


def test_headers_with_more_keys_take_the_general_path() -> None:
    head = model.encode_header(3, "text/plain", {"a": "1"}, "q", {"a": "Number"})
    assert json.loads(head[len(model.MAGIC) :]) == {
        "body_bytes": 3,
        "content_type": "text/plain",
        "attributes": {"a": "1"},
        "attribute_types": {"a": "Number"},
        "queue": "q",
    }
    assert model.encode_header(3, None, None, None) == model.MAGIC + b'{"body_bytes":3}\n'
