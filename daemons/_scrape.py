"""``GET /metrics``'s per-queue gauges on mq: what changed since the last scrape is read again, nothing else.

With 10,000 queues a scrape that read every queue directory (a ``stat`` each, on a worker
thread), walked every index on the event loop and had prometheus-client format 4,000+
samples cost ~20 % of the sends/s at 64 clients (docs/performance.md, issue 12/15 stops
19-20; issue 15's bar is 3 %). Here a scrape does per-queue work only for the queues that
may have changed since the last one:

- :class:`QueueGauges` keeps one row per queue (its label, ready count, oldest send time,
  redrive status). On a local filesystem with inotify, a queue this daemon has indexed and
  watches stays in ``QueueStates.metrics_current`` from the scrape that read its row until
  an inotify event of its directory (a message in or out, a ``.redrive`` written, the
  directory gone: whatever process or client did it, the kernel reports it), a rescan that
  changed its index, ``IN_Q_OVERFLOW`` (every queue leaves the set) or its watch is dropped.
  Only the queues not in that set are read again. On a shared filesystem (inotify sees
  nothing of other hosts) or without inotify every queue is read again at every scrape, as
  before, through :class:`ScrapeCache` (one ``stat`` per queue, more only if it changed).
- :class:`Lines` writes the per-queue families' sample lines itself, from a prefix per
  (format, family, label) made once by prometheus-client's own encoder, so the text is the
  encoder's byte for byte (both the Prometheus text format and OpenMetrics).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from mqcore.fsinfo import settled_dir_stamp
from mqcore.names import QueueName, parse_ready_name, sent_ms_of
from mqcore.protocol import Store

_T = TypeVar("_T")

#: The label value that sums every queue past the limit (``--metrics-max-queues``).
OTHER = "_other"

#: A redrive status as read from ``.redrive``: (moved, skipped, state, updated_ms).
Redrive = tuple[int, int, str, int]
#: A queue's cached reads: (directory stamp, trusted, redrive status, (ready count, oldest send ms) if scanned).
_Cached = tuple[tuple[int, int, int] | None, bool, Redrive | None, tuple[int, int | None] | None]

#: The per-queue gauge families: (name, help). Every queue with a row has a sample in each.
GAUGES = (
    ("mq_queue_messages_ready", "Messages ready to receive (SQS ApproximateNumberOfMessagesVisible)."),
    (
        "mq_queue_messages_in_flight",
        "Messages received and not yet deleted (SQS ApproximateNumberOfMessagesNotVisible).",
    ),
    (
        "mq_queue_messages_delayed",
        "Messages sent with a delay that has not ended (SQS ApproximateNumberOfMessagesDelayed).",
    ),
    (
        "mq_queue_oldest_message_age_seconds",
        "Age of the oldest ready message, 0 when none (SQS ApproximateAgeOfOldestMessage).",
    ),
)
#: The redrive families: (name, help). Only queues with a ``.redrive`` have a sample.
REDRIVE_GAUGES = (
    ("mq_redrive_moved_messages", "Messages moved by the dead-letter queue's last redrive task."),
    ("mq_redrive_running", "1 while a redrive task of the dead-letter queue runs."),
)
#: A redrive counts as running while its status was written less than this many ms ago.
REDRIVE_FRESH_MS = 10_000


def _scan_one(store: Store, queue: str) -> tuple[int, int | None] | None:
    """Worker thread: (ready count, oldest send time in epoch ms) of ``queue`` by one listing, None if unreadable."""
    try:
        names = store.scan_ready(queue)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a queue deleted meanwhile, a storage error: left out of this scrape
        return None
    oldest: int | None = None
    for name in names:
        parsed = parse_ready_name(name)
        if parsed is not None:
            sent = sent_ms_of(parsed[0])
            oldest = sent if oldest is None or sent < oldest else oldest
    return len(names), oldest


def _stamp(path: str) -> tuple[tuple[int, int, int] | None, bool]:
    """(:func:`mqcore.fsinfo.settled_dir_stamp` of ``path``, or (None, False) if it is unreadable)."""
    try:
        return settled_dir_stamp(path)
    except OSError:
        return None, False


class ScrapeCache:
    """What a scrape read from each queue directory and ``delay/``, reused while the directory's stamp is unchanged.

    A queue directory's mtime changes with every ready file renamed in or out and with a new
    ``.redrive`` (replaced by rename), through any process or host, so an unchanged
    :func:`~mqcore.fsinfo.dir_stamp` means its ready names and redrive status are as last read;
    a stamp that was not settled when taken (:func:`~mqcore.fsinfo.settled_dir_stamp`) is never
    reused. Worker thread only.

    Args:
        store: The store whose directories are read.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queues: dict[str, _Cached] = {}
        #: What :meth:`_dir` read of a whole directory (``queues/``, ``delay/``): path -> (stamp, trusted, value).
        self._dirs: dict[str, tuple[tuple[int, int, int] | None, bool, Any]] = {}

    def _dir(self, path: str, read: Callable[[], _T]) -> _T:
        """``read()``, or what it returned last time if ``path``'s stamp is trusted and unchanged."""
        stamp, trusted = _stamp(path)
        old = self._dirs.get(path)
        if old is not None and old[1] and stamp is not None and old[0] == stamp:
            value: _T = old[2]
            return value
        value = read()
        self._dirs[path] = (stamp, trusted, value)
        return value

    def list_queues(self) -> list[QueueName]:
        """``Store.list_queues()``, the same list object while ``queues/`` is unchanged (a queue created or deleted
        changes it)."""
        return self._dir(self.store.layout.queues, self.store.list_queues)

    def keep_only(self, queues: set[str]) -> None:
        """Forget what was read of the queues not in ``queues`` (deleted ones)."""
        self._queues = {queue: entry for queue, entry in self._queues.items() if queue in queues}

    def read(
        self,
        queues: Sequence[str],
        unindexed: set[str],
        checked: Mapping[Any, tuple[int, int, int] | None] | None = None,
    ) -> tuple[dict[str, tuple[int, int | None]], dict[Any, tuple[int, int]], dict[str, Redrive | None]]:
        """(ready counts and oldest send ms of the ``unindexed`` queues, ``count_delay()``, redrive of ``queues``).

        Only ``queues`` are looked at (a ``stat`` each, and a read only if the stamp changed); a
        redrive status is None for a queue without a ``.redrive``. ``checked``: queue -> its
        directory's stamp as the change checks last saw it (``QueueStates.checked_stamps``, a shared
        filesystem): an indexed queue with a stamp there is not ``stat`` ed again, so its redrive
        status is as fresh as those checks (docs/api.md).
        """
        store, cached = self.store, self._queues
        scanned: dict[str, tuple[int, int | None]] = {}
        redrive: dict[str, Redrive | None] = {}
        for queue in queues:
            known = checked.get(queue) if checked is not None and queue not in unindexed else None
            stamp: tuple[int, int, int] | None
            if known is not None:
                stamp, trusted = known, True  # kept only if settled at its listing (QueueStates._list_names)
            else:
                stamp, trusted = _stamp(store.layout.queue_dir(queue))  # type: ignore[arg-type]
            entry = cached.get(queue)
            if entry is not None and entry[1] and stamp is not None and entry[0] == stamp:
                status, counts = entry[2], entry[3]
            else:
                raw = store.read_redrive_status(queue)  # type: ignore[arg-type]
                status = None
                if raw:
                    moved, skipped, updated = (int(raw.get(k, 0)) for k in ("moved", "skipped", "updated_ms"))
                    status = (moved, skipped, str(raw.get("state")), updated)
                counts = None
            if queue in unindexed:
                counts = counts or _scan_one(store, queue)
                if counts is not None:
                    scanned[queue] = counts
            cached[queue] = (stamp, trusted, status, counts)
            redrive[queue] = status
        return scanned, self._dir(store.layout.delay, store.count_delay), redrive


