"""The flights example (examples/flights, docs/examples.md) runs end to end and its cross-check passes.

The example runs the command the README shows, ``python -m examples.flights``, as a
subprocess from the repository root, on the first 1,500 flights, with ``--master``
the run's standalone cluster (tests/spark/conftest.py, :class:`FlightsRun`): it starts
its own mq stack, replays the flights with several producers, runs the Spark
streaming job (its executor on the cluster's workers) and compares the result with
the batch computation. It is started with the run's first Spark test and runs in the
background meanwhile (conftest's ``_flights_early``); this test waits for it to end,
then reads the Parquet table the job wrote, as a user would look at it, and checks
that the example left nothing in its work dir but that table.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import FLIGHTS_LIMIT, FLIGHTS_TIMEOUT_SECONDS

pytestmark = [pytest.mark.spark, pytest.mark.timeout(480)]


def test_flights_example_runs_end_to_end_on_the_cluster_and_its_cross_check_passes(flights_run: Any) -> None:
    code, stdout, stderr = flights_run.finish()
    if code is None:
        pytest.fail(f"the example did not finish in {FLIGHTS_TIMEOUT_SECONDS} s\n{stdout}\n{stderr[-6000:]}")
    shown = f"exit {code}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-6000:]}"
    assert code == 0, shown
    assert re.search(rf"^cross-check: OK, \d+ rows .* same {FLIGHTS_LIMIT:,} CSV rows", stdout, re.M), shown
    assert re.search(rf"^  messages +{FLIGHTS_LIMIT:,} sent by 3 producers", stdout, re.M), shown
    assert re.search(rf"^  streamed +{FLIGHTS_LIMIT:,} flights aggregated by Spark", stdout, re.M), shown
    assert re.search(r"^  queue +0 ready, 0 in flight at the end", stdout, re.M), shown

    import pyarrow.parquet as pq

    output = flights_run.output
    table = pq.read_table(output).to_pylist()
    assert sum(row["flights"] for row in table) == FLIGHTS_LIMIT, table
    assert len({(row["carrier"], row["month"]) for row in table}) == len(table), table
    rows = re.search(r"^  result +(\d+) rows", stdout, re.M)
    assert rows is not None and int(rows.group(1)) == len(table), shown
    assert sorted(p.name for p in flights_run.work.iterdir()) == [output.name], "the example removed its work dir"
