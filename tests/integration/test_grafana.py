"""grafana/mq.json only names metrics that mq, mq-mover and mq-reaper export.

The names are taken from a live stack's scrapes (all three daemons, metrics on),
parsed with prometheus-client's parser: a family's name plus the sample names
it implies (``_total`` of a counter; ``_bucket``, ``_sum``, ``_count`` of a
histogram), so a labelled counter that has not counted yet still counts as
exported.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "mq.json"
#: A metric name in a PromQL expression (ours and the process collector's).
METRIC_RE = re.compile(r"\b((?:mq|process)_[a-z0-9_]+)\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL string of the dashboard: targets' ``expr`` and template variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str | dict):
                yield value if isinstance(value, str) else value.get("query", "")
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


async def exported_names(http: Any, urls: list[str]) -> set[str]:
    names: set[str] = set()
    for url in urls:
        async with http.get(url) as resp:
            assert resp.status == 200
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
            names.update(sample.name for sample in family.samples)
    return names


async def test_every_dashboard_expression_names_an_exported_metric(stack_factory, http) -> None:
    mover_port, reaper_port = free_port(), free_port()
    stack = stack_factory(
        mover_args=["--metrics-port", str(mover_port)], reaper_args=["--metrics-port", str(reaper_port)]
    )
    await stack.create_queue("g")
    await stack.send("g", b"x")
    names = await exported_names(
        http,
        [stack.url + "/metrics", f"http://127.0.0.1:{mover_port}/metrics", f"http://127.0.0.1:{reaper_port}/metrics"],
    )
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [e for e in expressions(dashboard) if METRIC_RE.search(e)]
    targets = sum(len(p.get("targets", [])) for p in dashboard["panels"])
    assert targets >= 20 and len(exprs) >= targets, "the dashboard lost its panels?"
    used = {name for expr in exprs for name in METRIC_RE.findall(expr)}
    assert sorted(used - names) == [], "the dashboard names metrics no daemon exports"
    for needed in ("mq_queue_messages_ready", "mq_queue_oldest_message_age_seconds", "mq_storage_free_bytes"):
        assert needed in used
    assert any("histogram_quantile" in e and "mq_http_request_duration_seconds_bucket" in e for e in exprs)