class QueueGauges:
    """One row per queue (label, ready count, oldest send ms) and the redrive statuses; values by label at a time.

    Rows are replaced by :meth:`update` for the queues read again; :meth:`values` sums or
    maxes the ``_other`` queues (kept apart, re-summed only when one of them changed).
    Event-loop thread only.
    """

    def __init__(self) -> None:
        #: queue -> (label, ready, oldest send ms or None); only queues that could be counted.
        self.rows: dict[str, tuple[str, int, int | None]] = {}
        #: queue -> redrive status, for the queues with a ``.redrive``.
        self.redrive: dict[str, Redrive] = {}
        #: queue -> (in flight, delayed) from the last listing of ``delay/``.
        self.delay: dict[Any, tuple[int, int]] = {}
        self._named: list[str] = []  # the named labels, sorted (label == queue)
        self._others: set[str] = set()
        self._labels: list[str] = []  # every label, sorted
        self._other_sum: tuple[int, int | None] | None = None  # (ready, oldest) over the others; None: stale
        self._layout_stale = True

    def keep_only(self, queues: set[str]) -> None:
        """Drop the rows of the queues not in ``queues`` (deleted ones)."""
        if any(queue not in queues for queue in self.rows):
            self.rows = {queue: row for queue, row in self.rows.items() if queue in queues}
            self.redrive = {queue: status for queue, status in self.redrive.items() if queue in queues}
            self._layout_stale = True

    def update(self, queue: str, row: tuple[str, int, int | None] | None, redrive: Redrive | None) -> None:
        """Set ``queue``'s row (None: it could not be counted, e.g. deleted meanwhile) and redrive status."""
        old = self.rows.get(queue)
        if row is None:
            if old is not None:
                del self.rows[queue]
                self._layout_stale = True
        else:
            self.rows[queue] = row
            if old is None or old[0] != row[0]:
                self._layout_stale = True
            elif row[0] == OTHER and old != row and self._other_sum is not None:
                self._other_sum = _replaced(self._other_sum, old, row)
        if redrive is None:
            self.redrive.pop(queue, None)
        else:
            self.redrive[queue] = redrive

    def set_delay(self, delay: dict[Any, tuple[int, int]]) -> None:
        """The in-flight and delayed counts by queue (``Store.count_delay()``)."""
        self.delay = delay

    def _layout(self) -> None:
        if self._layout_stale:
            self._named = sorted(queue for queue, row in self.rows.items() if row[0] != OTHER)
            self._others = {queue for queue, row in self.rows.items() if row[0] == OTHER}
            self._labels = sorted([*self._named, OTHER]) if self._others else self._named
            self._other_sum = None
            self._layout_stale = False

    def labels(self) -> list[str]:
        """Every label with a sample in the :data:`GAUGES` families, sorted."""
        self._layout()
        return self._labels

    def values(self, now_ms: int) -> list[dict[str, float]]:
        """The :data:`GAUGES` then :data:`REDRIVE_GAUGES` families' values by label, at ``now_ms`` (epoch ms)."""
        self._layout()
        rows, delay = self.rows, self.delay
        ready: dict[str, float] = {}
        in_flight: dict[str, float] = {}
        delayed: dict[str, float] = {}
        age: dict[str, float] = {}
        for queue in self._named:
            _, count, oldest = rows[queue]
            ready[queue] = count
            in_flight[queue], delayed[queue] = delay.get(queue, (0, 0))
            age[queue] = 0.0 if oldest is None else max(0, now_ms - oldest) / 1000
        others = self._others
        if others:
            if self._other_sum is None:
                counted = [rows[queue] for queue in others]
                oldest_times = [row[2] for row in counted if row[2] is not None]
                self._other_sum = (sum(row[1] for row in counted), min(oldest_times) if oldest_times else None)
            ready[OTHER], oldest_other = self._other_sum
            in_flight[OTHER] = delayed[OTHER] = 0
            for queue, (flying, waiting) in delay.items():
                if queue in others:
                    in_flight[OTHER] += flying
                    delayed[OTHER] += waiting
            age[OTHER] = 0.0 if oldest_other is None else max(0, now_ms - oldest_other) / 1000
        moved: dict[str, float] = {}
        running: dict[str, float] = {}
        for queue, (n, _skipped, state, updated) in self.redrive.items():
            row = rows.get(queue)
            if row is None:
                continue
            label = row[0]
            moved[label] = moved.get(label, 0) + n
            is_running = state == "running" and now_ms - updated <= REDRIVE_FRESH_MS
            running[label] = 1 if is_running or running.get(label) else 0
        return [ready, in_flight, delayed, age, moved, running]


