"""Kill -9 a Spark streaming query that reads an mq queue mid-stream, restart it from its checkpoint: nothing is lost.

A real stack (tests/conftest.py) holds the queue. The streaming query runs in a
subprocess (this file run as a script: ``python test_crash.py stream|drain ...``)
started in its own process group; SIGKILL to that group takes down the Python
driver and its JVM at once, as a machine crash would (the JVM's Python workers,
which run in process groups of their own, exit when it dies). Its sink is a
``foreachBatch`` that writes each micro-batch's rows to a new JSON-lines file
(written whole, then renamed) named after the batch and the run, so what reached
the sink survives the crash and every delivery is counted, replays included.

The crash lands at the worst moment for a queue source, every time: micro-batches
0 and 1 are committed in the checkpoint; micro-batch 2 is planned (its offset,
which names its leased messages, is in the checkpoint), its rows have reached the
sink, but it is not committed, because the sink holds batch 2 until the kill; and
most messages are still in the queue. After the kill the test waits until what the
dead job had leased is visible again (the source's short
``visibilityTimeoutSeconds``), restarts the query from the same checkpoint with
``trigger(availableNow=True)``, which replays batch 2 and drains the rest, and
checks what a user would: every message sent reached the sink (lost = 0) with its
body, duplicates (at least once: here the replayed batch 2) are counted and
reported, and the queue is empty.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

#: Messages in the queue at the start.
MESSAGES = 2000
#: The source's maxMessagesPerBatch before the crash (small: the crash comes with most messages still queued).
STREAM_BATCH = 100
#: The micro-batch the sink holds (after writing its rows, before Spark can commit it) until the kill.
HOLD_BATCH = 2
#: The source's maxMessagesPerBatch of the drain after the restart.
DRAIN_BATCH = 1000
#: The source's visibilityTimeoutSeconds: how soon what the killed job had leased is visible again.
VISIBILITY_SECONDS = 5
#: Generous bound on any one wait (JVM start-up on a loaded 2-core machine included); never a speed test.
WAIT_SECONDS = 150.0


# -- the job: runs in a subprocess -------------------------------------------------------------------------------


def _job(argv: list[str]) -> int:
    """``stream``: run the query until killed (holding batch ``--hold``); ``drain``: one availableNow run."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stream", "drain"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--max-per-batch", required=True)
    parser.add_argument("--hold", type=int, default=-1)
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import mqcore.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"mq-crash-{args.mode}")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    mqcore.spark.register(spark)
    sink = Path(args.sink)
    run = f"{args.mode}-{os.getpid()}"
    _log(f"session started ({run})")

    def write_batch(batch: Any, batch_id: int) -> None:
        rows = [{"message_id": r.message_id, "body": r.body_text} for r in batch.collect()]
        tmp = sink / f".batch-{batch_id:06d}-{run}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, sink / f"batch-{batch_id:06d}-{run}.jsonl")
        _log(f"batch {batch_id}: {len(rows)} rows")
        if batch_id == args.hold:
            _log(f"holding batch {batch_id} until killed")
            time.sleep(3600)

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.format("mq")
            .option("url", args.url)
            .option("queue", args.queue)
            .option("consumer", "crash-test")
            .option("maxMessagesPerBatch", args.max_per_batch)
            .option("visibilityTimeoutSeconds", str(VISIBILITY_SECONDS))
            .load()
            .select("message_id", "body_text")
            .writeStream.foreachBatch(write_batch)
            .option("checkpointLocation", args.checkpoint)
            .trigger(**trigger)
            .start()
        )

    if args.mode == "stream":
        start(processingTime="0.5 seconds").awaitTermination()  # until SIGKILL
        return 1
    start(availableNow=True).awaitTermination()
    _log("drained")
    spark.stop()
    return 0


