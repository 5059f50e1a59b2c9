"""The metrics step's windowed scrape cost (bench/scrape_windows.py): windows and their ratios from sends by second."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scrape_windows import window_ratios  # noqa: E402


def test_a_scraped_window_is_compared_with_the_mean_of_its_neighbours() -> None:
    # Seconds 100-115, 2-s windows from 100: scraped windows start at 100, 104, 108, 112.
    counts = {second: 1000 for second in range(100, 116)}
    counts[104] = counts[105] = 950  # the scraped window 2 sent 5 % less
    counts[106] = counts[107] = 1100  # its right neighbour 10 % more: the left one is 1,000
    ratios, scraped, unscraped = window_ratios(counts, 100, 115, 2)
    assert scraped == [2000, 1900, 2000, 2000]
    assert unscraped == [2000, 2200, 2000, 2000]
    # Windows 2 and 4 have a neighbour on both sides; window 6's right neighbour is the last window.
    assert ratios == [1900 / 2100, 2000 / 2100, 1.0]


def test_a_drift_of_the_machines_speed_cancels() -> None:
    # The send rate climbs 1 % a second; no window is scraped any slower.
    counts = {second: 1000 + 10 * (second - 200) for second in range(200, 230)}
    ratios, _, _ = window_ratios(counts, 200, 229, 3)
    assert all(abs(ratio - 1) < 1e-9 for ratio in ratios)


def test_windows_past_the_last_whole_second_are_left_out() -> None:
    counts = {second: 10 for second in range(0, 9)}
    ratios, scraped, unscraped = window_ratios(counts, 0, 6, 2)
    assert scraped == [20, 20] and unscraped == [20]  # 0-1, 4-5 scraped; 2-3 not; 6-7 ends past second 6
    assert ratios == []  # window 2 has no right neighbour
