"""mq-reaper's CPU second by second while its expiry sweeps run: a deep queue, or many idle ones.

mq-reaper sweeps every queue directory every ``--expire-interval`` seconds
(retention, purges). Before stop 21 that was a listing of each directory in
one go: 0.5-0.7 s of its CPU in one second at 1,000,000 ready messages, beside
a draining mq that lost a quarter of its CPU that second; and with 10,000
idle queues a listing and two metadata reads per queue, every minute, while
nothing happened (issue 12; docs/performance.md "The drain after a restart;
mq-reaper's sweep"). This script fills a root directly (bench/prefill.py, no
HTTP), starts ``mq-reaper`` alone on it (the ``python`` running this script,
so ``PYTHONPATH`` picks the code, as bench/inline_ab.py does) and samples its
CPU time from ``/proc`` every second. With ``--touch`` one message a second is
sent to the deep queue (its directory changes, as during a drain: the sweep
must list it every time).

Usage::

    .venv/bin/python bench/reaper_sweep.py --root /dev/shm/reaper-sweep [--deep 200000] [--queues 0]
        [--seconds 40] [--expire-interval 10] [--touch]

Prints one JSON object: CPU ms of mq-reaper per second, the largest second,
the mean, and the expiry sweep lines of its log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.prefill import fill  # noqa: E402
from mqcore.names import QueueName  # noqa: E402
from mqcore.protocol import Store  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
DEEP = QueueName("bench-big")


def _cpu_ms(pid: int) -> int:
    """User + system CPU of process ``pid`` (all its threads), ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 // TICK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="directory to fill (removed first); tmpfs for CPU figures")
    parser.add_argument("--deep", type=int, default=200_000, help="ready messages in one queue (0: none)")
    parser.add_argument("--queues", type=int, default=0, help="further queues of --per-queue messages each")
    parser.add_argument("--per-queue", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=40, help="seconds sampled after mq-reaper is ready")
    parser.add_argument("--expire-interval", type=float, default=10.0)
    parser.add_argument("--touch", action="store_true", help="send one message a second to the deep queue")
    parser.add_argument("--keep", action="store_true", help="reuse a filled --root as it is")
    args = parser.parse_args()
    root = Path(args.root)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
        work = [(DEEP, args.deep)] if args.deep else []
        work += [(f"idle-{i:05d}", args.per_queue) for i in range(args.queues)]
        fill(root, work, body_bytes=64)
    env = dict(os.environ, MQ_LOG_LEVEL="DEBUG")
    log_path = root.parent / f"{root.name}.reaper.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daemons.reaper",
                "--root",
                str(root),
                "--expire-interval",
                f"{args.expire_interval}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=os.environ.get("PYTHONPATH", "").split(":")[0] or REPO_DIR,
        )
    try:
        while b"mq-reaper ready" not in log_path.read_bytes():
            if proc.poll() is not None:
                raise SystemExit(log_path.read_text())
            time.sleep(0.05)
        store = Store(root, fsync=False) if args.touch else None
        per_s = []
        last = _cpu_ms(proc.pid)
        for _ in range(args.seconds):
            time.sleep(1.0)
            if store is not None:
                store.send(DEEP, b"touch")
            now = _cpu_ms(proc.pid)
            per_s.append(now - last)
            last = now
    finally:
        proc.terminate()
        proc.wait(10)
    lines = log_path.read_text().splitlines()
    sweeps = [line.split("expiry sweep ", 1)[1] for line in lines if "expiry sweep " in line]
    print(
        json.dumps(
            {
                "deep": args.deep,
                "queues": args.queues,
                "touch": args.touch,
                "expire_interval_s": args.expire_interval,
                "reaper_cpu_ms_per_s": per_s,
                "max_ms_in_a_second": max(per_s),
                "mean_ms_per_s": round(statistics.mean(per_s), 1),
                "sweeps": sweeps,
                "loadavg": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
