"""Kill -9 one worker of the standalone cluster (its executor JVM and Python workers) mid-stream: Spark
reschedules the lost tasks on the other worker, nothing is lost, and the only duplicates are the rows the
killed tasks had already sent.

The stream pipes a queue into another through the run's shared session
(tests/spark/conftest.py: two workers, one executor of this session on each): the
mq source leases micro-batches of ``BATCH`` messages, each row waits a few
milliseconds in the JVM (``reflect`` of ``Thread.sleep``, so every task takes a
second or so and the kill lands inside one), and the mq sink sends it to the target
queue with the source message id in its attributes. The test kills worker 1's whole
process tree once part of the stream has arrived, waits until every message has
arrived, then checks what a user would: every source message id in the target
queue (lost = 0) with its body, duplicates counted and no more than one
micro-batch's worth (a killed task's rows sent before the kill, sent again by its
retry), and the source queue empty. The worker is started again at the end, so
later tests have the cluster's four cores (the master has already replaced the
session's lost executor on the surviving worker).
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mqcore.client import BatchEntry, Client

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

#: Messages streamed.
MESSAGES = 600
#: maxMessagesPerBatch: the most rows a killed micro-batch can resend.
BATCH = 100
#: Milliseconds each row waits in the JVM (a task of 50 rows: ~1 s).
ROW_DELAY_MS = 20
#: Generous bound on any one wait (executor start-up on a loaded 2-core machine included); never a speed test.
WAIT_SECONDS = 150.0


def _wait(predicate: Callable[[], Any], what: str, query: Any = None) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := predicate()):
        if query is not None and query.exception() is not None:
            pytest.fail(f"the query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_SECONDS} s waiting for {what}")
        time.sleep(0.1)
    return value


def _executors(spark: Any) -> set[str]:
    """The ids of the executors the session has now."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds()
    return {str(ids.apply(i)) for i in range(ids.size())}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_kill_9_of_a_worker_mid_stream_loses_nothing(
    spark: Any, spark_cluster: Any, _module_stack: Any, queue: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    source, target = f"{queue[:70]}-in", f"{queue[:70]}-out"
    with Client(_module_stack.url) as client:
        for name in (source, target):
            client.create_queue(name)
        bodies = [f"w{i:04d}" for i in range(MESSAGES)]
        ids = client.send_batch(source, [BatchEntry(b) for b in bodies])
        assert all(isinstance(i, str) for i in ids), ids[:3]
        sent = dict(zip(ids, bodies, strict=True))
        _wait(lambda: len(_executors(spark)) == 2, "the session's two executors")
        executors = _executors(spark)

        stream = (
            spark.readStream.format("mq")
            .options(url=_module_stack.url, queue=source, consumer=f"kill-worker-{os.getpid()}")
            .option("maxMessagesPerBatch", str(BATCH))
            .option("numPartitions", "2")
            .option("visibilityTimeoutSeconds", "600")
            .load()
        )
        # reflect() of a void method gives a string ("null" or null): keep none of it, only the wait.
        sleep = f"reflect('java.lang.Thread', 'sleep', CAST({ROW_DELAY_MS} AS BIGINT))"
        delay = F.expr(f"substr(coalesce({sleep}, ''), 1, 0)")
        query = (
            stream.select(
                F.concat("body_text", delay).alias("value"),
                F.create_map(F.lit("source_id"), "message_id").alias("attributes"),
            )
            .writeStream.format("mq")
            .options(url=_module_stack.url, queue=target)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        killed: list[int] = []
        try:
            _wait(lambda: client.queue_stats(target)["ready"] >= BATCH + 20, "part of the stream in the target", query)
            commands = [_cmdline(pid) for pid in spark_cluster.descendants(1)]
            killed = spark_cluster.kill_worker(1)
            at_kill = client.queue_stats(target)["ready"]
            # The master replaces the lost executor (on the other worker): the set of ids changes.
            _wait(lambda: _executors(spark) != executors, "the driver to notice the lost executor", query)
            _wait(lambda: client.queue_stats(source)["ready"] == 0, "the source to be drained", query)
            _wait(lambda: len({m.attributes["source_id"] for m in client.iter_peek(target)}) == MESSAGES, "every id")
            _wait(lambda: client.queue_stats(source)["in_flight"] == 0, "the last batch to be acknowledged", query)
            assert query.isActive, query.exception()
        finally:
            query.stop()
        assert any("CoarseGrainedExecutorBackend" in c for c in commands), (
            f"no executor JVM below the worker: {commands}"
        )
        survivors = [pid for pid in killed if _state(pid) not in ("gone", "Z")]
        assert not survivors, f"processes of the killed worker still run: {[_cmdline(p) for p in survivors]}"

        out = list(client.iter_peek(target, page_size=1000))
        counts = collections.Counter(m.attributes["source_id"] for m in out)
        duplicates = sum(n - 1 for n in counts.values())
        report = (
            f"sent {MESSAGES}, in the target {len(out)} ({at_kill} at the kill), distinct {len(counts)}, "
            f"duplicates {duplicates}; killed below the worker: {len(killed)} processes"
        )
        sys.stderr.write(report + "\n")
        assert counts.keys() == sent.keys(), f"{report}; lost {sorted(sent.keys() - counts.keys())[:5]}"
        wrong = [m.body for m in out if m.body.decode() != sent[m.attributes["source_id"]]]
        assert not wrong, f"{report}; bodies changed: {wrong[:3]}"
        assert duplicates <= BATCH, f"{report}: more duplicates than the killed micro-batch holds"
        stats = client.queue_stats(source)
        assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0), stats

    spark_cluster.restart_worker(1)
    _wait(lambda: len(_executors(spark)) == 2, "the session's two executors again")


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2 :].split()[0]
