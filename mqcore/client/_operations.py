"""The mq HTTP API written once, as operations that :mod:`mqcore.client._http`'s two drivers run.

Every API method is an *operation*: a generator that yields the HTTP requests
it needs (:class:`Request`), receives each successful answer
(:class:`Response`) or has the typed error thrown into it, and returns the
method's result. An operation takes the parameters of its method exactly
(names, keyword-only ones, defaults: ``mqcore.client.api.QueueClient``), as
the clients' methods are made from it (``mqcore.client._http``); the methods
written in terms of others (``send_json``, ``ack``, ``nack``, ``iter_peek``)
are the Protocols'. The operation holds all the API knowledge (paths, query
parameters, JSON bodies, how to read the answer, how batches are split); it
performs no I/O, so :class:`~mqcore.client.Client` drives it over
``httpx.Client`` and :class:`~mqcore.client.AsyncClient` over
``httpx.AsyncClient`` (the hypercorn style: a protocol core without an I/O
framework).

Names: queue names are checked with :func:`mqcore.names.check_queue_name`
and message ids with :func:`mqcore.names.check_message_id` before any URL is
built (``InvalidQueueName`` / ``InvalidMessageId``, no request is sent), so
nothing a caller passes can address another path. Receipt handles travel in
JSON bodies (the batch endpoints), never in a URL, and are never parsed
(docs/api.md: receipt handles are opaque).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Unpack
from urllib.parse import quote

from mqcore.attributes import MAX_WAIT_SECONDS
from mqcore.client.options import (
    PEEK_DEFAULTS,
    RECEIVE_DEFAULTS,
    PeekOptions,
    ReceiveOptions,
    SendOptions,
    check_options,
    completed,
)
from mqcore.client.types import TEXT_CONTENT_TYPE, BatchEntry, Message, PeekedMessage, PeekPage
from mqcore.errors import InvalidRequest, MessageTooLarge, MQError, error_from_json
from mqcore.limits import DEFAULT_BATCH_MESSAGES, MAX_PEEK_LIMIT
from mqcore.names import check_bulk_key, check_fifo_id, check_message_id, check_queue_name

T = TypeVar("T")

#: Entries per request of ``delete_batch`` / ``change_visibility_batch`` / ``delete_by_ids`` (SQS: 10 per batch).
HANDLE_BATCH_SIZE = DEFAULT_BATCH_MESSAGES
#: The options of a send (an HTTP header each).
SEND_OPTIONS = SendOptions.__optional_keys__
#: Ids per request of ``peek_ids`` (the server's limit, ``MAX_PEEK_LIMIT``).
PEEK_IDS_BATCH_SIZE = MAX_PEEK_LIMIT


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request of an operation.

    Attributes:
        method: HTTP method.
        path: Absolute path below the base URL, already safe (checked names, quoted ids).
        params: Query parameters (None = none).
        json: JSON body (None = no JSON body).
        content: Raw body (single send).
        headers: Extra request headers.
        extra_read_seconds: Added to the client's read timeout: the longest the server may
            legitimately wait before answering (long polling, a send waiting for room).
    """

    method: str
    path: str
    params: Mapping[str, str | int] | None = None
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    extra_read_seconds: float = 0.0

    def describe(self) -> str:
        """``METHOD /path`` for log lines and error messages."""
        return f"{self.method} {self.path}"


@dataclass(frozen=True, slots=True)
class Response:
    """A successful (2xx) answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            MQError: The body is not JSON (not an mq server, or a proxy answered).
        """
        try:
            return json.loads(self.body)
        except ValueError:
            raise MQError(
                f"the server answered {self.status} with a body that is not JSON", status=self.status
            ) from None


#: An operation: yields requests, is sent their answers (or thrown their errors), returns T.
Op = Generator[Request, Response, T]


def _queue_path(queue: str, *rest: str) -> str:
    """``/queue/rest...`` after checking the queue name (InvalidQueueName, before any request)."""
    return "/" + "/".join((check_queue_name(queue), *rest))


def _body_bytes(body: bytes | str, content_type: str | None) -> tuple[bytes, str | None]:
    """The bytes to send and their content type: str -> UTF-8 + text/plain unless given."""
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or TEXT_CONTENT_TYPE
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def _attributes_header(attributes: Mapping[str, str]) -> str:
    """``X-Message-Attributes``: compact JSON, non-ASCII as ``\\u`` escapes (it is a header)."""
    return json.dumps(dict(attributes), separators=(",", ":"), ensure_ascii=True)