def _replaced(
    total: tuple[int, int | None], old: tuple[str, int, int | None], new: tuple[str, int, int | None]
) -> tuple[int, int | None] | None:
    """The ``_other`` (ready sum, oldest send ms) after one of its queues' row went from ``old`` to ``new``;
    None when only a new pass over every ``_other`` queue can tell (its oldest message left)."""
    ready, oldest = total[0] - old[1] + new[1], total[1]
    if new[2] is not None and (oldest is None or new[2] < oldest):
        oldest = new[2]
    elif old[2] is not None and old[2] == oldest and new[2] != old[2]:
        return None
    return ready, oldest


class _Families:
    """A ready list of metric families with the ``collect()`` the exposition encoders read."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


#: An exposition encoder (``prometheus_client.exposition.choose_encoder``'s first value).
Encoder = Callable[[Any], bytes]
#: A label value no metric or label name can hold (``@`` is in neither): :class:`Lines`' template marker.
_SENTINEL = "@mq@"
#: Whether a label value is written as it is by both exposition formats, which escape only a backslash, a double
#: quote and a newline in label values (Prometheus text format 0.0.4; OpenMetrics 1.0 "Escaping"). Queue names are.
_verbatim = re.compile(r'[^\\"\n]*').fullmatch


class Lines:
    """Sample lines of families with a ``queue`` label in one exposition format, as its encoder writes them.

    The header of a family and the text before the value of a sample (name, labels) come from
    ``encoder`` itself, once per family and per (family, label); a line is that prefix plus
    ``floatToGoString(value)``, which is how both prometheus-client encoders write a sample
    without timestamp or exemplar. Event-loop thread only.

    Args:
        encoder: The encoder of the format (e.g. ``generate_latest``).
        openmetrics: Whether the encoder ends its output with ``# EOF``.
    """

    def __init__(self, encoder: Encoder, *, openmetrics: bool) -> None:
        self.encoder = encoder
        self.openmetrics = openmetrics
        self._headers: dict[str, str] = {}
        self._prefixes: dict[str, dict[str, str]] = {}  # family -> label -> the line up to its value
        self._last: dict[str, tuple[float, str]] = {}  # prefix -> (value, line)
        self._texts: dict[str, tuple[list[str], dict[str, Any], str]] = {}  # family -> (labels, values, text)
        self._templates: dict[str, tuple[str, str]] = {}  # family -> a sample line's text before / after its label

    def encode(self, families: Iterable[Metric]) -> str:
        """``families`` as the encoder writes them, without the final ``# EOF`` of OpenMetrics."""
        text = self.encoder(_Families(families)).decode()
        return text[: -len("# EOF\n")] if self.openmetrics else text

    def _family(self, name: str, doc: str, counter: bool) -> GaugeMetricFamily | CounterMetricFamily:
        if counter:
            return CounterMetricFamily(name, doc, labels=["queue"])
        return GaugeMetricFamily(name, doc, labels=["queue"])

    def _from_template(
        self, name: str, doc: str, counter: bool, header: str, prefixes: dict[str, str], missing: list[str]
    ) -> list[str]:
        """Make the prefixes of the ``missing`` labels the encoder writes verbatim; return the others.

        The encoder writes one sample of the family labelled :data:`_SENTINEL` once; a plain label's
        prefix is that line with the label in the sentinel's place. A first scrape after 10,000 new
        queues took ~0.56 s of the loop when each label went through the encoder (docs/performance.md,
        stop 25); the text is the same byte for byte.
        """
        template = self._templates.get(name)
        if template is None:
            family = self._family(name, doc, counter)
            family.add_metric([_SENTINEL], 0.0)
            line = self.encode([family])[len(header) :]
            assert line.endswith(" 0.0\n") and line.count(_SENTINEL) == 1, line
            head, tail = line[: -len("0.0\n")].split(_SENTINEL)
            template = self._templates[name] = (head, tail)
        head, tail = template
        others = []
        for label in missing:
            if _verbatim(label):
                prefixes[label] = f"{head}{label}{tail}"
            else:
                others.append(label)
        return others

    def family(self, name: str, doc: str, values: dict[str, Any], labels: list[str], *, counter: bool = False) -> str:
        """The family ``name`` with one sample per label of ``labels`` (in that order), valued from ``values``.

        The text of the last call is reused while ``labels`` and ``values`` are equal to that call's.

        Args:
            name: The family's name (a counter's without ``_total``).
            doc: Its help text.
            values: label -> value (int or float).
            labels: The labels to write, in order; each must be in ``values``.
            counter: A counter family (else a gauge).
        """
        kept = self._texts.get(name)
        if kept is not None and kept[0] == labels and kept[1] == values:
            return kept[2]
        header = self._headers.get(name)
        if header is None:
            header = self._headers[name] = self.encode([self._family(name, doc, counter)])
        prefixes = self._prefixes.setdefault(name, {})
        missing = [label for label in labels if label not in prefixes]
        if missing:
            missing = self._from_template(name, doc, counter, header, prefixes, missing)
        if missing:
            family = self._family(name, doc, counter)
            for label in missing:
                family.add_metric([label], 0.0)
            lines = self.encode([family])[len(header) :].splitlines(keepends=True)
            for label, line in zip(missing, lines, strict=True):
                assert line.endswith(" 0.0\n"), line
                prefixes[label] = line[: -len("0.0\n")]
        out = [header]
        last = self._last
        for label in labels:
            prefix = prefixes[label]
            value = values[label]
            seen = last.get(prefix)
            if seen is not None and seen[0] == value:
                out.append(seen[1])
            else:
                line = f"{prefix}{floatToGoString(value)}\n"  # type: ignore[no-untyped-call]
                last[prefix] = (value, line)
                out.append(line)
        text = "".join(out)
        self._texts[name] = (list(labels), dict(values), text)
        return text


def gauge_families(values: list[dict[str, float]], labels: list[str]) -> Iterator[Metric]:
    """The :data:`GAUGES` and :data:`REDRIVE_GAUGES` as prometheus-client families (``QueueGauges.values``)."""
    for (name, doc), by_label in zip(GAUGES, values, strict=False):
        gauge = GaugeMetricFamily(name, doc, labels=["queue"])
        for label in labels:
            gauge.add_metric([label], by_label[label])
        yield gauge
    for (name, doc), by_label in zip(REDRIVE_GAUGES, values[len(GAUGES) :], strict=True):
        gauge = GaugeMetricFamily(name, doc, labels=["queue"])
        for label in sorted(by_label):
            gauge.add_metric([label], by_label[label])
        yield gauge


def gauge_text(lines: Lines, values: list[dict[str, float]], labels: list[str]) -> list[str]:
    """:func:`gauge_families` as text in ``lines``' format."""
    out = [lines.family(name, doc, by_label, labels) for (name, doc), by_label in zip(GAUGES, values, strict=False)]
    for (name, doc), by_label in zip(REDRIVE_GAUGES, values[len(GAUGES) :], strict=True):
        out.append(lines.family(name, doc, by_label, sorted(by_label)))
    return out
