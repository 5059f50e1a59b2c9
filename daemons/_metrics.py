"""Prometheus metrics of the three daemons (``GET /metrics`` on mq, ``--metrics-port`` on mq-mover and mq-reaper).

Exposition and registries are prometheus-client's. What mq counts on its hot
path is kept lean: a send, receive or delete adds to a plain ``dict`` on the
event-loop thread (no lock, no prometheus-client child lookup), and the HTTP
request histogram is a list of bucket counts per (route, method, status),
also loop-thread only. Both become metric families in custom collectors at
scrape time. Per-queue gauges (ready, in flight, delayed, oldest age, redrive
progress) are computed at scrape time from the broker's indexes and one
listing of ``delay/``, never updated per message. Storage metrics (fsync
latency, group-commit size, errors by step) come from
:data:`mqcore.protocol.STORAGE_HOOKS`, called on the saver threads: the fsync
and group-commit size histograms are lock-free queues of observations counted at
scrape (:class:`LocklessHistogram`), the others prometheus-client's thread-safe metrics.

Several daemons on one root: every daemon serves its own registry and
Prometheus scrapes each as its own target (its ``instance`` label), so no
multiprocess mode is needed; docs/metrics.md says how to aggregate. The
workers of one ``mq --processes N`` share a port, so there the worker that
answers adds its siblings' counters to its own (``daemons._procmetrics``).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.exposition import choose_encoder, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from daemons._procmetrics import gc_collector
from daemons._scrape import OTHER, Lines, QueueGauges, ScrapeCache, gauge_families, gauge_text
from mqcore.names import QueueName
from mqcore.protocol import STORAGE_HOOKS, now_ms

if TYPE_CHECKING:
    from aiohttp import web

    from daemons._broker import Broker

logger = logging.getLogger("mq.metrics")


class _Status(Protocol):
    """An answer with a status (an aiohttp response, or ``daemons._wire``'s preformatted answer)."""

    @property
    def status(self) -> int: ...


_Answer = TypeVar("_Answer", bound=_Status)

# No ``_created`` series: they double the output and no dashboard here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: The content type of OpenMetrics (the encoder then ends with ``# EOF``).
OPENMETRICS = "application/openmetrics-text"
#: Default of ``--metrics-max-queues``: queues named in labels before the rest go under ``_other``.
DEFAULT_MAX_QUEUES = 1000
#: Upper bounds of the HTTP request latency buckets, in seconds (a long poll lasts up to 20 s).
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)
#: Upper bounds of the fsync latency buckets, in seconds.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: The kinds of fsync the fsync histogram has a series for (its ``kind`` label).
FSYNC_KINDS = ("file", "directory", "syncfs")
#: Observations that may wait for a scrape before the observing thread counts them (:class:`LocklessHistogram`).
#: Small, because that thread is often the event loop in a lone send before its ``201``: 4096 made a lump
#: of ~8,200 observations, ~2 ms, once per 4,096 sends; 256 makes it ~0.12 ms (docs/performance.md, stop 27 "tail").
FSYNC_PENDING_MAX = 256
#: Upper bounds of the group-commit batch size buckets (callers covered by one directory fsync).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Upper bounds of mq-mover's redelivery lag buckets, in seconds (how late after its deadline a file moved).
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: The per-queue counters mq itself counts: event kind -> (metric name without ``_total``, help).
BROKER_COUNTERS = {
    "sent": ("mq_messages_sent", "Messages stored by sends through this process (SQS NumberOfMessagesSent)."),
    "received": (
        "mq_messages_received",
        "Messages handed out by receives of this process (SQS NumberOfMessagesReceived).",
    ),
    "deleted": ("mq_messages_deleted", "Messages deleted through this process (SQS NumberOfMessagesDeleted)."),
    "purged": ("mq_messages_purged", "Messages removed by purges through this process."),
    "capacity_rejected": (
        "mq_capacity_rejections",
        "Sends refused with 429 queue_full (the queue stayed at its capacity for capacity_wait_seconds).",
    ),
}


