"""``GET /metrics`` with ``--processes N``: the totals over all mq processes (docs/metrics.md).

prometheus-client's multiprocess mode does not fit mq: it keeps every sample
in mmap files written on the hot path and supports neither custom collectors
(mq's per-queue counters and request histogram are plain dicts turned into
families at scrape time, ``daemons._metrics``) nor the process collector.
Instead each worker serves its own registry, unchanged, on a Unix socket in
the supervisor's private directory (:func:`own_metrics_app`), and the worker
that answers a scrape adds its siblings' samples to its own
(:func:`combine`), by metric type:

- counters, histograms and summaries, and the process gauges
  :data:`SUMMED_GAUGES` (memory, open files, frozen objects): summed per label set
  (``mq_messages_sent_total``, ``mq_http_request_duration_seconds``,
  ``process_cpu_seconds_total``, fsync latency...);
- every other gauge describes the shared root (ready, in flight, delayed,
  oldest age, free bytes, redrive): the answering worker's own value, which
  it computes from the disk and its index as a single mq does;
- ``mq_processes``: how many processes the totals cover (fewer than
  ``--processes`` while a worker restarts or did not answer within
  :data:`SIBLING_TIMEOUT_SECONDS`).

A counter total drops when a worker restarts (its counts start again at 0),
which Prometheus's ``rate()`` treats as a counter reset, as it does a restart
of a single mq.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from aiohttp import web

#: Gauges that are per process and add up over the processes.
SUMMED_GAUGES = frozenset(
    {"process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds", "mq_gc_objects_frozen"}
)
#: Metric types whose samples add up over the processes.
SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
#: Seconds a scrape waits for a sibling's metrics before leaving it out.
SIBLING_TIMEOUT_SECONDS = 2.0


def own_metrics_app(registry: CollectorRegistry) -> web.Application:
    """The private app a worker serves on its Unix socket: ``GET /metrics`` = its own registry, text format.

    The per-queue gauges are not refreshed (the answering worker computes its own).
    """
    from aiohttp import web  # here: mq-mover and mq-reaper import this module (gc_collector) but never aiohttp

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    return app


async def _fetch(path: str) -> str | None:
    """The text metrics of the worker listening on Unix socket ``path``; None if it does not answer."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path), timeout=aiohttp.ClientTimeout(total=SIBLING_TIMEOUT_SECONDS)
            ) as session,
            session.get("http://mq/metrics") as response,
        ):
            if response.status != 200:
                return None
            return await response.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None  # restarting, or stopped: left out (mq_processes says how many are in)


class Combined:
    """A ready-made list of metric families, in the shape the exposition encoders read (``collect()``)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def combine(own: str, others: list[str]) -> Combined:
    """Add ``others`` (text expositions of sibling workers) to ``own`` (this worker's), by metric type.

    Args:
        own: This worker's registry in the Prometheus text format.
        others: The siblings' registries, same format.
    Returns:
        The families of ``own`` (same names, order and help), their summable samples
        totalled, plus any summable series only a sibling has, and ``mq_processes``.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for position, text in enumerate([own, *others]):
        for family in text_string_to_metric_families(text):
            summed = family.type in SUMMED_TYPES or family.name in SUMMED_GAUGES
            if position > 0 and not summed:
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            into = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                into[key] = into.get(key, 0.0) + sample.value if summed else sample.value
    out = []
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
        out.append(family)
    processes = Metric("mq_processes", "mq processes whose counters these totals include (--processes).", "gauge")
    processes.add_sample("mq_processes", {}, 1 + len(others))
    out.append(processes)
    return Combined(out)


def combiner(siblings: list[str]) -> Callable[[CollectorRegistry], Awaitable[Any]]:
    """The ``BrokerMetrics.combine`` of a worker: its registry plus the registries at ``siblings`` (socket paths)."""

    async def combined(registry: CollectorRegistry) -> Combined:
        fetched = await asyncio.gather(*(_fetch(path) for path in siblings))
        own = generate_latest(registry).decode()
        return combine(own, [text for text in fetched if text is not None])

    return combined


class GcCollector(GCCollector):
    """The cyclic garbage collector's work in this process, as metric families (every daemon's ``/metrics``).

    prometheus-client's ``GCCollector`` families (``python_gc_collections_total``,
    ``python_gc_objects_collected_total``, ``python_gc_objects_uncollectable_total`` per generation, from
    ``gc.get_stats()``), plus ``mq_gc_pause_seconds_total`` per generation (wall time inside
    collections, timed by a ``gc.callbacks`` hook: a collection holds the GIL, so on the loop's thread it is
    a pause of the loop) and ``mq_gc_objects_frozen`` (``gc.get_freeze_count()``: the start-up's objects,
    :func:`daemons._runtime.freeze_start_up`). Two readings of the counters tell whether a bench window held
    a full collection (generation 2) and how long the collector held the process.

    One per process (:func:`gc_collector`): the hook is installed once.
    """

    def __init__(self) -> None:  # not GCCollector's: that would register itself with the default registry
        #: Seconds inside collections so far, per generation (0, 1, 2).
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def collect(self) -> Iterator[Metric]:
        """The families, read now."""
        pauses = CounterMetricFamily(
            "mq_gc_pause_seconds",
            "Seconds spent in the cyclic garbage collector's collections of this generation (the process's "
            "thread that set one off is held meanwhile).",
            labels=["generation"],
        )
        for generation, seconds in enumerate(self.seconds):
            pauses.add_metric([str(generation)], round(seconds, 6))
        frozen = GaugeMetricFamily(
            "mq_gc_objects_frozen",
            "Objects in the garbage collector's permanent generation (frozen after start-up; never walked).",
            value=gc.get_freeze_count(),
        )
        yield from super().collect()
        yield from (pauses, frozen)


_gc_collector: GcCollector | None = None


def gc_collector() -> GcCollector:
    """This process's :class:`GcCollector` (made, and its hook installed, on the first call)."""
    global _gc_collector
    if _gc_collector is None:
        _gc_collector = GcCollector()
    return _gc_collector
