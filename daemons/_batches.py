"""The batch routes: batch send, batch delete and batch change of visibility (SQS's ...Batch actions).

Each takes ``{"entries": [...]}`` (``daemons._shapes.batch_entries``), fails an invalid entry alone
(``failed`` with ``sender_fault``) and answers ``{"successful", "failed"}``. Split from
``daemons/_http.py`` (which serves the single-message routes and the queue routes) to keep each
module under 800 lines; the request helpers they share (``read_json``, ``BROKER``) live there.
"""

from __future__ import annotations

import asyncio
import binascii
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from daemons._answers import batch_ids_text
from daemons._broker import Broker
from daemons._http import BROKER, SMALL_JSON_LIMIT_BYTES, parse_json, read_body, read_json, required_timeout
from daemons._shapes import batch_entries, check_keys, failed_entry, query_params
from mqcore.attributes import QueueAttributes
from mqcore.errors import InvalidRequest, MQError
from mqcore.names import MessageId, QueueName, ReceiptHandle, check_message_id, check_queue_name
from mqcore.protocol import SendEntry
from mqcore.service import fifo
from mqcore.service.handles import check_handle
from mqcore.service.requests import check_message_size, entry_size, send_entry

__all__ = ["MAX_HANDLE_BATCH", "delete_batch", "delete_batch_of", "send_batch", "send_batch_of", "visibility_batch"]

#: Most entries of a batch delete or batch change of visibility (SQS: 10).
MAX_HANDLE_BATCH = 10


_SEND_ENTRY_KEYS = (
    "id",
    "body",
    "body_base64",
    "content_type",
    "attributes",
    "delay_seconds",
    "group_id",
    "deduplication_id",
)


def _b64_body(encoded: object, where: str) -> bytes:
    """A batch entry's ``body_base64`` decoded (RFC 4648, with padding; what ``b64decode(validate=True)`` does).

    Raises:
        InvalidRequest: Not a string, or not strict base64.
    """
    try:
        if type(encoded) is not str:
            raise TypeError
        return binascii.a2b_base64(encoded, strict_mode=True)
    except (TypeError, ValueError, binascii.Error):
        raise InvalidRequest(
            f"{where}.body_base64 must be a base64 string (RFC 4648, with padding)", field=f"{where}.body_base64"
        ) from None


def _send_entry(item: dict[str, Any], where: str, attrs: QueueAttributes, queue: QueueName) -> SendEntry:
    """One entry of a batch send as a SendEntry (per-entry errors: InvalidRequest, InvalidAttribute)."""
    if "body_base64" in item and (len(item) == 1 or (len(item) == 2 and "id" in item)):
        # The usual entry, a body and an id: no other key to check, the queue's delay, no attributes.
        return SendEntry(_b64_body(item["body_base64"], where), None, None, attrs.delay_seconds * 1000)
    check_keys(item, _SEND_ENTRY_KEYS, where)
    if ("body" in item) == ("body_base64" in item):
        raise InvalidRequest(f"{where} needs exactly one of body and body_base64", field=where)
    if "body" in item:
        if not isinstance(item["body"], str):
            raise InvalidRequest(f"{where}.body must be a string (stored as UTF-8)", field=f"{where}.body")
        try:
            body = item["body"].encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"{where}.body is not valid Unicode (lone surrogate)", field=f"{where}.body") from None
    else:
        body = _b64_body(item["body_base64"], where)
    entry = send_entry(
        body, item.get("content_type"), item.get("attributes"), item.get("delay_seconds"), attrs, where=f"{where}."
    )
    if "group_id" in item or "deduplication_id" in item:  # FIFO queues (docs/api.md)
        group, dedup = fifo.fifo_fields(queue, item.get("group_id"), item.get("deduplication_id"), f"{where}.")
        entry = replace(entry, group_id=group, dedup_id=dedup)
    return entry


