"""A/B of lone operations on the loop thread (issue 12, stop 17): main against ``--inline-io auto`` and ``never``.

Per round, every variant in turn (their order rotated per round) gets the three
daemons on ONE root shared by all variants and rounds (the root lottery of this
VM's ext4, docs/performance.md "Batches and hand-offs"), and bench/run.py's own
steps on it: single sends at each ``--send-clients`` (wrk, bench/lua/post.lua),
then receive+delete at each ``--recv-clients`` (recv_delete.lua, on the queue
the sends filled, topped up as bench/run.py does). With ``--disk`` each variant's
sends and receive+deletes at one client are framed by the one-thread disk loops
(bench/disk_loop.py: one before, one after; the ratio is against their mean), as
bars 2 and 3 are. Sends of all rounds first, then the receive+delete rounds,
so that no delete frees inodes right before a send round (``--phase``).

A variant is a code tree and mq arguments: ``main`` runs the daemons of the tree
given by ``--base`` (through ``PYTHONPATH``), ``auto`` and ``never`` this tree with
``--inline-io auto`` / ``never``.

    .venv/bin/python bench/inline_ab.py --base /work/mq-base-inline --root /dev/shm/inl-ab \\
        --rounds 3 --seconds 4 --output /tmp/inline-ab.json
    .venv/bin/python bench/inline_ab.py --base /work/mq-base-inline --root /var/tmp/inl-ab --disk \\
        --send-clients 1 --recv-clients 1 --rounds 3 --seconds 4 --output /tmp/inline-ab-disk.json

It prints one line per measurement and writes every figure (rates, latency,
CPU per operation of mq and of all three daemons, the disk loops, ``uptime``)
as JSON.
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

from bench.disk_loop import disk_loop, receive_delete_loop  # noqa: E402
from bench.run import Api, Bench, Config, CpuMeter, Daemons, Wrk, ensure_wrk, log  # noqa: E402

QUEUE = "inline-ab"


def _variants(base: str) -> dict[str, tuple[str | None, list[str]]]:
    """name -> (PYTHONPATH of the code tree or None for this one, extra mq arguments)."""
    return {"main": (base, []), "auto": (None, ["--inline-io", "auto"]), "never": (None, ["--inline-io", "never"])}


def _loop(disk_dir: Path, kind: str, seconds: float) -> dict[str, Any]:
    meter = CpuMeter({})
    if kind == "sends":
        out = disk_loop(disk_dir, threads=1, duration_s=seconds, keep_files=True)
    else:
        out = receive_delete_loop(disk_dir, threads=1, duration_s=seconds, prefill=max(2000, int(seconds * 3000)))
    out["cpu"] = meter.stop()
    return out


def start_tree(root: Path, log_dir: Path, variant: tuple[str | None, list[str]]) -> tuple[Daemons, str]:
    """Start the three daemons on ``root`` from the code tree of ``variant`` (PYTHONPATH, or this tree if None)
    with its extra mq arguments; returns them and mq's URL. The caller's PYTHONPATH is left as it was."""
    pythonpath, extra = variant
    saved = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    else:
        os.environ.pop("PYTHONPATH", None)
    daemons = Daemons(root, log_dir, None, extra)
    try:
        return daemons, daemons.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def bench_config(seconds: float, send_clients: list[int], recv_clients: list[int]) -> Config:
    """bench/run.py's Config for an A/B's steps: ``seconds`` per step, no deep queues, no drain."""
    return Config(
        duration_s=seconds,
        depth=0,
        shallow_depth=0,
        disk_threads=1,
        send_clients=send_clients,
        recv_clients=recv_clients,
        drain_clients=1,
        drain=False,
        prefill_clients=16,
        drain_timeout_s=60,
    )


def add_common_args(parser: argparse.ArgumentParser, logs: str, rounds: int) -> None:
    """The arguments every A/B of bench/ shares: --base, --root, --logs, --rounds, --seconds."""
    parser.add_argument("--base", required=True, help="code tree of main (PYTHONPATH of the 'main' variant)")
    parser.add_argument("--root", required=True, help="the one root of every variant (kept)")
    parser.add_argument("--logs", default=logs)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--seconds", type=float, default=4.0)


def _one(
    args: argparse.Namespace, name: str, variant: tuple[str | None, list[str]], phase: str, wrk_exe: str
) -> dict[str, Any]:
    """Start the daemons of ``variant`` on the shared root, run ``phase``'s steps, stop them."""
    log_dir = Path(args.logs) / f"{name}-{phase}-{time.monotonic_ns()}"
    Path(args.root).mkdir(parents=True, exist_ok=True)
    daemons, url = start_tree(Path(args.root) / "mq", log_dir, variant)
    api = Api(url)
    try:
        api.create_queue(QUEUE)
        cfg = bench_config(args.seconds, args.send_clients, args.recv_clients)
        bench = Bench(cfg, api, Wrk(wrk_exe, url, log_dir / "wrk"), {"send": QUEUE}, daemons)
        out: dict[str, Any] = {"uptime": os.getloadavg()}
        if phase == "sends":
            out["sends"] = bench.sends()
        else:
            out["receive_delete"] = bench.receive_delete({})
        return out
    finally:
        api.close()
        daemons.stop()


