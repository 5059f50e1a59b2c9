"""The HTTP side of the ``mq`` daemon: request parsing and checks, the error middleware, the route handlers.

Each handler checks its request (path, query parameters, headers, JSON body:
the strict rules of ``docs/api.md``) with the helpers here, calls one
:class:`daemons._broker.Broker` method and shapes the answer. Every error
becomes a status and a JSON body in :func:`errors_middleware` (:func:`error_answer`).
The routes themselves are registered by :func:`daemons.front.make_app`; the
single send, receive and delete are also called directly, without the router
and the middlewares, by ``daemons._fastpath`` (:func:`send_to`, :func:`receive_from`,
:func:`delete_from`), and their work without aiohttp's request and response objects by ``daemons._wire``
(:func:`send_of`, :func:`receive_of`, :func:`delete_of`, :func:`error_response`): written once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from daemons import _auth
from daemons._answers import received_json, received_messages_text
from daemons._broker import Broker
from daemons._shapes import check_keys, parse_message_attributes, query_params
from mqcore.attributes import MAX_VISIBILITY_TIMEOUT_SECONDS, attributes_size
from mqcore.errors import (
    InvalidRequest,
    MessageTooLarge,
    MQError,
    RequestTimeout,
    StorageUnavailable,
    echo,
)
from mqcore.model import ReceivedMessage
from mqcore.names import (
    check_message_id,
    check_queue_name,
    is_fifo_queue,
    is_queue_prefix,
)
from mqcore.protocol import DEFAULT_PEEK_LIMIT, MAX_PEEK_LIMIT, PeekedFile, SendEntry
from mqcore.redrive import DEFAULT_REDRIVE_RATE
from mqcore.service import fifo
from mqcore.service.handles import check_handle
from mqcore.service.requests import (
    DELAY_SECONDS,
    PEEK_LIMIT,
    REDRIVE_RATE,
    VISIBILITY_TIMEOUT_SECONDS,
    Limit,
    ReceiveArgs,
    check_after,
    check_message_size,
    check_prefix,
    partition_from_query,
    receive_args_from_query,
)

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

#: Largest JSON body of the small JSON endpoints (attributes, visibility, batch delete), in bytes.
SMALL_JSON_LIMIT_BYTES = 65_536


BROKER = web.AppKey("broker", Broker)


def _json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every error into a status plus a JSON body ``{"error": code, "message": ...}``.

    Retriable errors (503 storage_unavailable, 429 queue_full) carry ``Retry-After`` in seconds.
    """
    try:
        return await handler(request)
    except Exception as exc:  # noqa: BLE001 -- error_answer logs it or raises it again
        return await error_answer(request, exc)


async def error_answer(request: web.BaseRequest, error: Exception) -> web.StreamResponse:
    """The answer of :func:`errors_middleware` to ``error`` (also ``daemons._fastpath``'s): :func:`error_response`'s;
    a 408 is sent at once and the connection cut (the rest of the body is never waited for).

    Raises:
        Exception: ``error`` itself when it is not an error answer (see :func:`error_response`).
    """
    response = error_response(error, request.method, request.path)
    if isinstance(error, RequestTimeout):  # answer, then cut the connection: never wait for the rest of the body
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        if request.transport is not None:
            cut(request.transport)
    return response


def cut(transport: asyncio.Transport) -> None:
    """End a connection after a 408: FIN now (the client reads the answer), the socket closed 1 s later.

    Shared by :func:`error_answer` (aiohttp) and ``daemons._wire``.
    """
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(1.0, transport.close)