async def send_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/batch {"entries": [...]} -> 200 {"successful", "failed"} (SQS SendMessageBatch).

    ``{"messages": [...]}`` is accepted as an alias of ``entries`` (the form before issue 10).

    Entries: {"id"?, "body" | "body_base64", "content_type"?, "attributes"?, "delay_seconds"?};
    1..--max-batch-messages of them, ids distinct. Valid entries are written on several saver
    threads at once and published with one group commit (Broker.send_batch, Broker._store_batch);
    each invalid one fails alone (sender_fault true). The sum of the bodies (and attributes)
    must fit max_message_bytes (413 for the whole request).
    """
    broker = request.app[BROKER]
    text = await send_batch_of(broker, request.match_info["queue"], request.query, lambda n: read_body(request, n))
    return web.Response(text=text, content_type="application/json")


async def send_batch_of(
    broker: Broker, queue_text: str, query: MultiMapping[str] | None, read: Callable[[int], Awaitable[bytes]]
) -> str:
    """The work of :func:`send_batch` (also ``daemons._wire``'s): the entries checked and stored; the answer's JSON.

    ``queue_text`` is the path's queue segment (not yet checked), ``query`` the query's parameters (None or
    empty without a query string), ``read(limit)`` reads the body, at most ``limit`` bytes (MessageTooLarge,
    RequestTimeout).

    Raises:
        MQError: Whatever :func:`send_batch` answers as an error (400, 404, 413, 503...).
    """
    queue = check_queue_name(queue_text)
    if query:
        query_params(query, ())
    state = await broker.queue_state(queue)
    attrs = state.attrs
    body = parse_json(await read(broker.settings.batch_request_limit_bytes))
    # "entries" as the batch delete and visibility take; "messages" is the older spelling, still accepted.
    key = "messages" if isinstance(body, dict) and "messages" in body and "entries" not in body else "entries"
    entries = batch_entries(body, key, broker.settings.max_batch_messages, default_ids=True)
    failed: list[dict[str, Any]] = []
    valid: list[tuple[str, SendEntry]] = []
    for i, (entry_id, item) in enumerate(entries):
        try:
            valid.append((entry_id, _send_entry(item, f"{key}[{i}]", attrs, queue)))
        except MQError as exc:
            failed.append(failed_entry(entry_id, exc))
    check_message_size(sum(entry_size(e) for _, e in valid), attrs)
    successful: list[str] = []
    if valid:
        results = await broker.sender.send_batch(queue, [e for _, e in valid])
        for (entry_id, _), result in zip(valid, results, strict=True):
            if isinstance(result, MQError):
                failed.append(failed_entry(entry_id, result))
            else:
                successful.append(f'{{"id": "{entry_id}", "message_id": "{result}"}}')
    # json.dumps of {"successful": [{"id", "message_id"}], "failed": [...]}, preformatted: an entry id is
    # 1-80 of [A-Za-z0-9_-] (batch_entries), a message id mq's own: neither needs escaping.
    return f'{{"successful": [{", ".join(successful)}], "failed": {json.dumps(failed)}}}'


async def _run_entries(
    entries: list[tuple[str, dict[str, Any]]], op: Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]
) -> web.Response:
    """Run ``op`` on every entry concurrently (their fsyncs are group-committed); collect the batch answer."""

    async def one(i: int, entry_id: str, item: dict[str, Any]) -> dict[str, Any] | MQError:
        try:
            return await op(entry_id, item, f"entries[{i}]")
        except MQError as exc:
            return exc

    results = await asyncio.gather(*(one(i, entry_id, item) for i, (entry_id, item) in enumerate(entries)))
    successful: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for (entry_id, _), result in zip(entries, results, strict=True):
        if isinstance(result, MQError):
            failed.append(failed_entry(entry_id, result))
        else:
            successful.append(result)
    return web.json_response({"successful": successful, "failed": failed})


async def delete_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/delete {"entries": [{"id", "receipt_handle" | "message_id"}]} (1-10)
    -> 200 {"successful": [{"id"}], "failed": [...]} (SQS DeleteMessageBatch; by id as SoftLayer)."""
    text = await delete_batch_of(
        request.app[BROKER], request.match_info["queue"], request.query, lambda n: read_body(request, n)
    )
    return web.Response(text=text, content_type="application/json")


async def delete_batch_of(
    broker: Broker, queue_text: str, query: MultiMapping[str] | None, read: Callable[[int], Awaitable[bytes]]
) -> str:
    """The work of :func:`delete_batch` (also ``daemons._wire``'s); the answer's JSON (arguments as
    :func:`send_batch_of`'s).

    Raises:
        MQError: Whatever :func:`delete_batch` answers as an error (400, 404, 413, 503...).
    """
    queue = check_queue_name(queue_text)
    if query:
        query_params(query, ())
    entries = batch_entries(
        parse_json(await read(SMALL_JSON_LIMIT_BYTES)), "entries", MAX_HANDLE_BATCH, default_ids=False
    )
    await broker.queue_state(queue)
    errors: list[MQError | None] = [None] * len(entries)
    targets: list[tuple[int, ReceiptHandle | MessageId]] = []
    for i, (_, item) in enumerate(entries):
        if len(item) == 2 and "receipt_handle" in item and "id" in item:  # the usual entry: nothing else to check
            try:
                targets.append((i, check_handle(item["receipt_handle"], queue)))
            except MQError as exc:
                errors[i] = exc
            continue
        where = f"entries[{i}]"
        try:
            check_keys(item, ("id", "receipt_handle", "message_id"), where)
            if ("receipt_handle" in item) == ("message_id" in item):
                raise InvalidRequest(f"{where} needs exactly one of receipt_handle and message_id", field=where)
            if "receipt_handle" in item:
                targets.append((i, check_handle(item["receipt_handle"], queue)))
            else:
                targets.append((i, check_message_id(item["message_id"])))
        except MQError as exc:
            errors[i] = exc
    results = await broker.leases.delete_many(queue, [target for _, target in targets])
    for (i, _), result in zip(targets, results, strict=True):
        if isinstance(result, MQError):
            errors[i] = result
    pairs = list(zip((entry_id for entry_id, _ in entries), errors, strict=True))
    return batch_ids_text(
        [entry_id for entry_id, error in pairs if error is None],
        [failed_entry(entry_id, error) for entry_id, error in pairs if error is not None],
    )


async def visibility_batch(request: web.Request) -> web.Response:
    """POST /<queue>/messages/visibility {"entries": [{"id", "receipt_handle", "visibility_timeout_seconds"}]}
    (1-10) -> 200 {"successful": [{"id", "receipt_handle", "visibility_deadline_ms"}], "failed": [...]}
    (SQS ChangeMessageVisibilityBatch)."""
    queue = check_queue_name(request.match_info["queue"])
    query_params(request, (), '{"entries": [{"id", "receipt_handle", "visibility_timeout_seconds"}]}')
    broker = request.app[BROKER]
    entries = batch_entries(await read_json(request), "entries", MAX_HANDLE_BATCH, default_ids=False)
    await broker.queue_state(queue)

    async def op(entry_id: str, item: dict[str, Any], where: str) -> dict[str, Any]:
        check_keys(item, ("id", "receipt_handle", "visibility_timeout_seconds"), where)
        timeout = required_timeout(item, f"{where}.")
        handle = check_handle(item.get("receipt_handle"), queue)
        _, current, deadline = await broker.leases.change_visibility(queue, handle, timeout)
        return {"id": entry_id, "receipt_handle": current, "visibility_deadline_ms": deadline}

    return await _run_entries(entries, op)
