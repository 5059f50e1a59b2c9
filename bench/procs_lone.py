"""One client's sends with ``mq --processes 1`` and ``2`` (issue 12, stop 20): rate, latency, CPU of each process.

A variant is a code tree (``--base`` through ``PYTHONPATH``, or this tree) and a
process count. Per round every variant in turn (order rotated per round) gets a
fresh ``mq`` (no mover or reaper: sends only) on its own root under ``--root``,
one queue, and one keep-alive connection sending 1 KiB bodies one after another
for ``--seconds`` (``http.client``: the next send starts as soon as the previous
``201`` is read, as bench/run.py's one wrk connection does). Printed per run:
sends/s, latency p50/p90/p99 in ms, and the CPU ms per send of the supervisor and
of each worker (``/proc/PID/stat`` utime+stime before and after the window), and
with ``--count-waits`` how many sends of the workers waited in
``daemons._idorder.before_ids`` and for how long (a ``sitecustomize`` put first on
the workers' ``PYTHONPATH`` wraps it and writes its counts to a file per process).

    .venv/bin/python bench/procs_lone.py --base /work/mq-base20 --root /dev/shm/procs-lone \\
        --rounds 3 --seconds 3 --output /tmp/procs-lone.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
QUEUE = "procs-lone"


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the workers of a supervisor)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


SHIM = """
import atexit, json, os, time
from daemons import _idorder

_counts = {"calls": 0, "waits": 0, "waited_ms": 0.0}
_original = _idorder.AckedIds.before_ids


async def before_ids(self):
    newest = getattr(self, "newest_elsewhere", self.newest)()  # the base's code waits for every slot
    must_wait = (newest + 1) * 1_000_000 > time.time_ns()
    started = time.perf_counter()
    await _original(self)
    _counts["calls"] += 1
    if must_wait:
        _counts["waits"] += 1
        _counts["waited_ms"] += (time.perf_counter() - started) * 1000
    if _counts["calls"] % 100 == 0:
        _dump()


def _dump():
    with open(os.path.join(os.environ["PROCS_WAITS_DIR"], f"{os.getpid()}.json"), "w") as fh:
        json.dump(_counts, fh)


_idorder.AckedIds.before_ids = before_ids
atexit.register(_dump)
"""


def start(
    tree: str | None, root: Path, processes: int, log: Path, waits: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """mq from ``tree`` (None: this one) on ``root``; the process and its port.

    With ``waits``: the workers count their waits in ``before_ids`` into ``waits/PID.json``.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = tree or str(REPO_DIR)
    if waits is not None:
        waits.mkdir(parents=True, exist_ok=True)
        (waits / "sitecustomize.py").write_text(SHIM)
        env["PYTHONPATH"] = f"{waits}:{env['PYTHONPATH']}"
        env["PROCS_WAITS_DIR"] = str(waits)
    args = [sys.executable, "-m", "daemons.front", "--root", str(root), "--port", "0", "--processes", str(processes)]
    out = log.open("wb")
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tree or str(REPO_DIR))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"mq listening on http://[^:]+:(\d+)", log.read_text(errors="replace"))
        if found:
            return proc, int(found.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"mq did not start: {log.read_text(errors='replace')[-2000:]}")


def sends(port: int, seconds: float) -> list[float]:
    """Sequential sends on one connection for ``seconds``; each one's latency in ms."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("PUT", f"/{QUEUE}")
    conn.getresponse().read()
    conn.close()  # a connection that sent a PUT is aiohttp's until it closes: the sends get a fresh one (daemons._wire)
    conn = http.client.HTTPConnection("127.0.0.1", port)
    body = b"x" * 1024
    headers = {"Content-Type": "application/octet-stream"}
    for _ in range(50):  # warm-up
        conn.request("POST", f"/{QUEUE}/messages", body, headers)
        conn.getresponse().read()
    out: list[float] = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        conn.request("POST", f"/{QUEUE}/messages", body, headers)
        response = conn.getresponse()
        response.read()
        if response.status != 201:
            raise RuntimeError(f"send answered {response.status}")
        out.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return out


def one(tree: str | None, processes: int, root: Path, seconds: float, count_waits: bool) -> dict[str, Any]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    waits = root / "waits" if count_waits else None
    proc, port = start(tree, root / "mq", processes, root / "mq.log", waits)
    try:
        pids = [proc.pid, *children(proc.pid)]
        before = {pid: cpu_s(pid) for pid in pids}
        t0 = time.perf_counter()
        lat = sends(port, seconds)
        wall = time.perf_counter() - t0
        used = {pid: cpu_s(pid) - before[pid] for pid in pids}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    lat.sort()
    n = len(lat)
    counted = [json.loads(f.read_text()) for f in waits.glob("*.json")] if waits is not None else []
    return {
        "before_ids": {k: round(sum(c[k] for c in counted), 1) for k in ("calls", "waits", "waited_ms")},
        "sends_per_s": round(n / wall, 1),
        "p50_ms": round(lat[n // 2], 3),
        "p90_ms": round(lat[int(n * 0.9)], 3),
        "p99_ms": round(lat[int(n * 0.99)], 3),
        "cpu_ms_per_send": [round(used[pid] * 1000 / n, 3) for pid in pids],
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="code tree of the base (through PYTHONPATH)")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--variants", default="base-p1,base-p2,new-p1,new-p2")
    parser.add_argument("--count-waits", action="store_true", help="count the sends that waited in before_ids")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            code, _, procs = name.partition("-p")
            tree = args.base if code == "base" else None
            figures = one(tree, int(procs), args.root / name, args.seconds, args.count_waits)
            got[name].append(figures)
            print(name, r + 1, json.dumps(figures), flush=True)
    shutil.rmtree(args.root, ignore_errors=True)
    summary = {
        name: {"median_sends_per_s": statistics.median(f["sends_per_s"] for f in runs), "runs": runs}
        for name, runs in got.items()
    }
    for name, figures in summary.items():
        print(name, "median", figures["median_sends_per_s"])
    if args.output:
        args.output.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
