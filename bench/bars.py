"""The bars of issue 12 ("Performance"), computed from one run's JSON.

Every entry is ``{"value", "bar", "met", "compare", "from"}``: ``compare`` is
``">="`` (a floor) or ``"<="`` (a ceiling), ``from`` says which figures of the
JSON give the value, and ``met`` is None when the step(s) it needs did not
run (or a figure is missing). The bars of issue 2 (sends at 64 clients over
the 64-thread disk loop, deep over shallow cycles) and issue 15 stay where
run.py has always put them.
"""

from __future__ import annotations

from typing import Any

#: Issue 12, bar 2: sends at 1 client over the 1-thread disk loop.
BAR_SENDS1_OVER_DISK1 = 0.8
#: Issue 12, bar 3: receive+delete at 1 and 16 clients over the receive+delete disk loop at 1 and 16 threads.
BAR_RECEIVE_OVER_DISK_RECEIVE = 0.8
#: Issue 12, bar 4: CPU per message summed over mq + mq-mover + mq-reaper (ms), single requests and batches of 10.
BAR_CPU_MS_SINGLE = 1.0
BAR_CPU_MS_BATCH = 0.3
#: Issue 12, bar 5: p99 of a send at 1 client over the 1-thread disk loop's p99.
BAR_SEND_P99_OVER_DISK_P99 = 2.0
#: Issue 12, scale.
BAR_STARTUP_S = 10.0
BAR_RSS_BYTES_PER_READY_MESSAGE = 200.0
BAR_MANY_QUEUES_OVER_FEW = 1.2
BAR_LONGPOLL_IDLE_CPU_PCT = 2.0
BAR_LONGPOLL_DELIVERY_P99_MS = 20.0
BAR_LARGE_OVER_DISK = 0.8
BAR_DRAIN_MIN_OVER_MAX_TENTH = 0.8


#: Bars that are a ceiling on one figure: (key in ``bars``, path of the figure in the run's JSON, bar).
_CEILINGS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    # bar 4: CPU of mq + mq-mover + mq-reaper from /proc, per message, at 16 clients
    ("cpu_ms_per_send16_all_daemons", ("sends", "clients_16", "cpu", "daemons_cpu_ms_per_op"), BAR_CPU_MS_SINGLE),
    (
        "cpu_ms_per_receive_delete16_all_daemons",
        ("receive_delete", "clients_16", "cpu", "daemons_cpu_ms_per_op"),
        BAR_CPU_MS_SINGLE,
    ),
    (
        "cpu_ms_per_message_batch_send16_all_daemons",
        ("batch_sends", "clients_16", "cpu", "daemons_cpu_ms_per_message"),
        BAR_CPU_MS_BATCH,
    ),
    (
        "cpu_ms_per_message_batch_receive_delete16_all_daemons",
        ("batch_receive_delete", "clients_16", "cpu", "daemons_cpu_ms_per_message"),
        BAR_CPU_MS_BATCH,
    ),
    # scale: a queue of 1,000,000 ready messages (mq-mover and mq-reaper "start just as fast")
    ("startup_mq_first_receive_s", ("startup", "mq_first_receive_s"), BAR_STARTUP_S),
    (
        "startup_mq_rss_bytes_per_ready_message",
        ("startup", "mq_rss_bytes_per_ready_message"),
        BAR_RSS_BYTES_PER_READY_MESSAGE,
    ),
    ("startup_mover_ready_s", ("startup", "mover_ready_s"), BAR_STARTUP_S),
    ("startup_reaper_ready_s", ("startup", "reaper_ready_s"), BAR_STARTUP_S),
    # ... and their start-up work done (CPU quiet for 1 s: mq-reaper's first expiry sweep lists the queue)
    ("startup_mover_settled_s", ("startup", "helpers", "mover_settled_s"), BAR_STARTUP_S),
    ("startup_reaper_settled_s", ("startup", "helpers", "reaper_settled_s"), BAR_STARTUP_S),
    ("startup_at_once_first_receive_s", ("startup", "all_three_at_once", "mq_first_receive_s"), BAR_STARTUP_S),
    # scale: 10,000 queues against 10 (GET / and a receive)
    ("queues_list_many_over_few_p50", ("queues", "list_many_over_few_p50"), BAR_MANY_QUEUES_OVER_FEW),
    ("queues_receive_many_over_few_p50", ("queues", "receive_many_over_few_p50"), BAR_MANY_QUEUES_OVER_FEW),
    # scale: 1,000 long-polling receivers (idle CPU in % of one core)
    ("longpoll_idle_mq_cpu_pct", ("longpoll", "idle_mq_cpu_pct"), BAR_LONGPOLL_IDLE_CPU_PCT),
    ("longpoll_delivery_p99_ms", ("longpoll", "delivery_ms", "p99"), BAR_LONGPOLL_DELIVERY_P99_MS),
)


