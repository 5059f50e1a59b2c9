"""The disk's own rate for the durable-send and receive+delete steps, without mq.

N threads (default 64) each loop, one message at a time, over exactly the
system calls a durable send needs (issue 2, "Benchmark"):

    fd = open(DIR/new/NAME, O_WRONLY|O_CREAT|O_EXCL)   write 1 KiB   fsync(fd)   close(fd)
    rename(DIR/new/NAME, DIR/queues/<queue>/NAME)       fsync(DIR/queues/<queue>)

Every message pays its own directory fsync (no group commit): this is the
rate that mq's group commit has to beat. Run it on the filesystem of the mq
root; tmpfs (``/dev/shm``) would hide the fsync cost.

The receive+delete loop (:func:`receive_delete_loop`, issue 12 bar 3) does
what mq, mq-mover and mq-reaper together do per received and deleted
message, on a directory prefilled with ready files (the threads take them
from one list, oldest first, so no two threads race for a file)::

    fd = open(DIR/queues/<queue>/NAME, O_RDONLY)   rename(... , DIR/delay/NAME)   read(fd) to the end   close(fd)
    rename(DIR/delay/NAME, DIR/remove/NAME)        fsync(DIR/remove)              unlink(DIR/remove/NAME)

Usage::

    .venv/bin/python bench/disk_loop.py --threads 64 --duration 10 [--dir ./var/bench-diskloop]
    .venv/bin/python bench/disk_loop.py --receive --threads 16 --duration 10

It prints one JSON object on stdout (``msgs_per_s``, ``mb_per_s``,
per-message latency and ``cpu_ms_per_msg``: the kernel's work for those
system calls); :func:`disk_loop` and :func:`receive_delete_loop` are the
same measurements as functions.
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
from collections.abc import Callable
from pathlib import Path

#: Body size of one message, in bytes (the issue's 1 KiB).
BODY_BYTES = 1024
#: Default run length, in seconds.
DEFAULT_DURATION_S = 10.0
#: Default number of threads (the issue's bar compares mq at 64 clients to this loop at 64 threads).
DEFAULT_THREADS = 64
#: Ready files the receive+delete loop prefills.
DEFAULT_RECEIVE_PREFILL = 30_000


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

    def one_send(index: int, n: int, dfd: int) -> bool:
        name = f"{index:04d}-{n:010d}.0"
        src = os.path.join(new_dir, name)
        fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(src, os.path.join(queue_dir, name))
        os.fsync(dfd)
        return True

    try:
        messages, elapsed, latencies, _, cpu_s = _run_threads(
            threads, duration_s, str(queue_dir), one_send, "disk-loop"
        )
    finally:
        if not keep_files:
            shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "threads": threads,
        "duration_s": round(elapsed, 3),
        "messages": messages,
        "msgs_per_s": round(messages / elapsed, 1),
        "mb_per_s": round(messages * body_bytes / elapsed / 1e6, 2),
        "latency_ms": _latency_ms(latencies),
        "cpu_ms_per_msg": round(cpu_s * 1000 / messages, 3) if messages else None,
        "body_bytes": body_bytes,
        "directory": str(Path(directory).resolve()),
    }


def _run_threads(
    threads: int, duration_s: float, sync_dir: str, one: Callable[[int, int, int], bool], name: str
) -> tuple[int, float, list[list[float]], bool, float]:
    """Run ``one(thread_index, n, dir_fd)`` in a loop on ``threads`` threads for ``duration_s`` seconds.

    Each thread opens ``sync_dir`` once (the directory it fsyncs) and, after a
    common start, calls ``one`` for its messages n = 0, 1, ... and times each
    call. ``one`` returns False when the thread has nothing left: every thread
    then stops and the window ends there. Returns ``(messages, elapsed_s,
    per-thread latencies in s, exhausted, cpu_s)``; ``cpu_s`` is the CPU time
    (user + system, ``time.thread_time``) the threads spent in their loops:
    the kernel's work for the system calls, to set beside mq's CPU per message.

    Raises:
        OSError: The first error of any thread (all threads stop).
    """
    counts = [0] * threads
    cpu = [0.0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    stop = threading.Event()
    exhausted = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(index: int) -> None:
        lat = latencies[index]
        n = 0
        dfd = -1
        try:
            dfd = os.open(sync_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            start.wait()
            cpu0 = time.thread_time()
            while not stop.is_set():
                t0 = time.perf_counter()
                if not one(index, n, dfd):
                    exhausted.set()
                    stop.set()
                    break
                lat.append(time.perf_counter() - t0)
                n += 1
                counts[index] = n
                cpu[index] = time.thread_time() - cpu0
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors.append(exc)
            stop.set()
            start.abort()
        finally:
            if dfd >= 0:
                os.close(dfd)

    pool = [threading.Thread(target=worker, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(threads)]
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
    finally:
        stop.set()
        for t in pool:
            t.join()
    if errors:
        raise errors[0]
    return messages, elapsed, latencies, exhausted.is_set(), sum(cpu)


def _latency_ms(latencies: list[list[float]]) -> dict[str, float]:
    """p50/p99/max in ms of per-thread latency lists (seconds)."""
    lat_all = sorted(x for per_thread in latencies for x in per_thread)
    return {
        "p50": round(_percentile(lat_all, 50) * 1000, 3),
        "p99": round(_percentile(lat_all, 99) * 1000, 3),
        "max": round((lat_all[-1] if lat_all else 0.0) * 1000, 3),
    }


def _prefill_ready(queue_dir: Path, count: int, body: bytes) -> list[str]:
    """Write ``count`` ready files (no fsync), then ``sync()`` once; return their names, oldest first."""
    names = [f"{n:010d}.0" for n in range(count)]
    for name in names:
        fd = os.open(queue_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
    # Write back now, so the loop measures its own system calls, not the prefill's writeback.
    os.sync()
    return names


class ReceiveDeleteDir:
    """A directory prefilled once for several windows of the receive+delete loop (issue 12 bar 3).

    bench/run.py alternates the loop's windows with mq's (:mod:`bench.windows`): the prefill is
    written once, before the first window, and each :meth:`window` takes the next files from it.
    Each thread takes the next ready file (oldest first) from one list shared by all, and per
    file: ``open`` it read-only, ``rename`` it into ``delay/``, ``read`` it to the end through
    the descriptor, ``close``, ``rename`` it into ``remove/``, ``fsync`` ``remove/`` (one
    directory fsync per message, no group commit) and ``unlink`` it: the system calls of mq's
    receive (docs/protocol.md 6.3) and delete (6.5) plus mq-reaper's unlink (6.7).

    Args:
        directory: Working directory (created if missing); the loop uses a fresh ``run-<hex>/`` in it.
        prefill: Ready files written first (no fsync each, one ``sync()`` after).
        body_bytes: Bytes per file.
        queue: Name of the queue directory.

    Raises:
        OSError: The prefill failed (e.g. disk full).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefill: int = DEFAULT_RECEIVE_PREFILL,
        body_bytes: int = BODY_BYTES,
        queue: str = "diskloop",
    ) -> None:
        self.directory, self.prefill, self.body_bytes = directory, prefill, body_bytes
        self.run_dir = Path(directory) / f"run-{uuid.uuid4().hex[:12]}"
        queue_dir = self.run_dir / "queues" / queue
        delay_dir, remove_dir = self.run_dir / "delay", self.run_dir / "remove"
        for d in (queue_dir, delay_dir, remove_dir):
            d.mkdir(parents=True)
        self.qdir, self.ddir, self.rdir = str(queue_dir), str(delay_dir), str(remove_dir)
        t_fill = time.perf_counter()
        try:
            # One list for all threads: list iterators hand out each item once, even across threads
            # (under the GIL), so no two threads take the same file and none runs dry before the rest.
            self._names = iter(_prefill_ready(queue_dir, prefill, os.urandom(body_bytes)))
        except BaseException:
            self.remove()
            raise
        #: Seconds the prefill took (writes and the ``sync()``).
        self.prefill_s = time.perf_counter() - t_fill
        #: Files taken by the windows so far.
        self.taken = 0

    def _one(self, index: int, n: int, dfd: int) -> bool:
        name = next(self._names, None)
        if name is None:
            return False
        ready = os.path.join(self.qdir, name)
        in_flight, removed = os.path.join(self.ddir, name), os.path.join(self.rdir, name)
        fd = os.open(ready, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.rename(ready, in_flight)
            while os.read(fd, 65536):
                pass
        finally:
            os.close(fd)
        os.rename(in_flight, removed)
        os.fsync(dfd)
        os.unlink(removed)
        return True

    def window(self, threads: int, duration_s: float) -> dict[str, object]:
        """Run the loop on ``threads`` threads for ``duration_s`` seconds (less if the prefill runs out).

        Returns:
            ``{"threads", "duration_s", "messages", "msgs_per_s", "mb_per_s", "latency_ms":
            {"p50", "p99", "max"}, "cpu_ms_per_msg", "prefill", "prefill_s", "left_before",
            "exhausted", "body_bytes", "directory"}``; ``left_before``: ready files when the window began.

        Raises:
            OSError: A system call failed; all threads stop.
            ValueError: ``threads`` < 1 or ``duration_s`` <= 0.
        """
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        left = self.prefill - self.taken
        messages, elapsed, latencies, exhausted, cpu_s = _run_threads(
            threads, duration_s, self.rdir, self._one, "rd-loop"
        )
        self.taken += sum(len(per_thread) for per_thread in latencies)
        return {
            "threads": threads,
            "duration_s": round(elapsed, 3),
            "messages": messages,
            "msgs_per_s": round(messages / elapsed, 1) if elapsed else 0.0,
            "mb_per_s": round(messages * self.body_bytes / elapsed / 1e6, 2) if elapsed else 0.0,
            "latency_ms": _latency_ms(latencies),
            "cpu_ms_per_msg": round(cpu_s * 1000 / messages, 3) if messages else None,
            "prefill": self.prefill,
            "prefill_s": round(self.prefill_s, 2),
            "left_before": left,
            "exhausted": exhausted,
            "body_bytes": self.body_bytes,
            "directory": str(Path(self.directory).resolve()),
        }

    def remove(self) -> None:
        """Delete the directory and what is left in it."""
        shutil.rmtree(self.run_dir, ignore_errors=True)


def receive_delete_loop(
    directory: str | os.PathLike[str],
    *,
    threads: int = 1,
    duration_s: float = DEFAULT_DURATION_S,
    prefill: int = DEFAULT_RECEIVE_PREFILL,
    body_bytes: int = BODY_BYTES,
    queue: str = "diskloop",
) -> dict[str, object]:
    """Run the receive+delete loop (issue 12, bar 3) once on a prefilled directory and return its rate.

    One window of :class:`ReceiveDeleteDir` (which says what the loop does per file), on a
    directory prefilled for it and removed afterwards.

    Args:
        directory: Working directory (created if missing); the run uses a
            fresh ``run-<hex>/`` inside it, removed afterwards.
        threads: Number of threads (>= 1).
        duration_s: Length of the measured window, in seconds. The window
            ends early when the prefill is used up (``exhausted`` is then True).
        prefill: Ready files written before the window (no fsync each, one
            ``sync()`` after).
        body_bytes: Bytes per file.
        queue: Name of the queue directory.

    Returns:
        :meth:`ReceiveDeleteDir.window`'s row.

    Raises:
        OSError: A system call failed; all threads stop.
        ValueError: ``threads`` < 1, ``duration_s`` <= 0 or ``prefill`` < ``threads``.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    if prefill < threads:
        raise ValueError(f"prefill must be >= threads ({threads}), got {prefill}")
    loop = ReceiveDeleteDir(directory, prefill=prefill, body_bytes=body_bytes, queue=queue)
    try:
        return loop.window(threads, duration_s)
    finally:
        loop.remove()


def main(argv: list[str] | None = None) -> int:
    """Command line: run :func:`disk_loop` and print its JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="var/bench-diskloop", help="working directory (same disk as the mq root)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="threads (default 64)")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds (default 10)")
    parser.add_argument("--body-bytes", type=int, default=BODY_BYTES, help="bytes per message (default 1024)")
    parser.add_argument(
        "--receive",
        action="store_true",
        help="run the receive+delete loop (open, rename into delay/, read, rename into remove/, fsync remove/, "
        "unlink) on a prefilled directory instead of the send loop",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=DEFAULT_RECEIVE_PREFILL,
        help=f"with --receive: ready files written first (default {DEFAULT_RECEIVE_PREFILL})",
    )
    args = parser.parse_args(argv)
    result: dict[str, object]
    if args.receive:
        result = receive_delete_loop(
            args.dir, threads=args.threads, duration_s=args.duration, prefill=args.prefill, body_bytes=args.body_bytes
        )
    else:
        result = disk_loop(args.dir, threads=args.threads, duration_s=args.duration, body_bytes=args.body_bytes)
    what = "receive+delete loop" if args.receive else "disk loop"
    print(f"{what}: {result['msgs_per_s']} msgs/s with {args.threads} threads", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
