"""mq on a shared filesystem with many indexed queues: idle CPU, another host's delivery delay, scrape cost.

Issue 12/15 (stop 20): on a shared filesystem (``MountInfo.shared``: GlusterFS, NFS) mq checks its
indexed queues' directories for other hosts' changes (``QueueStates.rescan_changed``). This bench
measures, for one mq on ``--root`` (a root inside one FUSE mount of a volume) and a brokerless
"other host" writing through ``--other-root`` (the same root through another mount of the volume):

- idle CPU over ``--idle`` seconds with ``--queues`` indexed queues: mq's, and the FUSE client's
  of mq's mount and the volume's brick daemons' (``--fuse-pid``, ``--brick-pid``, as ``/proc`` CPU ticks);
- the delay from another host's send to a long poll's answer on a queue chosen at random;
- the delay from another host's send until ``GET /{queue}`` counts it on a queue nobody waits on;
- ``GET /metrics``: latency and mq's CPU per scrape.

The code under test is the tree :func:`bench.run.mq_tree` picks (the first ``PYTHONPATH`` entry holding
``daemons/front.py``, else this checkout; mq runs there, since ``python -m`` puts its working directory
before ``PYTHONPATH``): run it once with ``PYTHONPATH`` pointing at the base's checkout and once without,
alternating (docs/performance.md).

Usage::

    .venv/bin/python bench/shared_checks.py --root /mnt/h1/mqroot --other-root /mnt/h2/mqroot \\
        --queues 1000 --port 18470 --fuse-pid 1234 --brick-pid 5678
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.run import mq_tree
from mqcore.names import QueueName
from mqcore.protocol import Store

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 if it is gone: a summed group may lose a process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def request(port: int, method: str, path: str, timeout: float = 60) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def take(port: int, queue: str) -> int:
    """One short-poll receive on ``queue`` (mq indexes it) and the delete of what it got (a message left over)."""
    status, _, headers = request(port, "GET", f"/{queue}/messages")
    if status == 200:
        request(port, "DELETE", f"/{queue}/messages/{headers['x-message-id']}")
    return status


def names(n: int) -> list[str]:
    return [f"sc-{i:05d}" for i in range(n)]


def make_queues(root: str, n: int) -> None:
    store = Store(root, fsync=False)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda q: store.create_queue(QueueName(q)), names(n)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--other-root", required=True)
    parser.add_argument("--queues", type=int, required=True)
    parser.add_argument("--port", type=int, default=18470)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--fuse-pid", type=int, action="append", default=[])
    parser.add_argument("--brick-pid", type=int, action="append", default=[])
    parser.add_argument("--create-only", action="store_true")
    parser.add_argument("--mq-arg", action="append", default=[], help="one more argument of mq (repeat)")
    args = parser.parse_args()
    os.makedirs(args.root, exist_ok=True)
    t0 = time.monotonic()
    make_queues(args.root, args.queues)
    print(f"queues ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    if args.create_only:
        return
    log = open(f"/tmp/scrape3-shared-mq-{args.port}.log", "wb")  # noqa: SIM115
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    mq = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daemons.front",
            "--root",
            args.root,
            "--port",
            str(args.port),
            "--workers",
            "2",
            *args.mq_arg,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=mq_tree(env.get("PYTHONPATH", "")),  # ``-m`` puts the cwd before PYTHONPATH: run the tree asked for
    )
    out: dict[str, Any] = {"queues": args.queues, "pythonpath": env.get("PYTHONPATH", ""), "mq_args": args.mq_arg}
    try:
        for _ in range(300):
            try:
                if request(args.port, "GET", "/")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda q: take(args.port, q), names(args.queues)))
        assert set(statuses) <= {200, 204}, set(statuses)
        out["index_s"] = round(time.monotonic() - t0, 1)
        time.sleep(2)
        pids = {"mq": [mq.pid], "fuse": args.fuse_pid, "bricks": args.brick_pid}
        before = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
        time.sleep(args.idle)
        out["idle_cpu_pct"] = {
            k: round(100 * (sum(cpu_s(p) for p in v) - before[k]) / args.idle, 1) for k, v in pids.items()
        }
        other = Store(args.other_root)
        rng = random.Random(1)
        waited: list[float] = []
        for _ in range(args.rounds):
            q = rng.choice(names(args.queues))
            got: list[float] = []

            def poll(q: str = q, got: list[float] = got) -> None:
                status, _, headers = request(args.port, "GET", f"/{q}/messages?wait_time_seconds=20")
                got.append(time.monotonic())
                if status == 200:
                    request(args.port, "DELETE", f"/{q}/messages/{headers['x-message-id']}")

            th = threading.Thread(target=poll)
            th.start()
            time.sleep(0.5)
            sent = time.monotonic()
            other.send(QueueName(q), b"x")
            th.join()
            waited.append(got[0] - sent)
        out["long_poll_delay_ms"] = sorted(round(w * 1000) for w in waited)
        counted: list[float] = []
        for _ in range(args.rounds):
            q = rng.choice(names(args.queues))
            sent = time.monotonic()
            other.send(QueueName(q), b"y")
            while json.loads(request(args.port, "GET", f"/{q}")[1])["ready"] < 1 and time.monotonic() < sent + 120:
                time.sleep(0.01)
            counted.append(time.monotonic() - sent)
            headers = request(args.port, "GET", f"/{q}/messages")[2]
            request(args.port, "DELETE", f"/{q}/messages/{headers['x-message-id']}")
        out["unwaited_count_delay_ms"] = sorted(round(c * 1000) for c in counted)
        scrapes = []
        c0 = cpu_s(mq.pid)
        for _ in range(5):
            s0 = time.monotonic()
            assert request(args.port, "GET", "/metrics")[0] == 200
            scrapes.append(time.monotonic() - s0)
        out["scrape_ms_median"] = round(statistics.median(scrapes) * 1000, 1)
        out["scrape_mq_cpu_ms_incl_idle"] = round((cpu_s(mq.pid) - c0) * 1000 / 5, 1)
        out["scrape_wall_s"] = round(sum(scrapes), 2)
    finally:
        print(json.dumps(out), flush=True)  # what was measured, even if a step failed
        mq.terminate()
        try:
            mq.wait(30)
        except subprocess.TimeoutExpired:  # a FUSE request that never came back (GlusterFS under load)
            mq.kill()


if __name__ == "__main__":
    main()
