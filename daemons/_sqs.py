"""SQS's AWS JSON 1.0 protocol on mq's port: ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` (docs/sqs.md).

A thin translation: each action parses its JSON request, calls the same
:class:`daemons._broker.Broker` methods the native routes of ``daemons._http``
call, and shapes SQS's answer with :mod:`mqcore.sqs` (names, URLs, ARNs,
attribute translation, MD5s, SQS's error codes). No rule of the queue is
written here: ranges, receipt handles, attempts, dead-letter queues and
redrive tasks are the service layer's. Errors are answered in the JSON
protocol's shape (``{"__type", "message"}`` plus the ``x-amzn-query-error``
header botocore maps back to its modeled exceptions), never as a 500 for a
bad request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from daemons import _auth, _sqs_auth
from daemons._broker import Broker
from daemons._http import BROKER
from mqcore import sqs, sqs_fifo, sqs_query
from mqcore.attributes import QueueAttributes
from mqcore.errors import MQError
from mqcore.model import ReceivedMessage
from mqcore.names import QueueName, ReceiptHandle, is_fifo_queue, sent_ms_of
from mqcore.protocol import SendEntry, now_ms
from mqcore.redrive import DEFAULT_REDRIVE_RATE
from mqcore.service import fifo
from mqcore.service.handles import check_handle
from mqcore.service.requests import MAX_MESSAGES, VISIBILITY_TIMEOUT_SECONDS, WAIT_TIME_SECONDS, Limit, ReceiveArgs

logger = logging.getLogger("mq.front")

#: Largest SQS JSON request body, in bytes: a batch of 1 MiB of messages plus JSON escapes and keys.
MAX_REQUEST_BYTES = 6 * 1_048_576 + 65_536
_CONTENT_TYPE = "application/x-amz-json-1.0"
#: Content-Type stored with messages sent through SQS (their bodies are strings).
SQS_CONTENT_TYPE = "text/plain; charset=utf-8"
#: Actions of SQS's API mq does not implement (answered UnsupportedOperation).
UNSUPPORTED = ("AddPermission", "RemovePermission")

Action = Callable[["Context", dict[str, Any]], Awaitable[dict[str, Any]]]

_REQUEST_ID_PREFIX = os.urandom(8).hex()
_request_numbers = itertools.count()


def new_request_id() -> str:
    """An ``x-amzn-RequestId``: UUID-shaped, unique per process start and request (random prefix, counter).

    ``uuid.uuid4()`` (a ``getrandom`` call and a UUID object) cost about 4 % of the event loop's
    time under a boto3 receive+delete load (docs/performance.md); nothing parses these ids.
    """
    p = _REQUEST_ID_PREFIX
    return f"{p[:8]}-{p[8:12]}-{p[12:16]}-{next(_request_numbers):016x}"


class Context:
    """One SQS request: the broker, the base URL of queue URLs, the account and region of ARNs."""

    def __init__(self, request: web.Request) -> None:
        self.broker: Broker = request.app[BROKER]
        settings = self.broker.settings
        self.account_id: str = settings.sqs_account_id
        self.region: str = settings.sqs_region
        self.base_url = f"{request.scheme}://{request.host}"
        self.request = request

    def visible(self, names: Sequence[str]) -> list[str]:
        """The ``names`` the request's grant matches (all without --auth-file; daemons._sqs_auth)."""
        return _auth.visible(self.request, names)

    def url(self, queue: str) -> str:
        return sqs.queue_url(self.base_url, self.account_id, queue)

    def arn(self, queue: str) -> str:
        return sqs.queue_arn(self.region, self.account_id, queue)

    async def store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a small Store call (one metadata file) on a saver thread."""
        return await asyncio.get_running_loop().run_in_executor(self.broker.savers, fn, *args)


def _error_response(error: sqs.SqsError, request_id: str, query: bool = False) -> web.Response:
    if query:
        return web.Response(
            status=error.http_status,
            body=sqs_query.render_error(error, request_id),
            content_type="text/xml",
            headers={"x-amzn-RequestId": request_id},
        )
    return web.Response(
        status=error.http_status,
        body=json.dumps(error.to_wire()).encode(),
        content_type=_CONTENT_TYPE,
        headers={"x-amzn-query-error": error.query_error, "x-amzn-RequestId": request_id},
    )


async def sqs_endpoint(request: web.Request) -> web.Response:
    """POST / (and POST /<account>/<queue>): one SQS action, in the AWS JSON 1.0 or the query protocol.

    JSON: the action is named by ``X-Amz-Target: AmazonSQS.<Action>``; the body is the action's
    JSON request. Answers 200 with the action's JSON result, or SQS's error (status, ``__type``,
    ``x-amzn-query-error``). Query (no X-Amz-Target): form-encoded ``Action=...`` parameters
    (in the body or the URL); XML answers and errors (:mod:`mqcore.sqs_query`), the same actions.
    Signatures are checked with ``--auth-file`` (its access keys, with their grants) or
    ``--sqs-credentials``, otherwise any credentials are accepted, as ElasticMQ (daemons._sqs_auth).
    """
    request_id = new_request_id()
    target = request.headers.get("X-Amz-Target", "")
    query = not target  # no X-Amz-Target: the query protocol (form-encoded Action=, XML answers)
    name = ""
    try:
        raw = await _read_body(request)
        grant = await _sqs_auth.authenticate(request, raw)  # SigV4 / access keys' grants (docs/security.md)
        if query:
            name, body = _query_request(request, raw)
        else:
            prefix, _, name = target.partition(".")
            if prefix != "AmazonSQS" or not name:
                raise sqs.SqsError("InvalidAction", f"X-Amz-Target must be AmazonSQS.<Action>, got {target[:80]!r}.")
            body = _json_request(raw)
        action = ACTIONS.get(name)
        if action is None:
            if name in UNSUPPORTED:
                raise sqs.SqsError("UnsupportedOperation", f"{name} is not supported by mq.")
            raise sqs.SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
        _sqs_auth.authorize(request, grant, name, body)
        result = await action(Context(request), body)
    except sqs.SqsError as exc:
        return _error_response(exc, request_id, query)
    except MQError as exc:
        error = sqs.from_mq_error(exc)
        if error.sqs_code in ("InternalError", "ServiceUnavailable"):
            logger.error("sqs action=%s failed: %s", name, exc)
        return _error_response(error, request_id, query)
    except (asyncio.CancelledError, web.HTTPException):
        raise
    except Exception:
        logger.exception("internal error in sqs action=%s", name)
        return _error_response(sqs.SqsError("InternalError", "internal error; see the server log"), request_id, query)
    if query:
        return web.Response(
            body=sqs_query.render_result(name, result, request_id),
            content_type="text/xml",
            headers={"x-amzn-RequestId": request_id},
        )
    return web.Response(
        body=json.dumps(result).encode(), content_type=_CONTENT_TYPE, headers={"x-amzn-RequestId": request_id}
    )


def _json_request(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        raise sqs.SqsError("InvalidParameterValue", "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise sqs.SqsError("InvalidParameterValue", "The request body must be a JSON object.")
    return body


def _query_request(request: web.Request, raw: bytes) -> tuple[str, dict[str, Any]]:
    """A query-protocol request: parameters from the URL and the form body; QueueUrl from the path if absent."""
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise sqs.SqsError("InvalidParameterValue", "The form body is not UTF-8.") from None
    params = {**dict(request.query), **dict(pairs)}
    if "Action" not in params:
        raise sqs.SqsError(
            "InvalidAction",
            "An SQS request names its action in an X-Amz-Target header (AWS JSON 1.0) or an Action "
            "parameter (query protocol); see docs/sqs.md.",
        )
    name, body = sqs_query.parse_request(params)
    if "QueueUrl" not in body and request.match_info.get("queue"):
        body["QueueUrl"] = f"{request.scheme}://{request.host}{request.path}"
    return name, body


async def _read_body(request: web.Request) -> bytes:
    """The whole request body, at most :data:`MAX_REQUEST_BYTES` (stops reading as soon as it is over)."""
    if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
        raise sqs.SqsError("BatchRequestTooLong", f"The request is larger than {MAX_REQUEST_BYTES} bytes.")
    chunks = bytearray()
    while chunk := await request.content.readany():
        chunks += chunk
        if len(chunks) > MAX_REQUEST_BYTES:
            raise sqs.SqsError("BatchRequestTooLong", f"The request is larger than {MAX_REQUEST_BYTES} bytes.")
    return bytes(chunks)


def _int(body: dict[str, Any], name: str, limit: Limit) -> int | None:
    """SQS parameter ``name`` checked against ``limit`` (the mq rule's range); None if absent."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or not limit.contains(value):
        raise sqs.SqsError(
            "InvalidParameterValue", f"Value {value!r} for parameter {name} is invalid: {limit.low}-{limit.high}."
        )
    return value


# -- queues ----------------------------------------------------------------------


async def create_queue(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """CreateQueue: idempotent with the same attributes, QueueNameExists with others (Broker.create_queue)."""
    queue = sqs.check_new_queue_name(body.get("QueueName"))
    sqs_fifo.check_queue_type(queue, body.get("Attributes"))
    translated = sqs.translate_queue_attributes(body.get("Attributes"), creating=True)
    tags = sqs.check_tags(body.get("tags"))
    changes = {k: v for k, v in translated.changes.items() if v is not None}
    created, _ = await ctx.broker.create_queue(queue, changes or None)
    stored = {k: v for k, v in translated.stored.items() if v is not None}
    if created and (stored or tags):
        await ctx.store(ctx.broker.store.replace_sqs_meta, queue, {"attributes": stored, "tags": tags})
    return {"QueueUrl": ctx.url(queue)}


async def get_queue_url(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """GetQueueUrl: the queue's URL, or QueueDoesNotExist."""
    name = body.get("QueueName")
    if name is None:
        raise sqs.SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    queue = sqs.queue_from_url(str(name))
    if str(name) != queue or not await ctx.broker.queue_exists(queue):
        raise sqs.SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    return {"QueueUrl": ctx.url(queue)}


async def list_queues(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ListQueues: QueueNamePrefix, MaxResults (1-1000) and NextToken."""
    prefix = body.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise sqs.SqsError("InvalidParameterValue", "QueueNamePrefix must be a string.")
    names = ctx.visible([n for n in await ctx.broker.list_queues("") if n.startswith(prefix)])
    chosen, token = sqs.page(names, body.get("MaxResults"), body.get("NextToken"))
    out: dict[str, Any] = {"QueueUrls": [ctx.url(n) for n in chosen]}
    if token is not None:
        out["NextToken"] = token
    return out


async def delete_queue(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """DeleteQueue (Broker.delete_queue)."""
    await ctx.broker.delete_queue(sqs.queue_from_url(body.get("QueueUrl")))
    return {}


async def _facts(ctx: Context, queue: QueueName) -> sqs.QueueFacts:
    stats = await ctx.broker.stats(queue)
    meta = await ctx.store(ctx.broker.store.queue_meta, queue)
    extra = await ctx.store(ctx.broker.store.read_sqs_meta, queue)
    stored = extra.get("attributes") if isinstance(extra.get("attributes"), dict) else {}
    modified = meta.get("modified_ms")
    return sqs.QueueFacts(
        attributes=await ctx.broker.get_attributes(queue),
        stored=stored,
        ready=stats["ready"],
        in_flight=stats["in_flight"],
        delayed=stats["delayed"],
        created_ms=stats["created_ms"],
        modified_ms=modified if isinstance(modified, int) else None,
    )


async def get_queue_attributes(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """GetQueueAttributes: the named attributes (``All``: every one), values as strings."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    names = sqs.wanted_names(body.get("AttributeNames"), sqs.ALL_QUEUE_ATTRIBUTES, "AttributeNames")
    facts = await _facts(ctx, queue)
    attributes = sqs.queue_attributes_out(facts, names, region=ctx.region, account_id=ctx.account_id, queue=queue)
    return {"Attributes": attributes} if attributes else {}


async def set_queue_attributes(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """SetQueueAttributes (Broker.set_attributes; SQS-only attributes into ``.sqs``)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    if body.get("Attributes") is None:
        raise sqs.SqsError("MissingParameter", "The request must contain the parameter Attributes.")
    translated = sqs.translate_queue_attributes(body.get("Attributes"))
    if translated.changes or not translated.stored:
        await ctx.broker.set_attributes(queue, translated.changes)
    if translated.stored:
        await _update_sqs_meta(ctx, queue, attributes=translated.stored)
    return {}


async def _update_sqs_meta(
    ctx: Context,
    queue: QueueName,
    *,
    attributes: dict[str, str | None] | None = None,
    tags: tuple[dict[str, str], list[str]] | None = None,
) -> None:
    """Read, change and replace the queue's ``.sqs`` file (last writer wins, as ``.attributes``)."""
    store = ctx.broker.store

    def update() -> None:
        meta = store.read_sqs_meta(queue)
        stored = dict(meta.get("attributes") or {})
        for key, value in (attributes or {}).items():
            if value is None:
                stored.pop(key, None)
            else:
                stored[key] = value
        current = dict(meta.get("tags") or {})
        if tags is not None:
            current = sqs.merge_tags(current, tags[0], tags[1])
        store.replace_sqs_meta(queue, {"attributes": stored, "tags": current})

    await ctx.store(update)


async def purge_queue(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """PurgeQueue (Broker.purge); PurgeQueueInProgress within 60 s of the last purge (SQS)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    state = await ctx.broker.queue_state(queue)
    last = sent_ms_of(state.purged_before) if state.purged_before else None
    if sqs.purge_in_progress(last, now_ms()):
        raise sqs.SqsError(
            "PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {queue} is allowed every 60 seconds.",
        )
    await ctx.broker.purge(queue)
    return {}


async def list_dead_letter_source_queues(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ListDeadLetterSourceQueues: queues whose RedrivePolicy names this one (MaxResults / NextToken)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    if not await ctx.broker.queue_exists(queue):
        raise sqs.SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    sources = []
    for name in await ctx.broker.list_queues(""):
        try:
            explicit = await ctx.store(ctx.broker.store.get_attributes, name)
        except MQError:
            continue
        if explicit.get("dead_letter_queue") == queue:
            sources.append(name)
    chosen, token = sqs.page(ctx.visible(sources), body.get("MaxResults"), body.get("NextToken"))
    out: dict[str, Any] = {"queueUrls": [ctx.url(n) for n in chosen]}
    if token is not None:
        out["NextToken"] = token
    return out


async def tag_queue(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """TagQueue: add or replace tags (kept in the queue's ``.sqs`` file)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    tags = sqs.check_tags(body.get("Tags"))
    await _update_sqs_meta(ctx, queue, tags=(tags, []))
    return {}


async def untag_queue(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """UntagQueue: remove the given tag keys."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    keys = body.get("TagKeys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise sqs.SqsError("InvalidParameterValue", "TagKeys must be a list of tag keys.")
    await _update_sqs_meta(ctx, queue, tags=({}, keys))
    return {}


async def list_queue_tags(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ListQueueTags."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    meta = await ctx.store(ctx.broker.store.read_sqs_meta, queue)
    tags = meta.get("tags") or {}
    return {"Tags": tags} if tags else {}


# -- messages ----------------------------------------------------------------------


async def send_message(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """SendMessage (Broker.send): MessageId, MD5OfMessageBody, MD5OfMessageAttributes."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    message = sqs.outgoing_message(body)
    group, dedup = sqs_fifo.check_send(queue, body)
    attrs = await ctx.broker.get_attributes(queue)
    _check_size(message.size_bytes, attrs.max_message_bytes)
    entry = SendEntry(
        message.body,
        SQS_CONTENT_TYPE,
        message.attributes or None,
        _delay_ms(queue, attrs, message),
        message.attribute_types,
        group,
        dedup,
    )
    message_id = await ctx.broker.sender.send(queue, entry)
    return {**_sent(message_id, message), **sqs_fifo.sent_fields(queue, message_id)}


def _delay_ms(queue: QueueName, attrs: QueueAttributes, message: sqs.OutgoingMessage) -> int:
    """A send's delay: its DelaySeconds, else the queue's; 0 on a FIFO queue (its delay applies at receive, 19.3)."""
    if message.delay_seconds is not None:
        return message.delay_seconds * 1000
    return 0 if is_fifo_queue(queue) else attrs.delay_seconds * 1000


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise sqs.SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes.",
        )


def _sent(message_id: str, message: sqs.OutgoingMessage) -> dict[str, Any]:
    out = {"MessageId": message_id, "MD5OfMessageBody": message.md5_of_body}
    if message.md5_of_attributes is not None:
        out["MD5OfMessageAttributes"] = message.md5_of_attributes
    return out


async def send_message_batch(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """SendMessageBatch (Broker.send_batch: one group commit); per-entry Successful / Failed."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    entries = sqs.check_batch(body.get("Entries"), "Entries")
    attrs = await ctx.broker.get_attributes(queue)
    failed: list[dict[str, Any]] = []
    valid: list[tuple[str, sqs.OutgoingMessage]] = []
    for entry in entries:
        try:
            message = sqs.outgoing_message(entry)
            group, dedup = sqs_fifo.check_send(queue, entry)
            _check_size(message.size_bytes, attrs.max_message_bytes)
            valid.append((entry["Id"], replace(message, group_id=group, dedup_id=dedup)))
        except sqs.SqsError as exc:
            failed.append(sqs.failed_entry(entry["Id"], exc))
    total = sum(m.size_bytes for _, m in valid)
    if total > sqs.MAX_BATCH_BYTES:
        raise sqs.SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {sqs.MAX_BATCH_BYTES} bytes.")
    successful: list[dict[str, Any]] = []
    if valid:
        send_entries = [
            SendEntry(
                m.body,
                SQS_CONTENT_TYPE,
                m.attributes or None,
                _delay_ms(queue, attrs, m),
                m.attribute_types or None,
                m.group_id,
                m.dedup_id,
            )
            for _, m in valid
        ]
        results = await ctx.broker.sender.send_batch(queue, send_entries)
        for (entry_id, message), result in zip(valid, results, strict=True):
            if isinstance(result, MQError):
                failed.append(sqs.failed_entry(entry_id, sqs.from_mq_error(result)))
            else:
                successful.append({"Id": entry_id, **_sent(result, message), **sqs_fifo.sent_fields(queue, result)})
    return {"Successful": successful, "Failed": failed}


async def receive_message(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ReceiveMessage (Broker.receive): MaxNumberOfMessages, WaitTimeSeconds, VisibilityTimeout,
    ReceiveRequestAttemptId, system attributes (AttributeNames / MessageSystemAttributeNames) and
    user attributes (MessageAttributeNames)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    max_messages = _int(body, "MaxNumberOfMessages", MAX_MESSAGES) or 1
    wait = _int(body, "WaitTimeSeconds", WAIT_TIME_SECONDS)
    visibility = _int(body, "VisibilityTimeout", VISIBILITY_TIMEOUT_SECONDS)
    attempt_id = body.get("ReceiveRequestAttemptId")
    if attempt_id is not None and not isinstance(attempt_id, str):
        raise sqs.SqsError("InvalidParameterValue", "ReceiveRequestAttemptId must be a string.")
    system = sqs.system_attribute_names(body.get("AttributeNames"), body.get("MessageSystemAttributeNames"))
    names = body.get("MessageAttributeNames")
    args = ReceiveArgs(max_messages, wait, visibility, attempt_id)
    messages = await ctx.broker.receive(queue, args)
    if messages and is_fifo_queue(queue):  # group ids of messages re-let by an attempt id, read from their files
        messages = await ctx.store(fifo.with_fifo_ids, ctx.broker.store, messages)
    return {"Messages": [_received(ctx, m, system, names) for m in messages]} if messages else {}


def _received(ctx: Context, message: ReceivedMessage, system: list[str], names: object) -> dict[str, Any]:
    text, md5 = sqs.body_and_md5(message.body)
    out: dict[str, Any] = {
        "MessageId": message.message_id,
        "ReceiptHandle": message.receipt_handle,
        "MD5OfBody": md5,
        "Body": text,
    }
    if system:  # only when asked for: most receives ask for none
        values = {
            "SenderId": ctx.account_id,
            "SentTimestamp": str(message.sent_ms),
            "ApproximateReceiveCount": str(message.receive_count),
            "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
        }
        if message.source_queue and message.source_queue != message.queue:
            values["DeadLetterQueueSourceArn"] = ctx.arn(message.source_queue)
        values.update(sqs_fifo.system_attributes(message))
        system_out = {n: values[n] for n in system if n in values}
        if system_out:
            out["Attributes"] = system_out
    if not names:
        return out
    user = sqs.wire_attributes(message.attributes, message.attribute_types, names)
    if user:
        out["MessageAttributes"] = user
        out["MD5OfMessageAttributes"] = sqs.md5_of_attributes(user)
    return out


def _handle(value: object) -> str:
    if value is None:
        raise sqs.SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    if not isinstance(value, str):
        raise sqs.SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    return value


def _parsed_handle(queue: QueueName, handle: object) -> ReceiptHandle:
    """The receipt handle of a delete or change of visibility, parsed for ``queue``.

    Raises:
        SqsError: MissingParameter, ReceiptHandleIsInvalid (malformed, or of another queue).
    """
    try:
        return check_handle(_handle(handle), queue)
    except MQError as exc:
        if exc.code == "invalid_receipt_handle":
            raise sqs.SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is invalid.") from None
        raise


def _delete_error(exc: MQError) -> sqs.SqsError | None:
    """A delete's error as SQS answers it: None (success) for a stale handle or a message already gone (SQS)."""
    if exc.code in ("stale_receipt_handle", "message_not_found"):
        return None
    return sqs.from_mq_error(exc)


async def _delete(ctx: Context, queue: QueueName, handle: object) -> None:
    """Delete by receipt handle; a stale handle or a message already gone succeeds without deleting (SQS)."""
    try:
        await ctx.broker.leases.delete_by_handle(queue, _parsed_handle(queue, handle))
    except MQError as exc:
        error = _delete_error(exc)
        if error is not None:
            raise error from None


async def delete_message(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """DeleteMessage (Broker.leases.delete_by_handle)."""
    await _delete(ctx, sqs.queue_from_url(body.get("QueueUrl")), body.get("ReceiptHandle"))
    return {}


async def _change(ctx: Context, queue: QueueName, handle: object, seconds: object) -> None:
    """Change visibility by receipt handle; a message no longer in flight under it: MessageNotInflight."""
    if seconds is None:
        raise sqs.SqsError("MissingParameter", "The request must contain the parameter VisibilityTimeout.")
    if not isinstance(seconds, int) or not VISIBILITY_TIMEOUT_SECONDS.contains(seconds):
        raise sqs.SqsError("InvalidParameterValue", f"Value {seconds!r} for parameter VisibilityTimeout is invalid.")
    parsed = _parsed_handle(queue, handle)
    try:
        await ctx.broker.leases.change_visibility(queue, parsed, seconds)
    except MQError as exc:
        if exc.code == "invalid_receipt_handle":
            raise sqs.SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is invalid.") from None
        raise


async def change_message_visibility(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ChangeMessageVisibility (Broker.leases.change_visibility)."""
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    await _change(ctx, queue, body.get("ReceiptHandle"), body.get("VisibilityTimeout"))
    return {}


async def _batch(
    ctx: Context, body: dict[str, Any], op: Callable[[QueueName, dict[str, Any]], Awaitable[None]]
) -> dict[str, Any]:
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    entries = sqs.check_batch(body.get("Entries"), "Entries")
    await ctx.broker.queue_state(queue)  # QueueDoesNotExist for the whole request

    async def one(entry: dict[str, Any]) -> sqs.SqsError | None:
        try:
            await op(queue, entry)
        except sqs.SqsError as exc:
            return exc
        except MQError as exc:
            return sqs.from_mq_error(exc)
        return None

    results = await asyncio.gather(*(one(e) for e in entries))
    successful = [{"Id": e["Id"]} for e, r in zip(entries, results, strict=True) if r is None]
    failed = [sqs.failed_entry(e["Id"], r) for e, r in zip(entries, results, strict=True) if r is not None]
    return {"Successful": successful, "Failed": failed}


async def delete_message_batch(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """DeleteMessageBatch: each entry as DeleteMessage, in one job of the remover thread (Leases.delete_by_handles).

    One rename per entry and one fsync of ``remove/`` for the batch, as concurrent deletes; a
    stale handle or a message already gone is a success, as DeleteMessage's.
    """
    queue = sqs.queue_from_url(body.get("QueueUrl"))
    entries = sqs.check_batch(body.get("Entries"), "Entries")
    await ctx.broker.queue_state(queue)  # QueueDoesNotExist for the whole request
    errors: list[sqs.SqsError | None] = [None] * len(entries)
    handles: list[tuple[int, ReceiptHandle]] = []
    for i, entry in enumerate(entries):
        try:
            handles.append((i, _parsed_handle(queue, entry.get("ReceiptHandle"))))
        except sqs.SqsError as exc:
            errors[i] = exc
    if handles:
        results = await ctx.broker.leases.delete_by_handles(queue, [h for _, h in handles])
        for (i, _), result in zip(handles, results, strict=True):
            if isinstance(result, MQError):
                errors[i] = _delete_error(result)
    successful = [{"Id": e["Id"]} for e, error in zip(entries, errors, strict=True) if error is None]
    failed = [sqs.failed_entry(e["Id"], error) for e, error in zip(entries, errors, strict=True) if error is not None]
    return {"Successful": successful, "Failed": failed}


async def change_message_visibility_batch(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ChangeMessageVisibilityBatch: each entry as ChangeMessageVisibility."""
    return await _batch(
        ctx, body, lambda queue, e: _change(ctx, queue, e.get("ReceiptHandle"), e.get("VisibilityTimeout"))
    )


# -- message move tasks (mq's redrive) ----------------------------------------------


async def start_message_move_task(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """StartMessageMoveTask: mq's redrive out of the dead-letter queue SourceArn (Broker.redrives.start)."""
    source = sqs.queue_from_arn(body.get("SourceArn"), "SourceArn")
    destination_arn = body.get("DestinationArn")
    destination = sqs.queue_from_arn(destination_arn, "DestinationArn") if destination_arn is not None else None
    rate = _int(body, "MaxNumberOfMessagesPerSecond", sqs.REDRIVE_RATE)
    status = await ctx.broker.redrives.start(source, destination, rate or DEFAULT_REDRIVE_RATE)
    return {"TaskHandle": sqs.task_handle(str(status["task_id"]), ctx.arn(source))}


async def cancel_message_move_task(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """CancelMessageMoveTask: stop the running redrive the TaskHandle names (Broker.redrives.cancel)."""
    task_id, source = sqs.parse_task_handle(body.get("TaskHandle"))
    current = await ctx.broker.redrives.read(source)
    if current is None or current.get("task_id") != task_id:
        raise sqs.SqsError("ResourceNotFoundException", "The specified task does not exist or is not running.")
    status = await ctx.broker.redrives.cancel(source)
    return {"ApproximateNumberOfMessagesMoved": status.get("moved", 0)}


async def list_message_move_tasks(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """ListMessageMoveTasks: the last redrive of SourceArn (mq keeps one task's status per queue)."""
    source = sqs.queue_from_arn(body.get("SourceArn"), "SourceArn")
    _int(body, "MaxResults", sqs.MOVE_TASKS_MAX_RESULTS)
    status = await ctx.broker.redrives.read(source)
    if status is None:
        return {"Results": []}
    return {"Results": [sqs.task_entry(status, region=ctx.region, account_id=ctx.account_id)]}


ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "CancelMessageMoveTask": cancel_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
}
