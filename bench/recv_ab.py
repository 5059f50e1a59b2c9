"""A/B of receive+delete (issue 12, stop 18): main's code against this tree's, at given client counts.

Per round, each variant in turn (order A B / B A alternating) gets the three daemons on ONE
root shared by all variants and rounds, the queue topped up to ``--depth`` ready messages
(wrk, bench/run.py's prefill), then wrk's recv_delete.lua at each ``--clients`` for
``--seconds``. Recorded per measurement: cycles/s, p99 of the requests, mq's CPU (user +
system, /proc) per cycle, mq's voluntary and involuntary context switches per cycle
(/proc/PID/status, all threads), and the three daemons' CPU per cycle. With ``--disk``
each measurement is framed by bench/disk_loop.py's receive+delete loop at the same number of
threads (before and after; the ratio is against their mean), as bar 3 is.

Variants (``--variants``): ``main`` is ``--base`` (through ``PYTHONPATH``),
``auto`` and ``never`` this tree with ``--inline-io auto`` / ``never``, ``NAME=PATH`` the code tree at PATH.

    .venv/bin/python bench/recv_ab.py --base /work/mq-base --root /dev/shm/recv-ab \\
        --clients 1,16 --rounds 4 --seconds 4 --output /tmp/recv-ab.json
    .venv/bin/python bench/recv_ab.py --base /work/mq-base --root /var/tmp/recv-ab --disk \\
        --clients 1,16 --rounds 4 --seconds 4 --output /tmp/recv-ab-disk.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.disk_loop import receive_delete_loop  # noqa: E402
from bench.inline_ab import add_common_args, bench_config, start_tree  # noqa: E402
from bench.run import Api, Bench, CpuMeter, Wrk, ensure_wrk, log  # noqa: E402

QUEUE = "recv-ab"


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of ``pid`` so far."""
    vol = invol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
    return vol, invol


def _measure(
    args: argparse.Namespace, name: str, variant: tuple[str | None, list[str]], wrk_exe: str
) -> dict[str, Any]:
    """Start the daemons of ``variant`` on the shared root, run recv_delete.lua at each client count, stop them."""
    log_dir = Path(args.logs) / f"{name}-{time.monotonic_ns()}"
    daemons, url = start_tree(Path(args.root) / "mq", log_dir, variant)
    api = Api(url)
    out: dict[str, Any] = {"uptime": os.getloadavg()}
    try:
        api.create_queue(QUEUE)
        cfg = bench_config(args.seconds, [1], args.clients)
        wrk = Wrk(wrk_exe, url, log_dir / "wrk")
        bench = Bench(cfg, api, wrk, {"send": QUEUE}, daemons)
        mq_pid = daemons.pids()["mq"]
        for clients in args.clients:
            bench.prefill(QUEUE, args.depth, what=f"{name} at {clients}")
            loops = [_loop(args, clients)] if args.disk else []
            meter = CpuMeter(daemons.pids())
            sw0 = switches(mq_pid)
            run = wrk.run("recv_delete.lua", clients=clients, threads=None, queue=QUEUE, duration_s=args.seconds)
            sw1 = switches(mq_pid)
            cpu = meter.stop()
            if args.disk:
                loops.append(_loop(args, clients))
            cycles = max(1, run.counts.get("cycles", 0))
            wall = cpu["wall_s"]
            row: dict[str, Any] = {
                "rate": round(run.rate("cycles"), 1),
                "p99_ms": run.latency_ms()["p99"],
                "empty": run.counts.get("empty", 0),
                "mq_cpu_ms": round(cpu["mq_cpu_pct"] * wall * 10 / cycles, 4),
                "daemons_cpu_ms": round(
                    sum(v for k, v in cpu.items() if k in ("mq_cpu_pct", "mover_cpu_pct", "reaper_cpu_pct"))
                    * wall
                    * 10
                    / cycles,
                    4,
                ),
                "vol_switches": round((sw1[0] - sw0[0]) / cycles, 2),
                "invol_switches": round((sw1[1] - sw0[1]) / cycles, 2),
                "other_cpu_pct": cpu["other_cpu_pct"],
            }
            if loops:
                loop_rate = statistics.mean(float(lp["msgs_per_s"]) for lp in loops)
                row["disk_loop"] = [lp["msgs_per_s"] for lp in loops]
                row["ratio"] = round(row["rate"] / loop_rate, 3)
            log(f"  {name} {clients} clients: {row}")
            out[f"clients_{clients}"] = row
        return out
    finally:
        api.close()
        daemons.stop()


def _loop(args: argparse.Namespace, clients: int) -> dict[str, Any]:
    """bench/disk_loop.py's receive+delete loop at ``clients`` threads on the root's filesystem."""
    return receive_delete_loop(
        Path(args.root) / "diskloop",
        threads=clients,
        duration_s=args.seconds,
        prefill=max(2000, int(args.seconds * 6000)),
    )


def _variants(spec: str, base: str) -> dict[str, tuple[str | None, list[str]]]:
    """name -> (PYTHONPATH of its code tree or None for this one, extra mq arguments).

    ``main`` is ``base``; ``auto`` / ``never`` this tree with ``--inline-io auto`` / ``never``;
    ``NAME=PATH`` the code tree at PATH (e.g. a copy of this tree's daemons/ and mqcore/ taken
    before an edit, so that an edit made while the bench runs does not leak into it).
    """
    out: dict[str, tuple[str | None, list[str]]] = {}
    for item in (x for x in spec.split(",") if x):
        name, _, path = item.partition("=")
        if path:
            out[name] = (path, [])
        elif name == "main":
            out[name] = (base, [])
        else:
            out[name] = (None, ["--inline-io", name])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and write the JSON; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, "/tmp/recv-ab-logs", 4)
    parser.add_argument("--depth", type=int, default=30000, help="ready messages before each measurement")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--variants", default="main,auto", help="comma-separated: main, auto, never, NAME=PATH")
    parser.add_argument("--disk", action="store_true", help="frame each measurement by the disk loop")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    wrk_exe = ensure_wrk(False)
    every = _variants(args.variants, args.base)
    names = list(every)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: _measure(args, name, every[name], wrk_exe) for name in order})
        Path(args.output).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    summary: dict[str, dict[str, Any]] = {}
    for name in names:
        for clients in args.clients:
            rows = [rnd[name][f"clients_{clients}"] for rnd in rounds]
            summary.setdefault(name, {})[f"clients_{clients}"] = {
                key: {
                    "median": round(statistics.median(row[key] for row in rows), 4),
                    "rounds": [row[key] for row in rows],
                }
                for key in rows[0]
                if isinstance(rows[0][key], (int, float))
            }
    Path(args.output).write_text(json.dumps({"args": vars(args), "rounds": rounds, "summary": summary}, indent=1))
    for name, per in summary.items():
        for label, keys in per.items():
            print(name, label, {k: v["median"] for k, v in keys.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
