"""A lone send's latency tail, stall by stall (issue 12, stop 27): what each slow send overlapped.

Starts mq, mq-mover and mq-reaper (bench/run.py's ``Daemons``) on a fresh root, one
queue, and one keep-alive client process (``http.client``, its collector off) that
sends 1 KiB bodies one after another for ``--seconds``, as bench/run.py's one wrk
connection does, and records every send's start and end (``CLOCK_MONOTONIC``). Meanwhile
this process samples every ``--sample-ms`` milliseconds, from ``/proc`` (kept open,
``pread``): mq's loop thread (its state letter, ``wchan`` and ``schedstat``: nanoseconds
on a CPU and waiting for one), the CPU of mq, mq-mover and mq-reaper, the machine's
``/proc/stat`` (busy, iowait, steal), the disk's ``/proc/diskstats`` (writes done,
I/O in flight) and, every tenth sample, ``/proc/meminfo`` (Dirty, Writeback).

For every send slower than ``--slow-ms`` it prints what those moved during the send:
the loop thread ran (mq's own work), waited for a CPU (the machine's load) or slept
(and where: the ``wchan`` letters), and whether the other daemons or the disk were busy.
``/metrics`` before and after give the collector's pauses and the fsync histograms.

    flock /work/bench27.lock .venv/bin/python bench/lone_tail.py --root /var/tmp/tail-t1 --seconds 20 \\
        --output /tmp/tail/t1.json
"""

from __future__ import annotations

import argparse
import array
import bisect
import gc
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))

from bench.disk_loop import disk_loop  # noqa: E402
from bench.run import MARKER, Api, Daemons  # noqa: E402

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
QUEUE = "lone-tail"
SLOW_LUA = Path(__file__).resolve().parent / "lua" / "post_slow.lua"

CLIENT = r"""
import gc, http.client, os, sys, time, array
gc.disable()
host, port, seconds, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
body = (b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_" * 16)[:1024]
conn = http.client.HTTPConnection(host, port)
headers = {"Content-Type": "application/octet-stream"}
starts, ends = array.array("q"), array.array("q")
now = time.monotonic_ns
stop = now() + int(seconds * 1e9)
while True:
    t0 = now()
    if t0 >= stop:
        break
    conn.request("POST", "/QUEUE_NAME/messages", body, headers)
    r = conn.getresponse()
    r.read()
    t1 = now()
    if r.status != 201:
        raise SystemExit(f"status {r.status}")
    starts.append(t0)
    ends.append(t1)
with open(out, "wb") as fh:
    fh.write(len(starts).to_bytes(8, "little"))
    starts.tofile(fh)
    ends.tofile(fh)
""".replace("QUEUE_NAME", QUEUE)


class Proc:
    """A ``/proc`` file kept open and re-read with ``pread`` (procfs regenerates it at offset 0)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def read(self) -> bytes:
        """The file's current text (up to 64 KiB)."""
        return os.pread(self.fd, 65536, 0)


def _cpu_ns(stat: bytes) -> int:
    """utime + stime of a ``/proc/PID/stat`` text, in nanoseconds."""
    fields = stat.rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_NS


def _disk_line(text: bytes, dev: bytes) -> tuple[int, int, int]:
    """Writes completed, I/Os in flight and ms spent doing I/O of ``dev`` in a ``/proc/diskstats`` text."""
    for line in text.splitlines():
        f = line.split()
        if len(f) > 13 and f[2] == dev:
            return int(f[7]), int(f[11]), int(f[12])
    return 0, 0, 0


