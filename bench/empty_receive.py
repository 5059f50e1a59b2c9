"""CPU of mq per empty short poll (issue 12, stop 18): ``--requests`` sequential ``GET /Q/messages`` on an
empty queue from one keep-alive client, per variant (main = ``--base`` through PYTHONPATH, or this tree),
alternated for ``--rounds``; prints requests/s, mq's CPU per request and its voluntary context switches
per request (every thread, /proc).

    nice -n -10 .venv/bin/python bench/empty_receive.py --base /work/mq-base --root /dev/shm/recv-empty
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.inline_ab import start_tree  # noqa: E402
from bench.recv_ab import switches  # noqa: E402
from bench.run import Api, CpuMeter  # noqa: E402


def _one(args: argparse.Namespace, name: str, tree: str | None) -> str:
    stamp = time.monotonic_ns()
    daemons, url = start_tree(Path(args.root) / f"mq-{name}-{stamp}", Path(args.logs) / f"{name}-{stamp}", (tree, []))
    api = Api(url)
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port)
    try:
        api.create_queue("empty")

        def poll(n: int) -> None:
            for _ in range(n):
                conn.request("GET", "/empty/messages")
                resp = conn.getresponse()
                resp.read()
                if resp.status != 204:
                    raise RuntimeError(f"expected 204, got {resp.status}")

        poll(200)  # warm up (and past the lone streak)
        pid = daemons.pids()["mq"]
        meter, sw0, t0 = CpuMeter(daemons.pids()), switches(pid), time.perf_counter()
        poll(args.requests)
        wall, sw1, cpu = time.perf_counter() - t0, switches(pid), meter.stop()
        cpu_us = cpu["mq_cpu_pct"] * cpu["wall_s"] * 10 / args.requests * 1000
        return (
            f"{name}: {args.requests / wall:.0f} empty receives/s, mq CPU {cpu_us:.1f} us each, "
            f"voluntary switches {(sw1[0] - sw0[0]) / args.requests:.2f} each, load {os.getloadavg()[0]:.1f}"
        )
    finally:
        conn.close()
        api.close()
        daemons.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print one line per measurement."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="code tree of main (PYTHONPATH of the 'main' variant)")
    parser.add_argument("--root", required=True, help="directory for the variants' roots (created)")
    parser.add_argument("--logs", default="/tmp/empty-receive-logs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args(argv)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    variants: list[tuple[str, str | None]] = [("main", args.base), ("branch", None)]
    for r in range(args.rounds):
        for name, tree in variants if r % 2 == 0 else variants[::-1]:
            print(_one(args, name, tree), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