def _log(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


# -- the test ----------------------------------------------------------------------------------------------------


def _require_spark() -> None:
    """Skip without pyspark, pyarrow or java; fail instead under CI=true, where the Spark suite must run.

    (The shared ``spark`` fixture would start a session in this process, which these subprocess tests do not need.)
    """
    missing = [f"{m} (pip install -e '.[spark]')" for m in ("pyspark", "pyarrow") if not importlib.util.find_spec(m)]
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing.append("java (Java 17)")
    if not missing:
        return
    reason = "Spark tests need " + " and ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(f"spark test cannot run under CI=true: {reason}")
    pytest.skip(reason)


class Job:
    """The job subprocess, in its own process group, with its output in a file."""

    def __init__(self, mode: str, tmp: Path, url: str, queue: str, max_per_batch: int, *extra: str) -> None:
        self.log = tmp / f"{mode}.log"
        command = [sys.executable, __file__, mode, "--url", url, "--queue", queue]
        command += ["--checkpoint", str(tmp / "checkpoint"), "--sink", str(tmp / "sink")]
        command += ["--max-per-batch", str(max_per_batch), *extra]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return f"--- {self.log.name}\n" + self.log.read_text(errors="replace")[-6000:]

    def kill_group(self) -> None:
        """SIGKILL the job's process group (the driver and its JVM) if the driver still runs; reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def _wait(predicate: Any, what: str, job: Job | None = None) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := predicate()):
        if job is not None and job.proc.poll() is not None:
            pytest.fail(f"the job exited with {job.proc.returncode} while waiting for {what}\n{job.output()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_SECONDS} s waiting for {what}" + (f"\n{job.output()}" if job else ""))
        time.sleep(0.05)
    return value


def _batch_ids(log_dir: Path) -> list[int]:
    """Batch ids in a checkpoint log (``offsets``: planned; ``commits``: done)."""
    try:
        return sorted(int(name) for name in os.listdir(log_dir) if name.isdigit())
    except FileNotFoundError:
        return []


def _sink_rows(sink: Path) -> list[dict[str, str]]:
    return [json.loads(line) for path in sorted(sink.glob("batch-*.jsonl")) for line in path.read_text().splitlines()]


def test_kill_9_mid_stream_then_restart_from_checkpoint_loses_nothing(stack_factory: Any, tmp_path: Path) -> None:
    _require_spark()
    from mqcore.client import Client

    began = time.monotonic()
    seconds: dict[str, float] = {}
    stack = stack_factory()
    queue = "crash"
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    sink.mkdir()
    with Client(stack.url) as client:
        client.create_queue(queue)
        bodies = [f"crash-{i:05d}" for i in range(MESSAGES)]
        results = client.send_batch(queue, bodies)
        assert all(isinstance(r, str) for r in results), [r for r in results if not isinstance(r, str)][:3]
        sent = dict(zip(results, bodies, strict=True))

        stream = Job("stream", tmp_path, stack.url, queue, STREAM_BATCH, "--hold", str(HOLD_BATCH))
        try:
            _wait(lambda: list(sink.glob(f"batch-{HOLD_BATCH:06d}-*.jsonl")), f"batch {HOLD_BATCH} in the sink", stream)
        finally:
            stream.kill_group()
        seconds["killed"] = time.monotonic() - began
        at_kill = client.queue_stats(queue)
        before = _sink_rows(sink)
        committed, planned = _batch_ids(checkpoint / "commits"), _batch_ids(checkpoint / "offsets")
        mid_stream = f"committed {committed}, planned {planned}, queue {at_kill}\n{stream.output()}"
        assert committed == list(range(HOLD_BATCH)), mid_stream
        assert planned == list(range(HOLD_BATCH + 1)), mid_stream
        assert at_kill["ready"] >= MESSAGES - (HOLD_BATCH + 1) * STREAM_BATCH, mid_stream

        # What the killed job had leased becomes visible again after VISIBILITY_SECONDS.
        _wait(lambda: client.queue_stats(queue)["in_flight"] == 0, "the killed job's leases to expire")
        seconds["leases expired"] = time.monotonic() - began

        drain = Job("drain", tmp_path, stack.url, queue, DRAIN_BATCH)
        try:
            drain.proc.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the drain did not finish in {WAIT_SECONDS} s\n{drain.output()}")
        finally:
            drain.kill_group()  # only if it still runs (a timeout, or pytest-timeout interrupting the wait)
        assert drain.proc.returncode == 0, f"the drain exited with {drain.proc.returncode}\n{drain.output()}"
        after = client.queue_stats(queue)
        seconds["drained"] = time.monotonic() - began

    rows = _sink_rows(sink)
    seen = {r["message_id"] for r in rows}
    lost = sorted(sent.keys() - seen)
    duplicates = len(rows) - len(seen)
    report = (
        f"sent {MESSAGES}, rows in the sink {len(rows)} ({len(before)} before the kill), distinct {len(seen)}, "
        f"lost {len(lost)}, duplicates {duplicates}; queue at the kill: {at_kill['ready']} ready, "
        f"{at_kill['in_flight']} in flight; seconds: {', '.join(f'{k} {v:.1f}' for k, v in seconds.items())}"
    )
    sys.stderr.write(report + "\n")  # shown by pytest -rA or -s: this run's duplicates and phases
    logs = f"{stream.output()}\n{drain.output()}"
    assert not lost, f"{report}; first lost ids {lost[:5]}\n{logs}"
    assert seen <= sent.keys(), f"{report}; ids never sent: {sorted(seen - sent.keys())[:5]}"
    wrong = [r for r in rows if r["body"] != sent[r["message_id"]]]
    assert not wrong, f"{report}; bodies changed: {wrong[:3]}"
    assert (after["ready"], after["in_flight"], after["delayed"]) == (0, 0, 0), f"{report}; queue after {after}\n{logs}"


if __name__ == "__main__":
    sys.exit(_job(sys.argv[1:]))
