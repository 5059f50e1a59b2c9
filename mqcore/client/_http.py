"""HTTP clients for the mq daemon: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

One implementation of the API, two drivers. Every API method is written once,
as an *operation*: a generator that yields the HTTP requests it needs
(:class:`_Request`), receives each successful answer (:class:`_Response`) or
has the typed error thrown into it, and returns the method's result. The
operation holds all the API knowledge (paths, query parameters, JSON bodies,
how to read the answer, how batches are split). :class:`Client` drives
operations over one ``httpx.Client`` and :class:`AsyncClient` over one
``httpx.AsyncClient`` (so every call reuses the pool's keep-alive
connections); the drivers only perform requests and retry them.

Retries (tenacity): a request that fails with :class:`~mqcore.errors.ConnectionFailed`
(no complete answer: refused, reset, timed out) or with an error whose class
is ``retriable`` (``503 storage_unavailable``, ``429 queue_full``) is sent
again, at most ``max_retries`` more times, after an exponential backoff with
full jitter ("Full Jitter", AWS Architecture Blog) that is at least the
server's ``Retry-After``. When the retries are used up, the last error is
raised. Errors answered by the server are rebuilt with
:func:`mqcore.errors.error_from_json`, so callers catch the same classes as
the daemons raise.

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
import logging
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from mqcore.attributes import MAX_WAIT_SECONDS
from mqcore.client._types import JSON_CONTENT_TYPE, TEXT_CONTENT_TYPE, BatchEntry, Message, PeekedMessage, PeekPage
from mqcore.errors import ConnectionFailed, InvalidRequest, MessageTooLarge, MQError, error_from_json
from mqcore.names import check_message_id, check_queue_name
from mqcore.protocol import MAX_PEEK_LIMIT

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Default base URL of the mq daemon.
DEFAULT_URL = "http://127.0.0.1:8080"
#: Entries per request of ``delete_batch`` / ``change_visibility_batch`` (SQS: 10 per batch).
HANDLE_BATCH_SIZE = 10
#: Default entries per request of ``send_batch`` (SQS: 10; ``mq --max-batch-messages`` allows up to 1,000).
SEND_BATCH_SIZE = 10
#: Default page size of ``peek`` / ``iter_peek``, in messages (the server allows 1-1,000).
PEEK_PAGE_SIZE = 100
#: Ids per request of ``peek_ids`` (the server's limit, ``MAX_PEEK_LIMIT``).
PEEK_IDS_BATCH_SIZE = MAX_PEEK_LIMIT


# -- the API, written once ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
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
class _Response:
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
_Op = Generator[_Request, _Response, T]


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


def _message(queue: str, item: Mapping[str, Any]) -> Message:
    """A :class:`Message` from one entry of a JSON receive answer."""
    return Message(
        queue=queue,
        message_id=item["message_id"],
        receipt_handle=item["receipt_handle"],
        body=base64.b64decode(item["body_base64"]),
        content_type=item["content_type"],
        attributes=dict(item.get("attributes") or {}),
        sent_ms=item["sent_timestamp_ms"],
        receive_count=item["receive_count"],
        first_receive_ms=item["first_receive_timestamp_ms"],
        visibility_deadline_ms=item["visibility_deadline_ms"],
    )


def _peeked(queue: str, item: Mapping[str, Any]) -> PeekedMessage:
    """A :class:`PeekedMessage` from one entry of a peek answer."""
    return PeekedMessage(
        queue=queue,
        message_id=item["message_id"],
        state=item["state"],
        body=base64.b64decode(item["body_base64"]),
        content_type=item["content_type"],
        attributes=dict(item.get("attributes") or {}),
        sent_ms=item["sent_timestamp_ms"],
        receive_count=item["receive_count"],
        visible_at_ms=item.get("visible_at_ms"),
        source_queue=item.get("source_queue"),
    )


def _list_queues_op(prefix: str) -> _Op[list[str]]:
    answer = yield _Request("GET", "/", {"prefix": prefix} if prefix else None)
    return list(answer.json()["queues"])


def _create_queue_op(queue: str, attributes: Mapping[str, Any] | None) -> _Op[bool]:
    answer = yield _Request("PUT", _queue_path(queue), json=dict(attributes) if attributes else None)
    return bool(answer.json()["created"])


def _delete_queue_op(queue: str) -> _Op[None]:
    yield _Request("DELETE", _queue_path(queue))


def _queue_stats_op(queue: str) -> _Op[dict[str, Any]]:
    answer = yield _Request("GET", _queue_path(queue))
    return dict(answer.json())


def _get_attributes_op(queue: str) -> _Op[dict[str, Any]]:
    answer = yield _Request("GET", _queue_path(queue, "attributes"))
    return dict(answer.json()["attributes"])


def _set_attributes_op(queue: str, changes: Mapping[str, Any]) -> _Op[dict[str, Any]]:
    answer = yield _Request("PUT", _queue_path(queue, "attributes"), json=dict(changes))
    return dict(answer.json()["attributes"])


def _purge_op(queue: str) -> _Op[int]:
    answer = yield _Request("POST", _queue_path(queue, "purge"))
    return int(answer.json()["removed"])


def _send_op(
    queue: str,
    body: bytes | str,
    content_type: str | None,
    attributes: Mapping[str, str] | None,
    delay_seconds: int | None,
) -> _Op[str]:
    path = _queue_path(queue, "messages")
    data, content_type = _body_bytes(body, content_type)
    headers: dict[str, str] = {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if delay_seconds is not None:
        headers["X-Delay-Seconds"] = str(delay_seconds)
    if attributes:
        headers["X-Message-Attributes"] = _attributes_header(attributes)
    # A send to a full queue may wait up to capacity_wait_seconds (0-20) for room.
    answer = yield _Request("POST", path, content=data, headers=headers, extra_read_seconds=MAX_WAIT_SECONDS)
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
    return item


def _send_batch_op(
    queue: str, entries: Iterable[bytes | str | BatchEntry], batch_size: int
) -> _Op[list[str | MQError]]:
    if batch_size < 1:
        raise InvalidRequest(f"batch_size must be at least 1, got {batch_size}")
    path = _queue_path(queue, "messages", "batch")
    items = [_batch_item(entry) for entry in entries]
    results: list[str | MQError] = []
    for start in range(0, len(items), batch_size):
        results += yield from _send_chunk_op(path, items[start : start + batch_size])
    return results


def _send_chunk_op(path: str, items: list[dict[str, Any]]) -> _Op[list[str | MQError]]:
    """Send one chunk; a chunk refused whole as too large is split in halves until each entry is alone.

    The server refuses a batch whose bodies together exceed ``max_message_bytes`` (413, nothing
    sent), though each could be sent on its own; an entry too large alone gets MessageTooLarge.
    """
    body = {"entries": [dict(item, id=str(i)) for i, item in enumerate(items)]}
    try:
        answer = yield _Request("POST", path, json=body, extra_read_seconds=MAX_WAIT_SECONDS)
    except MessageTooLarge as exc:
        if len(items) == 1:
            return [exc]
        half = len(items) // 2
        first = yield from _send_chunk_op(path, items[:half])
        second = yield from _send_chunk_op(path, items[half:])
        return first + second
    return _batch_results(answer.json(), len(items), lambda ok: str(ok["message_id"]))


def _receive_op(
    queue: str,
    max_messages: int,
    wait_time_seconds: int | None,
    visibility_timeout_seconds: int | None,
    attempt_id: str | None,
    partition: int | None,
    partitions: int | None,
) -> _Op[list[Message]]:
    path = _queue_path(queue, "messages")
    params: dict[str, str | int] = {"max_messages": max_messages}  # always the JSON form
    if wait_time_seconds is not None:
        params["wait_time_seconds"] = wait_time_seconds
    if visibility_timeout_seconds is not None:
        params["visibility_timeout_seconds"] = visibility_timeout_seconds
    if attempt_id is not None:
        params["attempt_id"] = attempt_id
    if partition is not None:
        params["partition"] = partition
    if partitions is not None:
        params["partitions"] = partitions
    # Without wait_time_seconds the queue's receive_wait_seconds (at most 20) applies.
    wait = MAX_WAIT_SECONDS if wait_time_seconds is None else max(0, wait_time_seconds)
    answer = yield _Request("GET", path, params, extra_read_seconds=wait)
    return [_message(queue, item) for item in answer.json()["messages"]]


def _delete_batch_op(queue: str, receipt_handles: Sequence[str]) -> _Op[list[MQError | None]]:
    path = _queue_path(queue, "messages", "delete")
    results: list[MQError | None] = []
    for start in range(0, len(receipt_handles), HANDLE_BATCH_SIZE):
        chunk = receipt_handles[start : start + HANDLE_BATCH_SIZE]
        entries = [{"id": str(i), "receipt_handle": handle} for i, handle in enumerate(chunk)]
        answer = yield _Request("POST", path, json={"entries": entries})
        results += _batch_results(answer.json(), len(chunk), lambda ok: None)
    return results


def _delete_op(queue: str, receipt_handle: str) -> _Op[None]:
    (result,) = yield from _delete_batch_op(queue, [receipt_handle])
    if result is not None:
        raise result


def _delete_by_id_op(queue: str, message_id: str) -> _Op[None]:
    path = _queue_path(queue, "messages", quote(check_message_id(message_id), safe=""))
    yield _Request("DELETE", path)


def _change_visibility_batch_op(queue: str, entries: Sequence[tuple[str, int]]) -> _Op[list[int | MQError]]:
    path = _queue_path(queue, "messages", "visibility")
    results: list[int | MQError] = []
    for start in range(0, len(entries), HANDLE_BATCH_SIZE):
        chunk = entries[start : start + HANDLE_BATCH_SIZE]
        items = [
            {"id": str(i), "receipt_handle": handle, "visibility_timeout_seconds": timeout_seconds}
            for i, (handle, timeout_seconds) in enumerate(chunk)
        ]
        answer = yield _Request("POST", path, json={"entries": items})
        results += _batch_results(answer.json(), len(chunk), lambda ok: int(ok["visibility_deadline_ms"]))
    return results


def _change_visibility_op(queue: str, receipt_handle: str, timeout_seconds: int) -> _Op[int]:
    (result,) = yield from _change_visibility_batch_op(queue, [(receipt_handle, timeout_seconds)])
    if isinstance(result, MQError):
        raise result
    return result


def _peek_op(queue: str, after: str | None, limit: int, partition: int | None, partitions: int | None) -> _Op[PeekPage]:
    params: dict[str, str | int] = {"limit": limit}
    if after is not None:
        params["after"] = after
    if partition is not None:
        params["partition"] = partition
    if partitions is not None:
        params["partitions"] = partitions
    answer = yield _Request("GET", _queue_path(queue, "peek"), params)
    data = answer.json()
    return PeekPage([_peeked(queue, item) for item in data["messages"]], data.get("next_after"))


def _peek_ids_op(queue: str, message_ids: Sequence[str]) -> _Op[list[PeekedMessage]]:
    path = _queue_path(queue, "peek")
    out: list[PeekedMessage] = []
    for start in range(0, len(message_ids), PEEK_IDS_BATCH_SIZE):
        chunk = [check_message_id(i) for i in message_ids[start : start + PEEK_IDS_BATCH_SIZE]]
        answer = yield _Request("POST", path, json={"message_ids": chunk})
        out += [_peeked(queue, item) for item in answer.json()["messages"]]
    return out


def _delete_by_ids_op(queue: str, message_ids: Sequence[str]) -> _Op[list[MQError | None]]:
    path = _queue_path(queue, "messages", "delete")
    results: list[MQError | None] = []
    for start in range(0, len(message_ids), HANDLE_BATCH_SIZE):
        chunk = [check_message_id(i) for i in message_ids[start : start + HANDLE_BATCH_SIZE]]
        entries = [{"id": str(i), "message_id": message_id} for i, message_id in enumerate(chunk)]
        answer = yield _Request("POST", path, json={"entries": entries})
        results += _batch_results(answer.json(), len(chunk), lambda ok: None)
    return results


def _start_redrive_op(queue: str, destination: str | None, max_messages_per_second: int | None) -> _Op[dict[str, Any]]:
    body: dict[str, Any] = {}
    if destination is not None:
        body["destination"] = destination
    if max_messages_per_second is not None:
        body["max_messages_per_second"] = max_messages_per_second
    answer = yield _Request("POST", _queue_path(queue, "redrive"), json=body)
    return dict(answer.json()["task"])


def _redrive_status_op(queue: str) -> _Op[dict[str, Any] | None]:
    answer = yield _Request("GET", _queue_path(queue, "redrive"))
    task = answer.json()["task"]
    return None if task is None else dict(task)


def _cancel_redrive_op(queue: str) -> _Op[dict[str, Any]]:
    answer = yield _Request("DELETE", _queue_path(queue, "redrive"))
    return dict(answer.json()["task"])


# -- what both drivers share -------------------------------------------------------------------


def _retry_after_header(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta form; an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _answer(response: httpx.Response) -> _Response:
    """The answer if it is 2xx.

    Raises:
        MQError: The typed error of any other status, rebuilt from the JSON error body.
    """
    if 200 <= response.status_code < 300:
        return _Response(response.status_code, response.headers, response.content)
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    raise error_from_json(body, response.status_code, _retry_after_header(response.headers.get("Retry-After")))


def _connection_failed(request: _Request, exc: httpx.TransportError) -> ConnectionFailed:
    """The ConnectionFailed for a transport error (refused, reset, timeout, protocol error)."""
    reason = str(exc) or type(exc).__name__
    return ConnectionFailed(
        f"{request.describe()}: no answer from the server ({type(exc).__name__}: {reason})",
        request=request.describe(),
        reason=type(exc).__name__,
    )


def _is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, MQError) and exc.retriable


class _Base:
    """Settings and retry policy common to :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float,
        max_retries: int,
        backoff_seconds: float,
        max_backoff_seconds: float,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_seconds < 0 or max_backoff_seconds < 0:
            raise ValueError("backoff_seconds and max_backoff_seconds must be >= 0")
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._backoff = wait_random_exponential(multiplier=backoff_seconds, max=max_backoff_seconds)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _timeout(self, request: _Request) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_seconds, read=self.timeout_seconds + request.extra_read_seconds)

    def _wait_seconds(self, state: RetryCallState) -> float:
        """Full-jitter exponential backoff, but at least the error's ``retry_after_seconds``."""
        seconds = self._backoff(state)
        exc = state.outcome.exception() if state.outcome is not None else None
        after = getattr(exc, "retry_after_seconds", None)
        if isinstance(after, int | float) and not isinstance(after, bool):
            seconds = max(seconds, float(after))
        return seconds

    def _retry_options(self, request: _Request) -> dict[str, Any]:
        attempts = self.max_retries + 1

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            sleep = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "retrying %s in %.2f s after %s (attempt %d of %d): %s",
                request.describe(),
                sleep,
                getattr(exc, "code", type(exc).__name__),
                state.attempt_number + 1,
                attempts,
                exc,
            )

        return {
            "stop": stop_after_attempt(attempts),
            "wait": self._wait_seconds,
            "retry": retry_if_exception(_is_retriable),
            "before_sleep": log_retry,
            "reraise": True,
        }


