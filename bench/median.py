"""The median of several runs' bars (issue 12: "median of at least three alternating rounds").

Each run of ``bench/run.py`` measures every bar against a reference taken in
the same run; this combines the JSON of several runs (for instance three
full runs one after the other, or A B A B A B runs of two variants, one
invocation per variant) into one JSON object on stdout: per bar, the values
of every run, their median, the bar and whether the median meets it.

Usage::

    .venv/bin/python bench/median.py /tmp/run1.json /tmp/run2.json /tmp/run3.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def median_bars(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per bar key of any run: ``{"values", "median", "bar", "compare", "met"}``.

    ``compare`` is taken from the bar entry (``">="`` or ``"<="``); bars of
    issue 2 without one are floors (``">="``). A run that lacks the bar (its
    step did not run) gives None in ``values`` and is left out of the median.
    """
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run.get("bars", {}) if k not in keys)
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        entries = [run.get("bars", {}).get(key) or {} for run in runs]
        values = [e.get("value") for e in entries]
        known = [v for v in values if isinstance(v, int | float)]
        limit = next((e["bar"] for e in entries if "bar" in e), None)
        compare = next((e["compare"] for e in entries if "compare" in e), ">=")
        med = round(statistics.median(known), 3) if known else None
        met = None
        if med is not None and limit is not None:
            met = med >= limit if compare == ">=" else med <= limit
        out[key] = {"values": values, "median": med, "bar": limit, "compare": compare, "met": met}
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: print the median bars of the given run files as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="JSON files written by bench/run.py (--output or bench/results/)")
    args = parser.parse_args(argv)
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    result = {
        "runs": [
            {"file": p, "started_at": r.get("started_at"), "command": r.get("command")}
            for p, r in zip(args.runs, runs, strict=True)
        ],
        "bars": median_bars(runs),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