def _meminfo(text: bytes) -> tuple[int, int]:
    """Dirty and Writeback, in kB."""
    dirty = int(re.search(rb"^Dirty:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    wb = int(re.search(rb"^Writeback:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    return dirty, wb


def _second_thread(pid: int, timeout_s: float = 5.0) -> int:
    """The id of the first thread ``pid`` starts besides its main one (the disk loop's worker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        if len(tids) > 1:
            return tids[1]
        time.sleep(0.001)
    raise SystemExit(f"process {pid} started no thread")


def sample(
    watched: tuple[int, int], pids: dict[str, int], client: subprocess.Popen[Any], every_s: float, dev: bytes
) -> list[tuple[Any, ...]]:
    """Sample until ``client`` exits; rows of (t_ns, state, wchan, run_ns, wait_ns, mq, mover, reaper cpu ns,
    machine (busy, iowait, steal) ticks, disk (writes, in flight, io ms), (dirty, writeback) kB).

    ``watched``: (pid, thread id) of the thread whose state and schedstat are read."""
    pid, tid = watched
    st, wchan, sched = (
        Proc(f"/proc/{pid}/task/{tid}/stat"),
        Proc(f"/proc/{pid}/task/{tid}/wchan"),
        Proc(f"/proc/{pid}/task/{tid}/schedstat"),
    )
    pstat = {name: Proc(f"/proc/{pid}/stat") for name, pid in pids.items()}
    machine, disk, mem = Proc("/proc/stat"), Proc("/proc/diskstats"), Proc("/proc/meminfo")
    time.sleep(0.05)  # the client's start-up (a Python loop imports for a few ms) is not sampled as a send
    rows: list[tuple[Any, ...]] = []
    memrow = _meminfo(mem.read())
    n = 0
    while client.poll() is None:
        t = time.monotonic_ns()
        try:
            s = st.read()
            state = s.rsplit(b")", 1)[1].split()[0].decode()
            w = wchan.read().decode() if state != "R" else ""
            run_ns, wait_ns = (int(x) for x in sched.read().split()[:2])
        except ProcessLookupError:  # the watched thread ended (the disk loop's worker, its window over)
            break
        cpus = tuple(_cpu_ns(p.read()) for p in pstat.values())
        m = [int(x) for x in machine.read().split(b"\n", 1)[0].split()[1:9]]
        busy = m[0] + m[1] + m[2] + m[5] + m[6]
        if n % 10 == 0:
            memrow = _meminfo(mem.read())
        rows.append((t, state, w, run_ns, wait_ns, cpus, (busy, m[4], m[7]), _disk_line(disk.read(), dev), memrow))
        n += 1
        time.sleep(every_s)
    return rows


def _scrape(api: Api) -> dict[str, float]:
    """Every sample of mq's ``/metrics`` that the analysis uses (gc, fsync histograms), by its full name."""
    _, _, body = api.request("GET", "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith(("mq_gc_pause", "python_gc_collections", "mq_storage_fsync_duration_seconds")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def latency_summary(starts: list[int], ends: list[int]) -> dict[str, float]:
    """p50, p90, p99, p99.9 and max of the sends' latencies, in ms."""
    lat = sorted((e - s) / 1e6 for s, e in zip(starts, ends, strict=True))

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(len(lat) * p / 100))], 3)

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "p999": pct(99.9), "max": round(lat[-1], 3)}