def _get(result: dict[str, Any], *path: str) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _div(a: Any, b: Any) -> float | None:
    if a is None or not b:
        return None
    return round(float(a) / float(b), 3)


def bar(value: Any, limit: float, compare: str, source: str, **extra: Any) -> dict[str, Any]:
    """One bar entry; ``met`` is None when ``value`` is None."""
    met = None if value is None else (value >= limit if compare == ">=" else value <= limit)
    return {"value": value, "bar": limit, "compare": compare, "met": met, "from": source, **extra}


def _paired(result: dict[str, Any], pair: str, key: str, fallback: float | None) -> tuple[float | None, str]:
    """A bar's value: the median of the per-round ratios of ``pairs.<pair>`` (bench/windows.py) when the run
    alternated its windows (stop 28 on), else ``fallback`` (one window each, an older run's JSON)."""
    rounds = _get(result, "pairs", pair, "rounds")
    if rounds:
        return _get(result, "pairs", pair, key), f"pairs.{pair}: median of {len(rounds)} per-round ratios"
    return fallback, "one window each"


def issue12_bars(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The bars of issue 12 (1 is run.py's ``sends64_over_disk_loop64``) from a run's ``result``.

    Bars 2, 3 and 5 (and the large bodies, in bench/scale.py) are medians of per-round ratios of
    windows alternated with the disk loop's (``pairs``, bench/windows.py); the rates beside them
    (``sends1_per_s`` ...) are the median windows', for reading only.
    """
    out: dict[str, dict[str, Any]] = {}
    s1 = _get(result, "sends", "clients_1", "sends_per_s")
    d1 = _get(result, "disk_loop", "threads_1", "msgs_per_s")
    value, how = _paired(result, "sends1", "ratio", _div(s1, d1))
    out["sends1_over_disk_loop1"] = bar(
        value,
        BAR_SENDS1_OVER_DISK1,
        ">=",
        f"sends.clients_1 / disk_loop.threads_1 ({how})",
        sends1_per_s=s1,
        disk_loop1_per_s=d1,
    )
    for n in (1, 16):
        r = _get(result, "receive_delete", f"clients_{n}", "cycles_per_s")
        d = _get(result, "disk_receive_loop", f"threads_{n}", "msgs_per_s")
        value, how = _paired(result, f"receive{n}", "ratio", _div(r, d))
        out[f"receive_delete{n}_over_disk_receive_loop{n}"] = bar(
            value,
            BAR_RECEIVE_OVER_DISK_RECEIVE,
            ">=",
            f"receive_delete.clients_{n} / disk_receive_loop.threads_{n} ({how})",
            receive_delete_per_s=r,
            disk_receive_loop_per_s=d,
        )
    for key, path, limit in _CEILINGS:
        out[key] = bar(_get(result, *path), limit, "<=", ".".join(path))
    p99 = _get(result, "sends", "clients_1", "latency_ms", "p99")
    dp99 = _get(result, "disk_loop", "threads_1", "latency_ms", "p99")
    value, how = _paired(result, "sends1", "p99_ratio", _div(p99, dp99))
    out["send1_p99_over_disk_loop1_p99"] = bar(
        value,
        BAR_SEND_P99_OVER_DISK_P99,
        "<=",
        f"sends.clients_1.latency_ms.p99 / disk_loop.threads_1.latency_ms.p99 ({how}, each window's own p99)",
        send1_p99_ms=p99,
        disk_loop1_p99_ms=dp99,
    )
    q = result.get("queues") or {}
    out["queues_mq_rss_bytes_per_queue"] = {
        "value": q.get("mq_rss_bytes_per_queue"),
        "note": "the issue asks that it be stated; no number set",
    }
    for key, row in sorted((result.get("large") or {}).items()):
        if key.startswith("bytes_") and isinstance(row, dict):
            out[f"large_{key}_over_disk_loop"] = bar(
                row.get("over_disk_loop"),
                BAR_LARGE_OVER_DISK,
                ">=",
                f"large.{key}: sends MB/s / disk loop MB/s"
                + (" (median of the per-round ratios)" if row.get("pairs") else " (one window each)"),
            )
    return out