def error_response(error: Exception, method: str, path: str) -> web.Response:
    """The status and JSON body ``{"error": code, "message": ...}`` of ``error`` raised by a handler.

    Shared by :func:`error_answer` (aiohttp) and ``daemons._wire`` (the hot routes' own connections).
    A storage error is logged (``method`` and ``path``, the request's, name it), an unexpected one with its
    traceback (500).

    Raises:
        Exception: ``error`` itself when it is not an error answer: an ``HTTPException`` under 400 (a
            redirect) or a socket's ``OSError`` (the client went away).
    """
    try:
        raise error
    except MQError as exc:
        headers = {}
        retry_after = getattr(exc, "retry_after_seconds", None)
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if isinstance(exc, StorageUnavailable):
            logger.error("storage unavailable method=%s path=%s error=%s", method, path, exc)
        return web.json_response(exc.to_json(), status=exc.status, headers=headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "message_too_large"}.get(exc.status, "http_error")
        allow = exc.headers.get("Allow")  # RFC 9110: a 405 lists the methods the route has
        return _json_error(exc.status, code, exc.reason or "error", {"Allow": allow} if allow is not None else None)
    except OSError as exc:
        if exc.filename is None:  # a socket's error (the client went away), not the storage's
            raise
        # A filesystem error that no transition turned into StorageUnavailable (e.g. a listing on a lost FUSE
        # mount, ENOTCONN): the storage is unavailable, the server is not broken (docs/cluster.md).
        logger.error("storage unavailable method=%s path=%s error=%s", method, path, exc)
        unavailable = StorageUnavailable(f"storage unavailable: {exc.strerror or exc}")
        headers = {"Retry-After": str(unavailable.retry_after_seconds)}
        return web.json_response(unavailable.to_json(), status=unavailable.status, headers=headers)
    except Exception:
        logger.exception("internal error method=%s path=%s", method, path)
        return _json_error(500, "internal_error", "internal error; see the server log")


async def read_body(request: web.Request, max_bytes: int, broker: Broker | None = None) -> bytes:
    """Read the request body, at most ``max_bytes`` bytes, within the daemon's ``--body-timeout``.

    ``broker``: the daemon's (default ``request.app[BROKER]``; the hot routes of ``daemons._fastpath``
    pass it, their requests have no matched app).

    Raises:
        MessageTooLarge: Content-Length or the bytes received exceed ``max_bytes``.
        RequestTimeout: The body took longer than ``body_timeout_seconds`` (408; the connection is closed).
    """
    if request.content.is_eof():  # the whole body has arrived (a small send's usual case): nothing to wait for
        return await _read_body(request, max_bytes)
    if broker is None:
        broker = request.app[BROKER]
    seconds = broker.settings.body_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            return await _read_body(request, max_bytes)
    except TimeoutError:
        raise body_timed_out(broker, request.method, request.path, request.remote) from None


def body_timed_out(broker: Broker, method: str, path: str, peer: str | None) -> RequestTimeout:
    """Count and log a body slower than ``--body-timeout``; the 408 error to raise (aiohttp's and ``_wire``'s)."""
    seconds = broker.settings.body_timeout_seconds
    broker.refusals["body_timeout"] += 1
    logger.warning("body timeout method=%s path=%s peer=%s after %.0f s", method, path, peer, seconds)
    return RequestTimeout(f"the request body did not arrive within {seconds:g} s (--body-timeout)")


async def _read_body(request: web.Request, max_bytes: int) -> bytes:
    """The body as the pieces aiohttp received, joined once (``request.read()`` copies a large body three times).

    Raises:
        MessageTooLarge: Content-Length or the bytes received exceed ``max_bytes``.
    """
    if request.content_length is not None and request.content_length > max_bytes:
        raise MessageTooLarge(request.content_length, max_bytes)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk, end_of_http_chunk = await content.readchunk()  # one received piece, never a join of several
        if not chunk:
            # (b"", True) ends one chunk of a chunked body, more may follow; aiohttp's shared empty
            # payload (no body) answers it to every call after its first, hence at_eof().
            if end_of_http_chunk and not content.at_eof():
                continue
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise MessageTooLarge(size, max_bytes)


async def read_json(request: web.Request, max_bytes: int = SMALL_JSON_LIMIT_BYTES, *, required: bool = True) -> Any:
    """The request body parsed as JSON; None for an empty body when not ``required``.

    Raises:
        MessageTooLarge: Body over ``max_bytes`` (413).
        InvalidRequest: Empty (when required) or not valid JSON (400).
    """
    return parse_json(await read_body(request, max_bytes), required=required)


