"""docs/api.md and docs/openapi.yaml document every route that mq serves.

PyYAML is not a dependency of the project, so openapi.yaml is read with a small
line-based reader of its ``paths:`` block (two-space indentation, as written):
``  /path:`` lines name paths and ``    method:`` lines under them name operations.
"""

from __future__ import annotations

import re
from pathlib import Path

from daemons.front import Broker, Settings, make_app

DOCS = Path(__file__).resolve().parents[2] / "docs"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def _normalize(path: str) -> str:
    """``/{queue}/messages/{message_id}`` -> ``/{}/messages/{}`` (variable names may differ)."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def openapi_operations(text: str) -> set[tuple[str, str]]:
    """(METHOD, normalized path) of every operation under ``paths:`` in openapi.yaml."""
    ops: set[tuple[str, str]] = set()
    in_paths = False
    path = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            in_paths = line.rstrip() == "paths:"
            path = None
            continue
        if not in_paths:
            continue
        m = re.fullmatch(r"  (/\S*):\s*", line)
        if m:
            path = _normalize(m.group(1))
            continue
        m = re.fullmatch(r"    ([a-z]+):\s*", line)
        if m and path is not None and m.group(1) in METHODS:
            ops.add((m.group(1).upper(), path))
    return ops


def api_md_operations(text: str) -> set[tuple[str, str]]:
    """(METHOD, normalized path) of every `` `METHOD /path` `` mention in api.md."""
    found = re.findall(r"`(GET|PUT|POST|DELETE|PATCH) (/[^`\s?]*)`", text)
    return {(method, _normalize(path)) for method, path in found}


async def served_operations(root: Path) -> set[tuple[str, str]]:
    """(METHOD, normalized canonical path) of every route of ``make_app`` (HEAD twins left out)."""
    broker = Broker(Settings(root=str(root)))
    try:
        app = make_app(broker)
        ops = set()
        for route in app.router.routes():
            if route.method in ("HEAD", "*"):
                continue
            ops.add((route.method, _normalize(route.resource.canonical)))
        return ops
    finally:
        await broker.close()


def test_openapi_reader_finds_the_paths_block() -> None:
    ops = openapi_operations((DOCS / "openapi.yaml").read_text())
    assert ("GET", "/") in ops
    assert ("DELETE", "/{}/messages/{}") in ops
    assert len(ops) >= 17


def test_api_md_and_openapi_document_the_same_operations() -> None:
    in_md = api_md_operations((DOCS / "api.md").read_text())
    in_yaml = openapi_operations((DOCS / "openapi.yaml").read_text())
    assert in_yaml - in_md == set(), "in openapi.yaml, not in api.md"
    assert in_md - in_yaml == set(), "in api.md, not in openapi.yaml"


async def test_every_served_route_is_documented(tmp_path: Path) -> None:
    served = await served_operations(tmp_path)
    assert ("POST", "/{}/messages") in served
    in_yaml = openapi_operations((DOCS / "openapi.yaml").read_text())
    in_md = api_md_operations((DOCS / "api.md").read_text())
    assert sorted(served - in_yaml) == [], "routes missing from docs/openapi.yaml"
    assert sorted(served - in_md) == [], "routes missing from docs/api.md"


async def test_every_documented_route_is_served(tmp_path: Path) -> None:
    served = await served_operations(tmp_path)
    in_yaml = openapi_operations((DOCS / "openapi.yaml").read_text())
    assert sorted(in_yaml - served) == [], "documented in openapi.yaml but not served"
