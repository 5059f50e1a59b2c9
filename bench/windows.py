"""mq and its disk loop measured in alternating windows, and the bars as medians of paired ratios (issue 12).

Issue 12 compares mq to a disk loop "measured in one run against a reference
measured in the same run, on the real disk, median of at least three
alternating rounds (this VM's disk drifts 2x within minutes)". Until stop 28
bench/run.py ran each loop once, minutes away from the mq window it was
compared with, and a bar read the weather of two different minutes (stop 27:
bar 5 read 0.475 because the loop's one window met a 2.39-ms p99, and 4.29 in
stop 26 because mq's did). :func:`alternate` runs ``rounds`` pairs of windows,
the loop's and mq's, back to back, the order inside a pair alternating
(loop mq | mq loop | loop mq | mq loop: A B B A A B B A for the default four rounds), and
:func:`paired` makes each pair one ratio, mq's window over the loop's
window beside it. A bar is the **median of the per-round ratios**:

- the two windows of a round are seconds apart, so a ratio compares mq and
  the loop in the same disk and CPU weather; a ratio of medians would divide
  mq's middle window by a loop window from another minute, which is what the
  rounds are there to avoid;
- the order inside a round alternates, so a cost the first (or the second)
  window of a round pays lands on both sides alike; with an even number of
  rounds each side goes first equally often, and each side's windows run back
  to back once (with three rounds only mq's did: stop 28's quick runs read
  that mq-first round lowest in 3 of 4 runs);
- the median of three or more ratios drops a round whose one window met a
  stall episode that its partner did not.

It reads the same for two identical servers: swap mq and the loop and every
ratio inverts, and so does the median (exactly with odd rounds; with even
ones the median is the mean of the middle two ratios, inverted to within the
spread of those two). Rates and p99s are
treated alike: bar 5 is the median of the per-round ratios of the two p99s
(each window's own p99), not a p99 of latencies pooled per side.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.bars import _div as _ratio
from bench.bars import _get as get_in

#: Rounds of (loop window, mq window) per compared pair (issue 12: "at least three alternating rounds"); even, so that
#: each side goes first in half of them.
DEFAULT_ROUNDS = 4

#: A window: a function of the round (0, 1, ...) that runs one measured window and returns its JSON row.
Window = Callable[[int], dict[str, Any]]


def order(rounds: int) -> list[str]:
    """Which side runs when: ``["loop", "mq", "mq", "loop", "loop", "mq", ...]`` (``rounds`` pairs).

    Raises:
        ValueError: ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out: list[str] = []
    for i in range(rounds):
        out += ["loop", "mq"] if i % 2 == 0 else ["mq", "loop"]
    return out


def alternate(rounds: int, loop: Window, mq: Window) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``rounds`` rounds of one ``loop`` window and one ``mq`` window each, in :func:`order`.

    Each row gets ``"round"`` (0-based) and ``"position"`` (0 = first window of its round).
    Returns ``(loop_rows, mq_rows)``, one row per round each.
    """
    rows: dict[str, list[dict[str, Any]]] = {"loop": [], "mq": []}
    for n, side in enumerate(order(rounds)):
        row = (loop if side == "loop" else mq)(n // 2)
        row["round"], row["position"] = n // 2, n % 2
        rows[side].append(row)
    return rows["loop"], rows["mq"]


def _get(row: dict[str, Any], path: str) -> Any:
    """The value at dotted ``path`` in ``row`` (bench.bars' walk), None where a key is missing."""
    return get_in(row, *path.split("."))


def _median(values: list[float | None]) -> float | None:
    xs = [x for x in values if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def paired(
    loop_rows: list[dict[str, Any]], mq_rows: list[dict[str, Any]], *, loop_rate: str, mq_rate: str
) -> dict[str, Any]:
    """The per-round ratios of mq's window over the loop's window of the same round, and their medians.

    Args:
        loop_rows: The loop's windows, one per round (:func:`alternate`).
        mq_rows: mq's windows, one per round.
        loop_rate: Dotted path of the rate in a loop row (e.g. ``msgs_per_s``, ``mb_per_s``).
        mq_rate: Dotted path of the rate in an mq row (e.g. ``sends_per_s``, ``cycles_per_s``).

    Returns:
        ``{"method", "order", "rounds": [{"round", "loop", "mq", "ratio", "loop_p99_ms", "mq_p99_ms",
        "p99_ratio", "loop_cpu_canary_ms", "mq_cpu_canary_ms"}], "ratio", "p99_ratio", "ratio_min",
        "ratio_max", "ratio_of_medians"}``: ``ratio`` and ``p99_ratio`` are the medians over rounds
        (the bars' values); ``ratio_of_medians`` is for comparison only.

    Raises:
        ValueError: The two lists differ in length.
    """
    if len(loop_rows) != len(mq_rows):
        raise ValueError(f"{len(loop_rows)} loop windows against {len(mq_rows)} mq windows")
    rounds = []
    for lr, mr in zip(loop_rows, mq_rows, strict=True):
        lp, mp = _get(lr, "latency_ms.p99"), _get(mr, "latency_ms.p99")
        rounds.append(
            {
                "round": mr.get("round"),
                "first": "loop" if lr.get("position") == 0 else "mq",
                "loop": _get(lr, loop_rate),
                "mq": _get(mr, mq_rate),
                "ratio": _ratio(_get(mr, mq_rate), _get(lr, loop_rate)),
                "loop_p99_ms": lp,
                "mq_p99_ms": mp,
                "p99_ratio": _ratio(mp, lp),
                "loop_cpu_canary_ms": _get(lr, "cpu.cpu_canary_ms"),
                "mq_cpu_canary_ms": _get(mr, "cpu.cpu_canary_ms"),
            }
        )
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    return {
        "method": "median over rounds of (mq window / the loop window of the same round); order alternates",
        "order": order(len(rounds)) if rounds else [],
        "rounds": rounds,
        "ratio": _median(ratios),
        "p99_ratio": _median([r["p99_ratio"] for r in rounds]),
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "ratio_of_medians": _ratio(_median([r["mq"] for r in rounds]), _median([r["loop"] for r in rounds])),
    }


def summary_row(rows: list[dict[str, Any]], rate: str) -> dict[str, Any]:
    """One row standing for several windows of the same kind, under the keys a single window had.

    The window with the median rate (the lower middle one for an even count), with every window
    under ``"windows"`` and the medians of the rate and of each latency percentile under
    ``"window_medians"``. Old readers of ``rate`` and ``latency_ms`` get the median window's figures.

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not rows:
        raise ValueError("no windows")
    ranked = sorted(rows, key=lambda r: _get(r, rate) or 0.0)
    middle = dict(ranked[(len(ranked) - 1) // 2])
    medians: dict[str, Any] = {rate: _median([_get(r, rate) for r in rows])}
    for pct in ("p50", "p99", "max"):
        medians[f"latency_ms.{pct}"] = _median([_get(r, f"latency_ms.{pct}") for r in rows])
    medians["cpu.cpu_canary_ms"] = _median([_get(r, "cpu.cpu_canary_ms") for r in rows])
    middle["windows"] = rows
    middle["window_medians"] = medians
    return middle
