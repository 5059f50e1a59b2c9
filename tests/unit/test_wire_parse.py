"""daemons._wire's request parse keeps header blocks it has seen: the same answers, never shared headers."""

from __future__ import annotations

import pytest

from daemons import _wire
from daemons._http import received_headers
from mqcore.model import ReceivedMessage

GET = b"GET /q/messages HTTP/1.1\r\nHost: localhost:8080"
POST = b"POST /q/messages HTTP/1.1\r\nHost: h\r\nContent-Type: application/octet-stream\r\nContent-Length: 1024"


def test_a_block_seen_again_parses_the_same_and_its_headers_are_the_requests_own():
    first = _wire._parse(POST)
    again = _wire._parse(POST)
    assert (
        first
        == again
        == (
            "POST",
            "/q/messages",
            1,
            True,
            {"host": "h", "content-type": "application/octet-stream", "content-length": "1024"},
            1024,
        )
    )
    assert first is not None and again is not None and first[4] is not again[4]
    first[4]["host"] = "changed"  # a request's headers are its own: the next one is not affected
    third = _wire._parse(POST)
    assert third is not None and third[4]["host"] == "h"
    # The same block behind another request line: its own method, target and version.
    delete = _wire._parse(b"DELETE /q/messages/abc HTTP/1.0\r\nHost: localhost:8080")
    get = _wire._parse(GET)
    assert delete is not None and delete[:4] == ("DELETE", "/q/messages/abc", 0, False)
    assert get is not None and get[:4] == ("GET", "/q/messages", 1, True)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /q/messages HTTP/1.1",  # no Host
        b"GET /q/messages HTTP/1.1\r\nHost: a\r\nHost: b",  # a name twice
        b"GET /q/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 5",  # a body on a GET
        b"POST /q/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 5x",
        b"POST /q/messages HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked",
        b"GET /q/messages HTTP/1.1\r\nHost: a\r\n folded",
        b"GET /q/messages HTTP/1.1\rHost: a",  # CR without LF
        b"GET /q/messages\r HTTP/1.1\r\nHost: a",
        b"GET /q/messages HTTP/1.1\r\nHost: a\r\nConnection: upgrade",
        b"PUT /q HTTP/1.1\r\nHost: a",
        b"GET /q/messages HTTP/1.1\r\nHost: \xc3\xa9",  # not ASCII
    ],
)
def test_a_head_outside_the_grammar_is_refused_every_time(head: bytes):
    assert _wire._parse(head) is None
    assert _wire._parse(head) is None


def test_a_long_block_is_parsed_but_not_kept():
    head = GET + b"\r\nX-Pad: " + b"p" * 2000
    for _ in range(2):
        got = _wire._parse(head)
        assert got is not None and got[4]["x-pad"] == "p" * 2000
    assert head[head.find(b"\r") :] not in _wire._BLOCKS


def _message(**fields: object) -> ReceivedMessage:
    base: dict[str, object] = {
        "queue": "q",
        "message_id": "0193a3b2c4d57e6f8819a2a3b4c5d6e7",
        "body": b"x" * 10,
        "content_type": "text/plain; charset=utf-8",
        "receive_count": 2,
        "deadline_ms": 1795531692039,
        "in_flight_name": "1795531692039.q.0193a3b2c4d57e6f8819a2a3b4c5d6e7.2.d28583c053fd3545",
        "first_receive_ms": 1795531662039,
    }
    base.update(fields)
    return ReceivedMessage(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        _message(),
        _message(attributes={"k": "v é"}, attribute_types={"k": "String"}),
        _message(queue="q.fifo", group_id="g", dedup_id="d"),
    ],
    ids=["plain", "attributes", "fifo"],
)
def test_a_raw_receive_head_has_the_headers_of_received_headers_in_their_order(message: ReceivedMessage) -> None:
    expected = "".join(f"{k}: {v}\r\n" for k, v in received_headers(message).items()).encode()
    assert _wire._received_fields(message) == expected
