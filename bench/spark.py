"""mq benchmark: Spark through the ``mq`` data source against the daemon's own HTTP rate.

Measured in ONE run on ONE stack (the same ``mq`` + ``mq-mover`` + ``mq-reaper``,
started by ``bench/run.py``'s :class:`~bench.run.Daemons` on a fresh root on the
real disk, default ``./var/bench-root-spark``; or ``--url`` for a running server):

``http``
    The daemon's own receive+delete throughput through the project's client:
    each thread loops ``Client.receive(max_messages=10, wait_time_seconds=0)`` +
    ``Client.delete_batch`` over a queue prefilled with ``--messages`` messages
    until the queue is empty; 1 and 4 threads (``--http-threads``), each its own
    client and queue. Messages/s = messages deleted / time to empty.
``source``
    Messages/s out of Spark: a streaming query ``readStream.format("mq")`` ->
    ``writeStream.format("noop")`` with ``trigger(availableNow=True)`` over a
    queue prefilled with ``--messages`` messages, timed from ``load()`` to the
    end of ``awaitTermination()`` (``msgs_per_s``), and with the Spark session's
    start-up and warm-up added (``msgs_per_s_incl_session_startup``). The rows
    come from the query's progress (``numInputRows``). Spark commits the last
    batch of an availableNow run only in the next run, so that batch is still
    leased when the query ends: the same query is then started once more on the
    same checkpoint (it acks that batch and finds the queue empty) and timed
    apart (``final_ack_run_s``, ``msgs_per_s_incl_final_ack``).
``sink``
    Messages/s into Spark's sink direction: a DataFrame of ``--messages`` rows
    (``body`` strings of ``--body-bytes`` bytes, ``--partitions`` partitions)
    written with ``df.write.format("mq").mode("append").save()``. The queues'
    prefills, done by ``--prefill-threads`` threads of ``Client.send_batch``
    (batches of 10), are the HTTP baseline of this direction.
``source_prefetch``
    ``source`` with the source option ``prefetch=true`` (the next micro-batch is
    leased while Spark processes the current one).
``stream_sink``
    The same rows written by a streaming query: Parquet files (written first,
    not timed) read with ``readStream`` and ``trigger(availableNow=True)`` into
    ``writeStream.format("mq")``.
``write_bar``
    Issue 17's write bar, alternating in one run: ``--write-rounds`` (default 3)
    rounds of ``--messages`` messages sent by the daemon's own HTTP batch send
    (``send_batch`` of 10 with as many threads as the streaming write runs tasks
    at once, i.e. the same total concurrency), each followed by the same number
    of rows written by an availableNow streaming write (as ``stream_sink``, a
    new checkpoint and queue per round); the bar is the ratio of the medians.
``read_bar``
    Issue 17's read bar with bulk leases (stop 15), alternating in one run:
    ``--read-rounds`` (default 3) rounds, each the daemon's own HTTP batch
    receive+delete (as ``http``) with ``--read-http-threads`` threads (default 4:
    the most requests the source has in flight, 2 executor tasks' bulk leases + the
    driver's deletes of the previous batch's 2 keys) on a fresh queue of
    ``--messages`` messages, then an availableNow streaming read (as ``source``,
    noop sink) of a fresh queue of as many; the bar compares the medians. With
    ``--read-http-threads 2,4`` each round also measures 2 threads (the
    executors' tasks at once).
``backlog``
    A queue of ``--backlog`` messages (default 1,000,000) drained by one
    availableNow run into noop, with the driver's RSS (this process, its JVM and
    the JVM's Python children: the source's driver-side runner) sampled every
    0.5 s: the peak, and samples over the run (flat = the driver holds one
    micro-batch at a time, whatever the backlog).

The bars. Issue 5: source messages/s >= 0.5 x the HTTP receive+delete
messages/s (the better of the thread counts). Issue 17, on the standalone
cluster: source >= 1.0 x HTTP receive+delete with the same total concurrency
(the driver's requests in flight, ``DRIVER_THREADS`` = 4: the 4-thread HTTP
figure), and the streaming write >= 0.8 x the HTTP ``send_batch`` rate (the
prefills; ``write_bar`` measures it against the same concurrency, alternating).
``--master cluster`` (the default) starts a standalone cluster
(mqcore.spark.cluster: a master and 2 workers of 2 cores; the app gets 2
executors of 1 core); ``--master local[2]`` measures in one JVM. Settings are
mqcore.spark.session's; before any part a warm-up (a tiny streaming read and a
tiny write) runs so that the first Spark part does not pay the first query's
costs alone.

It prints ONE JSON object on stdout (also saved in ``bench/results/spark-<time>.json``),
progress on stderr, daemon logs in ``var/bench-logs/spark-<time>/``. Usage,
from the repository root (needs the ``spark`` extra and Java 17)::

    .venv/bin/python bench/spark.py                      # 50,000 messages per part, ~6 minutes
    .venv/bin/python bench/spark.py --quick              # 5,000 messages per part
    .venv/bin/python bench/spark.py --parts source,http  # some parts, in this order
    .venv/bin/python bench/spark.py --max-messages-per-batch 2000 --body-bytes 256
    .venv/bin/python bench/spark.py --parts http,source,source_prefetch,sink,stream_sink,backlog \
        --messages 20000 --backlog 100000 --quiet-timeout 10    # issue 17's figures on a shared machine
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import (
    BENCH_DIR,
    REPO_DIR,
    CpuMeter,
    Daemons,
    _loadavg,
    _lock_root,
    _machine_ticks,
    _prepare_root,
    _ratio,
    log,
    machine_info,
)
from mqcore.client import Client

#: Parts of a run, in the default order.
PARTS = ("http", "source", "source_prefetch", "sink", "stream_sink", "write_bar", "read_bar", "backlog")
#: Parts run without --parts (the backlog part is long: ask for it).
DEFAULT_PARTS = ("http", "source", "source_prefetch", "sink", "stream_sink")
#: Bar of issue 5: the source's messages/s over the HTTP receive+delete messages/s.
BAR_SOURCE_OVER_HTTP = 0.5
#: Bars of issue 17 (on the standalone cluster): the source over HTTP receive+delete with the same
#: total concurrency (the source's requests in flight: 4, see _summary), and the
#: streaming write over HTTP send_batch (the prefills: --prefill-threads threads).
BAR_SOURCE_OVER_HTTP_SAME_CONCURRENCY = 1.0
BAR_STREAM_SINK_OVER_HTTP_SEND = 0.8
#: Messages per part (default, and with --quick).
MESSAGES, QUICK_MESSAGES = 50_000, 5_000
#: Entries per send_batch request of the prefills (mq's default --max-batch-messages).
PREFILL_BATCH = 10
#: Messages of the warm-up queue.
WARMUP_MESSAGES = 200


# -- CPU of a process tree (the Spark JVM and its Python workers) ------------------------


def _processes(*, children: bool) -> dict[int, tuple[int, float, str]]:
    """Every process now: pid -> (parent pid, user + system CPU seconds, name).

    With ``children``, the CPU includes the process's reaped children (right for the Spark
    tree, whose pyspark.daemon forks and reaps workers; wrong for init, which reaps every
    orphan on the machine).
    """
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            head, _, tail = Path(f"/proc/{entry}/stat").read_text().rpartition(")")
            fields = tail.split()
            cpu = sum(int(x) for x in fields[11 : 15 if children else 13]) * tick
            out[int(entry)] = (int(fields[1]), cpu, head.partition("(")[2])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _tree(procs: dict[int, tuple[int, float, str]], root_pid: int) -> set[int]:
    """``root_pid`` and its live descendants."""
    out = set()
    for pid in procs:
        p = pid
        while p > 1:
            if p == root_pid:
                out.add(pid)
                break
            p = procs[p][0] if p in procs else 0
    return out


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    return ""


class PartMeter:
    """:class:`~bench.run.CpuMeter` plus the Spark JVM's process tree (JVM + Python workers), and the
    processes outside the benchmark that used the most CPU (other developers' loads, kernel threads)."""

    def __init__(self, daemons: Daemons | None, jvm_pid: int | None, cluster_pids: tuple[int, ...] = ()) -> None:
        self.jvm_pid = jvm_pid
        self.cluster_pids = cluster_pids
        self.ours = {os.getpid(), *(daemons.pids().values() if daemons is not None else ())}
        self.p0, self.own0 = _processes(children=True), _processes(children=False)
        self.meter = CpuMeter(daemons.pids() if daemons is not None else {})

    def stop(self, messages: int) -> dict[str, Any]:
        """CPU figures since construction; ``spark_cpu_pct`` is of one core, like the others."""
        out: dict[str, Any] = self.meter.stop()
        p1, own1 = _processes(children=True), _processes(children=False)
        wall = out["wall_s"] or 1.0
        spark = _tree(p1, self.jvm_pid) if self.jvm_pid else set()
        for root in self.cluster_pids:  # the standalone cluster's master, workers, executors, Python workers
            spark |= _tree(p1, root)
        with_children = {pid: p1[pid][1] - self.p0[pid][1] if pid in self.p0 else p1[pid][1] for pid in p1}
        delta = {pid: own1[pid][1] - self.own0[pid][1] if pid in self.own0 else own1[pid][1] for pid in own1}
        if self.jvm_pid:
            out["spark_cpu_pct"] = round(100 * sum(with_children[pid] for pid in spark) / wall, 1)
            out["other_cpu_pct"] = round(max(0.0, out["other_cpu_pct"] - out["spark_cpu_pct"]), 1)
        foreign = sorted(
            (pid for pid in own1 if pid not in spark and pid not in self.ours and delta[pid] > 0.05 * wall),
            key=lambda pid: -delta[pid],
        )
        out["top_other_processes"] = [
            {"pid": pid, "name": own1[pid][2], "cpu_pct": round(100 * delta[pid] / wall, 1), "cmd": _cmdline(pid)}
            for pid in foreign[:5]
        ]
        if "mq_cpu_pct" in out and messages:
            out["mq_cpu_ms_per_message"] = round(out["mq_cpu_pct"] / 100 * out["wall_s"] * 1000 / messages, 3)
        return out


class Profiler:
    """py-spy on the Spark Python processes that appear during a part (``--profile DIR``).

    Every 0.1 s it looks for new descendants of the Spark JVM whose command line
    names a pyspark module (the driver-side streaming source runner, the
    executors' workers, ...) and starts ``py-spy record --idle --threads
    --format raw`` on each; raw files (collapsed stacks, wall time including
    waits) land in ``DIR/<part>-<pid>-<module>.txt``. Profiling slows the
    processes down: the figures of a profiled run are not comparable.
    """

    def __init__(self, out_dir: Path, jvm_pid: int, part: str) -> None:
        self.out_dir, self.jvm_pid, self.part = out_dir, jvm_pid, part
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.files: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="bench-profiler", daemon=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def _descendants(self) -> dict[int, str]:
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        out: dict[int, str] = {}
        for pid in parents:
            p = parents[pid]
            while p > 1 and p != self.jvm_pid:
                p = parents.get(p, 0)
            if p == self.jvm_pid:
                with contextlib.suppress(OSError):
                    out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return out

    def _watch(self) -> None:
        spy = str(Path(sys.executable).parent / "py-spy")
        while not self.stop_event.is_set():
            for pid, cmd in self._descendants().items():
                if pid in self.procs or "pyspark" not in cmd:
                    continue
                module = cmd.split()[-1].rsplit(".", 1)[-1]
                path = self.out_dir / f"{self.part}-{pid}-{module}.txt"
                self.files.append(str(path))
                args = [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--idle",
                    "--threads",
                    "--format",
                    "raw",
                    "--rate",
                    "100",
                    "--nonblocking",
                ]
                self.procs[pid] = subprocess.Popen(
                    [*args, "--output", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            self.stop_event.wait(0.1)

    def stop(self) -> list[str]:
        """Stop every py-spy (they write their file on SIGINT); return the files."""
        self.stop_event.set()
        self.thread.join()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        return [f for f in self.files if Path(f).exists()]


# -- helpers ------------------------------------------------------------------------------


def _body(i: int, size: int) -> bytes:
    """An ASCII body of ``size`` bytes that starts with its number (so body_text is decoded)."""
    head = f"{i:012d}".encode()
    return (head + b"x" * max(0, size - len(head)))[:size]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)


def _run_threads(count: int, target: Any) -> list[Any]:
    """Run ``target(k)`` on ``count`` threads started together; return the results in order; re-raise."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(k: int) -> None:
        try:
            start.wait()
            results[k] = target(k)
        except BaseException as exc:  # noqa: BLE001  re-raised below in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,), name=f"bench-{k}") for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class SparkBench:
    """The parts of one run against one stack; each method returns its JSON figures."""

    def __init__(self, args: argparse.Namespace, url: str, daemons: Daemons | None, work: Path) -> None:
        self.args, self.url, self.daemons, self.work = args, url, daemons, work
        self.client = Client(url, timeout_seconds=60)
        self.remove_dir = Path(args.root).resolve() / "mq" / "remove" if daemons is not None else None
        self.spark: Any = None
        self.jvm_pid: int | None = None
        self.cluster: Any = None
        self.cluster_pids: tuple[int, ...] = ()
        self.prefills: list[dict[str, Any]] = []
        self.queues: list[str] = []

    # -- stack --

    def _alive(self) -> None:
        if self.daemons is not None:
            self.daemons.check_alive()

    def meter(self) -> PartMeter:
        return PartMeter(self.daemons, self.jvm_pid, self.cluster_pids)

    def settle(self, timeout_s: float = 300.0) -> float:
        """Wait until mq-reaper has unlinked every deleted message (own stack only); return the wait."""
        t0 = time.monotonic()
        if self.remove_dir is None:
            return 0.0
        while time.monotonic() - t0 < timeout_s:
            try:
                left = sum(1 for _ in os.scandir(self.remove_dir))
            except FileNotFoundError:
                left = 0
            if left == 0:
                break
            time.sleep(0.2)
        time.sleep(self.args.pause)
        return round(time.monotonic() - t0, 1)

    def wait_quiet(self) -> dict[str, Any]:
        """Wait until the machine is idle (other helpers' loads would distort the figures).

        Idle = at most ``--quiet-busy-pct`` of all cores busy over a 3 s window while
        this bench does nothing; gives up after ``--quiet-timeout`` seconds and says so.
        """
        t0 = time.monotonic()
        busy = 100.0
        while True:
            m0 = _machine_ticks()
            time.sleep(3.0)
            d = [b - a for a, b in zip(m0, _machine_ticks(), strict=True)]
            busy = 100 * (sum(d) - d[3] - d[4]) / (sum(d) or 1)
            waited = time.monotonic() - t0
            if busy <= self.args.quiet_busy_pct or waited >= self.args.quiet_timeout:
                break
            if int(waited) % 60 < 3:
                log(f"  waiting for a quiet machine: {busy:.0f} % busy ({waited:.0f} s so far)")
        quiet = busy <= self.args.quiet_busy_pct
        if not quiet:
            log(f"  warning: the machine is still {busy:.0f} % busy; measuring anyway")
        return {"quiet": quiet, "busy_pct_before": round(busy, 1), "waited_s": round(time.monotonic() - t0, 1)}

    def before_part(self) -> dict[str, Any]:
        """Settle (reaper done) and wait for a quiet machine before a measured part."""
        wait = self.settle()
        return {"settle_wait_s": wait, **self.wait_quiet()}

    def queue(self, name: str) -> str:
        """Create a queue (named per run when the server is not ours) and return its name."""
        full = name if self.daemons is not None else f"{name}-{os.getpid()}"
        self.client.create_queue(full)
        self.queues.append(full)
        return full

    def prefill(self, queue: str, count: int, *, what: str, threads: int | None = None) -> dict[str, Any]:
        """Send ``count`` bodies with ``threads`` (default ``--prefill-threads``) threads of ``send_batch``."""
        threads, size = threads or self.args.prefill_threads, self.args.body_bytes
        self.settle()
        log(f"prefill {what}: {count:,} messages of {size} bytes, {threads} thread(s) of send_batch")
        shares = [range(k, count, threads) for k in range(threads)]

        def send(k: int) -> int:
            failed = 0
            with Client(self.url, timeout_seconds=60) as c:
                share = shares[k]
                for start in range(0, len(share), 1000):
                    bodies = [_body(i, size) for i in share[start : start + 1000]]
                    failed += sum(not isinstance(r, str) for r in c.send_batch(queue, bodies, batch_size=PREFILL_BATCH))
            return failed

        meter = self.meter()
        t0 = time.monotonic()
        failed = sum(_run_threads(threads, send))
        seconds = time.monotonic() - t0
        cpu = meter.stop(count)
        if failed:
            raise RuntimeError(f"prefill of {queue}: {failed} entries failed")
        ready = self.client.queue_stats(queue)["ready"]
        res = {
            "queue": queue,
            "messages": count,
            "threads": threads,
            "batch_size": PREFILL_BATCH,
            "seconds": round(seconds, 2),
            "msgs_per_s": round(count / seconds, 1),
            "ready_after": ready,
            "cpu": cpu,
        }
        log(f"  {res['msgs_per_s']:,} msgs/s ({seconds:.1f} s); ready {ready:,}")
        self.prefills.append(res)
        self._alive()
        return res

    # -- HTTP baseline --

    def http(self) -> dict[str, Any]:
        """Receive+delete loops through :class:`Client`, for each thread count, each on its own full queue."""
        out: dict[str, Any] = {}
        n = self.args.messages
        for threads in self.args.http_threads:
            queue = self.queue(f"spark-bench-http-{threads}")
            self.prefill(queue, n, what=f"http, {threads} thread(s)")
            before = self.before_part()
            log(f"http receive+delete: {threads} thread(s) until {queue} is empty")

            def drain(k: int, queue: str = queue) -> dict[str, Any]:
                deleted = failed = receives = empty = 0
                t_recv: list[float] = []
                t_del: list[float] = []
                with Client(self.url, timeout_seconds=60) as c:
                    while True:
                        t0 = time.monotonic()
                        msgs = c.receive(queue, max_messages=10, wait_time_seconds=0)
                        t1 = time.monotonic()
                        receives += 1
                        t_recv.append(t1 - t0)
                        if not msgs:
                            empty += 1
                            break
                        results = c.delete_batch(queue, [m.receipt_handle for m in msgs])
                        t_del.append(time.monotonic() - t1)
                        ok = sum(r is None for r in results)
                        deleted += ok
                        failed += len(results) - ok
                return {"deleted": deleted, "failed": failed, "receives": receives, "t_recv": t_recv, "t_del": t_del}

            meter = self.meter()
            t0 = time.monotonic()
            per_thread = _run_threads(threads, drain)
            seconds = time.monotonic() - t0
            deleted = sum(r["deleted"] for r in per_thread)
            cpu = meter.stop(deleted)
            self._alive()
            stats = self.client.queue_stats(queue)
            t_recv = [t for r in per_thread for t in r["t_recv"]]
            t_del = [t for r in per_thread for t in r["t_del"]]
            out[f"threads_{threads}"] = {
                "threads": threads,
                "queue": queue,
                "messages_deleted": deleted,
                "delete_failures": sum(r["failed"] for r in per_thread),
                "receives": sum(r["receives"] for r in per_thread),
                "seconds": round(seconds, 2),
                "msgs_per_s": round(deleted / seconds, 1),
                "receive_ms": {"p50": _pct(t_recv, 0.5), "p99": _pct(t_recv, 0.99)},
                "delete_batch_ms": {"p50": _pct(t_del, 0.5), "p99": _pct(t_del, 0.99)},
                "queue_after": {k: stats.get(k) for k in ("ready", "in_flight", "delayed")},
                "before": before,
                "cpu": cpu,
            }
            log(f"  {out[f'threads_{threads}']['msgs_per_s']:,} msgs/s ({deleted:,} in {seconds:.1f} s)")
        return out

    # -- Spark --

    def start_spark(self) -> dict[str, Any]:
        """Start the standalone cluster (``--master cluster``) and the session, register ``mq``, warm up; time each."""
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        from mqcore.spark.session import spark_session

        master = self.args.master
        res: dict[str, Any] = {}
        if master == "cluster":
            from mqcore.spark.cluster import StandaloneCluster

            log("starting the Spark standalone cluster (a master, 2 workers of 2 cores)")
            t0 = time.monotonic()
            self.cluster = StandaloneCluster(self.work / "cluster", workers=2, cores=2, memory="2g").start()
            master = self.cluster.url
            self.cluster_pids = tuple(self.cluster.pids())
            res["cluster_start_s"] = round(time.monotonic() - t0, 2)
            log(f"  cluster up in {res['cluster_start_s']:.1f} s at {master}")
        log(f"starting the Spark session ({master})")
        t0 = time.monotonic()
        # A backlog run has more micro-batches than the 100 progress entries a query keeps by default (its rows are
        # counted from them).
        extra = {
            "spark.driver.memory": self.args.driver_memory,
            "spark.sql.streaming.numRecentProgressUpdates": "10000",
        }
        spark = spark_session(
            master, self.work / "driver", app_name="mq-bench-spark", extra=extra, driver_nice=self.args.driver_nice
        )
        session_s = time.monotonic() - t0
        self.spark = spark
        with contextlib.suppress(AttributeError):
            self.jvm_pid = spark.sparkContext._gateway.proc.pid
        res.update({"session_start_s": round(session_s, 2), "warmup_s": 0.0})
        log(f"  session up in {session_s:.1f} s")
        if not self.args.no_warmup:
            t1 = time.monotonic()
            queue = self.queue("spark-bench-warmup")
            with Client(self.url) as c:
                c.send_batch(queue, [_body(i, self.args.body_bytes) for i in range(WARMUP_MESSAGES)])
            self._stream_read(queue, self.work / "ck-warmup", max_batch=WARMUP_MESSAGES // 2)
            df = self._rows(WARMUP_MESSAGES)
            self._writer(df.write, queue).mode("append").save()
            res["warmup_s"] = round(time.monotonic() - t1, 2)
            log(f"  warm-up (a {WARMUP_MESSAGES}-message streaming read and write) in {res['warmup_s']:.1f} s")
        res["startup_total_s"] = round(res["session_start_s"] + res["warmup_s"], 2)
        return res

    def _rows(self, n: int) -> Any:
        """A DataFrame of ``n`` rows with a ``body`` string column of ``--body-bytes`` characters."""
        size = self.args.body_bytes
        return self.spark.range(0, n, numPartitions=self.args.partitions).selectExpr(
            f"substring(concat(lpad(cast(id AS string), 12, '0'), repeat('x', {max(0, size - 12)})), 1, {size}) AS body"
        )

    def _writer(self, w: Any, queue: str) -> Any:
        return w.format("mq").option("url", self.url).option("queue", queue).option("batchSize", self.args.batch_size)

    def _stream_read(
        self, queue: str, checkpoint: Path, *, max_batch: int, sample: bool = False, prefetch: bool = False
    ) -> tuple[float, list[dict[str, Any]], dict[str, Any]]:
        """Run ``mq`` -> noop with availableNow to the end.

        Returns:
            Seconds from ``load()`` to the end of ``awaitTermination()``, the query's progress
            reports (JSON), and where the time went: before the first trigger, after the last,
            and with ``sample``, the queue's ready / in-flight counts every 0.25 s.
        """
        stop = threading.Event()
        samples: list[list[float]] = []
        t0 = time.monotonic()
        wall0 = time.time()

        def sampler() -> None:
            with Client(self.url, timeout_seconds=60) as c:
                while not stop.is_set():
                    stats = c.queue_stats(queue)
                    samples.append([round(time.monotonic() - t0, 2), stats["ready"], stats["in_flight"]])
                    stop.wait(0.25)

        thread = threading.Thread(target=sampler, name="bench-sampler", daemon=True) if sample else None
        if thread is not None:
            thread.start()
        try:
            df = (
                self.spark.readStream.format("mq")
                .option("url", self.url)
                .option("queue", queue)
                .option("maxMessagesPerBatch", max_batch)
                .option("numPartitions", self.args.partitions)
                .option("prefetch", str(prefetch).lower())
                .load()
            )
            query = (
                df.writeStream.format("noop")
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            started = time.monotonic() - t0
            query.awaitTermination()
            seconds = time.monotonic() - t0
        finally:
            stop.set()
            if thread is not None:
                thread.join()
        if query.exception() is not None:
            raise RuntimeError(f"streaming read of {queue} failed: {query.exception()}")
        progress = [json.loads(p.json) for p in query.recentProgress]
        timing: dict[str, Any] = {"start_returned_s": round(started, 2)}
        if progress:

            def at(p: dict[str, Any]) -> float:
                ts = datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
                return ts - wall0

            first, last = progress[0], progress[-1]
            timing["first_trigger_at_s"] = round(at(first), 2)
            timing["last_trigger_end_at_s"] = round(at(last) + last["durationMs"].get("triggerExecution", 0) / 1000, 2)
            timing["after_last_trigger_s"] = round(seconds - timing["last_trigger_end_at_s"], 2)
        if samples:
            timing["queue_samples"] = samples
            n = samples[0][1] + samples[0][2]
            timing["first_lease_seen_at_s"] = next((t for t, r, _ in samples if r < n), None)
            timing["all_leased_at_s"] = next((t for t, r, _ in samples if r == 0), None)
            timing["all_acked_at_s"] = next((t for t, r, f in samples if r == 0 and f == 0), None)
        return seconds, progress, timing

    @staticmethod
    def _progress_summary(progress: list[dict[str, Any]]) -> dict[str, Any]:
        """Rows, batches and where the batches' time went (Spark's durationMs, summed over the batches)."""
        batches = [p for p in progress if p.get("numInputRows", 0) > 0]
        durations: dict[str, int] = {}
        for p in progress:
            for k, v in p.get("durationMs", {}).items():
                durations[k] = durations.get(k, 0) + int(v)
        return {
            "rows": sum(int(p.get("numInputRows", 0)) for p in progress),
            "batches_with_rows": len(batches),
            "triggers": len(progress),
            "rows_per_batch": [int(p["numInputRows"]) for p in batches],
            "duration_ms_sum": durations,
            "per_batch_ms": [
                {k: p["durationMs"].get(k) for k in ("latestOffset", "queryPlanning", "addBatch", "triggerExecution")}
                for p in batches
            ],
        }

    def source(self, startup: dict[str, Any], *, prefetch: bool = False) -> dict[str, Any]:
        """Messages/s out of Spark: availableNow streaming read of a full queue into noop (``prefetch`` option)."""
        n = self.args.messages
        queue = self.queue("spark-bench-source-prefetch" if prefetch else "spark-bench-source")
        self.prefill(queue, n, what="source")
        before = self.before_part()
        max_batch = self.args.max_messages_per_batch
        log(f"source: availableNow read of {n:,} messages, maxMessagesPerBatch {max_batch}")
        checkpoint = self.work / ("ck-source-prefetch" if prefetch else "ck-source")
        meter = self.meter()
        profiler = (
            Profiler(Path(self.args.profile), self.jvm_pid, "source") if self.args.profile and self.jvm_pid else None
        )
        try:
            seconds, progress, timing = self._stream_read(
                queue, checkpoint, max_batch=max_batch, sample=True, prefetch=prefetch
            )
        finally:
            profiles = profiler.stop() if profiler is not None else []
        cpu = meter.stop(n)
        self._alive()
        summary = self._progress_summary(progress)
        left = self.client.queue_stats(queue)
        log(
            f"  {summary['rows']:,} rows in {seconds:.1f} s; "
            f"left ready {left['ready']:,}, in flight {left['in_flight']:,}"
        )
        ack_s, ack_rows, after = 0.0, 0, left
        if left["in_flight"]:
            # Spark acknowledges the last batch only in the next run: run once more to finish.
            ack_s, ack_progress, _ = self._stream_read(queue, checkpoint, max_batch=max_batch)
            ack_rows = sum(int(p.get("numInputRows", 0)) for p in ack_progress)
            after = self.client.queue_stats(queue)
        rows = summary["rows"]
        res = {
            "queue": queue,
            "messages": n,
            "max_messages_per_batch": max_batch,
            "num_partitions": self.args.partitions,
            "query_s": round(seconds, 2),
            "msgs_per_s": round(rows / seconds, 1),
            "msgs_per_s_incl_session_startup": round(rows / (seconds + startup["startup_total_s"]), 1),
            "final_ack_run_s": round(ack_s, 2),
            "msgs_per_s_incl_final_ack": round(rows / (seconds + ack_s), 1),
            "final_ack_run_rows": ack_rows,
            "queue_after_query": {k: left.get(k) for k in ("ready", "in_flight", "delayed")},
            "queue_after_final_ack_run": {k: after.get(k) for k in ("ready", "in_flight", "delayed")},
            "progress": summary,
            "timing": timing,
            "profiles": profiles,
            "before": before,
            "cpu": cpu,
        }
        log(
            f"  {res['msgs_per_s']:,} msgs/s (incl. session start-up {res['msgs_per_s_incl_session_startup']:,}); "
            f"final ack run {ack_s:.1f} s; then ready {after['ready']}, in flight {after['in_flight']}"
        )
        if rows < n:
            raise RuntimeError(f"the source delivered {rows} rows of {n}")
        return res

    def sink(self) -> dict[str, Any]:
        """Messages/s into the sink: batch write of N rows with ``df.write.format("mq").mode("append")``."""
        n = self.args.messages
        queue = self.queue("spark-bench-sink")
        before = self.before_part()
        df = self._rows(n)
        log(f"sink: batch write of {n:,} rows, {self.args.partitions} partitions, batchSize {self.args.batch_size}")
        meter = self.meter()
        t0 = time.monotonic()
        self._writer(df.write, queue).mode("append").save()
        seconds = time.monotonic() - t0
        cpu = meter.stop(n)
        self._alive()
        ready = self.client.queue_stats(queue)["ready"]
        res = {
            "queue": queue,
            "messages": n,
            "num_partitions": self.args.partitions,
            "batch_size": self.args.batch_size,
            "seconds": round(seconds, 2),
            "msgs_per_s": round(n / seconds, 1),
            "ready_after": ready,
            "before": before,
            "cpu": cpu,
        }
        log(f"  {res['msgs_per_s']:,} msgs/s ({seconds:.1f} s); ready {ready:,}")
        if ready < n:
            raise RuntimeError(f"the sink wrote {ready} messages of {n}")
        return res

    def stream_sink(self) -> dict[str, Any]:
        """Messages/s of a streaming write: N rows from Parquet (availableNow) into ``writeStream.format("mq")``."""
        n = self.args.messages
        queue = self.queue("spark-bench-stream-sink")
        src = self.work / "stream-sink-input"
        self._rows(n).write.mode("overwrite").parquet(str(src))
        before = self.before_part()
        log(f"stream_sink: availableNow write of {n:,} rows from Parquet")
        meter = self.meter()
        seconds, query = self._stream_write(src, queue, self.work / "ck-stream-sink")
        cpu = meter.stop(n)
        ready = self.client.queue_stats(queue)["ready"]
        res = {
            "queue": queue,
            "messages": n,
            "query_s": round(seconds, 2),
            "msgs_per_s": round(n / seconds, 1),
            "batches": len([p for p in query.recentProgress if p.numInputRows > 0]),
            "ready_after": ready,
            "before": before,
            "cpu": cpu,
        }
        log(f"  {res['msgs_per_s']:,} msgs/s ({seconds:.1f} s); ready {ready:,}")
        if ready < n:
            raise RuntimeError(f"the streaming sink wrote {ready} messages of {n}")
        return res

    def _stream_write(self, src: Path, queue: str, checkpoint: Path) -> tuple[float, Any]:
        """One availableNow streaming write of the Parquet files in ``src`` into ``queue``; (seconds, query)."""
        t0 = time.monotonic()
        df = self.spark.readStream.schema("body STRING").parquet(str(src))
        query = (
            self._writer(df.writeStream, queue)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.monotonic() - t0
        self._alive()
        if query.exception() is not None:
            raise RuntimeError(f"streaming write failed: {query.exception()}")
        return seconds, query

    def write_concurrency(self) -> int:
        """Requests a streaming write has in flight: its tasks at once (one ``send_batch`` each, in turn)."""
        return min(self.args.partitions, int(self.spark.sparkContext.defaultParallelism))

    def write_bar(self) -> dict[str, Any]:
        """Issue 17's write bar in one run: stream-write rounds alternating with their HTTP reference.

        Each of ``--write-rounds`` rounds sends ``--messages`` messages with the daemon's own
        HTTP batch send (``send_batch`` of 10, as many threads as the streaming write has tasks
        at once: :meth:`write_concurrency`) into a fresh queue, then writes the same number of
        rows with an availableNow streaming write (Parquet -> ``writeStream.format("mq")``, a
        new checkpoint) into another fresh queue. The bar compares the medians.
        """
        n, rounds = self.args.messages, self.args.write_rounds
        threads = self.write_concurrency()
        src = self.work / "write-bar-input"
        self._rows(n).write.mode("overwrite").parquet(str(src))
        before = self.before_part()
        log(f"write_bar: {rounds} rounds of {n:,} messages, HTTP send_batch with {threads} threads, then stream write")
        http_rates: list[float] = []
        stream_rates: list[float] = []
        loads: list[list[float]] = []
        for r in range(rounds):
            loads.append(_loadavg())
            sent = self.prefill(self.queue(f"spark-bench-wb-http-{r}"), n, what=f"write_bar round {r}", threads=threads)
            http_rates.append(sent["msgs_per_s"])
            queue = self.queue(f"spark-bench-wb-stream-{r}")
            self.settle()
            seconds, _ = self._stream_write(src, queue, self.work / f"ck-write-bar-{r}")
            ready = self.client.queue_stats(queue)["ready"]
            if ready < n:
                raise RuntimeError(f"the streaming write wrote {ready} messages of {n}")
            stream_rates.append(round(n / seconds, 1))
            log(f"  round {r}: HTTP send {http_rates[-1]:,} msgs/s, stream write {stream_rates[-1]:,} msgs/s")
        loads.append(_loadavg())
        http_median, stream_median = statistics.median(http_rates), statistics.median(stream_rates)
        ratio = _ratio(stream_median, http_median)
        log(f"  medians: HTTP send {http_median:,}, stream write {stream_median:,}: {ratio}x")
        return {
            "messages_per_round": n,
            "rounds": rounds,
            "http_send_threads": threads,
            "http_send_batch_msgs_per_s": http_rates,
            "stream_write_msgs_per_s": stream_rates,
            "http_send_median": http_median,
            "stream_write_median": stream_median,
            "ratio_of_medians": ratio,
            "loadavg_between_rounds": loads,
            "before": before,
        }

    def _drain_http(self, queue: str, threads: int) -> tuple[int, float]:
        """Receive (10) + delete_batch with ``threads`` threads until ``queue`` is empty: (deleted, seconds)."""

        def drain(k: int) -> int:
            deleted = 0
            with Client(self.url, timeout_seconds=60) as c:
                while msgs := c.receive(queue, max_messages=10, wait_time_seconds=0):
                    deleted += sum(r is None for r in c.delete_batch(queue, [m.receipt_handle for m in msgs]))
            return deleted

        t0 = time.monotonic()
        deleted = sum(_run_threads(threads, drain))
        return deleted, time.monotonic() - t0

    def read_bar(self) -> dict[str, Any]:
        """Issue 17's read bar in one run: HTTP receive+delete rounds alternating with streaming reads.

        Each of ``--read-rounds`` rounds drains a fresh queue of ``--messages`` messages with the
        daemon's own HTTP batch receive+delete for each of ``--read-http-threads`` (the reference),
        then a fresh queue of as many with an availableNow streaming read into noop (the executors'
        bulk leases, the driver's deletes by key; a new checkpoint). Messages/s are timed from the
        first request (``load()`` for Spark, so the query's start counts) to the queue's end; the
        bar compares the medians. CPU of mq per message is recorded for both.
        """
        n, rounds = self.args.messages, self.args.read_rounds
        max_batch = self.args.max_messages_per_batch
        before = self.before_part()
        log(
            f"read_bar: {rounds} rounds of {n:,} messages, HTTP receive+delete with {self.args.read_http_threads} "
            f"thread(s), then a streaming read (maxMessagesPerBatch {max_batch}, numPartitions {self.args.partitions})"
        )
        http: dict[int, list[float]] = {t: [] for t in self.args.read_http_threads}
        http_cpu: dict[int, list[float | None]] = {t: [] for t in self.args.read_http_threads}
        stream_rates: list[float] = []
        stream_cpu: list[float | None] = []
        batches: list[list[int]] = []
        loads: list[list[float]] = []
        for r in range(rounds):
            loads.append(_loadavg())
            for threads in self.args.read_http_threads:
                queue = self.queue(f"spark-bench-rb-http-{threads}-{r}")
                self.prefill(queue, n, what=f"read_bar round {r}, HTTP {threads} threads")
                self.settle()
                meter = self.meter()
                deleted, seconds = self._drain_http(queue, threads)
                cpu = meter.stop(deleted)
                if deleted < n:
                    raise RuntimeError(f"the HTTP loop deleted {deleted} messages of {n}")
                http[threads].append(round(deleted / seconds, 1))
                http_cpu[threads].append(cpu.get("mq_cpu_ms_per_message"))
            queue = self.queue(f"spark-bench-rb-stream-{r}")
            self.prefill(queue, n, what=f"read_bar round {r}, stream")
            self.settle()
            meter = self.meter()
            seconds, progress, _ = self._stream_read(queue, self.work / f"ck-read-bar-{r}", max_batch=max_batch)
            cpu = meter.stop(n)
            self._alive()
            rows = sum(int(p.get("numInputRows", 0)) for p in progress)
            left = self.client.queue_stats(queue)
            if rows < n or left["ready"] or left["in_flight"]:
                raise RuntimeError(f"the streaming read delivered {rows} rows of {n}; left {left}")
            stream_rates.append(round(rows / seconds, 1))
            stream_cpu.append(cpu.get("mq_cpu_ms_per_message"))
            batches.append([int(p["numInputRows"]) for p in progress if p.get("numInputRows")])
            log(
                f"  round {r}: HTTP "
                + ", ".join(f"{t} threads {http[t][-1]:,}" for t in http)
                + f" msgs/s; stream read {stream_rates[-1]:,} msgs/s ({len(batches[-1])} batches)"
            )
        loads.append(_loadavg())
        stream_median = statistics.median(stream_rates)
        medians = {t: statistics.median(v) for t, v in http.items()}
        ratios = {f"threads_{t}": _ratio(stream_median, m) for t, m in medians.items()}
        log(f"  medians: HTTP {medians}, stream read {stream_median:,}: {ratios}")
        return {
            "messages_per_round": n,
            "rounds": rounds,
            "max_messages_per_batch": max_batch,
            "num_partitions": self.args.partitions,
            "http_receive_delete_msgs_per_s": {f"threads_{t}": v for t, v in http.items()},
            "http_mq_cpu_ms_per_message": {f"threads_{t}": v for t, v in http_cpu.items()},
            "stream_read_msgs_per_s": stream_rates,
            "stream_mq_cpu_ms_per_message": stream_cpu,
            "stream_rows_per_batch": batches,
            "http_medians": {f"threads_{t}": m for t, m in medians.items()},
            "stream_read_median": stream_median,
            "ratio_of_medians": ratios,
            "loadavg_between_rounds": loads,
            "before": before,
        }

    def backlog(self) -> dict[str, Any]:
        """A ``--backlog`` queue drained by one availableNow run; the driver's RSS sampled every 0.5 s.

        The driver is this process, its JVM (the gateway) and the JVM's Python children (the
        data source's driver-side runner, which holds one micro-batch at a time).
        """
        n = self.args.backlog
        if self.args.backlog_prefill == "store" and self.daemons is not None:
            # mq's own protocol code, without the HTTP path and its fsyncs (bench/prefill.py), into a queue
            # the daemon has not seen yet: it indexes the queue's folder when it first touches it.
            from bench.prefill import fill

            queue = "spark-bench-backlog"
            log(f"prefill backlog: {n:,} messages written with mqcore's Store (no HTTP, no fsync)")
            filled = fill(Path(self.args.root).resolve() / "mq", [(queue, n)], body_bytes=self.args.body_bytes)
            log(f"  {filled['messages']:,} in {filled['write_s']} s + sync {filled['sync_s']} s")
            self.queues.append(queue)
        else:
            queue = self.queue("spark-bench-backlog")
            self.prefill(queue, n, what="backlog")
        before = self.before_part()
        max_batch = self.args.max_messages_per_batch
        log(f"backlog: availableNow drain of {n:,} messages, maxMessagesPerBatch {max_batch}, driver RSS sampled")
        samples: list[tuple[float, int, int, int]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def rss_kb(pid: int) -> int:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
            return 0

        def sampler() -> None:
            while not stop.is_set():
                jvm = py = 0
                if self.jvm_pid:
                    jvm = rss_kb(self.jvm_pid)
                    children = _tree(_processes(children=False), self.jvm_pid) - {self.jvm_pid}
                    py = sum(rss_kb(pid) for pid in children)
                samples.append((round(time.monotonic() - t0, 1), rss_kb(os.getpid()), jvm, py))
                stop.wait(0.5)

        thread = threading.Thread(target=sampler, name="bench-rss", daemon=True)
        meter = self.meter()
        thread.start()
        try:
            seconds, progress, _ = self._stream_read(queue, self.work / "ck-backlog", max_batch=max_batch)
        finally:
            stop.set()
            thread.join()
        cpu = meter.stop(n)
        self._alive()
        rows = sum(int(p.get("numInputRows", 0)) for p in progress)
        left = self.client.queue_stats(queue)
        totals = [b + j + p for _, b, j, p in samples]
        mib = 1024.0
        every = max(1, len(samples) // 20)
        res = {
            "queue": queue,
            "messages": n,
            "rows": rows,
            "max_messages_per_batch": max_batch,
            "query_s": round(seconds, 2),
            "msgs_per_s": round(rows / seconds, 1),
            "driver_peak_rss_mib": round(max(totals, default=0) / mib, 1),
            "driver_peak_rss_mib_by_process": {
                "bench_python": round(max((s[1] for s in samples), default=0) / mib, 1),
                "driver_jvm": round(max((s[2] for s in samples), default=0) / mib, 1),
                "driver_python_children": round(max((s[3] for s in samples), default=0) / mib, 1),
            },
            "driver_rss_mib_samples": [[t, round((b + j + p) / mib, 1)] for t, b, j, p in samples[::every]],
            "queue_after": {k: left.get(k) for k in ("ready", "in_flight", "delayed")},
            "before": before,
            "cpu": cpu,
        }
        log(
            f"  {rows:,} rows in {seconds:.1f} s ({res['msgs_per_s']:,} msgs/s); "
            f"driver peak RSS {res['driver_peak_rss_mib']:,} MiB; left {res['queue_after']}"
        )
        if rows < n:
            raise RuntimeError(f"the backlog drain delivered {rows} rows of {n}")
        return res

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        if self.cluster is not None:
            self.cluster.stop()
        self.client.close()


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(ImportError):
        import pyspark

        out["pyspark"] = pyspark.__version__
    with contextlib.suppress(ImportError):
        import pyarrow

        out["pyarrow"] = pyarrow.__version__
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        out["java"] = (java.stderr or java.stdout).splitlines()[0].strip()
    return out


def _bar(value: float | None, bar: float, **figures: Any) -> dict[str, Any]:
    """A bar's entry of the summary: ``value`` (a ratio, None if not measured), its figures, ``bar``, ``met``."""
    return {"value": value, **figures, "bar": bar, "met": value is not None and value >= bar}


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures and the bar."""
    http = {k: v["msgs_per_s"] for k, v in result.get("http", {}).items()}
    best_key = max(http, key=lambda k: http[k]) if http else None
    best = http[best_key] if best_key else 0.0
    src = result.get("source", {})
    rate = src.get("msgs_per_s", 0.0)
    value = _ratio(rate, best)
    prefill_rates = [p["msgs_per_s"] for p in result.get("prefills", [])]
    out: dict[str, Any] = {
        "http_receive_delete_msgs_per_s": http,
        "source_msgs_per_s": rate,
        "source_msgs_per_s_incl_session_startup": src.get("msgs_per_s_incl_session_startup"),
        "source_msgs_per_s_incl_final_ack": src.get("msgs_per_s_incl_final_ack"),
        "sink_batch_write_msgs_per_s": result.get("sink", {}).get("msgs_per_s"),
        "sink_streaming_write_msgs_per_s": result.get("stream_sink", {}).get("msgs_per_s"),
        "http_send_batch_prefill_msgs_per_s": {
            "min": min(prefill_rates, default=None),
            "max": max(prefill_rates, default=None),
        },
        "source_over_http": {k: _ratio(rate, v) for k, v in http.items()},
        "source_incl_session_startup_over_http_best": _ratio(src.get("msgs_per_s_incl_session_startup") or 0.0, best),
        "source_incl_final_ack_over_http_best": _ratio(src.get("msgs_per_s_incl_final_ack") or 0.0, best),
    }
    out["bar_source_over_http_receive_delete"] = _bar(
        value, BAR_SOURCE_OVER_HTTP, source_msgs_per_s=rate, http_msgs_per_s=best, http_threads=best_key
    )
    # The most requests the source has in flight: the executors' bulk leases (2 tasks at once on the
    # two-worker cluster) and the driver's deletes of the previous batch's keys (2): 4 (issue 17, stop 15).
    DRIVER_THREADS = 4  # the name of the figure in earlier results

    same = http.get(f"threads_{DRIVER_THREADS}")
    for part in ("source", "source_prefetch"):
        if part in result and same:
            ratio = _ratio(result[part]["msgs_per_s"], same)
            out[f"bar_{part}_over_http_same_concurrency"] = _bar(
                ratio, BAR_SOURCE_OVER_HTTP_SAME_CONCURRENCY, http_threads=DRIVER_THREADS
            )
    sink_rate = result.get("stream_sink", {}).get("msgs_per_s")
    send_rate = max(prefill_rates, default=None)
    if sink_rate and send_rate:
        out["bar_stream_sink_over_http_send"] = _bar(
            _ratio(sink_rate, send_rate), BAR_STREAM_SINK_OVER_HTTP_SEND, http_send_msgs_per_s=send_rate
        )
    if "read_bar" in result:
        ratios = result["read_bar"]["ratio_of_medians"]
        value = min((v for v in ratios.values() if v is not None), default=None)
        out["bar_read_bar_stream_over_http_receive_delete"] = _bar(
            value, BAR_SOURCE_OVER_HTTP_SAME_CONCURRENCY, ratios_by_http_threads=ratios
        )
    if "write_bar" in result:
        out["bar_stream_write_over_http_send_same_concurrency"] = _bar(
            result["write_bar"]["ratio_of_medians"],
            BAR_STREAM_SINK_OVER_HTTP_SEND,
            http_send_threads=result["write_bar"]["http_send_threads"],
        )
    if "backlog" in result:
        out["backlog"] = {k: result["backlog"][k] for k in ("messages", "msgs_per_s", "driver_peak_rss_mib")}
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--messages",
        "-n",
        type=int,
        default=None,
        help=f"messages per part (default {MESSAGES:,}; quick {QUICK_MESSAGES:,})",
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK_MESSAGES:,} messages per part")
    p.add_argument("--body-bytes", type=int, default=1024, help="bytes per message body (default 1024)")
    p.add_argument(
        "--max-messages-per-batch", type=int, default=10_000, help="source option maxMessagesPerBatch (default 10000)"
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=2,
        help="source numPartitions and partitions of the written DataFrame (default 2)",
    )
    p.add_argument("--batch-size", type=int, default=10, help="sink option batchSize (default 10)")
    p.add_argument("--http-threads", default="1,4", help="thread counts of the HTTP receive+delete loops (default 1,4)")
    p.add_argument("--write-rounds", type=int, default=3, help="rounds of the write_bar part (default 3)")
    p.add_argument("--read-rounds", type=int, default=3, help="rounds of the read_bar part (default 3)")
    p.add_argument(
        "--read-http-threads", default="4", help="thread counts of read_bar's HTTP reference (default 4; e.g. 2,4)"
    )
    p.add_argument("--prefill-threads", type=int, default=4, help="threads of send_batch for the prefills (default 4)")
    p.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated parts of {','.join(PARTS)}, run in this order (default {','.join(DEFAULT_PARTS)})",
    )
    p.add_argument("--pause", type=float, default=2.0, help="seconds of quiet before each measured part (default 2)")
    p.add_argument(
        "--quiet-busy-pct",
        type=float,
        default=15.0,
        help="before each part, wait until at most this %% of all cores is busy (default 15)",
    )
    p.add_argument(
        "--quiet-timeout", type=float, default=900.0, help="give up waiting for quiet after this (default 900 s)"
    )
    p.add_argument("--no-warmup", action="store_true", help="no warm-up query after the session starts")
    p.add_argument(
        "--driver-nice",
        type=int,
        default=None,
        help="start the driver's JVM in a session of its own at this nice value (root; mqcore.spark.session)",
    )
    p.add_argument("--driver-memory", default="2g", help="spark.driver.memory (default 2g)")
    p.add_argument(
        "--master",
        default="cluster",
        help="cluster (start a standalone cluster: a master and 2 workers, default), local[N] or spark://HOST:PORT",
    )
    p.add_argument(
        "--backlog-prefill",
        choices=("http", "store"),
        default="http",
        help="fill the backlog with send_batch over HTTP (default) or with mqcore's Store directly (own server only)",
    )
    p.add_argument("--backlog", type=int, default=1_000_000, help="messages of the backlog part (default 1,000,000)")
    p.add_argument("--url", help="measure this running mq instead of starting one (queues get a per-run name)")
    p.add_argument(
        "--root", default=str(REPO_DIR / "var" / "bench-root-spark"), help="bench root (default ./var/bench-root-spark)"
    )
    p.add_argument("--workers", type=int, default=None, help="mq --workers (default: mq's own default)")
    p.add_argument("--mq-arg", action="append", default=[], help="extra argument for mq (repeatable)")
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy the Spark Python processes during the source part into DIR (slows it: figures not comparable)",
    )
    p.add_argument("--keep-root", action="store_true", help="leave the bench root in place afterwards")
    p.add_argument("--output", help="also write the JSON here (default bench/results/spark-<time>.json)")
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = QUICK_MESSAGES if args.quick else MESSAGES
    args.http_threads = [int(x) for x in args.http_threads.split(",") if x]
    args.read_http_threads = [int(x) for x in args.read_http_threads.split(",") if x]
    args.parts = [x for x in args.parts.split(",") if x]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown --parts {sorted(unknown)}; choose among {','.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the parts; print the JSON; exit 0 (1 if a part failed)."""
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    root = Path(args.root).resolve()
    own_server = args.url is None
    _lock_root(root)
    if own_server:
        _prepare_root(root)
    else:
        root.mkdir(parents=True, exist_ok=True)
    log_dir = REPO_DIR / "var" / "bench-logs" / f"spark-{started:%Y%m%dT%H%M%SZ}"
    machine = machine_info(root, None)
    machine.pop("wrk", None)
    machine.update(_versions())
    result: dict[str, Any] = {
        "benchmark": "mq issues 5 and 17: Spark data source",
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine,
        "loadavg_at_start": _loadavg(),
        "config": {
            "parts": args.parts,
            "messages": args.messages,
            "body_bytes": args.body_bytes,
            "max_messages_per_batch": args.max_messages_per_batch,
            "partitions": args.partitions,
            "sink_batch_size": args.batch_size,
            "http_threads": args.http_threads,
            "prefill_threads": args.prefill_threads,
            "spark": f"{args.master}, ui off, shuffle partitions 2, log level ERROR, driver memory {args.driver_memory}"
            + (", 2 workers x 2 cores, 2 executors x 1 core x 512 MiB" if args.master != "local[2]" else ""),
            "backlog": args.backlog,
            "backlog_prefill": args.backlog_prefill,
            "write_rounds": args.write_rounds,
            "driver_nice": args.driver_nice,
            "warmup": not args.no_warmup,
            "profiled_with_py_spy": bool(args.profile),
            "server": "own (mq + mq-mover + mq-reaper started by the bench)" if own_server else args.url,
            "mq_workers": args.workers if args.workers is not None else "mq default",
            "mq_extra_args": args.mq_arg,
            "root": str(root),
        },
    }
    daemons: Daemons | None = None
    bench: SparkBench | None = None
    failed = None
    work = Path(tempfile.mkdtemp(prefix="spark-", dir=root))
    try:
        if own_server:
            daemons = Daemons(root / "mq", log_dir, args.workers, args.mq_arg)
            url = daemons.start()
        else:
            url = args.url
        result["config"]["url"] = url
        bench = SparkBench(args, url, daemons, work)
        spark_parts = {"source", "source_prefetch", "sink", "stream_sink", "write_bar", "read_bar", "backlog"}
        spark_parts &= set(args.parts)
        startup: dict[str, Any] = {"startup_total_s": 0.0}
        if spark_parts:
            startup = bench.start_spark()
            result["spark_startup"] = startup
        for part in args.parts:
            if part == "http":
                result["http"] = bench.http()
            elif part == "source":
                result["source"] = bench.source(startup)
            elif part == "source_prefetch":
                result["source_prefetch"] = bench.source(startup, prefetch=True)
            elif part == "sink":
                result["sink"] = bench.sink()
            elif part == "stream_sink":
                result["stream_sink"] = bench.stream_sink()
            elif part == "write_bar":
                result["write_bar"] = bench.write_bar()
            elif part == "read_bar":
                result["read_bar"] = bench.read_bar()
            elif part == "backlog":
                result["backlog"] = bench.backlog()
    except (RuntimeError, OSError) as exc:
        failed = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {failed}")
        result["error"] = failed
    finally:
        if bench is not None:
            result["prefills"] = bench.prefills
            if not own_server:
                for q in bench.queues:
                    with contextlib.suppress(Exception):
                        bench.client.delete_queue(q)
            bench.close()
        if daemons is not None:
            log("stopping the daemons")
            result["daemon_exit_codes"] = daemons.stop()
            result["logs"] = str(log_dir)
        shutil.rmtree(work, ignore_errors=True)
    result["summary"] = _summary(result)
    result["loadavg_at_end"] = _loadavg()
    result["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = json.dumps(result, indent=2)
    out_path = Path(args.output) if args.output else BENCH_DIR / "results" / f"spark-{started:%Y%m%dT%H%M%SZ}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text + "\n")
    log(f"results saved to {out_path}")
    if own_server and not args.keep_root and failed is None:
        log(f"removing {root}")
        shutil.rmtree(root, ignore_errors=True)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
