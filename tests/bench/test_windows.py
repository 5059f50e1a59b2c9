"""bench/windows.py alternates the disk loop's windows with mq's and makes a bar the median of per-round ratios.

The receive+delete loop's directory (bench/disk_loop.py ``ReceiveDeleteDir``) serves several windows from one
prefill, on real files; and bench/bars.py reads the paired figures when a run has them, the single windows of an
older run's JSON otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bars import issue12_bars  # noqa: E402
from bench.disk_loop import ReceiveDeleteDir  # noqa: E402
from bench.windows import alternate, order, paired, summary_row  # noqa: E402


def test_the_order_alternates_inside_each_round() -> None:
    assert order(1) == ["loop", "mq"]
    assert order(3) == ["loop", "mq", "mq", "loop", "loop", "mq"]
    with pytest.raises(ValueError):
        order(0)


def test_alternate_runs_the_windows_in_order_and_tags_them() -> None:
    ran: list[tuple[str, int]] = []

    def window(side: str) -> Any:
        def run(r: int) -> dict[str, Any]:
            ran.append((side, r))
            return {"side": side}

        return run

    loops, mqs = alternate(3, window("loop"), window("mq"))
    assert ran == [("loop", 0), ("mq", 0), ("mq", 1), ("loop", 1), ("loop", 2), ("mq", 2)]
    assert [(r["round"], r["position"]) for r in loops] == [(0, 0), (1, 1), (2, 0)]
    assert [(r["round"], r["position"]) for r in mqs] == [(0, 1), (1, 0), (2, 1)]


def _row(rate_key: str, rate: float, p99: float, canary: float = 1.0) -> dict[str, Any]:
    latency = {"p50": p99 / 2, "p99": p99, "max": p99 * 2}
    return {rate_key: rate, "latency_ms": latency, "cpu": {"cpu_canary_ms": canary}}


def test_a_bar_is_the_median_of_the_per_round_ratios_not_the_ratio_of_medians() -> None:
    # The disk halves its speed in round 1 and mq with it: each round's ratio is 0.5.
    loops = [_row("msgs_per_s", r, p) for r, p in ((2000, 1.0), (1000, 4.0), (2000, 1.0))]
    mqs = [_row("sends_per_s", r, p) for r, p in ((1000, 2.0), (500, 8.0), (1000, 1.0))]
    for n, (lr, mr) in enumerate(zip(loops, mqs, strict=True)):
        lr["round"], mr["round"] = n, n
        lr["position"], mr["position"] = n % 2, 1 - n % 2
    pair = paired(loops, mqs, loop_rate="msgs_per_s", mq_rate="sends_per_s")
    assert [r["ratio"] for r in pair["rounds"]] == [0.5, 0.5, 0.5]
    assert pair["ratio"] == 0.5
    assert [r["p99_ratio"] for r in pair["rounds"]] == [2.0, 2.0, 1.0]
    assert pair["p99_ratio"] == 2.0
    assert [r["first"] for r in pair["rounds"]] == ["loop", "mq", "loop"]
    assert pair["ratio_min"] == pair["ratio_max"] == 0.5
    assert pair["ratio_of_medians"] == 0.5
    with pytest.raises(ValueError):
        paired(loops, mqs[:2], loop_rate="msgs_per_s", mq_rate="sends_per_s")


def test_identical_sides_read_one_and_swapping_them_inverts_the_bar() -> None:
    a = [_row("x", r, p) for r, p in ((1500, 0.7), (900, 3.0), (1300, 1.1))]
    b = [_row("x", r, p) for r, p in ((1200, 0.9), (1000, 2.0), (1400, 0.8))]
    assert paired(a, a, loop_rate="x", mq_rate="x")["ratio"] == 1.0
    ab = paired(a, b, loop_rate="x", mq_rate="x")
    ba = paired(b, a, loop_rate="x", mq_rate="x")
    assert ab["ratio"] == pytest.approx(1 / ba["ratio"], rel=0.01)
    assert ab["p99_ratio"] == pytest.approx(1 / ba["p99_ratio"], rel=0.01)


def test_summary_row_keeps_the_old_keys_and_every_window() -> None:
    rows = [_row("sends_per_s", r, p, c) for r, p, c in ((1400, 1.2, 1.1), (900, 9.0, 1.9), (1200, 2.0, 1.3))]
    row = summary_row(rows, "sends_per_s")
    assert row["sends_per_s"] == 1200
    assert row["latency_ms"]["p99"] == 2.0
    assert row["windows"] == rows
    assert row["window_medians"] == {
        "sends_per_s": 1200,
        "latency_ms.p50": 1.0,
        "latency_ms.p99": 2.0,
        "latency_ms.max": 4.0,
        "cpu.cpu_canary_ms": 1.3,
    }
    with pytest.raises(ValueError):
        summary_row([], "sends_per_s")


def test_the_receive_loop_serves_several_windows_from_one_prefill(tmp_path: Path) -> None:
    rd = ReceiveDeleteDir(tmp_path, prefill=300)
    queue = rd.run_dir / "queues" / "diskloop"
    assert len(list(queue.iterdir())) == 300
    first = rd.window(1, 0.05)
    assert first["left_before"] == 300
    assert 0 < first["messages"] <= 300
    left = len(list(queue.iterdir()))
    assert left == 300 - rd.taken
    second = rd.window(2, 5.0)  # runs until the prefill is used up
    assert second["exhausted"] is True
    assert second["left_before"] == left
    assert list(queue.iterdir()) == [] and list((rd.run_dir / "remove").iterdir()) == []
    rd.remove()
    assert not rd.run_dir.exists()


def test_the_bars_read_the_paired_ratios_and_fall_back_to_single_windows() -> None:
    single = {
        "sends": {"clients_1": {"sends_per_s": 900.0, "latency_ms": {"p99": 3.0}}},
        "disk_loop": {"threads_1": {"msgs_per_s": 1000.0, "latency_ms": {"p99": 1.0}}},
    }
    bars = issue12_bars(single)
    assert bars["sends1_over_disk_loop1"]["value"] == 0.9
    assert bars["send1_p99_over_disk_loop1_p99"]["value"] == 3.0
    loops = [_row("msgs_per_s", 1000, 1.0), _row("msgs_per_s", 2000, 1.0), _row("msgs_per_s", 1000, 1.0)]
    mqs = [_row("sends_per_s", 700, 1.5), _row("sends_per_s", 1700, 1.2), _row("sends_per_s", 800, 1.0)]
    result = {**single, "pairs": {"sends1": paired(loops, mqs, loop_rate="msgs_per_s", mq_rate="sends_per_s")}}
    bars = issue12_bars(result)
    assert bars["sends1_over_disk_loop1"]["value"] == 0.8
    assert bars["send1_p99_over_disk_loop1_p99"]["value"] == 1.2
    assert "median of 3 per-round ratios" in bars["sends1_over_disk_loop1"]["from"]
    assert bars["receive_delete1_over_disk_receive_loop1"]["value"] is None