def parse_json(raw: bytes, *, required: bool = True) -> Any:
    """A request body parsed as JSON (:func:`read_json`'s rules, also ``daemons._wire``'s batch send's).

    Raises:
        InvalidRequest: Empty (when required) or not valid JSON (400).
    """
    if not raw.strip():
        if required:
            raise InvalidRequest("a JSON body is required")
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if value is None:  # JSON null is not an empty body: the optional bodies are objects or nothing
        raise InvalidRequest("the body must not be JSON null (send no body instead)")
    return value


def _stored_json(message: ReceivedMessage | PeekedFile) -> dict[str, Any]:
    """The fields a received and a peeked message share (after ``message_id`` and the first own field)."""
    return {
        "body_base64": base64.b64encode(message.body).decode("ascii"),
        "content_type": message.content_type,
        "attributes": message.attributes,
        "attribute_types": message.attribute_types,
        "sent_timestamp_ms": message.sent_ms,
        "receive_count": message.receive_count,
    }


# -- queues ----------------------------------------------------------------


#: Queue names a ``GET /`` page holds: 1-1,000, and 1,000 when not given (SQS ListQueues MaxResults).
QUEUE_LIST_LIMIT = Limit("limit", 1, 1000)


async def list_queues(request: web.Request) -> web.Response:
    """GET /?prefix=P&after=NAME&limit=N -> 200 {"queues": [names], "next_after": NAME | null} (SQS ListQueues).

    Sorted names starting with P and greater than ``after``, at most ``limit``
    (1-1,000, default 1,000: SQS's MaxResults and its cap without it) before
    the request's token filters them; ``next_after`` is the page's last name
    when more names follow (pass it as ``after``), else null.
    """
    params = query_params(request, ("prefix", "after", "limit"))
    prefix = check_prefix(params.get("prefix", ""))
    after = params.get("after", "")
    if not is_queue_prefix(after):
        raise InvalidRequest(f"after must be a queue name, got {echo(after)}", parameter="after")
    limit = QUEUE_LIST_LIMIT.from_text(params.get("limit")) or QUEUE_LIST_LIMIT.high
    broker = request.app[BROKER]
    if _auth.grant_of(request) is None:  # every name is visible: the page's bytes are kept (_queue_list.py)
        body = await broker.run_in(broker.savers, broker.queue_names.page_json, prefix, after, limit)
        return web.Response(body=body, content_type="application/json", charset="utf-8")
    names, more = await broker.list_queue_page(prefix, after, limit)
    queues = _auth.visible(request, list(names))
    return web.json_response({"queues": queues, "next_after": names[-1] if more else None})


async def get_queue(request: web.Request) -> web.Response:
    """GET /<queue> -> 200 {"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds",
    "created_ms", "attributes", "redrive"} or 404 (SQS GetQueueAttributes' approximate counts)."""
    queue = check_queue_name(request.match_info["queue"])
    return web.json_response(await request.app[BROKER].stats(queue))


async def put_queue(request: web.Request) -> web.Response:
    """PUT /<queue> [attributes JSON] -> 201 {"queue", "created", "attributes"} (idempotent, SQS CreateQueue).

    The body is queue attributes only when it is sent as ``application/json`` (or ``+json``), or
    when it parses as a JSON object whatever its Content-Type (``curl -d '{...}'``); any other
    body (a form, text) is ignored, as SoftLayer MQ ignores it. An empty body creates the queue
    with the defaults. 409 queue_name_exists if the queue exists and a given attribute differs
    from its explicit value; 400 invalid_attribute; 400 invalid_request for an
    ``application/json`` body that is not a JSON object.
    """
    queue = check_queue_name(request.match_info["queue"])
    body: Any
    if request.content_type == "application/json" or request.content_type.endswith("+json"):
        body = await read_json(request, required=False)
        if body is not None and not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object of queue attributes (or empty)")
    else:
        body = _json_object_or_none(await read_body(request, SMALL_JSON_LIMIT_BYTES))
    created, attrs = await request.app[BROKER].create_queue(queue, body)
    return web.json_response({"queue": queue, "created": created, "attributes": attrs.to_json()}, status=201)