_CLIENT_ARGS_DOC = """
    Args:
        url: Base URL of the mq daemon, e.g. ``http://127.0.0.1:8080`` (a path prefix is kept).
        timeout_seconds: Connect, read, write and pool timeout of each request, in seconds. A
            receive's read timeout is raised by its long-poll wait (``wait_time_seconds``, or 20
            when the queue's ``receive_wait_seconds`` applies) and a send's by 20 (the longest
            ``capacity_wait_seconds`` a full queue may make it wait).
        max_retries: How many more times a request is sent after a ConnectionFailed or a
            retriable error (StorageUnavailable 503, QueueFull 429); 0 = never retry.
        backoff_seconds: Base of the exponential backoff, in seconds: before retry n the client
            sleeps a random time in [0, min(max_backoff_seconds, backoff_seconds * 2 ** (n - 1))]
            (full jitter), and at least the server's Retry-After.
        max_backoff_seconds: Cap of the backoff window, in seconds (a longer Retry-After is honoured).

    Raises:
        ValueError: A negative count or duration, or ``timeout_seconds`` <= 0.
"""


# -- the blocking client -----------------------------------------------------------------------


class Client(_Base):
    """Blocking client of the mq HTTP API (docs/api.md), over one ``httpx.Client``.

    Thread-safe: one client (and its pool of keep-alive connections) can serve many threads.
    Use it as a context manager, or call :meth:`close`.

    Every method raises :class:`~mqcore.errors.ConnectionFailed` when the server gave no answer
    after the retries, :class:`~mqcore.errors.InvalidQueueName` (before any request) for a bad
    queue name, and the :mod:`mqcore.errors` class of any error answer, e.g.
    :class:`~mqcore.errors.QueueNotFound`, :class:`~mqcore.errors.StorageUnavailable` (after the
    retries). Only the errors particular to a method are listed below.
    """

    __doc__ = (__doc__ or "") + _CLIENT_ARGS_DOC

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_seconds: float = 30.0,
        max_retries: int = 3,
        backoff_seconds: float = 0.1,
        max_backoff_seconds: float = 10.0,
    ) -> None:
        super().__init__(
            url,
            timeout_seconds=timeout_seconds,
            max_retries=max_retries,
            backoff_seconds=backoff_seconds,
            max_backoff_seconds=max_backoff_seconds,
        )
        self._http = httpx.Client(base_url=url, timeout=timeout_seconds)

    # -- driver --

    def _once(self, request: _Request) -> _Response:
        try:
            response = self._http.request(
                request.method,
                request.path,
                params=request.params,
                json=request.json,
                content=request.content,
                headers=request.headers,
                timeout=self._timeout(request),
            )
        except httpx.TransportError as exc:
            raise _connection_failed(request, exc) from exc
        return _answer(response)

    def _run(self, op: _Op[T]) -> T:
        try:
            request = next(op)
            while True:
                try:
                    response = Retrying(**self._retry_options(request))(self._once, request)
                except MQError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(response)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- lifecycle --

    def close(self) -> None:
        """Close the connections. The client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- queues --

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues, sorted (``GET /``).

        Args:
            prefix: Only names starting with it (0-80 characters of ``[A-Za-z0-9_-]``).
                SQS: QueueNamePrefix.
        Raises:
            InvalidRequest: ``prefix`` is not 0-80 characters of ``[A-Za-z0-9_-]``.
        """
        return self._run(_list_queues_op(prefix))

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        """Create a queue, with attributes, atomically (``PUT /{queue}``); idempotent.

        Args:
            queue: Queue name, 1-80 characters of ``[A-Za-z0-9_-]`` (SQS's rule).
            attributes: Queue attributes to set (docs/api.md, Queue attributes), e.g.
                ``{"visibility_timeout_seconds": 60, "dead_letter_queue": "jobs-dlq"}``.
        Returns:
            True if the queue was created now, False if it existed already.
        Raises:
            QueueNameExists: The queue exists and a given attribute differs from its value
                (SQS CreateQueue semantics).
            InvalidAttribute: An unknown key or a value out of range (``details["name"]``).
        """
        return self._run(_create_queue_op(queue, attributes))

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and every message in it, ready, in flight or delayed (``DELETE /{queue}``).

        Raises:
            QueueNotFound: The queue does not exist.
        """
        self._run(_delete_queue_op(queue))

    def queue_stats(self, queue: str) -> dict[str, Any]:
        """Counts, attributes and redrive status of a queue (``GET /{queue}``).

        Returns:
            ``{"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds" (float or
            None), "created_ms" (epoch ms or None), "attributes", "redrive" (task status or None)}``;
            counts are approximate with several daemons (as SQS's).
        Raises:
            QueueNotFound: The queue does not exist.
        """
        return self._run(_queue_stats_op(queue))

    def get_attributes(self, queue: str) -> dict[str, Any]:
        """Effective attributes of a queue, every key, defaults filled in (``GET /{queue}/attributes``).

        Raises:
            QueueNotFound: The queue does not exist.
        """
        return self._run(_get_attributes_op(queue))

    def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change some attributes of a queue (``PUT /{queue}/attributes``, a merge).

        Args:
            queue: Queue name.
            changes: Attribute keys to change; a ``None`` value returns the key to its default.
        Returns:
            The effective attributes after the change.
        Raises:
            InvalidAttribute: Unknown key or value out of range (nothing is changed).
            QueueNotFound: The queue does not exist.
        """
        return self._run(_set_attributes_op(queue, changes))

    def purge(self, queue: str) -> int:
        """Delete every message sent before now, in any state (``POST /{queue}/purge``; SQS PurgeQueue).

        Returns:
            How many messages were removed at once (others are never delivered either).
        Raises:
            QueueNotFound: The queue does not exist.
        """
        return self._run(_purge_op(queue))

    # -- sending --

    def send(
        self,
        queue: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """Send one message (``POST /{queue}/messages``); durable when this returns.

        Args:
            queue: Queue name.
            body: ``bytes`` as is; ``str`` as UTF-8 (content type ``text/plain; charset=utf-8``
                unless ``content_type`` is given). At most the queue's ``max_message_bytes``.
            content_type: Stored and returned on receive (default ``application/octet-stream``
                for bytes).
            attributes: Message attributes, name -> string (at most 10; SQS's name rules).
            delay_seconds: 0-900: invisible this long; None = the queue's ``delay_seconds``.
                SQS: DelaySeconds.
        Returns:
            The message id.
        Raises:
            MessageTooLarge: Body plus attributes over ``max_message_bytes``
                (``details["size_bytes"]``, ``details["max_bytes"]``).
            InvalidAttribute: A bad message attribute.
            InvalidRequest: ``delay_seconds`` out of range.
            QueueFull: The queue stayed at its ``capacity`` (after the retries).
            ConnectionFailed: No answer; the message may or may not have been stored (a retry
                after a lost answer can store it twice: delivery is at least once).
        """
        return self._run(_send_op(queue, body, content_type, attributes, delay_seconds))

    def send_json(
        self,
        queue: str,
        value: Any,
        *,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        """Send ``json.dumps(value)`` as UTF-8 with content type ``application/json``.

        Read it back with :meth:`Message.json`. Arguments and errors as :meth:`send`.

        Raises:
            TypeError: ``value`` is not JSON-serialisable (before any request).
        """
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return self.send(
            queue, data, content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = SEND_BATCH_SIZE
    ) -> list[str | MQError]:
        """Send any number of messages, ``batch_size`` per request (``POST /{queue}/messages/batch``).

        A request the server refuses whole because its bodies together exceed
        ``max_message_bytes`` (413) is split in halves and sent again, so each entry that
        fits alone is sent. Entries that failed are not sent again, whatever the error.

        Args:
            queue: Queue name.
            entries: Bodies (as :meth:`send`) or :class:`BatchEntry` with content type,
                attributes and delay.
            batch_size: Entries per request, 1 to the server's ``--max-batch-messages``
                (default 10, as SQS SendMessageBatch).
        Returns:
            One result per entry, in order: the message id, or the error that entry failed
            with (e.g. InvalidAttribute, MessageTooLarge, QueueFull when the queue reached its
            ``capacity``: a batch may be sent in part).
        Raises:
            InvalidRequest: ``batch_size`` < 1 (before any request), or over the server's limit.
            QueueNotFound: The queue does not exist (entries of earlier requests were sent).
        """
        return self._run(_send_batch_op(queue, entries, batch_size))

    # -- receiving --

    def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_time_seconds: int | None = None,
        visibility_timeout_seconds: int | None = None,
        attempt_id: str | None = None,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` ready messages, oldest first (``GET /{queue}/messages``, JSON form).

        Each message stays in flight (invisible) for the visibility timeout; delete it with
        :meth:`delete` / :meth:`ack` before then, or it is delivered again.

        Args:
            queue: Queue name.
            max_messages: 1-10. SQS: MaxNumberOfMessages.
            wait_time_seconds: Long polling: 0-20 seconds to wait for a message when none is
                ready; None = the queue's ``receive_wait_seconds``. SQS: WaitTimeSeconds.
            visibility_timeout_seconds: 0-43,200; None = the queue's. SQS: VisibilityTimeout.
            attempt_id: 1-128 printable ASCII characters: a receive retried with the same
                attempt id within 5 minutes returns the same messages (SQS
                ReceiveRequestAttemptId). Pass one to make the automatic retry after a
                ConnectionFailed safe; without one, messages leased by a lost answer come back
                only after their visibility timeout.
            partition: With ``partitions``: only messages whose id falls in this partition,
                ``0 <= partition < partitions`` (``mqcore.names.partition_of``; SMQ's batches).
            partitions: Number of partitions, 1-1,000; give both or neither.
        Returns:
            The messages, oldest first; ``[]`` when none became ready within the wait.
        Raises:
            InvalidRequest: A parameter out of range, or only one of partition/partitions.
        """
        return self._run(
            _receive_op(
                queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
            )
        )

    def delete(self, queue: str, receipt_handle: str) -> None:
        """Delete a received message by its receipt handle (SQS DeleteMessage).

        Sent as a one-entry ``POST /{queue}/messages/delete`` so the handle stays opaque.

        Raises:
            StaleReceiptHandle: The message was received again since this handle was issued;
                the newer receive is left alone.
            MessageNotFound: Already deleted (or expired, purged, dead-lettered). After a
                retried ConnectionFailed this may mean the first attempt deleted it.
            InvalidReceiptHandle: Malformed, or a handle of another queue.
        """
        self._run(_delete_op(queue, receipt_handle))

    def delete_by_id(self, queue: str, message_id: str) -> None:
        """Delete a message by id wherever it is: ready, in flight, delayed (SoftLayer delete).

        Raises:
            InvalidMessageId: ``message_id`` is not a lowercase UUIDv7 (before any request).
            MessageNotFound: No such message.
        """
        self._run(_delete_by_id_op(queue, message_id))

    def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        """Delete any number of received messages by receipt handle, 10 per request (SQS DeleteMessageBatch).

        Returns:
            One result per handle, in order: None if deleted, else the error (StaleReceiptHandle,
            MessageNotFound, InvalidReceiptHandle, ...).
        """
        return self._run(_delete_batch_op(queue, receipt_handles))

    def change_visibility(self, queue: str, receipt_handle: str, timeout_seconds: int) -> int:
        """Set the visibility timeout of a received message, counted from now (SQS ChangeMessageVisibility).

        Args:
            queue: Queue name.
            receipt_handle: Handle from the receive (it stays valid after the change).
            timeout_seconds: 0-43,200 seconds from now; 0 makes the message ready at once.
        Returns:
            The new visibility deadline, epoch milliseconds.
        Raises:
            StaleReceiptHandle: The message was received again since this handle was issued.
            MessageNotInFlight: Its visibility timeout had already ended.
            MessageNotFound: The message was deleted.
            InvalidRequest: ``timeout_seconds`` out of range.
        """
        return self._run(_change_visibility_op(queue, receipt_handle, timeout_seconds))

    def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        """Change visibility timeouts of any number of received messages, 10 per request.

        Args:
            queue: Queue name.
            entries: ``(receipt_handle, timeout_seconds)`` pairs, as :meth:`change_visibility`.
        Returns:
            One result per entry, in order: the new visibility deadline (epoch ms) or the error.
        """
        return self._run(_change_visibility_batch_op(queue, entries))

    def ack(self, message: Message) -> None:
        """Delete a received message: ``delete(message.queue, message.receipt_handle)``. Errors as :meth:`delete`."""
        self.delete(message.queue, message.receipt_handle)

    def nack(self, message: Message, delay_seconds: int = 0) -> None:
        """Give a received message back, to be received again after ``delay_seconds`` (0-43,200).

        ``change_visibility(message.queue, message.receipt_handle, delay_seconds)``; the receive
        count goes up on the next receive. Errors as :meth:`change_visibility`.
        """
        self.change_visibility(message.queue, message.receipt_handle, delay_seconds)

    # -- peeking --

    def peek(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = PEEK_PAGE_SIZE,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> PeekPage:
        """Read messages without receiving them: no lease, no receive count change (``GET /{queue}/peek``).

        Args:
            queue: Queue name.
            after: Only messages with ids greater than this one (a page's ``next_after``).
            limit: 1-1,000 messages per page.
            partition: With ``partitions``: only messages of this partition (as a partitioned receive).
            partitions: Number of partitions, 1-1,000.
        Returns:
            A page of ready, in-flight and delayed messages, oldest first.
        Raises:
            InvalidRequest: ``limit`` or the partition out of range, or ``after`` not a message id.
        """
        return self._run(_peek_op(queue, after, limit, partition, partitions))

    def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        """Read the given messages without receiving them, wherever they are (``POST /{queue}/peek``).

        Any number of ids, 1,000 per request. Ids not in the queue (deleted,
        never sent) are left out of the answer.

        Returns:
            The messages found, in id order within each 1,000.
        Raises:
            InvalidMessageId: An id is malformed (before any request).
        """
        return self._run(_peek_ids_op(queue, message_ids))

    def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        """Delete any number of messages by id, wherever they are, 10 per request (SoftLayer delete, batched).

        Returns:
            One result per id, in order: None if deleted, else the error (MessageNotFound, ...).
        Raises:
            InvalidMessageId: An id is malformed (before any request).
        """
        return self._run(_delete_by_ids_op(queue, message_ids))

    def iter_peek(
        self,
        queue: str,
        *,
        page_size: int = PEEK_PAGE_SIZE,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> Iterator[PeekedMessage]:
        """Every message of a queue (or of one partition), oldest first, read page by page with :meth:`peek`.

        Messages sent while iterating appear if their ids sort after the current page.
        Errors as :meth:`peek`, raised while iterating.
        """
        after: str | None = None
        while True:
            page = self.peek(queue, after=after, limit=page_size, partition=partition, partitions=partitions)
            yield from page.messages
            if page.next_after is None:
                return
            after = page.next_after

    # -- redrive --

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        """Start moving a dead-letter queue's ready messages back (SQS StartMessageMoveTask).

        Args:
            queue: The dead-letter queue to empty.
            destination: Move everything to this queue; None = each message's original queue.
            max_messages_per_second: 1-10,000 (default 500 on the server).
        Returns:
            The task status (docs/api.md, Redrive task status): ``task_id``, ``state``, ``moved``...
        Raises:
            RedriveInProgress: A redrive out of this queue is running.
            QueueNotFound: The queue or the destination does not exist.
            InvalidRequest: The destination is the queue itself.
        """
        return self._run(_start_redrive_op(queue, destination, max_messages_per_second))

    def redrive_status(self, queue: str) -> dict[str, Any] | None:
        """Status of the last redrive out of ``queue``, or None if there never was one."""
        return self._run(_redrive_status_op(queue))

    def cancel_redrive(self, queue: str) -> dict[str, Any]:
        """Cancel the running redrive out of ``queue``; messages already moved stay moved.

        Returns:
            The task status, ``state`` ``cancelled``.
        Raises:
            RedriveNotRunning: No redrive out of this queue is running.
        """
        return self._run(_cancel_redrive_op(queue))


# -- the asyncio client ------------------------------------------------------------------------


class AsyncClient(_Base):
    """Asyncio client of the mq HTTP API, over one ``httpx.AsyncClient``.

    The same methods, arguments, results and errors as :class:`Client`, as coroutines
    (``iter_peek`` returns an async iterator); their docstrings are :class:`Client`'s.
    Use it with ``async with``, or await :meth:`close`.
    """

    __doc__ = (__doc__ or "") + _CLIENT_ARGS_DOC

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_seconds: float = 30.0,
        max_retries: int = 3,
        backoff_seconds: float = 0.1,
        max_backoff_seconds: float = 10.0,
    ) -> None:
        super().__init__(
            url,
            timeout_seconds=timeout_seconds,
            max_retries=max_retries,
            backoff_seconds=backoff_seconds,
            max_backoff_seconds=max_backoff_seconds,
        )
        self._http = httpx.AsyncClient(base_url=url, timeout=timeout_seconds)

    # -- driver --

    async def _once(self, request: _Request) -> _Response:
        try:
            response = await self._http.request(
                request.method,
                request.path,
                params=request.params,
                json=request.json,
                content=request.content,
                headers=request.headers,
                timeout=self._timeout(request),
            )
        except httpx.TransportError as exc:
            raise _connection_failed(request, exc) from exc
        return _answer(response)

    async def _run(self, op: _Op[T]) -> T:
        try:
            request = next(op)
            while True:
                try:
                    response = await AsyncRetrying(**self._retry_options(request))(self._once, request)
                except MQError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(response)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- lifecycle --

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the API --

    async def list_queues(self, prefix: str = "") -> list[str]:
        return await self._run(_list_queues_op(prefix))

    async def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        return await self._run(_create_queue_op(queue, attributes))

    async def delete_queue(self, queue: str) -> None:
        await self._run(_delete_queue_op(queue))

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        return await self._run(_queue_stats_op(queue))

    async def get_attributes(self, queue: str) -> dict[str, Any]:
        return await self._run(_get_attributes_op(queue))

    async def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await self._run(_set_attributes_op(queue, changes))

    async def purge(self, queue: str) -> int:
        return await self._run(_purge_op(queue))

    async def send(
        self,
        queue: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        return await self._run(_send_op(queue, body, content_type, attributes, delay_seconds))

    async def send_json(
        self,
        queue: str,
        value: Any,
        *,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return await self.send(
            queue, data, content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    async def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = SEND_BATCH_SIZE
    ) -> list[str | MQError]:
        return await self._run(_send_batch_op(queue, entries, batch_size))

    async def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_time_seconds: int | None = None,
        visibility_timeout_seconds: int | None = None,
        attempt_id: str | None = None,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> list[Message]:
        return await self._run(
            _receive_op(
                queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
            )
        )

    async def delete(self, queue: str, receipt_handle: str) -> None:
        await self._run(_delete_op(queue, receipt_handle))

    async def delete_by_id(self, queue: str, message_id: str) -> None:
        await self._run(_delete_by_id_op(queue, message_id))

    async def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        return await self._run(_delete_batch_op(queue, receipt_handles))

    async def change_visibility(self, queue: str, receipt_handle: str, timeout_seconds: int) -> int:
        return await self._run(_change_visibility_op(queue, receipt_handle, timeout_seconds))

    async def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        return await self._run(_change_visibility_batch_op(queue, entries))

    async def ack(self, message: Message) -> None:
        await self.delete(message.queue, message.receipt_handle)

    async def nack(self, message: Message, delay_seconds: int = 0) -> None:
        await self.change_visibility(message.queue, message.receipt_handle, delay_seconds)

    async def peek(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = PEEK_PAGE_SIZE,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> PeekPage:
        return await self._run(_peek_op(queue, after, limit, partition, partitions))

    async def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        return await self._run(_peek_ids_op(queue, message_ids))

    async def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        return await self._run(_delete_by_ids_op(queue, message_ids))

    async def iter_peek(
        self,
        queue: str,
        *,
        page_size: int = PEEK_PAGE_SIZE,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> AsyncIterator[PeekedMessage]:
        after: str | None = None
        while True:
            page = await self.peek(queue, after=after, limit=page_size, partition=partition, partitions=partitions)
            for message in page.messages:
                yield message
            if page.next_after is None:
                return
            after = page.next_after

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        return await self._run(_start_redrive_op(queue, destination, max_messages_per_second))

    async def redrive_status(self, queue: str) -> dict[str, Any] | None:
        return await self._run(_redrive_status_op(queue))

    async def cancel_redrive(self, queue: str) -> dict[str, Any]:
        return await self._run(_cancel_redrive_op(queue))


def _copy_docstrings() -> None:
    """Give each AsyncClient method the docstring of the Client method of the same name."""
    for name, method in vars(AsyncClient).items():
        sync = vars(Client).get(name)
        if callable(method) and sync is not None and method.__doc__ is None:
            method.__doc__ = sync.__doc__


_copy_docstrings()
