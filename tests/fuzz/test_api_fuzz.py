"""Schemathesis over docs/openapi.yaml against a live stack (mq, mq-mover, mq-reaper): every
operation gets generated requests, valid and invalid; no answer may be a 500, every answer must
match the documented status codes, content types, headers and schemas, nothing may appear
outside the root, and every daemon must still run at the end. Bounded: a few examples per
operation (``MQ_FUZZ_EXAMPLES``, default 15), no deadline.

Stateful too: schemathesis' state machine follows the OpenAPI links of docs/openapi.yaml
(create a queue -> send -> receive -> delete by receipt handle or change its visibility, ...),
so later steps use the queues, ids and receipt handles earlier answers gave, with the same
checks. Bounded: ``MQ_FUZZ_SCENARIOS`` scenarios (default 30) of at most 8 steps."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import initialize
from schemathesis.core.transport import Response
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput
from schemathesis.specs.openapi import checks

from tests.conftest import PLAIN_HTTP, REPO, Daemons, Stack

EXAMPLES = int(os.environ.get("MQ_FUZZ_EXAMPLES", "15"))
SCENARIOS = int(os.environ.get("MQ_FUZZ_SCENARIOS", "30"))
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
    _no_long_poll(case)
    case.call_and_validate(base_url=fuzz_stack.url, timeout=30, excluded_checks=NOT_CHECKED)


def _no_long_poll(case: schemathesis.Case) -> None:
    if case.query and case.query.get("wait_time_seconds") not in (None, 0, "0"):
        case.query["wait_time_seconds"] = 0  # a long poll proves nothing here and costs up to 20 s


def _single_form_receive(case: schemathesis.Case) -> bool:
    return case.operation.label == "GET /{queue}/messages" and "max_messages" not in (case.query or {})


def test_chains_of_operations_follow_the_links(fuzz_stack: Stack) -> None:
    linked = schemathesis.openapi.from_path(REPO / "docs" / "openapi.yaml")
    # Only the documented links (not schemathesis' inferred ones), so every chain is one docs/openapi.yaml states.
    linked.config.phases.stateful.inference.algorithms = []
    machine = linked.as_state_machine()
    names = itertools.count()

    class Chains(machine):  # type: ignore[misc,valid-type]  # schemathesis builds the class at run time
        # Schemathesis starts chains only at POSTs that have links (here: a send to a random, so missing,
        # queue); each scenario first creates a queue, so the links from PUT /{queue} have a queue to follow.
        @initialize(target=machine.bundles["PUT /{queue} -> 201"])
        def create_queue(self) -> StepOutput:
            case = linked["/{queue}"]["PUT"].Case(path_parameters={"queue": f"chain-{next(names)}"})
            self.recorder.record_case(case=case)  # as schemathesis' own rules do: later links name it as parent
            output = self.step(StepInput.initial(case))
            assert output.response.status_code == 201, output.response.text
            return output

        def before_call(self, case: schemathesis.Case) -> None:
            _no_long_poll(case)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
            return {"base_url": fuzz_stack.url, "timeout": 30}

        def validate_response(self, response: Response, case: schemathesis.Case, **kwargs: object) -> None:
            excluded = NOT_CHECKED
            if _single_form_receive(case) and response.status_code == 200:
                # The single form answers the message's body as it was sent, under the sender's Content-Type
                # (docs/api.md): a JSON message there is not a ReceiveResult, which a schema cannot tie to the
                # absence of max_messages. What the single form promises instead: the message in headers.
                assert response.headers.get("x-message-id") and response.headers.get("x-receipt-handle"), response
                excluded = [*NOT_CHECKED, checks.response_schema_conformance, checks.content_type_conformance]
            case.validate_response(response, excluded_checks=excluded, recorder=self.recorder)

    Chains.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )


def test_the_root_holds_only_the_protocol_directories(fuzz_stack: Stack) -> None:
    root = Path(fuzz_stack.root)
    assert set(os.listdir(root)) <= {"new", "queues", "delay", "remove", "tmp", "attempts", "redrive", ".mq"}, (
        os.listdir(root)
    )


def test_405_lists_the_allowed_methods(fuzz_stack: Stack) -> None:
    response = httpx.request("TRACE", f"{fuzz_stack.url}/", timeout=30, verify=PLAIN_HTTP)
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
    assert "GET" in response.headers["Allow"]
