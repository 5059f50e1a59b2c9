"""docs/api.md and docs/openapi.yaml document every route that mq serves.

openapi.yaml is parsed with PyYAML and checked against the OpenAPI 3.1 schema
by openapi-spec-validator; api.md is searched for `` `METHOD /path` `` mentions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from openapi_spec_validator import validate

from daemons.front import Broker, Settings, make_app

DOCS = Path(__file__).resolve().parents[2] / "docs"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def _normalize(path: str) -> str:
    """``/{queue}/messages/{message_id}`` -> ``/{}/messages/{}`` (variable names may differ)."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def load_openapi() -> dict[str, Any]:
    """docs/openapi.yaml as a dict."""
    return yaml.safe_load((DOCS / "openapi.yaml").read_text())


def openapi_operations(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(METHOD, normalized path) of every operation under ``paths``."""
    return {
        (method.upper(), _normalize(path))
        for path, item in spec["paths"].items()
        for method in item
        if method in METHODS
    }


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


def test_openapi_document_is_valid_openapi() -> None:
    spec = load_openapi()
    validate(spec)  # raises on any violation of the OpenAPI schema
    ops = openapi_operations(spec)
    assert ("GET", "/") in ops
    assert ("DELETE", "/{}/messages/{}") in ops
    assert len(ops) >= 17


def test_api_md_and_openapi_document_the_same_operations() -> None:
    in_md = api_md_operations((DOCS / "api.md").read_text())
    in_yaml = openapi_operations(load_openapi())
    assert in_yaml - in_md == set(), "in openapi.yaml, not in api.md"
    assert in_md - in_yaml == set(), "in api.md, not in openapi.yaml"


async def test_every_served_route_is_documented(tmp_path: Path) -> None:
    served = await served_operations(tmp_path)
    assert ("POST", "/{}/messages") in served
    in_yaml = openapi_operations(load_openapi())
    in_md = api_md_operations((DOCS / "api.md").read_text())
    assert sorted(served - in_yaml) == [], "routes missing from docs/openapi.yaml"
    assert sorted(served - in_md) == [], "routes missing from docs/api.md"


async def test_every_documented_route_is_served(tmp_path: Path) -> None:
    served = await served_operations(tmp_path)
    in_yaml = openapi_operations(load_openapi())
    assert sorted(in_yaml - served) == [], "documented in openapi.yaml but not served"
