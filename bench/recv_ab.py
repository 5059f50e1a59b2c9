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
``auto`` and ``never`` this tree with ``--inline-io auto`` / ``never``, ``NAME=PATH`` the code tree at PATH,
``floor-inline`` / ``floor-group`` / ``floor-pool`` bench/python_floor.py's server of that variant (one
process; its ready files written fresh before each measurement, no fsync each, one ``sync()``): the Python
floor of bar 3 measured in the same run (stop 22). Per measurement also: the CPU per cycle of mq's loop
thread and of its other threads, mq-mover's and mq-reaper's. ``--strace DIR`` runs ``strace -c -f`` on
mq (or the floor) for each measurement (its system calls per cycle; strace slows what it traces, so
the rates of such a run are not comparable). For mq also the deletes per fsync of ``remove/`` (its
directory fsync rounds from ``GET /metrics``), the loop thread's time on a core and waiting for one
(schedstat), and its context switches per cycle.

    .venv/bin/python bench/recv_ab.py --base /work/mq-base --root /dev/shm/recv-ab \\
        --clients 1,16 --rounds 4 --seconds 4 --output /tmp/recv-ab.json
    .venv/bin/python bench/recv_ab.py --base /work/mq-base --root /var/tmp/recv-ab --disk \\
        --clients 1,16 --rounds 4 --seconds 4 --output /tmp/recv-ab-disk.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.disk_loop import receive_delete_loop  # noqa: E402
from bench.inline_ab import add_common_args, bench_config, start_tree  # noqa: E402
from bench.python_floor import QUEUE as FLOOR_QUEUE  # noqa: E402
from bench.python_floor import FloorServer, Spare, _threads, make_root, mq_rounds  # noqa: E402
from bench.run import Api, Bench, CpuMeter, Wrk, WrkRun, ensure_wrk, log  # noqa: E402

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


def schedstat(pid: int) -> tuple[int, int]:
    """(ns on a core, ns waiting on a run queue) of ``pid``'s main thread (the event loop) so far."""
    try:
        run_ns, wait_ns, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0, 0
    return int(run_ns), int(wait_ns)


def _loop_split(
    before: dict[str, tuple[int, int, bool]], after: dict[str, tuple[int, int, bool]]
) -> tuple[float, float]:
    """CPU seconds of the main threads (event loops) and of the other threads between two :func:`_threads`."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0
    for key, (ticks, _, is_main) in after.items():
        spent = ticks - before.get(key, (0, 0, is_main))[0]
        if is_main:
            main += spent
        else:
            other += spent
    return main / tick, other / tick


class _Strace:
    """``strace -c -f -p PID`` for one measurement (``--strace DIR``): its summary table in DIR."""

    def __init__(self, out_dir: str | None, pid: int, label: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if out_dir is None:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(out_dir) / f"{label}-{time.monotonic_ns()}.txt"
        self.proc = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(self.path)])
        time.sleep(0.5)  # attached to every thread before the run starts

    def stop(self) -> str | None:
        """Detach (SIGINT: strace writes its table) and return the table's path."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait()
        return str(self.path)


def _row(run: WrkRun, cpu: dict[str, float], threads: tuple[float, float]) -> dict[str, Any]:
    """One measurement's figures per cycle (the server's CPU as "mq" for the floor too); ``threads``:
    :func:`_loop_split` of the server's process."""
    cycles = max(1, run.counts.get("cycles", 0))
    wall = cpu["wall_s"]

    def per_cycle(key: str) -> float:
        return round(cpu.get(key, 0.0) * wall * 10 / cycles, 4)

    return {
        "rate": round(run.rate("cycles"), 1),
        "p50_ms": run.latency_ms()["p50"],
        "p99_ms": run.latency_ms()["p99"],
        "empty": run.counts.get("empty", 0),
        "mq_cpu_ms": per_cycle("mq_cpu_pct"),
        "mq_loop_cpu_ms": round(threads[0] * 1000 / cycles, 4),
        "mq_threads_cpu_ms": round(threads[1] * 1000 / cycles, 4),
        "mover_cpu_ms": per_cycle("mover_cpu_pct"),
        "reaper_cpu_ms": per_cycle("reaper_cpu_pct"),
        "daemons_cpu_ms": round(sum(per_cycle(f"{k}_cpu_pct") for k in ("mq", "mover", "reaper")), 4),
        "wrk_cpu_ms": per_cycle("wrk_cpu_pct"),
        "other_cpu_pct": cpu["other_cpu_pct"],
    }


def _switched(
    row: dict[str, Any], run: WrkRun, sw: tuple[tuple[int, int], tuple[int, int]], st: tuple[tuple[int, int], ...]
) -> None:
    """Add the server's context switches per cycle (all threads) and its loop thread's time on a core and
    waiting for one per cycle (schedstat, ms) to ``row``."""
    cycles = max(1, run.counts.get("cycles", 0))
    row["vol_switches"] = round((sw[1][0] - sw[0][0]) / cycles, 2)
    row["invol_switches"] = round((sw[1][1] - sw[0][1]) / cycles, 2)
    row["loop_run_ms"] = round((st[1][0] - st[0][0]) / 1e6 / cycles, 4)
    row["loop_wait_ms"] = round((st[1][1] - st[0][1]) / 1e6 / cycles, 4)


