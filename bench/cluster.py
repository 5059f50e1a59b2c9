"""Cluster figures (docs/performance.md, "Cluster"): mq on a GlusterFS volume with one, two and three hosts.

Builds its own replica-3 volume on loopback with ``scripts/gluster.sh`` (root, FUSE and the
glusterfs-server/-client packages needed; see docs/cluster.md), then for 1, 2 and 3 hosts starts a
full stack per host (mq on 127.0.0.3, .4, .5 with mq-mover and mq-reaper, each on its own FUSE
mount of one root) and measures, with ``--threads`` HTTP clients per host (1 KiB bodies):

1. durable sends/s, in total and per host, for ``--duration`` seconds;
2. receive+delete cycles/s (GET, then DELETE with the receipt handle), in total and per host;
3. with two hosts or more: the cross-host delivery delay, send through host 1 and a waiting long
   poll on host 2, p50/p99 over ``--samples`` messages;

and the single-thread (and ``--threads``-thread) durable-send disk loop (``bench/disk_loop.py``)
run through one mount. Prints one JSON object on stdout; progress goes to stderr.

Usage (as root, from the repository root)::

    .venv/bin/python -m bench.cluster --duration 5 --threads 4   # or: .venv/bin/python bench/cluster.py ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script (python bench/cluster.py), as the other benches allow
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.disk_loop import disk_loop

REPO = Path(__file__).resolve().parent.parent
GLUSTER_SH = REPO / "scripts" / "gluster.sh"
BODY = b"x" * 1024


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def start_daemon(module: str, args: list[str], ready: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m daemons.<module>``; return it and its readiness line (its URL for mq)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", f"daemons.{module}", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        if ready in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, line
    raise RuntimeError(f"{module} exited before ready")


def start_hosts(mounts: list[Path], name: str) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, urls = [], []
    for i, mount in enumerate(mounts):
        root = str(mount / name)
        os.makedirs(root, exist_ok=True)
        mq, line = start_daemon(
            "front",
            ["--root", root, "--port", "0", "--address", f"127.0.0.{3 + i}", "--rescan-interval", "30"],
            "mq listening on http://",
        )
        match = re.search(r"(http://[^\s/]+)", line)
        assert match, line
        urls.append(match.group(1))
        procs.append(mq)
        procs.append(start_daemon("mover", ["--root", root, "--rescan-interval", "1"], "mq-mover ready")[0])
        procs.append(start_daemon("reaper", ["--root", root, "--rescan-interval", "1"], "mq-reaper ready")[0])
    return procs, urls


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def run_clients(urls: list[str], threads: int, duration: float, work: Any) -> list[int]:
    """Run ``work(client, url)`` in ``threads`` threads per host until ``duration`` passes; per-host counts."""
    counts = [0] * len(urls)
    lock = threading.Lock()
    end = time.monotonic() + duration

    def loop(i: int) -> None:
        with httpx.Client(base_url=urls[i], timeout=30) as client:
            while time.monotonic() < end:
                if not work(client):
                    break
                with lock:
                    counts[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(len(urls)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return counts


def send(client: httpx.Client) -> bool:
    return client.post("/bench/messages", content=BODY).status_code == 201


def receive_delete(client: httpx.Client) -> bool:
    r = client.get("/bench/messages")
    if r.status_code != 200:
        return False  # 204: the queue is empty
    d = client.delete(
        f"/bench/messages/{r.headers['X-Message-Id']}", params={"receipt_handle": r.headers["X-Receipt-Handle"]}
    )
    return d.status_code == 200


def cross_host_delay(urls: list[str], samples: int) -> dict[str, float]:
    delays = []
    with httpx.Client(timeout=30) as http:
        http.put(f"{urls[0]}/delay")
        for _ in range(samples):
            http.get(f"{urls[1]}/delay/messages")  # indexed on host 2
            result: dict[str, Any] = {}

            def poll(result: dict[str, Any] = result) -> None:
                result["r"] = http.get(f"{urls[1]}/delay/messages?wait_time_seconds=20")
                result["t"] = time.monotonic()

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.1)  # the long poll is waiting
            sent = time.monotonic()
            http.post(f"{urls[0]}/delay/messages", content=b"d")
            poller.join()
            r = result["r"]
            if r.status_code == 200:
                delays.append((result["t"] - sent) * 1000)
                http.delete(
                    f"{urls[1]}/delay/messages/{r.headers['X-Message-Id']}",
                    params={"receipt_handle": r.headers["X-Receipt-Handle"]},
                )
    delays.sort()
    return {
        "samples": len(delays),
        "p50_ms": round(statistics.median(delays), 1),
        "p99_ms": round(delays[min(len(delays) - 1, int(len(delays) * 0.99))], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--threads", type=int, default=4, help="HTTP clients per host (default 4)")
    parser.add_argument("--samples", type=int, default=30, help="cross-host delay samples (default 30)")
    args = parser.parse_args(argv)
    state = tempfile.mkdtemp(prefix="mq-gluster-bench-", dir="/tmp")
    env = {**os.environ, "MQ_GLUSTER_STATE": state, "MQ_GLUSTER_HOSTS": "3"}
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "threads_per_host": args.threads,
        "duration_s": args.duration,
        "hosts": {},
    }
    try:
        log("building the volume")
        out = subprocess.run(["bash", str(GLUSTER_SH), "up"], env=env, capture_output=True, text=True, check=True)
        mounts = [Path(line) for line in out.stdout.split()]
        for n in (1, 2, 3):
            procs, urls = start_hosts(mounts[:n], f"bench-{n}")
            try:
                httpx.put(f"{urls[0]}/bench")
                log(f"{n} host(s): sends")
                sends = run_clients(urls, args.threads, args.duration, send)
                log(f"{n} host(s): receive+delete")
                cycles = run_clients(urls, args.threads, args.duration, receive_delete)
                entry: dict[str, Any] = {
                    "sends_per_s": round(sum(sends) / args.duration, 1),
                    "sends_per_s_per_host": [round(c / args.duration, 1) for c in sends],
                    "receive_delete_per_s": round(sum(cycles) / args.duration, 1),
                    "receive_delete_per_s_per_host": [round(c / args.duration, 1) for c in cycles],
                }
                if n >= 2:
                    log(f"{n} hosts: cross-host delay")
                    entry["cross_host_delay"] = cross_host_delay(urls, args.samples)
                result["hosts"][str(n)] = entry
            finally:
                stop(procs)
        log("disk loop through the mount")
        for threads in (1, args.threads):
            loop = disk_loop(mounts[0] / "diskloop", threads=threads, duration_s=args.duration)
            result[f"disk_loop_{threads}_threads_msgs_per_s"] = loop["msgs_per_s"]
        result["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        subprocess.run(["bash", str(GLUSTER_SH), "down"], env=env, capture_output=True, check=False)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
