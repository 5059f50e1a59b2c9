"""A/B rounds of batch sends and batch receive+delete: CPU per message per daemon and per thread.

Alternates variants of the code (each a ``PYTHONPATH`` directory, ``-`` for this checkout)
round by round, A B, B A, A B ..., so that a shared machine's load falls on every variant alike.
Each round starts mq + mq-mover + mq-reaper (this venv's console scripts; the variant's
``mqcore`` and ``daemons`` through ``PYTHONPATH``) on a root of its own under ``--root``,
runs ``bench/lua/post_batch.lua`` (``send``), ``bench/lua/post.lua`` (``single``: one message a
request) or prefills and runs
``bench/lua/recv_delete_batch.lua`` (``recv``) under wrk at ``--clients`` connections,
discards ``--warmup`` seconds and reads every daemon thread's user and system ticks from
``/proc/<pid>/task/*/stat`` over ``--seconds``. CPU per message: the daemons' ticks over the
messages sent (files that appeared) or received and deleted (wrk's count of deleted entries).
Prints one JSON line per round and a median table at the end::

    .venv/bin/python bench/ab_batches.py --variant main=/work/mq-base-batch --variant new=- \\
        --mode send --rounds 3 --root /dev/shm/ab

``--variant-arg NAME=ARG`` (repeatable) gives variant NAME's mq an extra argument, so one checkout
can run as two variants (e.g. ``--variant fsync=- --variant-arg fsync=--file-sync=fsync``).

``--foreign-mib-per-s R`` runs another program's writes during each round: a process appending
``--foreign-burst-mib B`` MiB at once (default 1) to ``foreign.bin`` in the round's root, at R MiB/s on
average, never fsynced, from 1 s before the load on (dirty page cache of the root's filesystem that
is not mq's: what ``--file-sync syncfs`` waits for and ``auto`` avoids); the file is deleted after the
round. Each round also gives wrk's request latency (p50, p99, in ms).

Not a test: figures only (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.run import LUA_DIR, Daemons  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[str, tuple[int, int]]:
    """User and system ticks of ``pid``'s main thread (the event loop) and of its other threads together."""
    out: dict[str, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        user, system = int(fields[11]), int(fields[12])
        name = "loop" if task.name == str(pid) else "threads"  # the event loop; the worker threads together
        u, s = out.get(name, (0, 0))
        out[name] = (u + user, s + system)
    return out


def snapshot(pids: dict[str, int]) -> dict[str, dict[str, tuple[int, int]]]:
    return {name: thread_ticks(pid) for name, pid in pids.items()}


def machine_busy() -> int:
    """Busy ticks of the whole machine (``/proc/stat``: all but idle and iowait), every process and kernel thread."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def depth(url: str, queue: str) -> int:
    with urllib.request.urlopen(f"{url}/{queue}", timeout=30) as resp:
        return int(json.load(resp)["ready"])


def make_queue(url: str, queue: str) -> None:
    req = urllib.request.Request(
        f"{url}/{queue}", method="PUT", data=b"{}", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=30).read()


def wrk(
    script: str, url: str, queue: str, clients: int, threads: int, seconds: int, quota: int = 0
) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        MQB_QUEUE=queue,
        MQB_BATCH="10",
        MQB_BODY_BYTES="1024",
        MQB_QUOTA=str(quota),
        MQB_THREADS=str(threads),
    )
    cmd = ["wrk", f"-t{threads}", f"-c{clients}", f"-d{seconds}s", "--timeout", "30s", "-s", str(LUA_DIR / script)]
    return subprocess.Popen([*cmd, url + "/"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


#: The foreign writer of ``--foreign-mib-per-s``: appends bursts of argv[3] MiB to argv[1], argv[2] MiB/s on average,
#: until killed.
FOREIGN_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
chunk, rate, burst, start, n = os.urandom(1 << 20), float(sys.argv[2]), int(sys.argv[3]), time.monotonic(), 0
while True:
    for _ in range(burst):
        os.write(fd, chunk)
    n += burst
    time.sleep(max(0.0, start + n / rate - time.monotonic()))
"""


def foreign_writer(root: Path, rate: float, burst: int) -> subprocess.Popen[bytes] | None:
    """Start the foreign writer in ``root``: ``rate`` MiB/s in bursts of ``burst`` MiB (None when ``rate`` is 0)."""
    if not rate:
        return None
    return subprocess.Popen([sys.executable, "-c", FOREIGN_WRITER, str(root / "foreign.bin"), str(rate), str(burst)])


def wrk_latency_ms(out: str) -> dict[str, float]:
    """p50 and p99 request latency (ms) from wrk's MQBENCH_JSON line (bench/lua/mqbench.lua); {} if none."""
    for line in out.splitlines():
        if line.startswith("MQBENCH_JSON "):
            latency = json.loads(line[len("MQBENCH_JSON ") :])["latency_us"]
            return {"p50_ms": latency["p50"] / 1000, "p99_ms": latency["p99"] / 1000}
    return {}


def one_round(variant: str, path: str, args: argparse.Namespace, n: int) -> dict[str, Any]:
    # --same-root: every round on one root (a queue each), so no round meets a fresh directory's block group
    # or another round's deletes first (the real disk's lottery, docs/performance.md stop 16).
    root = Path(args.root) / ("shared" if args.same_root else f"{variant}-{n}")
    root.mkdir(parents=True, exist_ok=True)
    if path == "-":
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = path
    daemons = Daemons(root / "mq", root / "logs", None, args.mq_args.get(variant, []))
    url = daemons.start()
    queue = f"ab-{variant}-{n}"
    make_queue(url, queue)
    writer: subprocess.Popen[bytes] | None = None
    try:
        if args.mode == "recv":
            need = args.prefill
            fill = wrk("post_batch.lua", url, queue, 4, 4, 600, quota=need)
            while depth(url, queue) < need and fill.poll() is None:
                time.sleep(0.5)
            fill.terminate()
            fill.communicate()
            time.sleep(2)  # the reaper and mover idle again
        writer = foreign_writer(root, args.foreign_mib_per_s, args.foreign_burst_mib)
        if writer is not None:
            time.sleep(1.0)  # the other program already writes when the load arrives
        script = {"send": "post_batch.lua", "single": "post.lua"}.get(args.mode, "recv_delete_batch.lua")
        threads = args.clients if args.mode == "recv" else min(2, args.clients)
        proc = wrk(script, url, queue, args.clients, threads, int(args.warmup + args.seconds + 1))
        time.sleep(args.warmup)
        pids = daemons.pids()
        d0, t0, s0, m0 = depth(url, queue), time.monotonic(), snapshot(pids), machine_busy()
        attached = [
            subprocess.Popen(cmd.format(pid=pids[who], out=f"{root}/{who}", seconds=int(args.seconds)), shell=True)
            for who, cmd in (a.split("=", 1) for a in args.attach)
        ]
        time.sleep(args.seconds)
        for a in attached:
            a.wait()
        d1, t1, s1, m1 = depth(url, queue), time.monotonic(), snapshot(pids), machine_busy()
        latency = wrk_latency_ms(proc.communicate()[0])
        daemons.check_alive()
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
            (root / "foreign.bin").unlink(missing_ok=True)
        daemons.stop()
    messages = abs(d1 - d0)
    per: dict[str, float] = {}
    total = 0.0
    for name, threads_1 in s1.items():
        for thread, (u1, sy1) in threads_1.items():
            u0, sy0 = s0[name].get(thread, (0, 0))
            us_user = (u1 - u0) / TICK * 1e6 / max(messages, 1)
            us_sys = (sy1 - sy0) / TICK * 1e6 / max(messages, 1)
            if us_user + us_sys > 0:
                per[f"{name}/{thread}"] = round(us_user + us_sys, 1)
                per[f"{name}/{thread} sys"] = round(us_sys, 1)
            total += us_user + us_sys
    daemons_ms = {
        name: round(sum(v for k, v in per.items() if k.startswith(name + "/") and not k.endswith(" sys")) / 1000, 3)
        for name in pids
    }
    return {
        "variant": variant,
        "round": n,
        "mode": args.mode,
        "clients": args.clients,
        "messages_per_s": round(messages / (t1 - t0), 1),
        "ran_dry": args.mode == "recv" and d1 == 0,  # empty receives counted: the figure is too high
        "ms_per_message": round(total / 1000, 3),
        # The whole machine's busy CPU (wrk, the kernel's writeback threads, other users too) per message.
        "machine_ms_per_message": round((m1 - m0) / TICK * 1e3 / max(messages, 1), 3),
        "daemons_ms": daemons_ms,
        "threads_us": per,
        "load": os.getloadavg()[0],
        **latency,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=PYTHONPATH ('-' for this checkout)")
    ap.add_argument("--mode", choices=("send", "single", "recv"), required=True)
    ap.add_argument("--variant-arg", action="append", default=[], help="NAME=ARG: an extra mq argument of variant NAME")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--prefill", type=int, default=50000, help="messages in the queue before a recv round")
    ap.add_argument(
        "--attach",
        action="append",
        default=[],
        help="DAEMON=COMMAND run over the measured seconds ({pid}, {out}, {seconds}), e.g. a profiler",
    )
    ap.add_argument(
        "--foreign-mib-per-s", type=float, default=0.0, help="another program's unsynced writes in the root, MiB/s"
    )
    ap.add_argument("--foreign-burst-mib", type=int, default=1, help="MiB the foreign writer writes at once")
    ap.add_argument("--same-root", action="store_true", help="run every round on one root (a queue per round)")
    ap.add_argument("--root", required=True, help="a directory; each round gets its own root in it")
    args = ap.parse_args()
    args.mq_args = {}
    for item in args.variant_arg:
        name, arg = item.split("=", 1)
        args.mq_args.setdefault(name, []).append(arg)
    variants = [v.split("=", 1) for v in args.variant]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for n in range(1, args.rounds + 1):
        # A B, then B A, ...: neither variant always runs after the other (a shared root ages between runs).
        for name, path in variants if n % 2 else variants[::-1]:
            res = one_round(name, path, args, n)
            results[name].append(res)
            print(json.dumps(res), flush=True)
    for name, rounds in results.items():
        figures = [r["ms_per_message"] for r in rounds]
        rounds_text = " / ".join(f"{f:.3f}" for f in figures)
        rates = [r["messages_per_s"] for r in rounds]
        p99 = [r.get("p99_ms", 0.0) for r in rounds]
        print(
            f"{name}: ms per message {rounds_text} (median {statistics.median(figures):.3f}); "
            f"messages/s {' / '.join(f'{r:.0f}' for r in rates)} (median {statistics.median(rates):.0f}); "
            f"p99 ms {' / '.join(f'{p:.1f}' for p in p99)} (median {statistics.median(p99):.1f})"
        )


if __name__ == "__main__":
    main()
