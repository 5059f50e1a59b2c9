"""syncfs rounds per send with ``mq --processes 1`` and ``2`` at 64 clients (issue 12, stop 20).

Each process of ``mq --processes N`` runs its own group commit, so with ``syncfs``
(``--file-sync auto`` on a local filesystem) N processes issue their own ``syncfs``
calls, each flushing the whole filesystem. Per run (the process counts of
``--order`` in turn) a fresh ``mq`` of this tree on ``ROOT/procs-sfI``, one queue,
``wrk`` with ``--clients`` connections sending 1 KiB bodies (bench/lua/post.lua)
for ``--seconds``, and ``GET /metrics`` before and after (totals over the
processes): sends/s and sends per ``syncfs`` call, plus the file and directory
fsyncs of the window.

    .venv/bin/python bench/procs_syncfs.py --root /var/tmp --order 2,1,1,2,1,2
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.procs_lone import start  # noqa: E402

KINDS = ("file", "directory", "syncfs")


def fsyncs(port: int) -> dict[str, float]:
    """The ``mq_storage_fsync_duration_seconds`` counts by kind, from ``GET /metrics``."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for kind in KINDS:
        found = re.search(rf'mq_storage_fsync_duration_seconds_count\{{kind="{kind}"\}} ([0-9.e+]+)', text)
        out[kind] = float(found.group(1)) if found else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, type=Path, help="directory on the disk to measure")
    parser.add_argument("--order", default="1,2,2,1", help="process counts, one run each")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args(argv)
    for i, processes in enumerate(int(p) for p in args.order.split(",")):
        root = args.root / f"procs-sf{i}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        proc, port = start(None, root / "mq", processes, root / "mq.log")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.request("PUT", "/sf")
            conn.getresponse().read()
            conn.close()
            before = fsyncs(port)
            env = dict(os.environ, MQB_QUEUE="sf", MQB_THREADS="4")
            script = str(REPO_DIR / "bench/lua/post.lua")
            wrk = ["wrk", "-t4", f"-c{args.clients}", f"-d{args.seconds}s", "-s", script, f"http://127.0.0.1:{port}"]
            out = subprocess.run(wrk, env=env, capture_output=True, text=True, check=True)
            time.sleep(0.3)  # the last rounds' counts
            after = fsyncs(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            subprocess.run(["ionice", "-c3", "rm", "-rf", str(root)], check=False)
        found = re.search(r'"sent":\s*(\d+)', out.stdout)
        sent = int(found.group(1)) if found else 0
        done = {kind: after[kind] - before[kind] for kind in KINDS}
        figures = {
            "processes": processes,
            "sends_per_s": round(sent / args.seconds),
            "sends_per_syncfs": round(sent / max(done["syncfs"], 1), 2),
            **{f"{kind}_fsyncs": int(done[kind]) for kind in KINDS},
            "load": round(os.getloadavg()[0], 1),
        }
        print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
