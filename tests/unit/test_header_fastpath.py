"""The usual send's message header (no attributes; a content type or none) is preformatted: the general form's bytes."""

from __future__ import annotations

import json

import pytest

from mqcore import model


def general_form(body_bytes: int, queue: str, content_type: str | None = None) -> bytes:
    """What ``encode_header`` wrote for every message before the preformatted path (docs/protocol.md 4)."""
    header: dict[str, object] = {"body_bytes": body_bytes}
    if content_type:
        header["content_type"] = content_type
    header["queue"] = queue
    return model.MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n"


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


@pytest.mark.parametrize(
    "content_type",
    ["application/octet-stream", "text/plain; charset=utf-8", 'x/"q"\\b', "text/caf\u00e9", "a" * 128, "a" * 129],
)
@pytest.mark.parametrize("queue", ["q", "orders.fifo"])
def test_a_content_type_gives_the_general_forms_bytes(content_type: str, queue: str) -> None:
    for _ in range(2):  # the first call fills the cache, the second reads it
        assert model.encode_header(1024, content_type, None, queue) == general_form(1024, queue, content_type)
        assert model.encode_header(7, content_type, {}, queue) == general_form(7, queue, content_type)