def _json_object_or_none(raw: bytes) -> dict[str, Any] | None:
    """``raw`` parsed as a JSON object, or None when it is not one (SoftLayer MQ ignores a PUT body)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


async def delete_queue(request: web.Request) -> web.Response:
    """DELETE /<queue> -> 200 (the queue and every message in it) or 404."""
    queue = check_queue_name(request.match_info["queue"])
    await request.app[BROKER].delete_queue(queue)
    return web.json_response({"queue": queue, "deleted": True})


async def get_attributes(request: web.Request) -> web.Response:
    """GET /<queue>/attributes -> 200 {"queue", "attributes"} (effective: defaults filled in)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    attrs = await request.app[BROKER].get_attributes(queue)
    return web.json_response({"queue": queue, "attributes": attrs.to_json()})


async def put_attributes(request: web.Request) -> web.Response:
    """PUT /<queue>/attributes {key: value|null} -> 200 {"queue", "attributes"} (merge; SQS SetQueueAttributes)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object of queue attributes")
    attrs = await request.app[BROKER].set_attributes(queue, body)
    return web.json_response({"queue": queue, "attributes": attrs.to_json()})


async def purge_queue(request: web.Request) -> web.Response:
    """POST /<queue>/purge -> 200 {"queue", "purged": true, "removed": N} (SQS PurgeQueue)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    removed = await request.app[BROKER].purge(queue)
    return web.json_response({"queue": queue, "purged": True, "removed": removed})


# -- messages ----------------------------------------------------------------


async def send_message(request: web.Request) -> web.Response:
    """POST /<queue>/messages: :func:`send_to` (the route as the application serves it)."""
    return await send_to(request, request.app[BROKER], request.match_info["queue"])


async def send_to(request: web.Request, broker: Broker, queue_text: str) -> web.Response:
    """POST /<queue>/messages -> 201 + X-Message-Id once the message is durable (SQS SendMessage).

    Headers: Content-Type (stored), X-Delay-Seconds (0-900; default the queue's
    delay_seconds), X-Message-Attributes (JSON object name -> string). The body and
    the attributes together must fit the queue's max_message_bytes (413). A full
    queue answers 429 queue_full + Retry-After after capacity_wait_seconds.
    """
    message_id = await send_of(broker, queue_text, request.headers, lambda limit: read_body(request, limit, broker))
    return web.Response(
        status=201, body=sent_body(message_id), content_type="application/json", headers={"X-Message-Id": message_id}
    )


async def send_of(
    broker: Broker,
    queue_text: str,
    headers: Mapping[str, str],
    read: Callable[[int], Awaitable[bytes]],
    answered: list[Callable[[], None]] | None = None,
) -> str:
    """The work of :func:`send_to` (also ``daemons._wire``'s): the checks, the message stored; its id.

    ``queue_text`` is the path's queue segment (not yet checked), ``headers`` the request's, looked up by
    lower-case name; ``read(limit)`` reads the body, at most ``limit`` bytes (MessageTooLarge, RequestTimeout);
    ``answered``: :meth:`daemons._send.Sender.send`'s (the bookkeeping to run right after the ``201``).

    Raises:
        MQError: Whatever :func:`send_to` answers as an error (400, 404, 413, 429, 503...).
    """
    queue = check_queue_name(queue_text)
    state = await broker.queue_state(queue)
    attrs = state.attrs
    delay_text = headers.get("x-delay-seconds")
    delay = attrs.delay_seconds
    if delay_text is not None:
        value = DELAY_SECONDS.from_text(delay_text.strip(), name="X-Delay-Seconds")
        delay = value if value is not None else delay
    message_attributes = parse_message_attributes(headers.get("x-message-attributes"))
    body = await read(attrs.max_message_bytes)
    check_message_size(len(body) + attributes_size(message_attributes) if message_attributes else len(body), attrs)
    entry = SendEntry(body, headers.get("content-type"), message_attributes or None, delay * 1000)
    if "x-message-group-id" in headers or "x-message-deduplication-id" in headers:  # FIFO queues
        group, dedup = fifo.fifo_fields(
            queue, headers.get("x-message-group-id"), headers.get("x-message-deduplication-id")
        )
        entry = replace(entry, group_id=group, dedup_id=dedup)
    return await broker.sender.send(queue, entry, answered)