def _framed(row: dict[str, Any], loops: list[dict[str, Any]]) -> None:
    """Add the disk loops around the measurement (``--disk``) and the ratio against their mean to ``row``."""
    if loops:
        loop_rate = statistics.mean(float(lp["msgs_per_s"]) for lp in loops)
        row["disk_loop"] = [lp["msgs_per_s"] for lp in loops]
        row["disk_loop_cpu_ms"] = [lp.get("cpu_ms_per_msg") for lp in loops]
        row["ratio"] = round(row["rate"] / loop_rate, 3)


def _run(
    args: argparse.Namespace, wrk: Wrk, pids: dict[str, int], pid: int, queue: str, clients: int, name: str
) -> tuple[WrkRun, dict[str, Any]]:
    """recv_delete.lua at ``clients`` against the server ``pid`` (its processes ``pids``, named as
    CpuMeter's, the server "mq"); the run and its row (:func:`_row`, :func:`_switched`, ``--strace``)."""
    meter = CpuMeter(pids)
    strace = _Strace(args.strace, pid, f"{name}-{clients}")
    sw0, t0, s0 = switches(pid), _threads(pid), schedstat(pid)
    run = wrk.run("recv_delete.lua", clients=clients, threads=None, queue=queue, duration_s=args.seconds)
    sw1, t1, s1 = switches(pid), _threads(pid), schedstat(pid)
    cpu = meter.stop()
    traced = strace.stop()
    row = _row(run, cpu, _loop_split(t0, t1))
    _switched(row, run, (sw0, sw1), (s0, s1))
    if traced:
        row["strace"] = traced
    return run, row


#: The floor variants' ready-file writers, kept for the whole run (each names its files in one sequence).
_SPARES: dict[str, Spare] = {}


def _measure_floor(args: argparse.Namespace, name: str, wrk_exe: str) -> dict[str, Any]:
    """bench/python_floor.py's server (variant ``name`` minus ``floor-``) at each client count."""
    variant = name.removeprefix("floor-")
    log_dir = Path(args.logs) / f"{name}-{time.monotonic_ns()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    froot = make_root(Path(args.root) / name)
    spare = _SPARES.setdefault(name, Spare(Path(args.root) / name / "spare"))  # its names go on across rounds
    out: dict[str, Any] = {"uptime": os.getloadavg()}
    for clients in args.clients:
        spare.top_up(froot / "queues" / FLOOR_QUEUE, args.depth)
        loops = [_loop(args, clients)] if args.disk else []
        server = FloorServer(froot, variant, 1, 64, log_dir / "floor-server.log")
        try:
            wrk = Wrk(wrk_exe, server.url, log_dir / "wrk")
            row = _run(args, wrk, {"mq": server.pid}, server.pid, FLOOR_QUEUE, clients, name)[1]
        finally:
            server.stop()
        if args.disk:
            loops.append(_loop(args, clients))
        _framed(row, loops)
        log(f"  {name} {clients} clients: {row}")
        out[f"clients_{clients}"] = row
    return out


def _measure(
    args: argparse.Namespace, name: str, variant: tuple[str | None, list[str]], wrk_exe: str
) -> dict[str, Any]:
    """Start the daemons of ``variant`` on the shared root, run recv_delete.lua at each client count, stop them."""
    if name.startswith("floor-"):
        return _measure_floor(args, name, wrk_exe)
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
            port = int(url.rsplit(":", 1)[1])
            rounds0 = mq_rounds(port)
            run, row = _run(args, wrk, daemons.pids(), mq_pid, QUEUE, clients, name)
            fsyncs = mq_rounds(port).get("directory", 0.0) - rounds0.get("directory", 0.0)
            if args.disk:
                loops.append(_loop(args, clients))
            # A receive+delete run's directory fsyncs are the deletes' fsyncs of remove/ (group commit).
            row["deletes_per_remove_fsync"] = round(run.counts.get("cycles", 0) / fsyncs, 2) if fsyncs else 0.0
            _framed(row, loops)
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
        elif name.startswith("floor-"):
            out[name] = (None, [])  # bench/python_floor.py's server: see _measure_floor
        else:
            out[name] = (None, ["--inline-io", name])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and write the JSON; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, "/tmp/recv-ab-logs", 4)
    parser.add_argument("--depth", type=int, default=30000, help="ready messages before each measurement")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument(
        "--variants",
        default="main,auto",
        help="comma-separated: main, auto, never, NAME=PATH, floor-inline, floor-group, floor-pool",
    )
    parser.add_argument("--disk", action="store_true", help="frame each measurement by the disk loop")
    parser.add_argument("--strace", metavar="DIR", help="strace -c -f the server of each measurement into DIR")
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
