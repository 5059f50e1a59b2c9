"""The disk's own rate for the durable-send steps, without mq.

N threads (default 64) each loop, one message at a time, over exactly the
system calls a durable send needs (issue 2, "Benchmark"):

    fd = open(DIR/new/NAME, O_WRONLY|O_CREAT|O_EXCL)   write 1 KiB   fsync(fd)   close(fd)
    rename(DIR/new/NAME, DIR/queues/<queue>/NAME)       fsync(DIR/queues/<queue>)

Every message pays its own directory fsync (no group commit): this is the
rate that mq's group commit has to beat. Run it on the filesystem of the mq
root; tmpfs (``/dev/shm``) would hide the fsync cost.

Usage::

    .venv/bin/python bench/disk_loop.py --threads 64 --duration 10 [--dir ./var/bench-diskloop]

It prints one JSON object on stdout (``msgs_per_s`` and per-message latency);
:func:`disk_loop` is the same measurement as a function.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path

#: Body size of one message, in bytes (the issue's 1 KiB).
BODY_BYTES = 1024
#: Default run length, in seconds.
DEFAULT_DURATION_S = 10.0
#: Default number of threads (the issue's bar compares mq at 64 clients to this loop at 64 threads).
DEFAULT_THREADS = 64


def _percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(pct / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


def disk_loop(
    directory: str | os.PathLike[str],
    *,
    threads: int = DEFAULT_THREADS,
    duration_s: float = DEFAULT_DURATION_S,
    body_bytes: int = BODY_BYTES,
    queue: str = "diskloop",
    keep_files: bool = False,
) -> dict[str, object]:
    """Run the durable-send loop and return its rate.

    Args:
        directory: Working directory (created if missing); the run uses a
            fresh ``run-<hex>/`` inside it with ``new/`` and ``queues/<queue>/``,
            removed afterwards unless ``keep_files``.
        threads: Number of threads, each sending one message at a time (>= 1).
        duration_s: Length of the measured window, in seconds.
        body_bytes: Bytes written per message.
        queue: Name of the queue directory the files are renamed into.
        keep_files: Leave the written files in place.

    Returns:
        ``{"threads", "duration_s", "messages", "msgs_per_s", "latency_ms":
        {"p50", "p99", "max"}, "body_bytes", "directory"}``. ``messages``
        counts the messages whose directory fsync completed inside the window.

    Raises:
        OSError: A system call failed (e.g. disk full); all threads stop.
        ValueError: ``threads`` < 1 or ``duration_s`` <= 0.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    run_dir = Path(directory) / f"run-{uuid.uuid4().hex[:12]}"
    new_dir = run_dir / "new"
    queue_dir = run_dir / "queues" / queue
    new_dir.mkdir(parents=True)
    queue_dir.mkdir(parents=True)
    body = os.urandom(body_bytes)
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(index: int) -> None:
        lat = latencies[index]
        n = 0
        dfd = -1
        try:
            dfd = os.open(queue_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            start.wait()
            while not stop.is_set():
                name = f"{index:04d}-{n:010d}.0"
                src = os.path.join(new_dir, name)
                t0 = time.perf_counter()
                fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                try:
                    os.write(fd, body)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(src, os.path.join(queue_dir, name))
                os.fsync(dfd)
                lat.append(time.perf_counter() - t0)
                n += 1
                counts[index] = n
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors.append(exc)
            stop.set()
            start.abort()
        finally:
            if dfd >= 0:
                os.close(dfd)

    pool = [threading.Thread(target=worker, args=(i,), name=f"disk-loop-{i}", daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    messages, elapsed = 0, 0.0
    try:
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        t0 = time.perf_counter()
        stop.wait(duration_s)
        messages = sum(counts)
        elapsed = time.perf_counter() - t0
        stop.set()
        for t in pool:
            t.join()
    finally:
        stop.set()
        if not keep_files:
            shutil.rmtree(run_dir, ignore_errors=True)
    if errors:
        raise errors[0]
    lat_all = sorted(x for per_thread in latencies for x in per_thread)
    return {
        "threads": threads,
        "duration_s": round(elapsed, 3),
        "messages": messages,
        "msgs_per_s": round(messages / elapsed, 1),
        "latency_ms": {
            "p50": round(_percentile(lat_all, 50) * 1000, 3),
            "p99": round(_percentile(lat_all, 99) * 1000, 3),
            "max": round((lat_all[-1] if lat_all else 0.0) * 1000, 3),
        },
        "body_bytes": body_bytes,
        "directory": str(Path(directory).resolve()),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: run :func:`disk_loop` and print its JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="var/bench-diskloop", help="working directory (same disk as the mq root)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="threads (default 64)")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds (default 10)")
    parser.add_argument("--body-bytes", type=int, default=BODY_BYTES, help="bytes per message (default 1024)")
    args = parser.parse_args(argv)
    result = disk_loop(args.dir, threads=args.threads, duration_s=args.duration, body_bytes=args.body_bytes)
    print(f"disk loop: {result['msgs_per_s']} msgs/s with {args.threads} threads", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
