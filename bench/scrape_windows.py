"""The metrics step's scrape cost from alternated windows of one send run (issue 12, stop 28).

The step's first figure compares 10-s runs with and without a scrape every second, four of each:
this VM's CPUs change speed by 1.2-1.5x from one 10-s run to the next (the bench's CPU probe), so
the runs of one variant spread 10-20 % and a cost of a few per cent was not readable from them
(stop 27: 0.028-0.109 for the same code; docs/performance.md, stop 28 "scrape2"). Here one wrk run
sends for the whole measurement and counts its ``201`` s by the second they arrived in
(``bench/lua/post_timed.lua``); a thread scrapes ``GET /metrics`` once a second during every other
window of ``window_s`` seconds. Neighbouring windows are a few seconds apart, so the CPU's speed is
nearly the same in both; each window with scrapes is compared with the mean of the windows without
on either side of it, and the cost is 1 - the median of those ratios.
"""

from __future__ import annotations

import http.client
import math
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.run import Api, CpuMeter, Wrk


def _scraper(
    api: Api, first: int, window_s: int, stop: threading.Event, out: list[tuple[int, float]], errors: list[str]
) -> None:
    """Thread: from epoch second ``first``, at the start of each second of the even windows (0, 2, ...), one
    ``GET /metrics``; record (its second, its seconds of latency) until ``stop``. A scrape that fails or does
    not answer 200 ends the thread with its reason in ``errors`` (the caller raises it: windows without their
    scrapes would read as no cost).
    """
    second = first
    try:
        while not stop.is_set():
            if (second - first) // window_s % 2 == 0:
                wait = second + 0.005 - time.time()
                if wait > 0 and stop.wait(wait):
                    return
                started = time.perf_counter()
                status, _, _ = api.request("GET", "/metrics")
                if status != 200:
                    errors.append(f"GET /metrics answered {status}")
                    return
                out.append((second, time.perf_counter() - started))
            second += 1
    except (OSError, http.client.HTTPException) as exc:
        errors.append(f"GET /metrics failed: {exc!r}")
    finally:
        api.close()


def window_ratios(
    counts: dict[int, int], first: int, last: int, window_s: int
) -> tuple[list[float], list[int], list[int]]:
    """Each scraped window's sends over the mean of its two unscraped neighbours' (and the window totals).

    Args:
        counts: Sends by the epoch second their ``201`` arrived in.
        first: The first second of window 0 (a window with scrapes; windows alternate from there).
        last: The last whole second of the run (windows past it are left out).
        window_s: Seconds per window.
    Returns:
        (ratios of the scraped windows that have a neighbour on both sides, sends of every scraped
        window, sends of every unscraped window), windows in time order.
    """
    totals = [
        sum(counts.get(second, 0) for second in range(start, start + window_s))
        for start in range(first, last - window_s + 2, window_s)
    ]
    ratios = [
        totals[i] / ((totals[i - 1] + totals[i + 1]) / 2)
        for i in range(2, len(totals) - 1, 2)
        if totals[i - 1] + totals[i + 1] > 0
    ]
    return ratios, totals[0::2], totals[1::2]


def scrape_windows(
    wrk: Wrk, api: Api, meter: CpuMeter, queue: str, clients: int, seconds: float, window_s: int = 2
) -> dict[str, Any]:
    """Sends at ``clients`` for ``seconds`` (plus 2 s of ramp-up and 1 s of tail, not counted), with one
    ``GET /metrics`` a second in every other window of ``window_s`` seconds; the cost is 1 - the median of
    each scraped window's sends over its unscraped neighbours' mean.

    Args:
        wrk: The bench's wrk runner.
        api: A client of mq (its own connection for the scrapes; closed at the end).
        meter: Started just before; stopped here (mq's CPU per send over the whole run).
        queue: The queue the sends go to.
        clients: wrk connections (2 threads).
        seconds: Counted seconds (whole windows of it are used).
        window_s: Seconds per window.
    Returns:
        The figures (``cost``, the ratios, window totals, scrapes and their median ms, CPU).
    Raises:
        RuntimeError: A scrape failed (and what wrk raises: it did not report).
    """
    first = math.ceil(time.time()) + 2  # wrk starts below: its first two seconds ramp up 64 connections
    scrapes: list[tuple[int, float]] = []
    errors: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=_scraper, args=(api, first, window_s, stop, scrapes, errors), daemon=True)
    thread.start()
    try:
        run = wrk.run("post_timed.lua", clients=clients, threads=2, queue=queue, duration_s=seconds + 3)
    finally:
        stop.set()
        thread.join()
    ended = time.time()
    cpu = meter.stop()
    if errors:
        raise RuntimeError(f"metrics windows: {errors[0]}")
    sent = run.counts.get("sent", 0)
    counts = {int(key[len("sent_at_") :]): n for key, n in run.counts.items() if key.startswith("sent_at_")}
    ratios, with_, without = window_ratios(counts, first, math.floor(ended) - 2, window_s)
    return {
        "window_s": window_s,
        "cost": round(1 - statistics.median(ratios), 4) if ratios else None,
        "ratios": [round(r, 4) for r in ratios],
        "cost_of_means": round(1 - statistics.mean(with_) / statistics.mean(without), 4)
        if with_ and without and sum(without)
        else None,
        "sends_by_window_with_scrapes": with_,
        "sends_by_window_without": without,
        "sends_per_s": round(run.rate("sent"), 1),
        "scrapes": len(scrapes),
        "scrape_ms_median": round(statistics.median(s for _, s in scrapes) * 1000, 1) if scrapes else None,
        "mq_cpu_ms_per_send": round(cpu["mq_cpu_pct"] / 100 * cpu["wall_s"] * 1000 / sent, 3)
        if sent and "mq_cpu_pct" in cpu
        else None,
        "machine_busy_pct": cpu.get("machine_busy_pct"),
        "cpu_canary_ms": cpu.get("cpu_canary_ms"),
    }
