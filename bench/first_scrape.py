"""The first ``GET /metrics`` after mq indexed many queues: how long it holds mq's event loop.

Issue 12, stop 26: the first scrape at 10,004 queues builds every queue's row and sample lines
at once. This starts ``mq`` alone on ``--root`` (filled with ``--queues`` queues of
``--messages`` messages by :mod:`bench.prefill` if it has fewer), indexes every queue with one
receive (visibility 0: the message stays ready), then makes ``--scrapes`` scrapes a second
apart. During each, a second connection asks ``GET /readyz`` every ``--probe-ms`` ms: its
longest answer is the longest time the loop could not answer (plus one request's own time).
Prints one JSON object: per scrape its ms, mq's CPU ms, the body's bytes and the probe's
answers (count, median, p99, max). Run from the repository root with the venv's Python; with
``PYTHONPATH=<another checkout>`` the daemon is that checkout's code::

    flock /work/bench26.lock .venv/bin/python -m bench.first_scrape --root /dev/shm/NAME
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.prefill import fill

#: Queues the bench's metrics step holds besides its 10,000 (send, receive, deep, ...): filled alike here.
EXTRA = ("bench-send", "bench-recv", "bench-cycle", "bench-deep")


def _cpu_ms(pid: int) -> float:
    """User + system CPU ms of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") * 1000


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.read()


def _probe(port: int, every_s: float, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Thread: ``GET /readyz`` every ``every_s`` seconds (own connection) until ``stop``; each answer's (seconds,
    epoch seconds at its start)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        while not stop.is_set():
            started, at = time.perf_counter(), time.time()
            _get(conn, "/readyz")
            out.append((time.perf_counter() - started, at))
            stop.wait(every_s)
    finally:
        conn.close()


def _queues(root: str) -> list[str]:
    path = os.path.join(root, "queues")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="mq root (kept; filled if it has fewer queues)")
    parser.add_argument("--queues", type=int, default=10_000, help="the bench's metrics queues (plus 4 others)")
    parser.add_argument("--messages", type=int, default=10, help="messages per queue when filling")
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--probe-ms", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=18961)
    parser.add_argument("--openmetrics", action="store_true", help="ask for OpenMetrics (Accept header)")
    args = parser.parse_args(argv)
    names = [*EXTRA, *(f"bench-metrics-{i:05d}" for i in range(args.queues))]
    filled = None
    if len(_queues(args.root)) < len(names):
        filled = fill(args.root, [(q, args.messages) for q in names])
    log = open(os.path.join("/tmp", f"first_scrape_{args.port}.log"), "w")  # noqa: SIM115 - the daemon's lifetime
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daemons.front",
            "--root",
            args.root,
            "--address",
            "127.0.0.1",
            "--port",
            str(args.port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if args.openmetrics else {}
    result: dict[str, Any] = {"root": args.root, "filled": filled, "pythonpath": os.environ.get("PYTHONPATH")}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
        for _ in range(300):
            try:
                if _get(conn, "/readyz")[0] == 200:
                    break
            except OSError:
                conn.close()
            time.sleep(0.1)
        queues = _queues(args.root)
        started = time.perf_counter()
        for queue in queues:
            _get(conn, f"/{queue}/messages?visibility_timeout_seconds=0")
        result["queues"], result["index_s"] = len(queues), round(time.perf_counter() - started, 1)
        time.sleep(1.0)
        scrapes = []
        for _ in range(args.scrapes):
            stop, answers = threading.Event(), []  # type: ignore[var-annotated]
            probe = threading.Thread(target=_probe, args=(args.port, args.probe_ms / 1000, stop, answers))
            probe.start()
            time.sleep(0.2)
            before, started, started_at = _cpu_ms(proc.pid), time.perf_counter(), time.time()
            status, body = _get(conn, "/metrics", headers)
            took, cpu = time.perf_counter() - started, _cpu_ms(proc.pid) - before
            time.sleep(0.1)
            stop.set()
            probe.join()
            answers.sort()
            seconds = [answer[0] for answer in answers]
            scrapes.append(
                {
                    "status": status,
                    "ms": round(took * 1000, 1),
                    "mq_cpu_ms": round(cpu),
                    "bytes": len(body),
                    "probe_answers": len(answers),
                    "probe_median_ms": round(statistics.median(seconds) * 1000, 2),
                    "probe_p99_ms": round(seconds[int(len(seconds) * 0.99)] * 1000, 1),
                    "probe_max_ms": round(seconds[-1] * 1000, 1),
                    "probe_top5": [  # (ms, ms from the scrape's start to the answer's start)
                        (round(ms * 1000, 1), round((at - started_at) * 1000)) for ms, at in answers[-5:]
                    ],
                }
            )
            time.sleep(1.0)
        result["scrapes"] = scrapes
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    print(json.dumps(result))
    return 0 if all(scrape["status"] == 200 for scrape in result.get("scrapes", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