def _summary(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Medians per variant: rates, p99, CPU per operation, and the ratios to the disk loops."""
    out: dict[str, Any] = {}
    for name in names:
        rows: dict[str, list[float]] = {}
        for rnd in rounds:
            got = rnd.get(name)
            if not got:
                continue
            for step, per in (("sends", "sends_per_s"), ("receive_delete", "cycles_per_s")):
                for key, row in got.get(step, {}).items():
                    if not isinstance(row, dict) or per not in row:
                        continue
                    label = f"{step}.{key}"
                    rows.setdefault(f"{label}.rate", []).append(row[per])
                    rows.setdefault(f"{label}.p99_ms", []).append(row["latency_ms"]["p99"])
                    cpu = row.get("cpu", {})
                    for c in ("mq_cpu_ms_per_op", "daemons_cpu_ms_per_op"):
                        if cpu.get(c) is not None:
                            rows.setdefault(f"{label}.{c}", []).append(cpu[c])
            for key in ("sends_ratio_1", "receive_ratio_1", "sends_p99_ratio_1"):
                if got.get(key) is not None:
                    rows.setdefault(key, []).append(got[key])
        out[name] = {k: {"median": round(statistics.median(v), 3), "rounds": v} for k, v in sorted(rows.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and write the JSON; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, "/tmp/inline-ab-logs", 3)
    parser.add_argument("--send-clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    parser.add_argument("--recv-clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--variants", default="main,auto,never")
    parser.add_argument("--phase", default="sends,receive", help="sends, receive, or both in that order")
    parser.add_argument("--disk", action="store_true", help="frame the 1-client rows by the 1-thread disk loops")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    wrk_exe = ensure_wrk(False)
    every = _variants(args.base)
    names = [n for n in args.variants.split(",") if n]
    disk_dir = Path(args.root) / "diskloop"
    result: dict[str, Any] = {"args": vars(args), "phases": {}}
    for phase in [p for p in args.phase.split(",") if p]:
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            rnd: dict[str, Any] = {}
            for name in order:
                got: dict[str, Any] = {}
                before = _loop(disk_dir, phase, args.seconds) if args.disk else None
                got.update(_one(args, name, every[name], phase, wrk_exe))
                after = _loop(disk_dir, phase, args.seconds) if args.disk else None
                if before is not None and after is not None:
                    got["disk_loops"] = [before, after]
                    loop_rate = (float(before["msgs_per_s"]) + float(after["msgs_per_s"])) / 2
                    if phase == "sends":
                        row = got["sends"].get("clients_1")
                        if row:
                            got["sends_ratio_1"] = round(row["sends_per_s"] / loop_rate, 3)
                            loop_p99 = (before["latency_ms"]["p99"] + after["latency_ms"]["p99"]) / 2
                            got["sends_p99_ratio_1"] = round(row["latency_ms"]["p99"] / loop_p99, 3)
                    else:
                        row = got["receive_delete"].get("clients_1")
                        if row:
                            got["receive_ratio_1"] = round(row["cycles_per_s"] / loop_rate, 3)
                    log(f"  {name}: disk loop {before['msgs_per_s']} / {after['msgs_per_s']} msgs/s")
                rnd[name] = got
                log(f"round {r + 1} {phase} {name} done, load {os.getloadavg()}")
            rounds.append(rnd)
            Path(args.output).write_text(json.dumps(result | {"partial": {phase: rounds}}, indent=1))
        result["phases"][phase] = {"rounds": rounds, "summary": _summary(rounds, names)}
        Path(args.output).write_text(json.dumps(result, indent=1))
        print(json.dumps({phase: result["phases"][phase]["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