class QueueLabels:
    """Bounded ``queue`` label values: the first ``max_queues`` queues seen keep their name, later ones ``_other``.

    Args:
        max_queues: How many names to keep (``--metrics-max-queues``; 0 = every queue is ``_other``).
    """

    def __init__(self, max_queues: int = DEFAULT_MAX_QUEUES) -> None:
        self.max_queues = max_queues
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, queue: str) -> str:
        """The label value of ``queue``."""
        if queue in self._named:
            return queue
        with self._lock:
            if len(self._named) < self.max_queues:
                self._named.add(queue)
                return queue
        return OTHER


class BrokerCounts:
    """Per-queue event counts of the mq daemon, added on the event-loop thread only (no lock).

    Args:
        labels: The bounded label values.
    """

    def __init__(self, labels: QueueLabels) -> None:
        self.labels = labels
        self.counts: dict[str, dict[str, int]] = {kind: {} for kind in BROKER_COUNTERS}

    def add(self, kind: str, queue: str, n: int = 1) -> None:
        """Count ``n`` events of ``kind`` (a key of :data:`BROKER_COUNTERS`) on ``queue``."""
        if n:
            by_queue = self.counts[kind]
            label = self.labels(queue)
            by_queue[label] = by_queue.get(label, 0) + n


class RequestTimes:
    """The ``mq_http_request_duration_seconds`` histogram, kept as plain bucket counts (event-loop thread only)."""

    def __init__(self) -> None:
        #: (route, method, status) -> [count per bucket (last = +Inf)..., sum of seconds]
        self.series: dict[tuple[str, str, str], list[float]] = {}

    def observe(self, key: tuple[str, str, str], seconds: float) -> None:
        """Count one request of ``key`` that took ``seconds``."""
        row = self.series.get(key)
        if row is None:
            row = self.series[key] = [0.0] * (len(REQUEST_BUCKETS) + 2)
        row[bisect.bisect_left(REQUEST_BUCKETS, seconds)] += 1
        row[-1] += seconds

    def family(self) -> HistogramMetricFamily:
        """The histogram as a metric family (cumulative buckets, as Prometheus wants)."""
        family = HistogramMetricFamily(
            "mq_http_request_duration_seconds",
            "HTTP requests by route, method and status, and how long they took (seconds).",
            labels=["route", "method", "status"],
        )
        for key, row in list(self.series.items()):
            running = 0.0
            buckets = []
            for bound, n in zip((*map(str, REQUEST_BUCKETS), "+Inf"), row[:-1], strict=True):
                running += n
                buckets.append((bound, running))
            family.add_metric(list(key), buckets, row[-1])
        return family