def sent_body(message_id: str) -> bytes:
    """The body of a send's 201: ``{"message_id": "<id>"}`` (json.dumps of it, preformatted: an id is a UUID)."""
    return b'{"message_id": "%s"}' % message_id.encode()


_RECEIVE_PARAMS = (
    "max_messages",
    "wait_time_seconds",
    "visibility_timeout_seconds",
    "attempt_id",
    "partition",
    "partitions",
)


async def receive_message(request: web.Request) -> web.Response:
    """GET /<queue>/messages: :func:`receive_from` (the route as the application serves it)."""
    return await receive_from(request, request.app[BROKER], request.match_info["queue"])


async def receive_from(request: web.Request, broker: Broker, queue_text: str) -> web.Response:
    """GET /<queue>/messages -> one message raw (200, or 204 if none) or up to 10 as JSON (SQS ReceiveMessage).

    Query: max_messages (1-10; selects the JSON form), wait_time_seconds (0-20, long polling;
    default the queue's receive_wait_seconds), visibility_timeout_seconds (0-43200; default the
    queue's), attempt_id (1-128 printable ASCII, no space: SQS ReceiveRequestAttemptId),
    partition + partitions (both or neither; 0 <= partition < partitions <= 1000: only messages
    with ``partition_of(id, partitions) == partition``, SMQ's batches).
    The raw form's headers: Content-Type, X-Message-Id, X-Receipt-Handle, X-Receive-Count,
    X-Sent-Timestamp, X-First-Receive-Timestamp, X-Visibility-Deadline (epoch ms),
    X-Message-Attributes (JSON, only if the message has attributes).
    """
    messages, json_text = await receive_of(broker, queue_text, request.query if request.query_string else None)
    if json_text is not None:
        return web.Response(text=json_text, content_type="application/json")
    if not messages:
        return web.Response(status=204)
    return web.Response(body=messages[0].body, headers=received_headers(messages[0]))


async def receive_of(
    broker: Broker, queue_text: str, query: MultiMapping[str] | None
) -> tuple[list[ReceivedMessage], str | None]:
    """The work of :func:`receive_from` (also ``daemons._wire``'s): (messages leased, None) for the raw form
    (at most one), ([], the JSON form's 200 body) with ``max_messages``.

    ``queue_text`` is the path's queue segment (not yet checked), ``query`` the query's parameters (None
    without a query string).

    Raises:
        MQError: Whatever :func:`receive_from` answers as an error (400, 404, 503...).
    """
    queue = check_queue_name(queue_text)
    if query is not None:
        args, as_json = receive_args_from_query(query_params(query, _RECEIVE_PARAMS))
    else:  # the usual receive: every default
        args, as_json = ReceiveArgs(), False
    messages = await broker.receive(queue, args)
    if messages and is_fifo_queue(queue):  # the group ids of messages re-let by an attempt id, from their files
        messages = await broker.run_in(broker.savers, fifo.with_fifo_ids, broker.store, messages)
    if as_json:
        return [], received_messages_text([received_json(m, fifo.native_fields(m)) for m in messages])
    return messages, None


def received_headers(message: ReceivedMessage) -> dict[str, str]:
    """The headers of a raw receive's 200 (its body is the message's), in the order they are sent."""
    headers = {
        "Content-Type": message.content_type,
        "X-Message-Id": message.message_id,
        "X-Receive-Count": str(message.receive_count),
        "X-Sent-Timestamp": str(message.sent_ms),
        "X-Receipt-Handle": message.receipt_handle,
        "X-First-Receive-Timestamp": str(message.first_receive_ms),
        "X-Visibility-Deadline": str(message.deadline_ms),
    }
    if message.attributes:
        headers["X-Message-Attributes"] = json.dumps(message.attributes, separators=(",", ":"), ensure_ascii=True)
    headers.update({fifo.NATIVE_HEADERS[k]: v for k, v in fifo.native_fields(message).items()})
    return headers


