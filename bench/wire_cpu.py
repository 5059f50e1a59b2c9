"""mq's CPU per request on tmpfs, two source trees alternated: the hot routes' HTTP cost (issue 12, stop 17).

Starts ``mq`` (alone: no mover, no reaper) from each tree in turn (``--tree NAME=PATH``, run with
this interpreter and ``PYTHONPATH=PATH``) on a fresh root under ``--root`` (tmpfs: /dev/shm), drives
it with wrk and the bench/lua scripts, and reads the mq process's CPU from /proc around each step:

- ``send_cN``: 1 KiB sends (post.lua) at N connections, ms of CPU per 201;
- ``rd_cN``: receive+delete cycles (recv_delete.lua) at N connections on a prefilled queue, per cycle;
- ``send_64k`` / ``send_1m``: 64 KiB and 1 MiB sends at 1 connection, per 201;
- ``batch_cN``: batch sends of 10 1 KiB messages (post_batch.lua, base64 bodies) at N connections, per message;
- ``rdbatch_cN``: batch receives of 10 and batch deletes of their handles (recv_delete_batch.lua) at N
  connections on a prefilled queue, per message;
- ``empty_cN``: receives of an empty queue (204, no long poll) at N connections, per request: the
  HTTP stack's own cost with the least broker work.

Rounds alternate the trees; the medians per tree are printed as one JSON object (with the load average).

    .venv/bin/python bench/wire_cpu.py --tree branch=. --tree main=/work/mq-base --rounds 3 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_LUA = Path(__file__).resolve().parent / "lua"


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, method: str) -> None:
    request = urllib.request.Request(url, method=method, data=b"" if method in ("PUT", "POST") else None)
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except urllib.error.HTTPError:
        pass


class Mq:
    """One mq process from ``tree`` on a fresh root under ``base``."""

    def __init__(self, tree: Path, base: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="wire-cpu-", dir=base))
        self.port = _free_port()
        env = dict(os.environ, PYTHONPATH=str(tree))
        code = "import sys; from daemons.front import main; sys.exit(main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--root", str(self.root), "--port", str(self.port)],
            env=env,
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"wire_cpu: mq from {tree} did not listen")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _wrk(mq: Mq, script: str, clients: int, seconds: int, env: dict[str, str]) -> dict[str, Any]:
    """Run wrk with ``script`` (a bench/lua file), or on the queue's messages path with none ("")."""
    target = ["-s", str(_LUA / script), mq.url] if script else [f"{mq.url}/{env['MQB_QUEUE']}/messages"]
    run = subprocess.run(
        ["wrk", f"-t{clients}", f"-c{clients}", f"-d{seconds}s", *target],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MQB_THREADS": str(clients), **env},
    )
    if not script:
        done = re.search(r"(\d+) requests in", run.stdout)
        return {"counts": {"requests": int(done.group(1)) if done else 0}}
    match = re.search(r"MQBENCH_JSON (\{.*\})", run.stdout)
    return json.loads(match.group(1)) if match else {}


def _stat(out: dict[str, Any], key: str) -> int:
    return int(out.get("counts", {}).get(key, 0))


def step(mq: Mq, name: str, seconds: int) -> float | None:
    """Run one step on its own queue; mq's CPU ms per counted op."""
    queue = f"q{name.replace('_', '')}"
    _call(f"{mq.url}/{queue}", "PUT")
    kind, _, arg = name.partition("_")
    env = {"MQB_QUEUE": queue}
    if kind == "empty":
        before = _cpu_s(mq.proc.pid)
        ops = _stat(_wrk(mq, "", int(arg[1:]), seconds, env), "requests")
    elif kind == "rd":
        clients = int(arg[1:])
        prefill = {1: 12_000, 16: 20_000}.get(clients, 20_000)
        _wrk(mq, "post.lua", 8, 60, {**env, "MQB_QUOTA": str(prefill)})
        before = _cpu_s(mq.proc.pid)
        out = _wrk(mq, "recv_delete.lua", clients, seconds, env)
        ops = _stat(out, "cycles")
    elif kind == "rdbatch":  # batch receive + batch delete, per message
        clients = int(arg[1:])
        _wrk(mq, "post_batch.lua", 8, 60, {**env, "MQB_QUOTA": "40000"})
        before = _cpu_s(mq.proc.pid)
        ops = _stat(_wrk(mq, "recv_delete_batch.lua", clients, seconds, env), "cycles")
    elif kind == "batch":
        before = _cpu_s(mq.proc.pid)
        ops = _stat(_wrk(mq, "post_batch.lua", int(arg[1:]), seconds, env), "sent")
    else:
        clients = int(arg[1:]) if arg.startswith("c") else 1
        if arg in ("64k", "1m"):
            env["MQB_BODY_BYTES"] = str(65_536 if arg == "64k" else 1_048_576)
        before = _cpu_s(mq.proc.pid)
        out = _wrk(mq, "post.lua", clients, seconds, env)
        ops = _stat(out, "sent")
    cpu = _cpu_s(mq.proc.pid) - before
    _call(f"{mq.url}/{queue}", "DELETE")
    return round(cpu * 1000 / ops, 4) if ops else None


def main() -> int:
    """Alternate the trees over the rounds; print the medians."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (repeat)")
    p.add_argument("--root", default="/dev/shm", help="where each mq's root is made (tmpfs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=4)
    p.add_argument("--steps", default="send_c1,send_c16,send_c64,rd_c1,rd_c16,send_64k,send_1m")
    args = p.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)]
    results: dict[str, dict[str, list[float | None]]] = {name: {} for name, _ in trees}
    loads = [os.getloadavg()[0]]
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for name, tree in order:
            mq = Mq(tree, Path(args.root))
            try:
                for step_name in args.steps.split(","):
                    value = step(mq, step_name, args.seconds)
                    results[name].setdefault(step_name, []).append(value)
                    print(f"round {rnd} {name} {step_name}: {value} ms", file=sys.stderr, flush=True)
            finally:
                mq.stop()
            loads.append(os.getloadavg()[0])
    medians = {
        name: {k: statistics.median([v for v in vs if v is not None] or [0.0]) for k, vs in steps.items()}
        for name, steps in results.items()
    }
    print(json.dumps({"cpu_ms_per_op_median": medians, "rounds": results, "loadavg_1m": loads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