def metrics_middleware(times: RequestTimes) -> Callable[..., Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that times every request into ``times`` (two clock reads and a dict lookup)."""
    from aiohttp import web  # here, not at the top: mq-mover and mq-reaper import this module without aiohttp

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        return await timed(times, route, request.method, handler(request))

    return middleware


async def timed(times: RequestTimes, route: str, method: str, answer: Awaitable[_Answer]) -> _Answer:
    """Await ``answer`` (one request's handling) and count it in ``times`` under (route, method, status).

    ``answer`` gives an aiohttp response or anything else with an int ``status`` (``daemons._wire``'s answers).

    The status is the answer's; an ``HTTPException`` raised through it counts under its own status,
    a client gone (``CancelledError``) as 499, any other exception as 500. Used by
    :func:`metrics_middleware` and by ``daemons._fastpath`` (the hot routes without middlewares).

    Raises:
        BaseException: Whatever ``answer`` raises, after counting it.
    """
    started = time.perf_counter()
    status = 500
    try:
        response = await answer
        status = response.status
        return response
    except BaseException as exc:
        status = failed_status(exc)
        raise
    finally:
        times.observe((route, method, str(status)), time.perf_counter() - started)


def failed_status(exc: BaseException) -> int:
    """The status a request that raised ``exc`` counts under: 499 for a client gone (``CancelledError``; nginx's
    "client closed request", e.g. during a long poll), an ``HTTPException``'s own status, else 500."""
    if isinstance(exc, asyncio.CancelledError):
        return 499
    from aiohttp import web  # only on this path: not an import per request (mq-reaper imports no aiohttp)

    return exc.status if isinstance(exc, web.HTTPException) else 500


class LocklessHistogram(Collector):
    """A histogram observed from any thread without a lock (by default ``mq_storage_fsync_duration_seconds``).

    A saver fsyncs one file per message: prometheus-client's ``Histogram.observe``
    (a bucket search in Python and two increments under its lock, 1.2-4.8 µs, and the
    lock's waits while savers take the GIL from each other) was half of the savers'
    Python time in batch sends (docs/performance.md, issue 12 stop 17). Here an
    observation is one ``deque.append`` (atomic under the GIL); the bucket counts are
    made when the histogram is scraped, or by the observing thread once
    :data:`FSYNC_PENDING_MAX` observations wait (memory stays bounded without scrapes).

    The group commits' batch sizes (``mq_storage_group_commit_batch_size``, one observation per
    directory fsync: each lone delete's) are kept the same way (:meth:`batch_sizes`).

    Args:
        name, doc: The histogram's name and help text.
        buckets: Its upper bounds (ascending; +Inf is added).
        label: Its one label's name, or None for a histogram without labels (its one kind is ``""``).
        kinds: The label's values.
    """

    def __init__(
        self,
        name: str = "mq_storage_fsync_duration_seconds",
        doc: str = "fsync latency, by kind: file (a message file), directory (one group-commit round) or syncfs (one"
        " round of the message files' group commit).",
        buckets: tuple[float, ...] = FSYNC_BUCKETS,
        label: str | None = "kind",
        kinds: tuple[str, ...] = FSYNC_KINDS,
    ) -> None:
        self.name, self.doc, self.buckets, self.label = name, doc, buckets, label
        #: Observed values not yet counted, by kind ("file", "directory").
        self.pending: dict[str, collections.deque[float]] = {kind: collections.deque() for kind in kinds}
        #: kind -> [count per bucket (last = +Inf)..., sum of values]; under ``_lock``.
        self._rows = {kind: [0.0] * (len(buckets) + 2) for kind in kinds}
        self._lock = threading.Lock()

    @classmethod
    def batch_sizes(cls) -> LocklessHistogram:
        """The ``mq_storage_group_commit_batch_size`` histogram (no label: observe with kind ``""``)."""
        return cls(
            "mq_storage_group_commit_batch_size",
            "Callers (messages or batches) made durable by one directory fsync (group commit).",
            BATCH_BUCKETS,
            None,
            ("",),
        )

    def observe(self, kind: str, seconds: float) -> None:
        """Note one value (an fsync's seconds) of ``kind`` (one of the kinds given) (any thread)."""
        pending = self.pending[kind]
        pending.append(seconds)
        if len(pending) > FSYNC_PENDING_MAX:
            self.count()

    def count(self) -> None:
        """Move every pending observation into the bucket counts (any thread)."""
        with self._lock:
            for kind, pending in self.pending.items():
                row = self._rows[kind]
                popleft = pending.popleft
                while pending:
                    seconds = popleft()  # only this thread (it holds the lock) takes from the left
                    row[bisect.bisect_left(self.buckets, seconds)] += 1
                    row[-1] += seconds

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        self.count()
        yield self._family()

    def _family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=[self.label] if self.label else [])
        with self._lock:
            rows = {kind: list(row) for kind, row in self._rows.items()}
        for kind, row in rows.items():
            bounds = (*map(str, self.buckets), "+Inf")
            cumulative = list(zip(bounds, itertools.accumulate(row[:-1]), strict=True))
            family.add_metric([kind] if self.label else [], cumulative, row[-1])
        return family


class StorageMetrics:
    """fsync latency, group-commit batch size and storage errors by step, fed by :data:`STORAGE_HOOKS`.

    Args:
        registry: Where the metrics are registered.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.fsync = LocklessHistogram()
        registry.register(self.fsync)
        self.batch = LocklessHistogram.batch_sizes()  # one observation per directory fsync: no lock, as fsync's
        registry.register(self.batch)
        self.errors = Counter(
            "mq_storage_errors",
            "Storage errors (ENOSPC, EIO, a failed fsync...) by the step that failed.",
            ["step"],
            registry=registry,
        )
        self.races = Counter(
            "mq_storage_races_lost",
            "File steps that lost a race to another process or host and were recovered from (docs/protocol.md"
            " 13.2, 13.3): create/EEXIST retried under a new name; open or rename/ENOENT or ESTALE: taken by another.",
            ["step", "errno"],
            registry=registry,
        )
        #: Its collectors, in the order they are registered.
        self.collectors = (self.fsync, self.batch, self.errors, self.races)

    def on_fsync(self, kind: str, seconds: float, batch: int) -> None:
        """STORAGE_HOOKS.on_fsync (any thread): a message file's fsync is one ``deque.append``."""
        self.fsync.observe(kind, seconds)
        if kind != "file":
            self.batch.observe("", batch)

    def on_error(self, step: str) -> None:
        """STORAGE_HOOKS.on_error (any thread)."""
        self.errors.labels(step).inc()

    def on_race(self, step: str, errno_name: str) -> None:
        """STORAGE_HOOKS.on_race (any thread)."""
        self.races.labels(step, errno_name).inc()

    def install(self) -> None:
        """Make this process's storage report to these metrics."""
        STORAGE_HOOKS.on_fsync = self.on_fsync
        STORAGE_HOOKS.on_error = self.on_error
        STORAGE_HOOKS.on_race = self.on_race


class DiskCollector(Collector):
    """Free bytes and inodes of the root's filesystem, read (``statvfs``) at scrape time.

    Args:
        root: The root directory.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            st = os.statvfs(self.root)
        except OSError:
            return
        yield GaugeMetricFamily(
            "mq_storage_free_bytes", "Bytes available to mq on the root's filesystem.", st.f_bavail * st.f_frsize
        )
        yield GaugeMetricFamily("mq_storage_free_inodes", "Inodes available on the root's filesystem.", st.f_favail)
        yield GaugeMetricFamily("mq_storage_size_bytes", "Size of the root's filesystem.", st.f_blocks * st.f_frsize)


class BrokerCollector(Collector):
    """The mq daemon's per-queue gauges (from the last :meth:`refresh`), counters and request histogram.

    Args:
        broker: The broker whose state is read.
        counts: Its event counts.
        times: Its request histogram.
    """

    def __init__(self, broker: Broker, counts: BrokerCounts, times: RequestTimes) -> None:
        self.broker = broker
        self.counts = counts
        self.times = times
        self.gauges = QueueGauges()
        self.cache = ScrapeCache(broker.store)
        self._queues: list[QueueName] | None = None
        self._queue_set: set[str] = set()
        self._refreshing = asyncio.Lock()
        #: The sample lines already written, by exposition content type.
        self._lines: dict[str, Lines] = {}
        #: The labels of each counter of :attr:`counts`, sorted (while their number is unchanged).
        self._sorted: dict[str, list[str]] = {}

    def describe(self) -> list[Metric]:
        return []

    async def refresh(self) -> None:
        """Bring the per-queue gauges up to date: ready and oldest age from this daemon's indexes (a listing
        for the queues it has not indexed), in flight and delayed from one listing of ``delay/``.

        Only the queues that may have changed since the last refresh are looked at (see
        ``daemons._scrape``): on a local filesystem with inotify, the queues this daemon
        indexes and watches whose directory had no event since; otherwise every queue, at a
        ``stat`` each while its directory is unchanged (:class:`ScrapeCache`). The file work
        runs on a worker thread (not on the saver threads: a scrape must neither wait behind
        nor hold up the sends' fsyncs)."""
        async with self._refreshing:
            states = self.broker.queues
            queues = await asyncio.to_thread(self.cache.list_queues)
            if states.watcher is not None:  # what other processes did before the scrape, not a window later
                states.on_watch_events()
            if queues is not self._queues:
                self._queues, self._queue_set = queues, set(queues)
                self.gauges.keep_only(self._queue_set)
                self.cache.keep_only(self._queue_set)
            current = states.metrics_current if states.watcher is not None and not states.change_check_seconds else None
            need = self._queue_set if current is None else self._queue_set - current
            ordered: Sequence[QueueName] = queues if len(need) == len(queues) else sorted(need)  # type: ignore[arg-type]
            indexed: dict[str, tuple[int, int | None]] = {}
            unindexed: set[str] = set()
            fetcher_for = states.fetcher_for
            for queue in ordered:
                state = fetcher_for(queue).queues.get(queue)
                if state is None:
                    unindexed.add(queue)
                    continue
                indexed[queue] = (len(state.index), state.index.oldest_sent_ms())
                if current is not None and states.watcher is not None and states.watcher.watching(queue):
                    current.add(queue)  # before the redrive read: an event from now on takes it out again
            checked = states.checked_stamps if states.change_check_seconds else None
            scanned, delay, redrive = await asyncio.to_thread(self.cache.read, ordered, unindexed, checked)
            label_of, gauges = self.counts.labels, self.gauges
            for queue in ordered:
                counts = indexed.get(queue) or scanned.get(queue)
                row = None if counts is None else (label_of(queue), counts[0], counts[1])
                gauges.update(queue, row, redrive.get(queue))
            gauges.set_delay(delay)

    def _refusals(self) -> CounterMetricFamily:
        refused = CounterMetricFamily(
            "mq_refusals",
            "Requests and connections refused to protect mq, by reason (docs/security.md).",
            labels=["reason"],
        )
        for reason in ("connections", "body_timeout", "waiters", "unauthorized", "forbidden"):
            refused.add_metric([reason], self.broker.refusals[reason])
        return refused

    def collect(self) -> Iterator[Metric]:
        yield from gauge_families(self.gauges.values(now_ms()), self.gauges.labels())
        yield self._refusals()
        for kind, (name, doc) in BROKER_COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["queue"])
            for label, value in sorted(self.counts.counts[kind].items()):
                counter.add_metric([label], value)
            yield counter
        yield self.times.family()

    def lines(self, encoder: Callable[[Any], bytes], content_type: str) -> Lines:
        """The :class:`Lines` of the exposition format ``content_type`` (written by ``encoder``)."""
        lines = self._lines.get(content_type)
        if lines is None:
            if len(self._lines) >= 8:  # content types come from the scraper's Accept: keep a few
                self._lines.clear()
            lines = self._lines[content_type] = Lines(encoder, openmetrics=content_type.startswith(OPENMETRICS))
        return lines

    def text(self, lines: Lines) -> list[str]:
        """What :meth:`collect` yields, as text in ``lines``' format (no ``# EOF``)."""
        out = gauge_text(lines, self.gauges.values(now_ms()), self.gauges.labels())
        out.append(lines.encode([self._refusals()]))
        for kind, (name, doc) in BROKER_COUNTERS.items():
            by_label = self.counts.counts[kind]
            labels = self._sorted.get(kind)
            if labels is None or len(labels) != len(by_label):  # labels are only ever added
                labels = self._sorted[kind] = sorted(by_label)
            out.append(lines.family(name, doc, by_label, labels, counter=True))
        out.append(lines.encode([self.times.family()]))
        return out


class _Chain:
    """Several collectors as one ``collect()``, in order."""

    def __init__(self, *collectors: Any) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


class BrokerMetrics:
    """Everything ``GET /metrics`` of one mq daemon serves.

    Args:
        broker: The broker (its settings give the root and ``metrics_max_queues``).
    """

    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        self.counts = BrokerCounts(QueueLabels(broker.settings.metrics_max_queues))
        self.times = RequestTimes()
        self.collector = BrokerCollector(broker, self.counts, self.times)
        self.storage = StorageMetrics(self.registry)
        self.storage.install()
        self.registry.register(self.collector)
        disk = DiskCollector(broker.settings.root)
        self.registry.register(disk)
        process = ProcessCollector(registry=self.registry)
        collector = gc_collector()
        self.registry.register(collector)
        #: The registry's collectors before and after :attr:`collector`, in its order.
        self._around = (_Chain(*self.storage.collectors), _Chain(disk, process, collector))
        #: With ``--processes N``: adds the other workers' metrics to this registry's (daemons._procmetrics).
        self.combine: Callable[[CollectorRegistry], Awaitable[Any]] | None = None

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``: the Prometheus text format (or OpenMetrics if the scraper asks for it).

        The text is what the format's encoder makes of :attr:`registry`; the per-queue families'
        lines are written from cached prefixes (:class:`daemons._scrape.Lines`), not by the encoder.
        """
        from aiohttp import web  # mq has imported it long before; mq-mover and mq-reaper never do

        await self.collector.refresh()
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        if self.combine is not None:
            body = encoder(await self.combine(self.registry))
        else:
            lines = self.collector.lines(encoder, content_type)
            before, after = self._around
            parts = [lines.encode(before.collect()), *self.collector.text(lines), lines.encode(after.collect())]
            if lines.openmetrics:
                parts.append("# EOF\n")
            body = "".join(parts).encode()
        return web.Response(body=body, headers={"Content-Type": content_type})


# -- mq-mover and mq-reaper ----------------------------------------------------------


def serve_metrics(port: int, address: str, registry: CollectorRegistry) -> Callable[[], None]:
    """Serve ``registry`` on ``http://address:port/metrics`` from a thread; return the function that stops it.

    Raises:
        OSError: The port cannot be bound.
    """
    server, thread = start_http_server(port, address, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


def daemon_registry(root: str) -> tuple[CollectorRegistry, StorageMetrics]:
    """A registry with the process collector, the root's free space and the storage metrics (installed)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(gc_collector())
    registry.register(DiskCollector(root))
    storage = StorageMetrics(registry)
    storage.install()
    return registry, storage


class MoverMetrics:
    """mq-mover's counters: what happened to each due file, per queue, and how late it moved.

    Args:
        registry: Where they are registered.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.labels = QueueLabels()
        self.moves = {
            "redelivered": Counter(
                "mq_messages_redelivered",
                "In-flight messages made ready again because their visibility timeout ended.",
                ["queue"],
                registry=registry,
            ),
            "delay_ended": Counter(
                "mq_messages_delay_ended",
                "Delayed messages made ready when their delay ended.",
                ["queue"],
                registry=registry,
            ),
            "dead_lettered": Counter(
                "mq_messages_dead_lettered",
                "Messages moved to their queue's dead-letter queue (received max_receive_count times).",
                ["queue"],
                registry=registry,
            ),
            "expired": Counter(
                "mq_messages_expired",
                "Messages removed after their queue's retention period (label where: ready or in_flight).",
                ["queue", "where"],
                registry=registry,
            ),
            "purged": Counter(
                "mq_mover_purged_messages",
                "In-flight messages of a purge moved to remove/ when their lease ended.",
                ["queue"],
                registry=registry,
            ),
            "orphaned": Counter(
                "mq_mover_orphaned_messages", "In-flight messages whose queue was deleted.", registry=registry
            ),
        }
        self.errors = Counter("mq_mover_errors", "Moves that failed (retried at the next rescan).", registry=registry)
        self.lag = Histogram(
            "mq_mover_redelivery_lag_seconds",
            "How long after its deadline a due file was moved, in seconds.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    def count(self, queue: str, result: str | Exception, receive_count: int, late_ms: int) -> None:
        """Count one due file's outcome (``Mover._move_one``'s result, or the error)."""
        if isinstance(result, Exception):
            self.errors.inc()
            return
        if result == "gone":
            return
        self.lag.observe(max(0, late_ms) / 1000)
        label = self.labels(queue)
        if result == "redelivered":
            self.moves["redelivered" if receive_count else "delay_ended"].labels(label).inc()
        elif result == "expired":
            self.moves["expired"].labels(label, "in_flight").inc()
        elif result == "orphaned":
            self.moves["orphaned"].inc()
        elif result in self.moves:
            self.moves[result].labels(label).inc()


class ReaperMetrics:
    """mq-reaper's counters: files, bytes and queues reaped; messages expired per queue.

    Args:
        registry: Where they are registered.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.labels = QueueLabels()
        self.files = Counter("mq_reaper_reaped_files", "Message files unlinked from remove/.", registry=registry)
        self.bytes = Counter("mq_reaper_reaped_bytes", "Bytes of the message files unlinked.", registry=registry)
        self.queues = Counter("mq_reaper_reaped_queues", "Deleted queue directories removed.", registry=registry)
        self.expired = Counter(
            "mq_messages_expired",
            "Messages removed after their queue's retention period (label where: ready or in_flight).",
            ["queue", "where"],
            registry=registry,
        )
        self.in_flight_removed = Counter(
            "mq_reaper_in_flight_removed", "In-flight files moved to remove/ (expired or purged).", registry=registry
        )
        self.new_dropped = Counter(
            "mq_reaper_abandoned_new_files", "Files of dead writers unlinked from new/.", registry=registry
        )
        self.errors = Counter("mq_reaper_errors", "Reaps and sweep steps that failed.", registry=registry)

    def expired_ready(self, queue: str, n: int) -> None:
        """Count ``n`` ready messages of ``queue`` moved to remove/ by an expiry sweep."""
        self.expired.labels(self.labels(queue), "ready").inc(n)
