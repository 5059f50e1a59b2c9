"""Every daemon freezes its start-up's objects out of the garbage collector and reports the collector's work.

(issue 12, stop 26; docs/metrics.md "The garbage collector".) The three daemons run as subprocesses on a real
root; their ``/metrics`` are scraped over HTTP and parsed with prometheus-client's own parser.
"""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families
from test_metrics import free_port, scrape, value

GENERATIONS = ("0", "1", "2")


async def test_each_daemon_reports_the_collector_and_its_frozen_start_up(stack_factory, http) -> None:
    mover_port, reaper_port = free_port(), free_port()
    stack = stack_factory(
        mover_args=["--metrics-port", str(mover_port)], reaper_args=["--metrics-port", str(reaper_port)]
    )
    await stack.create_queue("g")
    for i in range(50):
        await stack.send("g", f"m{i}".encode())
    for name, url in (
        ("mq", f"{stack.url}/metrics"),
        ("mq-mover", f"http://127.0.0.1:{mover_port}/metrics"),
        ("mq-reaper", f"http://127.0.0.1:{reaper_port}/metrics"),
    ):
        samples = await scrape(http, url)
        # A daemon's imports alone are tens of thousands of objects the collector tracks.
        assert value(samples, "mq_gc_objects_frozen") > 10_000, (name, stack.logs())
        for generation in GENERATIONS:
            assert ("python_gc_collections_total", frozenset({("generation", generation)})) in samples, name
            assert value(samples, "python_gc_objects_uncollectable_total", generation=generation) == 0, name
            assert value(samples, "mq_gc_pause_seconds_total", generation=generation) >= 0, name
        assert f"{name}: " in stack.logs() and "objects of the start-up frozen" in stack.logs()


async def test_pause_seconds_count_the_collections_that_ran(stack_factory, http) -> None:
    stack = stack_factory(mover=False, reaper=False)
    before = await scrape(http, f"{stack.url}/metrics")
    await stack.create_queue("c")
    # Enough requests that young collections run in mq: each allocates objects the collector tracks.
    await asyncio.gather(*(stack.send("c", json.dumps({"n": i}).encode()) for i in range(300)))
    after = await scrape(http, f"{stack.url}/metrics")
    young = value(after, "python_gc_collections_total", generation="0") - value(
        before, "python_gc_collections_total", generation="0"
    )
    assert young > 0
    assert value(after, "mq_gc_pause_seconds_total", generation="0") > value(
        before, "mq_gc_pause_seconds_total", generation="0"
    )
    async with http.get(f"{stack.url}/metrics") as resp:
        families = {family.name: family for family in text_string_to_metric_families(await resp.text())}
    assert families["mq_gc_pause_seconds"].type == "counter"
    assert families["mq_gc_objects_frozen"].type == "gauge"
