"""An idle cluster's cost on a shared filesystem, and another host's delivery delay (issue 12, stop 27).

Three "hosts" (the FUSE mounts ``STATE/hosts/h1..h3`` of ``scripts/gluster.sh up``) each run mq (and,
with ``--stack``, mq-mover and mq-reaper, ``--rescan-interval 1`` as tests/cluster) on one root of the
volume. ``--queues`` empty queues are created through host 1 and every mq indexes each of them (one
short-poll receive). Then, printed as one JSON object:

- ``idle_cpu_pct``: % of a core over ``--idle`` seconds of every GlusterFS process of ``STATE``
  (bricks, FUSE clients, self-heal daemon) and of the daemons;
- ``short_poll``: a message sent through host 1's mq (after its 201) on a queue nobody touched for
  ``--quiet`` seconds, then short-poll receives on host 2 back to back: ms until one answers 200, and
  how many polls that took;
- ``long_poll_ms``: a long poll waiting on host 2 (started 0.5 s before), the send through host 1:
  ms from the 201 to the poll's answer;
- ``count_ms``: a send through host 1 on a quiet queue, then ``GET /{queue}`` on host 2 until it counts it.

The code is whatever ``daemons`` the interpreter imports (``PYTHONPATH=/work/mq-base27`` for the base).

Usage (root; the volume up)::

    .venv/bin/python bench/idle_cluster.py --state /var/tmp/cluster-gluster --name r1 --queues 6
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (python bench/idle_cluster.py), as the other benches allow
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster import stop
from bench.run import mq_tree
from bench.shared_checks import cpu_s, request, take
from mqcore.names import QueueName
from mqcore.protocol import Store


def gluster_pids(state: str) -> list[int]:
    """Pids of the GlusterFS processes whose command line names ``state`` (bricks, FUSE clients, shd, glusterd)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "gluster" in cmd.split(" ", 1)[0] and f"{state}/" in cmd:
            out.append(int(pid))
    return out


#: The checkout whose daemons run (:func:`bench.run.mq_tree`): ``python -m`` puts its working directory first on
#: ``sys.path``, before ``PYTHONPATH``, so the daemons start there.
CODE = str(mq_tree())


def start(module: str, args: list[str], log: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    return subprocess.Popen(
        [sys.executable, "-m", f"daemons.{module}", *args],
        cwd=CODE,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True)
    parser.add_argument("--name", required=True, help="the root's directory on the volume (fresh per run)")
    parser.add_argument("--queues", type=int, required=True)
    parser.add_argument("--port", type=int, default=18570)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quiet", type=float, default=12.0)
    parser.add_argument("--stack", action="store_true", help="mq-mover and mq-reaper too")
    args = parser.parse_args()
    roots = [f"{args.state}/hosts/h{h}/{args.name}" for h in (1, 2, 3)]
    names = [f"ic-{i:04d}" for i in range(args.queues)]
    store = Store(roots[0])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda q: store.create_queue(QueueName(q)), names))
    ports = [args.port + h for h in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    code = subprocess.run(
        [sys.executable, "-c", "import daemons._turns as t; print(t.__file__)"],
        cwd=CODE,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out: dict[str, Any] = {"queues": args.queues, "daemons": code, "stack": args.stack}
    try:
        for h, root in enumerate(roots):
            procs.append(
                start(
                    "front",
                    ["--root", root, "--port", str(ports[h]), "--rescan-interval", "30"],
                    f"/tmp/cluster/mq-{args.name}-{h}.log",
                )
            )
            if args.stack:
                for module in ("mover", "reaper"):
                    procs.append(
                        start(
                            module,
                            ["--root", root, "--rescan-interval", "1"],
                            f"/tmp/cluster/{module}-{args.name}-{h}.log",
                        )
                    )
        for port in ports:
            for _ in range(900):
                try:
                    if request(port, "GET", "/")[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.1)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(lambda pq: take(*pq), [(p, q) for p in ports for q in names]))
        assert set(statuses) <= {200, 204}, set(statuses)
        time.sleep(args.quiet)  # every queue quiet (backed off, in the new code)
        gl = gluster_pids(args.state)
        groups = {"gluster": gl, "daemons": [p.pid for p in procs]}
        before = {k: sum(cpu_s(p) for p in v) for k, v in groups.items()}
        load0 = os.getloadavg()[0]
        time.sleep(args.idle)
        out["idle_cpu_pct"] = {
            k: round(100 * (sum(cpu_s(p) for p in v) - before[k]) / args.idle, 1) for k, v in groups.items()
        }
        out["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        a, b = ports[0], ports[1]
        rng = random.Random(7)
        order = names[:]
        rng.shuffle(order)
        short: list[tuple[int, int]] = []
        for r in range(args.rounds):  # quiet queues: each round its own, none touched since the idle spell
            q = order[r % len(order)]
            assert request(a, "POST", f"/{q}/messages")[0] == 201
            sent, polls = time.monotonic(), 0
            while True:
                polls += 1
                status, _, headers = request(b, "GET", f"/{q}/messages")
                if status == 200:
                    break
                assert time.monotonic() < sent + 120, "short poll: not received in 120 s"
            short.append((round((time.monotonic() - sent) * 1000), polls))
            request(b, "DELETE", f"/{q}/messages/{headers['x-message-id']}")
        out["short_poll"] = {"ms": [s[0] for s in short], "polls": [s[1] for s in short]}
        time.sleep(args.quiet)
        counted: list[int] = []
        for r in range(args.rounds):
            q = order[(args.rounds + r) % len(order)]
            assert request(a, "POST", f"/{q}/messages")[0] == 201
            sent = time.monotonic()
            while json.loads(request(b, "GET", f"/{q}")[1])["ready"] < 1:
                assert time.monotonic() < sent + 120, "count: not counted in 120 s"
                time.sleep(0.005)
            counted.append(round((time.monotonic() - sent) * 1000))
            assert take(b, q) == 200
        out["count_ms"] = counted
        waited: list[int] = []
        for r in range(args.rounds):
            q = order[r % len(order)]
            got: list[float] = []

            def poll(q: str = q, got: list[float] = got) -> None:
                status, _, headers = request(b, "GET", f"/{q}/messages?wait_time_seconds=20")
                got.append(time.monotonic())
                assert status == 200, status
                request(b, "DELETE", f"/{q}/messages/{headers['x-message-id']}")

            th = threading.Thread(target=poll)
            th.start()
            time.sleep(0.5)
            assert request(a, "POST", f"/{q}/messages")[0] == 201
            sent = time.monotonic()
            th.join()
            waited.append(round((got[0] - sent) * 1000))
        out["long_poll_ms"] = waited
        out["medians"] = {
            "short_ms": statistics.median(out["short_poll"]["ms"]),
            "count_ms": statistics.median(counted),
            "long_ms": statistics.median(waited),
        }
    finally:
        print(json.dumps(out), flush=True)  # what was measured, even if a step failed
        stop(procs)


if __name__ == "__main__":
    main()