def analyse(slow_sends: list[tuple[int, int]], t0: int, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Per slow send (start, end in monotonic ns): what the samples inside it moved (the module's docstring)."""
    times = [r[0] for r in rows]
    slow = []
    for s, e in slow_sends:
        ms = (e - s) / 1e6
        i, j = bisect.bisect_right(times, s) - 1, bisect.bisect_left(times, e)
        i, j = max(i, 0), min(j, len(rows) - 1)
        a, b = rows[i], rows[j]
        states: dict[str, int] = {}
        for r in rows[i : j + 1]:
            key = r[1] + (":" + r[2] if r[2] else "")
            states[key] = states.get(key, 0) + 1
        span = (b[0] - a[0]) / 1e6
        slow.append(
            {
                "at_s": round((s - t0) / 1e9, 3),
                "ms": round(ms, 2),
                "window_ms": round(span, 2),
                "loop_ran_ms": round((b[3] - a[3]) / 1e6, 2),
                "loop_waited_cpu_ms": round((b[4] - a[4]) / 1e6, 2),
                "mq_cpu_ms": round((b[5][0] - a[5][0]) / 1e6, 1),
                "mover_cpu_ms": round((b[5][1] - a[5][1]) / 1e6, 1),
                "reaper_cpu_ms": round((b[5][2] - a[5][2]) / 1e6, 1),
                "machine_busy_ticks": b[6][0] - a[6][0],
                "iowait_ticks": b[6][1] - a[6][1],
                "steal_ticks": b[6][2] - a[6][2],
                "disk_writes": b[7][0] - a[7][0],
                "disk_inflight_max": max(r[7][1] for r in rows[i : j + 1]),
                "disk_io_ms": b[7][2] - a[7][2],
                "dirty_kb": a[8][0],
                "writeback_kb_max": max(r[8][1] for r in rows[i : j + 1]),
                "states": states,
            }
        )
    gaps = [(b[0] - a[0]) / 1e6 for a, b in itertools.pairwise(rows)]
    return {
        "samples": len(rows),
        "sample_gap_ms": {"p50": sorted(gaps)[len(gaps) // 2] if gaps else None, "max": max(gaps) if gaps else None},
        "slow": slow,
    }


PERF_EVENTS = (
    "block:block_rq_issue",
    "block:block_rq_complete",
    "syscalls:sys_enter_fsync",
    "syscalls:sys_enter_fdatasync",
    "syscalls:sys_enter_syncfs",
    "syscalls:sys_enter_sync",
)


def perf_events(path: Path, t0: int, result: dict[str, Any]) -> None:
    """Add to each slow send of ``result`` the block requests and sync calls of the machine during it.

    Per slow send: ``issued`` = block requests issued by each command (``comm/pid``, writes and
    sectors), ``syncs`` = fsync-family calls by command, and ``ours`` = the same for mq's pids; in
    ``result["perf_totals"]`` the whole window's counts per command (who else wrote).
    """
    text = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "comm,pid,time,event,trace"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    pat = re.compile(r"^\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
    events: list[tuple[int, str, str, str]] = []
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            comm, pid, t, ev, rest = m.groups()
            events.append((int(float(t) * 1e9), f"{comm}/{pid}", ev.rsplit(":", 1)[-1], rest))
    events.sort()
    times = [e[0] for e in events]
    totals: dict[str, dict[str, int]] = {}
    for _, who, ev, _ in events:
        if ev != "block_rq_complete":
            totals.setdefault(who, {}).setdefault(ev, 0)
            totals[who][ev] += 1
    result["perf_totals"] = dict(sorted(totals.items(), key=lambda kv: -sum(kv[1].values()))[:25])
    result["perf_events"] = len(events)
    for row in result["slow"]:
        s = t0 + int(row["at_s"] * 1e9)
        e = s + int(row["ms"] * 1e6)
        i, j = bisect.bisect_left(times, s), bisect.bisect_right(times, e)
        issued: dict[str, list[int]] = {}
        syncs: dict[str, int] = {}
        for _, who, ev, rest in events[i:j]:
            if ev == "block_rq_issue":
                m = re.search(r"(\S+) \d+ \(\S*\) \d+ \+ (\d+)", rest)
                got = issued.setdefault(who, [0, 0])
                got[0] += 1
                got[1] += int(m.group(2)) if m else 0
            elif ev.startswith("sys_enter_"):
                key = f"{who} {ev.removeprefix('sys_enter_')}"
                syncs[key] = syncs.get(key, 0) + 1
        row["issued"] = issued
        row["syncs"] = syncs


LOOP = r"""
import array, gc, sys, threading, time
gc.disable()
sys.path.insert(0, sys.argv[4])
from bench import disk_loop as dl

class Clock:
    # bench.disk_loop's own loop, untouched: its worker thread reads time.perf_counter() (CLOCK_MONOTONIC)
    # right before and right after each message, so those readings are each message's start and end.
    stamps = array.array("q")
    def perf_counter(self):
        t = time.perf_counter()
        if threading.current_thread().name.startswith("disk-loop"):
            self.stamps.append(int(t * 1e9))
        return t
    def __getattr__(self, name):
        return getattr(time, name)

clock = Clock()
dl.time = clock
dl.disk_loop(sys.argv[1], threads=1, duration_s=float(sys.argv[2]), keep_files=True)
stamps = clock.stamps[: len(clock.stamps) // 2 * 2]
with open(sys.argv[3], "wb") as fh:
    fh.write((len(stamps) // 2).to_bytes(8, "little"))
    stamps[0::2].tofile(fh)
    stamps[1::2].tofile(fh)
"""


def _read_times(path: Path) -> tuple[list[int], list[int]]:
    """The starts and ends (monotonic ns) a client or loop subprocess wrote."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    both = array.array("q")
    both.frombytes(data[8:])
    return list(both[:n]), list(both[n:])


def run_phase(kind: str, args: argparse.Namespace, url: str, pids: dict[str, int], tag: str) -> dict[str, Any]:
    """One window of ``--seconds``: ``mq`` (sends through ``--client``) or ``loop`` (the 1-thread disk loop's
    six calls, in a subprocess, in ROOT/diskloop), sampled, with the slow sends analysed."""
    host, port = url.removeprefix("http://").split(":")
    out_bin = args.output.with_name(f"{args.output.stem}-{tag}.bin")
    perf_data = args.output.with_name(f"{args.output.stem}-{tag}.perf")
    perf = None
    if args.perf:
        events = [x for k in PERF_EVENTS for x in ("-e", k)]
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", *events, "-o", str(perf_data)],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(0.5)
    t0 = time.monotonic_ns()
    client: subprocess.Popen[Any]
    if kind == "loop":
        loop_dir = args.root / "diskloop" / tag
        client = subprocess.Popen(
            [sys.executable, "-c", LOOP, str(loop_dir), str(args.seconds), str(out_bin), str(REPO_DIR)]
        )
        watched = (client.pid, _second_thread(client.pid))
    elif args.client == "python":
        client = subprocess.Popen([sys.executable, "-c", CLIENT, host, port, str(args.seconds), str(out_bin)])
        watched = (pids["mq"], pids["mq"])
    else:
        env = dict(os.environ, MQB_QUEUE=QUEUE, MQB_SLOW_US=str(int(args.slow_ms * 1000)), MQB_THREADS="1")
        client = subprocess.Popen(
            ["wrk", "-t1", "-c1", f"-d{int(args.seconds)}s", "--timeout", "30s", "-s", str(SLOW_LUA), url + "/"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        watched = (pids["mq"], pids["mq"])
    rows = sample(watched, pids, client, args.sample_ms / 1000, args.device.encode())
    out, err = client.communicate()
    if client.returncode != 0:
        raise SystemExit(f"{kind} failed: {err}")
    if perf is not None:
        perf.send_signal(2)
        perf.wait()
    if kind == "loop" or args.client == "python":
        starts, ends = _read_times(out_bin)
        latency, sends = latency_summary(starts, ends), len(starts)
        slow_sends = [(s, e) for s, e in zip(starts, ends, strict=True) if e - s >= args.slow_ms * 1e6]
        over = {f"over_{ms}ms": sum(1 for s, e in zip(starts, ends, strict=True) if e - s >= ms * 1e6) for ms in OVER}
    else:
        line = next(x for x in out.splitlines() if x.startswith("MQBENCH_JSON "))
        data = json.loads(line.removeprefix("MQBENCH_JSON "))
        counts = data["counts"]
        sends = counts.get("sent", 0)
        latency = {k: round(v / 1000, 3) for k, v in data["latency_us"].items() if k.startswith(("p", "max"))}
        slow_sends = sorted(
            (int(k[5:]) * 1000, int(k[5:]) * 1000 + v * 1000) for k, v in counts.items() if k.startswith("slow_")
        )
        over = {f"over_{ms}ms": sum(1 for s, e in slow_sends if e - s >= ms * 1e6) for ms in OVER}
    result: dict[str, Any] = {
        "phase": tag,
        "kind": kind,
        "client": "loop" if kind == "loop" else args.client,
        "sends": sends,
        "per_s": round(sends / args.seconds, 1),
        "latency_ms": latency,
        **over,
    }
    result.update(analyse(slow_sends, t0, rows))
    if perf is not None:
        perf_events(perf_data, t0, result)
    return result


#: Latency thresholds (ms) whose counts each window reports (``over_<ms>ms``); the smallest must be >= --slow-ms.
OVER = (5, 10, 20)


def main() -> int:
    """Command line: see the module's docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True, help="a new directory for the daemons' root")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each window")
    ap.add_argument(
        "--order",
        default="mq",
        help="the windows, comma-separated: mq (sends to mq) or loop (the 1-thread disk loop), e.g. mq,loop,loop,mq",
    )
    ap.add_argument("--slow-ms", type=float, default=5.0, help="sends at least this slow are listed")
    ap.add_argument("--sample-ms", type=float, default=2.0)
    ap.add_argument("--client", choices=("wrk", "python"), default="wrk", help="wrk (bench/run.py's) or http.client")
    ap.add_argument("--device", default="vda", help="the disk in /proc/diskstats")
    ap.add_argument("--mq-arg", action="append", default=[], help="an extra argument for mq (repeatable)")
    ap.add_argument(
        "--loops",
        type=float,
        default=0.0,
        help="first run the 1-thread and the 64-thread disk loops this many seconds each in ROOT/diskloop "
        "(bench/run.py's order before its sends step)",
    )
    ap.add_argument(
        "--perf",
        action="store_true",
        help="record the machine's block requests and fsync/syncfs/sync calls (perf record -a) during each "
        "window and list, per slow send, who issued them",
    )
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    gc.disable()
    if args.root.exists():
        raise SystemExit(f"{args.root} exists: pass a new --root")
    args.root.mkdir(parents=True)
    (args.root / MARKER).write_text("made by bench/lone_tail.py\n")
    loops = {}
    if args.loops:
        for threads in (1, 64):
            got = disk_loop(args.root / "diskloop", threads=threads, duration_s=args.loops, keep_files=True)
            loops[threads] = {k: got[k] for k in ("msgs_per_s", "latency_ms")}
            print(json.dumps({"disk_loop": threads, **loops[threads]}), flush=True)
    daemons = Daemons(args.root / "mq", args.root / "logs", None, args.mq_arg)
    url = daemons.start()
    phases = []
    try:
        api = Api(url)
        api.create_queue(QUEUE)
        for n, kind in enumerate(args.order.split(",")):
            before = _scrape(api)
            got = run_phase(kind, args, url, daemons.pids(), f"{n}{kind}")
            after = _scrape(api)
            got["metrics_delta"] = {
                k: round(after[k] - before.get(k, 0), 6)
                for k in after
                if after[k] != before.get(k) and ("gc" in k or k.endswith(("_sum", "_count")) or "+Inf" in k)
            }
            phases.append(got)
            print(json.dumps({k: got[k] for k in ("phase", "per_s", "latency_ms", *(f"over_{m}ms" for m in OVER))}))
            print("  ", json.dumps(got["metrics_delta"]))
    finally:
        daemons.stop()
    args.output.write_text(json.dumps({"root": str(args.root), "disk_loops": loops, "phases": phases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
