"""tests/fuzz's collection: schemathesis' coverage-phase cases are built when a test runs, not when it is collected.

``@schema.parametrize()`` (test_api_fuzz.py) makes one test item per operation of docs/openapi.yaml, and
schemathesis builds each item's coverage-phase cases (its explicit examples: every boundary and invalid value the
schema allows, ``schemathesis.generation.hypothesis.builder.add_coverage``) while pytest *collects* the module:
~3 CPU-s on a quiet machine, in every xdist worker of ``scripts/test.sh`` and in its warm-up collection, though
one worker runs tests/fuzz (docs/performance.md, "mqctl, daemon start-ups and tests/fuzz's collection
(issue 12, stop 30)").

Here the collection of this folder keeps ``add_coverage``'s arguments on the test function instead, and the
item's set-up calls the real ``add_coverage`` with them on the same function: the same generator, operation and
configuration, so the same cases in the same order (they are appended after the schema's own examples, as
schemathesis does; Hypothesis runs explicit examples in reverse order of attachment). No case and no phase is
dropped; a coverage case schemathesis cannot build (``InvalidSchema``) fails the item's set-up instead of its
collection. Items that a worker never runs never pay for their cases.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
from schemathesis.generation.hypothesis import builder

#: Schemathesis' own builder of an operation's coverage-phase examples (schemathesis 4.x).
_ADD_COVERAGE: Callable[..., Callable[..., Any]] = builder.add_coverage
#: Where a collected test function keeps the arguments of its coverage cases until its item is set up.
_PENDING = "_mq_coverage_cases_pending"


def _add_coverage_later(test: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Stands in for ``builder.add_coverage`` while this folder is collected: keeps its arguments on ``test``."""
    setattr(test, _PENDING, (args, kwargs))
    return test


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """Collect this folder's nodes with the coverage cases put off (only while they are collected)."""
    builder.add_coverage = _add_coverage_later
    try:
        return (yield)
    finally:
        builder.add_coverage = _ADD_COVERAGE


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before an item of this folder runs: attach the coverage cases its collection put off (once)."""
    test = getattr(item, "obj", None)
    pending = vars(test).pop(_PENDING, None) if test is not None and hasattr(test, "__dict__") else None
    if pending is not None:
        args, kwargs = pending
        _ADD_COVERAGE(test, *args, **kwargs)
