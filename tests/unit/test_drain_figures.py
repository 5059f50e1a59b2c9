"""The drain step's tenths and CPU-speed figures (bench/run.py), computed from depth polls and canary samples."""

from __future__ import annotations

from bench.run import _canary_figures, _tenths, cpu_canary_ms


def test_tenths_of_a_drain_that_slowed_by_half() -> None:
    # 1,000 messages: the first half at 100/s, the second at 50/s, polled every second.
    samples = [(float(t), 1000 - 100 * t) for t in range(6)]
    samples += [(5.0 + t, 500 - 50 * t) for t in range(1, 11)]
    assert _tenths(samples, 1000) == [100.0] * 5 + [50.0] * 5


def test_a_tenth_at_a_slower_cpu_is_counted_at_the_median_speed() -> None:
    samples = [(float(t), 1000 - 100 * t) for t in range(6)]
    samples += [(5.0 + t, 500 - 50 * t) for t in range(1, 11)]
    tenths = _tenths(samples, 1000)
    # The canary took twice the CPU in the second half: the CPUs ran at half speed there.
    canary = [(t + 0.5, 1.0) for t in range(5)] + [(t + 0.5, 2.0) for t in range(5, 15)]
    figures = _canary_figures(canary, samples, 1000, tenths)
    assert figures["canary_ms_by_tenth"] == [1.0] * 5 + [2.0] * 5
    assert figures["tenths_per_s_at_median_speed"] == [50.0] * 5 + [50.0] * 5
    assert figures["min_over_max_tenth_at_median_speed"] == 1.0
    assert len(figures["canary_ms_per_second"]) == 15


def test_no_canary_adds_no_figures() -> None:
    assert _canary_figures([], [(0.0, 10), (1.0, 0)], 10, [10.0] * 10) == {}


def test_the_canary_measures_cpu_time() -> None:
    assert cpu_canary_ms() > 0
