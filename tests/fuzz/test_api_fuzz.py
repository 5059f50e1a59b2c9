"""Schemathesis over docs/openapi.yaml against a live stack (mq, mq-mover, mq-reaper): every
operation gets generated requests, valid and invalid; no answer may be a 500, every answer must
match the documented status codes, content types, headers and schemas, nothing may appear
outside the root, and every daemon must still run at the end. Bounded: a few examples per
operation (``MQ_FUZZ_EXAMPLES``, default 15), no deadline."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi import checks

from tests.conftest import REPO, Daemons, Stack

EXAMPLES = int(os.environ.get("MQ_FUZZ_EXAMPLES", "15"))
#: Checks that test what JSON Schema cannot say about this API, not the server:
#: positive_data_acceptance expects every schema-valid request to succeed, but the API has rules
#: across fields (partition needs partitions, a receipt handle must be one the server issued, a
#: queue must exist); unsupported_method and allow_header_conformance expect a 405 listing only the
#: documented methods for every other method, but paths overlap by design: DELETE
#: /q/messages/batch is a delete of message id "batch" (400 invalid_message_id), and a 405's Allow
#: truthfully lists every route the path matches (test_405_lists_the_allowed_methods checks it).
NOT_CHECKED = [checks.positive_data_acceptance, checks.unsupported_method, checks.allow_header_conformance]


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = Daemons()
    base = tmp_path_factory.mktemp("fuzz")
    try:
        stack = started.stack(base / "root", visibility_timeout=1)
        yield stack
        # Nothing was written next to the root (a queue name or id that escaped it would land here).
        assert sorted(os.listdir(base)) == ["root"], os.listdir(base)
        assert all(d.running for d in stack.daemons()), stack.logs()
    finally:
        started.stop_all()


schema = schemathesis.openapi.from_path(REPO / "docs" / "openapi.yaml")


@schemathesis.serializer("application/x-amz-json-1.0")
def _amz_json(ctx: object, value: object) -> dict[str, bytes]:
    """Bodies of the SQS endpoint (AWS JSON 1.0 is JSON under its own media type)."""
    return {"data": json.dumps(value).encode()}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_answers_as_documented(case: schemathesis.Case, fuzz_stack: Stack) -> None:
    if case.query and case.query.get("wait_time_seconds") not in (None, 0, "0"):
        case.query["wait_time_seconds"] = 0  # a long poll proves nothing here and costs up to 20 s
    case.call_and_validate(base_url=fuzz_stack.url, timeout=30, excluded_checks=NOT_CHECKED)


def test_the_root_holds_only_the_protocol_directories(fuzz_stack: Stack) -> None:
    root = Path(fuzz_stack.root)
    assert set(os.listdir(root)) <= {"new", "queues", "delay", "remove", "tmp", "attempts", "redrive", ".mq"}, (
        os.listdir(root)
    )


def test_405_lists_the_allowed_methods(fuzz_stack: Stack) -> None:
    response = httpx.request("TRACE", f"{fuzz_stack.url}/", timeout=30)
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
    assert "GET" in response.headers["Allow"]
