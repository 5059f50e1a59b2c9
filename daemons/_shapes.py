"""Shape checks of a request's parts, shared by the native routes (``daemons/_http.py``) and others.

Query parameters given once and known, JSON objects with only known keys, the entries of a
batch request (SQS's batch rules: 1..N entries with distinct ids of 1-80 characters of
``[A-Za-z0-9_-]``), a batch answer's ``failed`` item, and the ``X-Message-Attributes`` header.
Pure functions: each raises an :class:`mqcore.errors.MQError` subclass the error middleware
turns into a 400 with a JSON body naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from mqcore.attributes import check_message_attributes
from mqcore.errors import InvalidAttribute, InvalidRequest, MQError, cap, echo

_ENTRY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _short(value: object) -> str:
    """``value`` in JSON spelling, capped (``mqcore.errors.echo``): error messages name bad input without
    echoing all of it."""
    return echo(value)


def query_params(
    request: web.BaseRequest | MultiMapping[str], allowed: tuple[str, ...], body_form: str | None = None
) -> dict[str, str]:
    """The query parameters, each given at most once and each one of ``allowed``.

    Args:
        request: The request, or its query's parameters (``daemons._wire``'s requests are not aiohttp's).
        allowed: The parameter names the route takes.
        body_form: For a route that takes its values in a JSON body, that body's form (e.g.
            ``{"visibility_timeout_seconds": N}``): an unknown parameter's message names it.
    Raises:
        InvalidRequest: An unknown or repeated parameter (400, ``details.parameter``).
    """
    out: dict[str, str] = {}
    query = request.query if isinstance(request, web.BaseRequest) else request
    for key, value in query.items():
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            hint = f"; this call takes a JSON body {body_form}" if body_form else ""
            raise InvalidRequest(f"unknown query parameter {_short(key)} (known: {known}{hint})", parameter=cap(key))
        if key in out:
            raise InvalidRequest(f"query parameter {_short(key)} is given more than once", parameter=cap(key))
        out[key] = value
    return out


def check_keys(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """Raise InvalidRequest naming the first key of ``obj`` not in ``allowed``."""
    for key in obj:
        if key not in allowed:
            raise InvalidRequest(
                f"unknown key {_short(key)} in {where} (known: {', '.join(allowed)})",
                field=cap(f"{where}.{key}"),
            )


def batch_entries(body: Any, key: str, limit: int, *, default_ids: bool) -> list[tuple[str, dict[str, Any]]]:
    """The entries of a batch request ``{key: [entry, ...]}`` with their ids.

    Whole-request rules (SQS's batch rules): a JSON object with only ``key``;
    1..``limit`` entries, each an object; ids of 1-80 characters of
    ``[A-Za-z0-9_-]``, distinct (default: the entry's index, if ``default_ids``).

    Raises:
        InvalidRequest: Any of those broken (400); the message names the entry.
    """
    if not isinstance(body, dict):
        raise InvalidRequest(f'the body must be a JSON object {{"{key}": [...]}}')
    check_keys(body, (key,), "the request")
    items = body.get(key)
    if not isinstance(items, list):
        raise InvalidRequest(f"{key} must be a list of 1-{limit} entries", field=key)
    if not 1 <= len(items) <= limit:
        raise InvalidRequest(
            f"a batch holds 1-{limit} entries, got {len(items)}", field=key, entries=len(items), max_entries=limit
        )
    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"{key}[{i}] must be a JSON object", field=f"{key}[{i}]")
        entry_id = item.get("id", str(i) if default_ids else None)
        if not isinstance(entry_id, str) or not _ENTRY_ID_RE.fullmatch(entry_id):
            raise InvalidRequest(
                f"{key}[{i}].id must be 1-80 characters of A-Z, a-z, 0-9, '-', '_', got {_short(entry_id)}",
                field=f"{key}[{i}].id",
            )
        if entry_id in seen:
            raise InvalidRequest(f"entry id {_short(entry_id)} is used more than once", field=f"{key}[{i}].id")
        seen.add(entry_id)
        out.append((entry_id, item))
    return out


def failed_entry(entry_id: str, exc: MQError) -> dict[str, Any]:
    """A ``failed`` item of a batch answer; sender_fault is true for 4xx errors a retry cannot fix.

    ``details`` (sizes, names, retry_after_seconds) is there when the error has any, as in a
    whole-request error body, so a client can rebuild the same typed error.
    """
    item: dict[str, Any] = {
        "id": entry_id,
        "error": exc.code,
        "message": exc.message,
        "sender_fault": 400 <= exc.status < 500 and not exc.retriable,
    }
    if exc.details:
        item["details"] = exc.details
    return item


def parse_message_attributes(text: str | None) -> dict[str, str]:
    """The ``X-Message-Attributes`` header: a JSON object name -> string (SQS message attribute rules).

    Raises:
        InvalidAttribute: Not JSON, or any rule of ``check_message_attributes`` broken (400).
    """
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidAttribute("X-Message-Attributes must be a JSON object of name -> string", name=None) from None
    return check_message_attributes(obj)