async def peek_messages(request: web.Request) -> web.Response:
    """GET /<queue>/peek?after=ID&limit=N[&partition=i&partitions=M] -> 200 {"messages", "next_after"}.

    Reads up to ``limit`` (1-1000, default 100) of the queue's messages with ids
    greater than ``after``, oldest first, without receiving them: ready, in
    flight and delayed, each with its ``state``. Nothing changes (no lease, no
    receive count). ElasticMQ users' "peek"; SQS has none. With ``partition``
    and ``partitions`` only that partition's messages (as a partitioned receive).
    """
    queue = check_queue_name(request.match_info["queue"])
    params = query_params(request, ("after", "limit", "partition", "partitions"))
    limit = PEEK_LIMIT.from_text(params.get("limit"))
    after = check_after(params.get("after"))
    partition = partition_from_query(params)
    messages, next_after = await request.app[BROKER].peek(queue, after, limit or DEFAULT_PEEK_LIMIT, partition)
    return web.json_response({"messages": [_peeked_json(m) for m in messages], "next_after": next_after})


async def peek_by_ids(request: web.Request) -> web.Response:
    """POST /<queue>/peek {"message_ids": [ID, ...]} -> 200 {"messages": [...]}.

    Reads the given messages (1-1000 ids) wherever they are in the queue,
    without receiving them; ids not in the queue are left out of the answer.
    """
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object {"message_ids": [...]}')
    check_keys(body, ("message_ids",), "the request")
    ids = body.get("message_ids")
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_PEEK_LIMIT:
        raise InvalidRequest(f"message_ids must be a list of 1-{MAX_PEEK_LIMIT} message ids", field="message_ids")
    for i, value in enumerate(ids):
        if not isinstance(value, str):
            raise InvalidRequest(f"message_ids[{i}] must be a message id string", field=f"message_ids[{i}]")
        try:
            check_message_id(value)
        except InvalidRequest as exc:
            raise InvalidRequest(f"message_ids[{i}]: {exc.message}", field=f"message_ids[{i}]") from None
    messages = await request.app[BROKER].peek_ids(queue, ids)
    return web.json_response({"messages": [_peeked_json(m) for m in messages]})


def _peeked_json(message: PeekedFile) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "state": message.state,
        **_stored_json(message),
        "visibility_deadline_ms": message.visibility_deadline_ms,
        "visible_at_ms": message.visibility_deadline_ms,  # deprecated name of visibility_deadline_ms (docs/api.md)
        "source_queue": message.source_queue,
        **({"group_id": message.group_id} if message.group_id is not None else {}),  # FIFO queues
    }


async def delete_message(request: web.Request) -> web.Response:
    """DELETE /<queue>/messages/<id>: :func:`delete_from` (the route as the application serves it)."""
    match = request.match_info
    return await delete_from(request, request.app[BROKER], match["queue"], match["message_id"])


async def delete_from(request: web.Request, broker: Broker, queue_text: str, id_text: str) -> web.Response:
    """DELETE /<queue>/messages/<id>[?receipt_handle=H] -> 200 {"message_id", "deleted": true, "was"}.

    Without a handle: by id, wherever the message is (SoftLayer); 404 if nowhere; 400 bad id.
    With a handle (SQS DeleteMessage): only if H is the message's latest receive; 410
    stale_receipt_handle (the newer lease is untouched), 400 invalid_receipt_handle, 404.
    """
    body = await delete_of(broker, queue_text, id_text, request.query if request.query_string else None)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