def _entry_error(item: Mapping[str, Any]) -> MQError:
    """The typed error of a batch answer's ``failed`` item (``error``, ``message``, ``sender_fault``)."""
    status = 400 if item.get("sender_fault", True) else 503
    return error_from_json(dict(item), status)


def _batch_results(answer: Any, count: int, success: Callable[[Mapping[str, Any]], T]) -> list[T | MQError]:
    """Per-entry results of a batch answer, in entry order (entry ids are ``"0"``..``str(count - 1)``)."""
    by_id: dict[str, T | MQError] = {}
    for item in answer.get("successful", []):
        by_id[str(item.get("id"))] = success(item)
    for item in answer.get("failed", []):
        by_id[str(item.get("id"))] = _entry_error(item)
    return [
        by_id[str(i)] if str(i) in by_id else MQError("the server's batch answer has no result for this entry")
        for i in range(count)
    ]


def _stored(queue: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a received and a peeked message share, from one entry of a JSON answer."""
    return {
        "queue": queue,
        "message_id": item["message_id"],
        "body": base64.b64decode(item["body_base64"]),
        "content_type": item["content_type"],
        "attributes": dict(item.get("attributes") or {}),
        "sent_ms": item["sent_timestamp_ms"],
        "receive_count": item["receive_count"],
    }


def _message(queue: str, item: Mapping[str, Any]) -> Message:
    """A :class:`Message` from one entry of a JSON receive answer."""
    return Message(
        **_stored(queue, item),
        receipt_handle=item["receipt_handle"],
        first_receive_ms=item["first_receive_timestamp_ms"],
        visibility_deadline_ms=item["visibility_deadline_ms"],
        group_id=item.get("group_id"),
        deduplication_id=item.get("deduplication_id"),
        sequence_number=item.get("sequence_number"),
    )


def _peeked(queue: str, item: Mapping[str, Any]) -> PeekedMessage:
    """A :class:`PeekedMessage` from one entry of a peek answer."""
    return PeekedMessage(
        **_stored(queue, item),
        state=item["state"],
        # the wire key's glossary name (docs/api.md), or its deprecated one from an older server
        visibility_deadline_ms=item.get("visibility_deadline_ms", item.get("visible_at_ms")),
        source_queue=item.get("source_queue"),
        group_id=item.get("group_id"),
    )


def list_queues(prefix: str = "") -> Op[list[str]]:
    """Every queue name starting with ``prefix``: ``GET /`` page by page (1,000 names a page, ``next_after``)."""
    names: list[str] = []
    after: str | None = None
    while True:
        params = {"prefix": prefix} if prefix else {}
        if after:
            params["after"] = after
        answer = yield Request("GET", "/", params or None)
        page = answer.json()
        names.extend(page["queues"])
        after = page.get("next_after")
        if not after:
            return names


def create_queue(queue: str, attributes: Mapping[str, Any] | None = None) -> Op[bool]:
    answer = yield Request("PUT", _queue_path(queue), json=dict(attributes) if attributes else None)
    return bool(answer.json()["created"])


def delete_queue(queue: str) -> Op[None]:
    yield Request("DELETE", _queue_path(queue))


def queue_stats(queue: str) -> Op[dict[str, Any]]:
    answer = yield Request("GET", _queue_path(queue))
    return dict(answer.json())


def get_attributes(queue: str) -> Op[dict[str, Any]]:
    answer = yield Request("GET", _queue_path(queue, "attributes"))
    return dict(answer.json()["attributes"])


def set_attributes(queue: str, changes: Mapping[str, Any]) -> Op[dict[str, Any]]:
    answer = yield Request("PUT", _queue_path(queue, "attributes"), json=dict(changes))
    return dict(answer.json()["attributes"])


def purge(queue: str) -> Op[int]:
    answer = yield Request("POST", _queue_path(queue, "purge"))
    return int(answer.json()["removed"])


def send(queue: str, body: bytes | str, **options: Unpack[SendOptions]) -> Op[str]:
    check_options(options, SEND_OPTIONS, "send")  # an option left out is None (SendOptions)
    path = _queue_path(queue, "messages")
    data, content_type = _body_bytes(body, options.get("content_type"))
    headers: dict[str, str] = {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if (delay_seconds := options.get("delay_seconds")) is not None:
        headers["X-Delay-Seconds"] = str(delay_seconds)
    if attributes := options.get("attributes"):
        headers["X-Message-Attributes"] = _attributes_header(attributes)
    # FIFO queues (docs/api.md "FIFO queues"); checked here too, as a header cannot carry every string.
    if (group_id := options.get("group_id")) is not None:
        headers["X-Message-Group-Id"] = check_fifo_id(group_id, "group_id")
    if (deduplication_id := options.get("deduplication_id")) is not None:
        headers["X-Message-Deduplication-Id"] = check_fifo_id(deduplication_id, "deduplication_id")
    # A send to a full queue may wait up to capacity_wait_seconds (0-20) for room.
    answer = yield Request("POST", path, content=data, headers=headers, extra_read_seconds=MAX_WAIT_SECONDS)
    return str(answer.json()["message_id"])


def _batch_item(entry: bytes | str | BatchEntry) -> dict[str, Any]:
    """The JSON of one batch send entry (without its id); bodies always as base64."""
    if not isinstance(entry, BatchEntry):
        entry = BatchEntry(entry)
    data, content_type = _body_bytes(entry.body, entry.content_type)
    item: dict[str, Any] = {"body_base64": base64.b64encode(data).decode("ascii")}
    if content_type is not None:
        item["content_type"] = content_type
    if entry.attributes:
        item["attributes"] = dict(entry.attributes)
    if entry.delay_seconds is not None:
        item["delay_seconds"] = entry.delay_seconds
    if entry.group_id is not None:
        item["group_id"] = entry.group_id
    if entry.deduplication_id is not None:
        item["deduplication_id"] = entry.deduplication_id
    return item


def send_batch(
    queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = DEFAULT_BATCH_MESSAGES
) -> Op[list[str | MQError]]:
    if batch_size < 1:
        raise InvalidRequest(f"batch_size must be at least 1, got {batch_size}")
    path = _queue_path(queue, "messages", "batch")
    items = [_batch_item(entry) for entry in entries]
    results: list[str | MQError] = []
    for start in range(0, len(items), batch_size):
        results += yield from _send_chunk(path, items[start : start + batch_size])
    return results


def _send_chunk(path: str, items: list[dict[str, Any]]) -> Op[list[str | MQError]]:
    """Send one chunk; a chunk refused whole as too large is split in halves until each entry is alone.

    The server refuses a batch whose bodies together exceed ``max_message_bytes`` (413, nothing
    sent), though each could be sent on its own; an entry too large alone gets MessageTooLarge.
    """
    body = {"entries": [dict(item, id=str(i)) for i, item in enumerate(items)]}
    try:
        answer = yield Request("POST", path, json=body, extra_read_seconds=MAX_WAIT_SECONDS)
    except MessageTooLarge as exc:
        if len(items) == 1:
            return [exc]
        half = len(items) // 2
        first = yield from _send_chunk(path, items[:half])
        second = yield from _send_chunk(path, items[half:])
        return first + second
    return _batch_results(answer.json(), len(items), lambda ok: str(ok["message_id"]))


def _given(**params: str | int | None) -> dict[str, str | int]:
    """The query parameters that are not None, in the order given (None = leave it to the server)."""
    return {name: value for name, value in params.items() if value is not None}


def receive(queue: str, **options: Unpack[ReceiveOptions]) -> Op[list[Message]]:
    args = completed(options, RECEIVE_DEFAULTS, "receive")  # max_messages always: the JSON form
    path = _queue_path(queue, "messages")
    params = _given(**args)
    # Without wait_time_seconds the queue's receive_wait_seconds (at most 20) applies.
    wait_time_seconds = args["wait_time_seconds"]
    wait = MAX_WAIT_SECONDS if wait_time_seconds is None else max(0, wait_time_seconds)
    answer = yield Request("GET", path, params, extra_read_seconds=wait)
    return [_message(queue, item) for item in answer.json()["messages"]]


def delete_batch(queue: str, receipt_handles: Sequence[str]) -> Op[list[MQError | None]]:
    path = _queue_path(queue, "messages", "delete")
    results: list[MQError | None] = []
    for start in range(0, len(receipt_handles), HANDLE_BATCH_SIZE):
        chunk = receipt_handles[start : start + HANDLE_BATCH_SIZE]
        entries = [{"id": str(i), "receipt_handle": handle} for i, handle in enumerate(chunk)]
        answer = yield Request("POST", path, json={"entries": entries})
        results += _batch_results(answer.json(), len(chunk), lambda ok: None)
    return results


def delete(queue: str, receipt_handle: str) -> Op[None]:
    (result,) = yield from delete_batch(queue, [receipt_handle])
    if result is not None:
        raise result


def delete_by_id(queue: str, message_id: str) -> Op[None]:
    path = _queue_path(queue, "messages", quote(check_message_id(message_id), safe=""))
    yield Request("DELETE", path)


def change_visibility_batch(queue: str, entries: Sequence[tuple[str, int]]) -> Op[list[int | MQError]]:
    path = _queue_path(queue, "messages", "visibility")
    results: list[int | MQError] = []
    for start in range(0, len(entries), HANDLE_BATCH_SIZE):
        chunk = entries[start : start + HANDLE_BATCH_SIZE]
        items = [
            {"id": str(i), "receipt_handle": handle, "visibility_timeout_seconds": seconds}
            for i, (handle, seconds) in enumerate(chunk)
        ]
        answer = yield Request("POST", path, json={"entries": items})
        results += _batch_results(answer.json(), len(chunk), lambda ok: int(ok["visibility_deadline_ms"]))
    return results


def change_visibility(queue: str, receipt_handle: str, visibility_timeout_seconds: int) -> Op[int]:
    (result,) = yield from change_visibility_batch(queue, [(receipt_handle, visibility_timeout_seconds)])
    if isinstance(result, MQError):
        raise result
    return result


def lease_bulk(
    queue: str, key: str, *, max_messages: int = 10, visibility_timeout_seconds: int | None = None
) -> Op[list[Message]]:
    path = _queue_path(queue, "leases", check_bulk_key(key))
    body = _given(max_messages=max_messages, visibility_timeout_seconds=visibility_timeout_seconds)
    # Leasing a micro-batch's share of 10,000 messages takes the server a while: give it the longest wait.
    answer = yield Request("POST", path, json=body, extra_read_seconds=MAX_WAIT_SECONDS)
    return [_message(queue, item) for item in answer.json()["messages"]]


def delete_bulk(queue: str, key: str) -> Op[int]:
    answer = yield Request("DELETE", _queue_path(queue, "leases", check_bulk_key(key)))
    return int(answer.json()["deleted"])


def peek(queue: str, **options: Unpack[PeekOptions]) -> Op[PeekPage]:
    params = _given(**completed(options, PEEK_DEFAULTS, "peek"))
    answer = yield Request("GET", _queue_path(queue, "peek"), params)
    data = answer.json()
    return PeekPage([_peeked(queue, item) for item in data["messages"]], data.get("next_after"))


def peek_ids(queue: str, message_ids: Sequence[str]) -> Op[list[PeekedMessage]]:
    path = _queue_path(queue, "peek")
    out: list[PeekedMessage] = []
    for start in range(0, len(message_ids), PEEK_IDS_BATCH_SIZE):
        chunk = [check_message_id(i) for i in message_ids[start : start + PEEK_IDS_BATCH_SIZE]]
        answer = yield Request("POST", path, json={"message_ids": chunk})
        out += [_peeked(queue, item) for item in answer.json()["messages"]]
    return out


def delete_by_ids(queue: str, message_ids: Sequence[str]) -> Op[list[MQError | None]]:
    path = _queue_path(queue, "messages", "delete")
    results: list[MQError | None] = []
    for start in range(0, len(message_ids), HANDLE_BATCH_SIZE):
        chunk = [check_message_id(i) for i in message_ids[start : start + HANDLE_BATCH_SIZE]]
        entries = [{"id": str(i), "message_id": message_id} for i, message_id in enumerate(chunk)]
        answer = yield Request("POST", path, json={"entries": entries})
        results += _batch_results(answer.json(), len(chunk), lambda ok: None)
    return results


def start_redrive(
    queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
) -> Op[dict[str, Any]]:
    body: dict[str, Any] = {}
    if destination is not None:
        body["destination"] = destination
    if max_messages_per_second is not None:
        body["max_messages_per_second"] = max_messages_per_second
    answer = yield Request("POST", _queue_path(queue, "redrive"), json=body)
    return dict(answer.json()["task"])


def redrive_status(queue: str) -> Op[dict[str, Any] | None]:
    answer = yield Request("GET", _queue_path(queue, "redrive"))
    task = answer.json()["task"]
    return None if task is None else dict(task)


def cancel_redrive(queue: str) -> Op[dict[str, Any]]:
    answer = yield Request("DELETE", _queue_path(queue, "redrive"))
    return dict(answer.json()["task"])
