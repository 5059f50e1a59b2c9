"""Kill -9 the driver of a Spark streaming query that reads an mq queue mid-stream, restart it from its
checkpoint on the cluster: nothing is lost.

A real stack (tests/conftest.py) holds the queue. The streaming query's driver runs
in a subprocess (this file run as a script) submitted to the run's standalone
cluster (tests/spark/conftest.py), in its own process group; SIGKILL to that group
takes down the Python driver and its JVM at once, as a machine crash would (the
master then removes the application and its workers kill its executors). Its sink is a
``foreachBatch`` that writes each micro-batch's rows to a new JSON-lines file
(written whole, then renamed) named after the batch and the run, so what reached
the sink survives the crash and every delivery is counted, replays included.

The crash lands at the worst moment for a queue source, every time: micro-batches
0 and 1 are committed in the checkpoint; micro-batch 2 is planned (its offset,
which names its leased messages, is in the checkpoint), its rows have reached the
sink, but it is not committed, because the sink holds batch 2 until the kill; and
most messages are still in the queue. After the kill the test waits until what the
dead job had leased is visible again (the source's short
``visibilityTimeoutSeconds``), restarts the query from the same checkpoint in another
driver (the run's shared session, on the same cluster) with
``trigger(availableNow=True)``, which replays batch 2 and drains the rest, and
checks what a user would: every message sent reached the sink (lost = 0) with its
body, duplicates (at least once: here the replayed batch 2) are counted and
reported, and the queue is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

#: Messages in the queue at the start.
MESSAGES = 600
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


def start_query(spark: Any, args: argparse.Namespace, run: str, **trigger: Any) -> Any:
    """Start the streaming query: the mq source into a foreachBatch sink that writes one file per batch.

    ``args``: url, queue, checkpoint, sink, max_per_batch and hold (the batch the sink holds until the
    driver is killed; -1 for none). ``run`` names this run's files.
    """
    sink = Path(args.sink)

    def write_batch(batch: Any, batch_id: int) -> None:
        rows = [{"message_id": r.message_id, "body": r.body_text} for r in batch.collect()]
        tmp = sink / f".batch-{batch_id:06d}-{run}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, sink / f"batch-{batch_id:06d}-{run}.jsonl")
        _log(f"batch {batch_id}: {len(rows)} rows")
        if batch_id == args.hold:
            _log(f"holding batch {batch_id} until killed")
            time.sleep(3600)

    return (
        spark.readStream.format("mq")
        .option("url", args.url)
        .option("queue", args.queue)
        .option("consumer", "crash-test")
        .option("maxMessagesPerBatch", str(args.max_per_batch))
        .option("visibilityTimeoutSeconds", str(VISIBILITY_SECONDS))
        .load()
        .select("message_id", "body_text")
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**trigger)
        .start()
    )


def _job(argv: list[str]) -> int:
    """Run the query on the cluster until killed, holding batch ``--hold`` (the driver this test kills)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--max-per-batch", required=True)
    parser.add_argument("--hold", type=int, default=-1)
    parser.add_argument("--java-options", default="")
    args = parser.parse_args(argv)

    from mqcore.spark.session import spark_session

    # One executor (the app's own JVM to start on a loaded 2-core machine is the cost of this test).
    extra = {"spark.cores.max": "1"}
    extra.update({f"spark.{side}.extraJavaOptions": args.java_options for side in ("driver", "executor")})
    spark = spark_session(args.master, Path(args.work_dir), app_name="mq-crash-stream", extra=extra)
    run = f"stream-{os.getpid()}"
    _log(f"session started ({run})")
    start_query(spark, args, run, processingTime="0.5 seconds").awaitTermination()  # until SIGKILL
    return 1


def _log(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


# -- the test ----------------------------------------------------------------------------------------------------


class Job:
    """The driver subprocess, in its own process group, with its output in a file."""

    def __init__(
        self, tmp: Path, master: str, url: str, queue: str, max_per_batch: int, hold: int, java_options: str
    ) -> None:
        self.log = tmp / "stream.log"
        command = [sys.executable, __file__, "--master", master, "--work-dir", str(tmp / "driver")]
        command += ["--java-options", java_options]
        command += ["--url", url, "--queue", queue, "--checkpoint", str(tmp / "checkpoint")]
        command += ["--sink", str(tmp / "sink"), "--max-per-batch", str(max_per_batch), "--hold", str(hold)]
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


def test_kill_9_of_the_driver_mid_stream_then_restart_from_checkpoint_loses_nothing(
    spark: Any, spark_cluster: Any, stack_factory: Any, tmp_path: Path, favour_driver: Any, spark_jvm_options: str
) -> None:
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

        stream = Job(tmp_path, spark_cluster.url, stack.url, queue, STREAM_BATCH, HOLD_BATCH, spark_jvm_options)
        favour_driver(stream.proc.pid)
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

        # The restart: the same query from the same checkpoint, in another driver (this run's session).
        args = argparse.Namespace(
            url=stack.url, queue=queue, checkpoint=str(checkpoint), sink=str(sink), max_per_batch=DRAIN_BATCH, hold=-1
        )
        drain = start_query(spark, args, "drain", availableNow=True)
        try:
            assert drain.awaitTermination(WAIT_SECONDS), f"the drain did not finish in {WAIT_SECONDS} s"
        finally:
            drain.stop()
        assert drain.exception() is None, drain.exception()
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
    logs = stream.output()
    assert not lost, f"{report}; first lost ids {lost[:5]}\n{logs}"
    assert seen <= sent.keys(), f"{report}; ids never sent: {sorted(seen - sent.keys())[:5]}"
    wrong = [r for r in rows if r["body"] != sent[r["message_id"]]]
    assert not wrong, f"{report}; bodies changed: {wrong[:3]}"
    assert (after["ready"], after["in_flight"], after["delayed"]) == (0, 0, 0), f"{report}; queue after {after}\n{logs}"


if __name__ == "__main__":
    sys.exit(_job(sys.argv[1:]))
