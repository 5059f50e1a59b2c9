"""Checks shared by the HTTP tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

from typing import Any

import pytest


def assert_error(reply: Any, status: int, code: str | set[str], context: str = "") -> dict[str, Any]:
    """``reply`` has ``status`` and a JSON body ``{"error": code, "message": <non-empty str>}``; return the body."""
    codes = {code} if isinstance(code, str) else code
    assert reply.status == status, f"{context}: expected {status} {codes}, got {reply.status} {reply.body[:300]!r}"
    try:
        body = reply.json
    except ValueError:
        pytest.fail(f"{context}: {reply.status} body is not JSON: {reply.body[:300]!r}")
    assert isinstance(body, dict), f"{context}: {body!r}"
    assert body.get("error") in codes, f"{context}: expected error in {codes}, got {body!r}"
    assert isinstance(body.get("message"), str) and body["message"], f"{context}: no message in {body!r}"
    assert (reply.content_type or "").startswith("application/json"), f"{context}: {reply.content_type}"
    return body