async def delete_of(broker: Broker, queue_text: str, id_text: str, query: MultiMapping[str] | None) -> bytes:
    """The work of :func:`delete_from` (also ``daemons._wire``'s): the message deleted; the answer's JSON body.

    ``queue_text`` and ``id_text`` are the path's segments (not yet checked), ``query`` the query's
    parameters (None without a query string).

    Raises:
        MQError: Whatever :func:`delete_from` answers as an error (400, 404, 410, 503...).
    """
    queue = check_queue_name(queue_text)
    message_id = check_message_id(id_text)
    params = query_params(query, ("receipt_handle",)) if query is not None else {}
    if "receipt_handle" in params:
        handle = check_handle(params["receipt_handle"], queue, message_id)
        _, where = await broker.leases.delete_by_handle(queue, handle)
    else:
        where = await broker.leases.delete(queue, message_id)
    # json.dumps of {"message_id", "deleted": true, "was"}, preformatted: an id is a UUID, "was" a fixed word.
    return b'{"message_id": "%s", "deleted": true, "was": "%s"}' % (message_id.encode(), where.encode())


async def change_visibility(request: web.Request) -> web.Response:
    """POST /<queue>/messages/<id>/visibility {"receipt_handle", "visibility_timeout_seconds"}
    -> 200 {"message_id", "receipt_handle" (current), "visibility_deadline_ms"} (SQS ChangeMessageVisibility).

    The new timeout counts from now (0-43200 s; 0 = ready at once). 410 stale_receipt_handle,
    400 message_not_in_flight / invalid_receipt_handle / invalid_request, 404.
    """
    queue = check_queue_name(request.match_info["queue"])
    message_id = check_message_id(request.match_info["message_id"])
    query_params(request, (), '{"receipt_handle": "...", "visibility_timeout_seconds": N}')
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object {"receipt_handle", "visibility_timeout_seconds"}')
    check_keys(body, ("receipt_handle", "visibility_timeout_seconds"), "the request")
    timeout = required_timeout(body, "")
    handle = check_handle(body.get("receipt_handle"), queue, message_id)
    _, current, deadline = await request.app[BROKER].leases.change_visibility(queue, handle, timeout)
    return web.json_response({"message_id": message_id, "receipt_handle": current, "visibility_deadline_ms": deadline})


def required_timeout(obj: dict[str, Any], where: str) -> int:
    timeout = VISIBILITY_TIMEOUT_SECONDS.optional(obj.get("visibility_timeout_seconds"), key="field", where=where)
    if timeout is None:
        raise InvalidRequest(
            f"{where}visibility_timeout_seconds is required (0-{MAX_VISIBILITY_TIMEOUT_SECONDS})",
            field=f"{where}visibility_timeout_seconds",
        )
    return timeout


# -- redrive -------------------------------------------------------------------


async def start_redrive(request: web.Request) -> web.Response:
    """POST /<dlq>/redrive {"destination"?, "max_messages_per_second"? (1-10000, default 500)}
    -> 202 {"task": status}; 409 redrive_in_progress; 404 (SQS StartMessageMoveTask)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    body = await read_json(request, required=False)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object {"destination"?, "max_messages_per_second"?} (or empty)')
    check_keys(body, ("destination", "max_messages_per_second"), "the request")
    rate = REDRIVE_RATE.optional(body.get("max_messages_per_second"), key="field")
    destination = body.get("destination")
    if destination is not None:
        destination = check_queue_name(destination)
        _auth.require(request, "send", destination)
    status = await request.app[BROKER].redrives.start(queue, destination, rate or DEFAULT_REDRIVE_RATE)
    return web.json_response({"task": status}, status=202)


async def get_redrive(request: web.Request) -> web.Response:
    """GET /<dlq>/redrive -> 200 {"task": status or null} ("running" not updated for 10 s shows "failed")."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    return web.json_response({"task": await request.app[BROKER].redrives.read(queue)})


async def cancel_redrive(request: web.Request) -> web.Response:
    """DELETE /<dlq>/redrive -> 200 {"task": status} (cancel requested); 404 redrive_not_running."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, ())
    return web.json_response({"task": await request.app[BROKER].redrives.cancel(queue)})
