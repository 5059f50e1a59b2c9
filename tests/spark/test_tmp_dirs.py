"""Spark's scratch folders go to the test's own temp dir: the run leaves no ``spark-*``, ``blockmgr-*``,
``artifacts-*`` or ``mq-flights-*`` folder in the system temp folder.

This module's name sorts after the other Spark modules', so in a full run it checks
after every Spark test (the shared session, the crash jobs, the flights example) has
run; alone, it runs a shuffle on the shared session first. Folders that were there
before the run's first Spark process are not counted (another run's).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark]


def test_spark_leaves_no_scratch_folders_in_the_system_temp_folder(
    spark: Any, spark_cluster: Any, tmp_baseline: set[str], leftovers: Callable[[], set[str]]
) -> None:
    counts = spark.range(2000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    assert sum(row["count"] for row in counts) == 2000

    new = sorted(leftovers() - tmp_baseline)
    assert not new, f"Spark left scratch folders in the system temp folder: {new}"
    work = Path(spark_cluster.work_dir)
    used = [p.name for p in work.glob("local/*") if p.name.startswith(("spark-", "blockmgr-"))]
    assert used, f"the executors' local dirs are not under the cluster's work dir {work}"
