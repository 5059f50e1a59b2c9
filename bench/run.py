"""mq benchmark: the figures and bars of issue 2, section "Benchmark".

Starts its own ``mq`` + ``mq-mover`` + ``mq-reaper`` on a fresh root on the
real disk (default ``./var/bench-root``; never tmpfs, which hides the fsync
cost), or measures an already running server given with ``--url``. The load
comes from wrk (Debian package ``wrk``) driven by the Lua scripts in
``bench/lua/``; every body is 1 KiB (1024 bytes). Measured, in this order:

1. the disk's own rate for the durable-send steps (``bench/disk_loop.py``) at
   1 and 64 threads, in a directory next to the mq root, in windows
   alternated with those of step 2 (below);
2. durable sends/s with p50/p99 latency at 1, 16 and 64 concurrent clients;
3. receive+delete cycles/s at 1 and 16 clients (GET, then DELETE of the
   received id on the same connection);

Every figure compared with a disk loop (sends at 1 and 64 clients, receive+delete
at 1 and 16, the large bodies) is measured in ``--rounds`` (3) rounds of one
loop window and one mq window of ``--window`` (5) seconds, the order inside a
round alternating (loop mq | mq loop | loop mq), and its bar is the median of
the per-round ratios (:mod:`bench.windows`; issue 12: "median of at least
three alternating rounds"). The sends at 16 clients and the steps with no
disk loop beside them run one ``--duration`` window.
4. send->receive->delete cycles/s at one client on a queue held at 100
   messages, then on one held at 100,000 (``--depth``), prefilled with wrk POSTs;
5. the drain of that deep queue to empty with receive+delete at 16 clients,
   with the rate of each tenth of the drain;
6. batches (issue 3), in the same run as the single-message figures: batch
   sends (``POST /<queue>/messages/batch``, ``--batch-size`` messages of 1 KiB
   each, bodies base64 in JSON) at 1, 16 and 64 clients right after the single
   sends, and batch receive+delete (``GET /<queue>/messages?max_messages=N``,
   then ``POST /<queue>/messages/delete`` with the receipt handles) at 1 and 16
   clients right after the single receive+delete. Both are reported in
   messages/s next to the single-message figures (``batches_summary``).

Issue 12 ("Performance") adds, in this order: the receive+delete disk loop
at 1 and 16 threads (step ``disk_receive``, before the receive+delete step),
and the scale steps of :mod:`bench.scale`: ``startup`` (1,000,000 ready
messages, mq restarted, its first receive timed, RSS per message), ``drain``
(now of ``--drain-depth`` messages, 1,000,000, written directly by
:mod:`bench.prefill`), ``queues`` (10 vs 10,000 queues), ``longpoll``
(1,000 waiting receivers: idle CPU and delivery p99) and ``large`` (64 KiB
and 1 MiB sends vs the disk loop in MB/s). CPU per message is also summed
over mq + mq-mover + mq-reaper (``daemons_cpu_ms_per_op`` /
``daemons_cpu_ms_per_message``).

It prints ONE JSON object on stdout (also saved in ``bench/results/``) with
all figures, the machine, and the bars (``bars``: value, bar, met): sends at
64 clients / disk loop at 64 threads (>= 1.0), deep cycles / shallow cycles
(>= 0.8), and every bar and scale figure of issue 12 (:mod:`bench.bars`).
Progress goes to stderr. Usage, from the repository root::

    .venv/bin/python bench/run.py                 # full run, ~16 minutes quiet (the 1,000,000-message drain: ~6)
    .venv/bin/python bench/run.py --quick         # 3 s steps, 10,000-deep queue, small scale steps
    .venv/bin/python bench/run.py --steps sends,batch_sends,receive,batch_receive   # batches vs single
    .venv/bin/python bench/run.py --url http://127.0.0.1:8080 --root /var/lib/mq
    .venv/bin/python bench/run.py --steps metrics  # sends/s at 64 clients with and without a scrape a second

A real-disk run right after mass deletes is skewed on ext4 without a journal (this VM's disk):
the kernel will not reuse an inode freed less than 60-300 s ago and scans them all on every
create, so sends pay milliseconds of kernel CPU each for whatever was deleted in the 5 minutes
before (docs/performance.md, "Recycled message files"). So the bench moves a previous root aside
instead of deleting it before measuring, deletes it after its measurements, and records the
seconds since its last such delete in the JSON (``seconds_since_bench_deleted_roots``; a warning
under 300 s). Deletes by anything else on the disk (another run's ``rm -rf``) skew it the same way.

CI does not run the benchmark. wrk is installed with ``apt-get install -y wrk``
when missing and running as root (``--no-install`` to refuse).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import http.client
import itertools
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bars import BAR_DRAIN_MIN_OVER_MAX_TENTH, issue12_bars
from bench.disk_loop import ReceiveDeleteDir, disk_loop, receive_delete_loop
from bench.prefill import fill
from bench.scale import BIG_QUEUE, Scale
from bench.scrape_windows import scrape_windows
from bench.windows import DEFAULT_ROUNDS, alternate, paired, summary_row

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
LUA_DIR = BENCH_DIR / "lua"


def mq_tree(pythonpath: str | None = None) -> Path:
    """The source tree the daemons import: the first ``PYTHONPATH`` entry holding ``daemons/front.py``, else this one.

    The daemons run with it as their working directory: ``mq --processes N`` starts its workers as
    ``python -m daemons.front`` with the supervisor's working directory, and ``-m`` puts that directory
    first on ``sys.path``, so a ``PYTHONPATH=<other tree>`` A/B run from this tree's directory would
    serve this tree in its workers (docs/performance.md, "Several processes with syncfs").

    Args:
        pythonpath: A ``PYTHONPATH`` value (default: this process's environment's).
    """
    value = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    for entry in value.split(os.pathsep):
        if entry and (Path(entry) / "daemons" / "front.py").is_file():
            return Path(entry).resolve()
    return REPO_DIR


#: Bytes per message body (issue 2: 1 KiB).
BODY_BYTES = 1024
#: Marker file that lets the runner wipe a root it created itself.
MARKER = ".mq-bench-root"
#: ext4 without a journal does not reuse an inode freed less than this many seconds ago (RECENTCY_DIRTY).
EXT4_RECENT_DELETE_S = 300
#: Readiness lines of the daemons (team contract).
READY_MQ = re.compile(r"mq listening on (http://[0-9.]+:[0-9]+)")
READY_MOVER = "mq-mover ready"
READY_REAPER = "mq-reaper ready"
#: Steps of a run, in order.
STEPS = (
    "disk",
    "sends",
    "batch_sends",
    "disk_receive",
    "receive",
    "batch_receive",
    "cycles",
    "startup",
    "drain",
    "queues",
    "longpoll",
    "large",
    "metrics",
)
#: Messages per batch request (SQS's limit and mq's default --max-batch-messages).
BATCH_SIZE = 10
#: Bars set by issue 2.
BAR_SENDS_OVER_DISK = 1.0
BAR_DEEP_OVER_SHALLOW = 0.8
#: The CPU figures of each run of the metrics step kept in its JSON (:class:`CpuMeter`'s keys).
RUN_CPU_KEYS = (
    "mq_cpu_ms_per_op",
    "mq_cpu_pct",
    "mover_cpu_pct",
    "reaper_cpu_pct",
    "wrk_cpu_pct",
    "bench_cpu_pct",
    "other_cpu_pct",
    "machine_busy_pct",
    "cpu_canary_ms",
)
#: Bar set by issue 15: a scrape of GET /metrics every second costs at most this share of sends/s at 64 clients.
BAR_METRICS_COST = 0.03


def log(msg: str) -> None:
    """Progress line on stderr, with the time."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- CPU accounting ------------------------------------------------------------

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (field 3, the state, is index 0); [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (e.g. the workers of ``mq --processes N``)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its descendants (live, or exited and reaped).

    0.0 if gone. Counting the descendants keeps the figures right when mq
    runs several processes (``mq --processes N``, issue 12).
    """
    total = 0
    for i, p in enumerate(_descendants(pid)):
        fields = _proc_stat(p)
        if len(fields) > 14:
            # utime + stime, and for every process the children it has reaped (cutime + cstime);
            # a child still alive is counted on its own, never twice.
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        elif i == 0:
            return 0.0
    return total * _TICK_S


def rss_bytes(pid: int) -> int:
    """Resident memory (VmRSS) of ``pid`` and its descendants, in bytes; 0 if gone."""
    total = 0
    for p in _descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


def _machine_ticks() -> list[int]:
    """The aggregate ``cpu`` line of /proc/stat: user nice system idle iowait irq softirq steal."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return [0] * 8


DAEMON_KEYS = ("mq", "mover", "reaper")


def daemons_cpu_ms(cpu: dict[str, float], ops: int) -> float | None:
    """CPU milliseconds per operation summed over mq + mq-mover + mq-reaper (issue 12, bar 4), None if unknown."""
    pcts = [cpu[f"{k}_cpu_pct"] for k in DAEMON_KEYS if f"{k}_cpu_pct" in cpu]
    if not pcts or not ops:
        return None
    return round(sum(pcts) / 100 * cpu["wall_s"] * 1000 / ops, 3)


class CpuMeter:
    """Where the CPU went during one step: the machine, each daemon, wrk, the bench itself.

    Percentages of ``*_pct`` are of ONE core (200 = both cores of a 2-core
    machine), except ``machine_busy_pct`` and ``iowait_pct`` (of all cores).
    wrk's share is the CPU of the children reaped during the step (the
    daemons are reaped only at the end, so that is wrk).
    ``cpu_canary_ms`` is the median of :func:`cpu_canary_ms`, taken once a
    second by a thread of the bench during the step: how fast the CPUs ran
    (this VM's vary by 1.5x within minutes, unreported as steal; issue 12,
    stop 22), to read a step's figures against another's.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        #: (time.monotonic(), cpu_canary_ms) once a second while the meter runs.
        self.canary: list[tuple[float, float]] = []
        self._canary_stop = threading.Event()
        self._canary_thread = threading.Thread(target=self._sample_canary, name="cpu-canary", daemon=True)
        self._canary_thread.start()
        self.t0 = time.monotonic()
        self.m0 = _machine_ticks()
        self.p0 = {name: _proc_cpu_s(pid) for name, pid in pids.items()}
        self.c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.s0 = resource.getrusage(resource.RUSAGE_SELF)

    def _sample_canary(self) -> None:
        while True:
            self.canary.append((time.monotonic(), cpu_canary_ms()))
            if self._canary_stop.wait(1.0):
                return

    def stop(self) -> dict[str, float]:
        """Figures since construction."""
        wall = time.monotonic() - self.t0
        self._canary_stop.set()
        self._canary_thread.join(5)
        m1 = _machine_ticks()
        d = [b - a for a, b in zip(self.m0, m1, strict=True)]
        total = sum(d) or 1
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s1 = resource.getrusage(resource.RUSAGE_SELF)
        out = {
            "wall_s": round(wall, 2),
            "machine_busy_pct": round(100 * (total - d[3] - d[4]) / total, 1),
            "machine_system_pct": round(100 * (d[2] + d[5] + d[6]) / total, 1),
            "iowait_pct": round(100 * d[4] / total, 1),
            "steal_pct": round(100 * d[7] / total, 1),
        }
        for name, pid in self.pids.items():
            out[f"{name}_cpu_pct"] = round(100 * (_proc_cpu_s(pid) - self.p0[name]) / wall, 1)
        wrk = (c1.ru_utime - self.c0.ru_utime) + (c1.ru_stime - self.c0.ru_stime)
        me = (s1.ru_utime - self.s0.ru_utime) + (s1.ru_stime - self.s0.ru_stime)
        out["wrk_cpu_pct"] = round(100 * wrk / wall, 1)
        out["bench_cpu_pct"] = round(100 * me / wall, 1)
        # CPU of everything else: kernel threads working for us (jbd2 journal commits,
        # ext4 workers, softirq) and any other process (which would disturb the figures).
        ours = sum(v for k, v in out.items() if k.endswith("_cpu_pct"))
        busy_cores_pct = (total - d[3] - d[4]) / total * 100 * len(os.sched_getaffinity(0))
        out["other_cpu_pct"] = round(max(0.0, busy_cores_pct - ours), 1)
        if self.canary:  # its own CPU (~1 ms a second) counts in bench_cpu_pct
            out["cpu_canary_ms"] = round(statistics.median(c for _, c in self.canary), 3)
        return out


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


# -- machine -------------------------------------------------------------------


def _mount_of(path: Path) -> dict[str, str]:
    """Mount point, filesystem type, device and options of ``path`` (from /proc/self/mountinfo)."""
    best: dict[str, str] = {}
    real = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 2:
            continue
        mnt = fields[4].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best.get("mount_point", "")):
            best = {"mount_point": mnt, "fstype": rfields[0], "device": rfields[1], "options": fields[5]}
    return best


def machine_info(root: Path, wrk: str | None) -> dict[str, Any]:
    """What the figures were measured on."""
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    wrk_version = ""
    if wrk:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10)
            wrk_version = (out.stdout + out.stderr).splitlines()[0].strip()
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "-C", str(REPO_DIR), "describe", "--always", "--dirty"], capture_output=True, text=True
        )
        commit = out.stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "root_filesystem": _mount_of(root),
        "wrk": wrk_version,
        "mq_commit": commit,
    }


# -- wrk -----------------------------------------------------------------------


def ensure_wrk(install: bool) -> str:
    """Path of wrk; installs the Debian package when missing (root + apt-get) unless told not to.

    Raises:
        SystemExit: wrk is missing and could not be installed.
    """
    found = shutil.which("wrk")
    if found:
        return found
    if install and os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk not found: apt-get install -y wrk")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        done = subprocess.run(["apt-get", "install", "-y", "wrk"], stdout=sys.stderr, env=env, check=False)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update"], stdout=sys.stderr, env=env, check=False)
            subprocess.run(["apt-get", "install", "-y", "wrk"], stdout=sys.stderr, env=env, check=False)
        found = shutil.which("wrk")
        if found:
            return found
    raise SystemExit(
        "bench: wrk is required (the load generator). Install it with: sudo apt-get install -y wrk "
        "(Debian/Ubuntu), or build it from https://github.com/wg/wrk and put it on PATH."
    )


@dataclass
class WrkRun:
    """What one wrk run reported (from the MQBENCH_JSON line of bench/lua/mqbench.lua)."""

    duration_s: float
    requests: int
    latency_us: dict[str, float]
    errors: dict[str, int]
    counts: dict[str, int]
    raw: dict[str, Any] = field(repr=False)

    def rate(self, key: str) -> float:
        """``counts[key]`` per second of the run."""
        return self.counts.get(key, 0) / self.duration_s if self.duration_s > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        """Request latency percentiles, in milliseconds."""
        lat = self.latency_us
        return {k: round(float(lat.get(k, 0)) / 1000.0, 3) for k in ("p50", "p90", "p99", "p999", "max")}

    def latency_by_method_ms(self) -> dict[str, dict[str, float]]:
        """p50/p90/p99 per HTTP method, in ms, from the scripts' own 5%-wide histograms.

        Only meaningful with one connection per wrk thread (receive+delete and
        cycle runs); wrk's own figures (:meth:`latency_ms`) mix all methods.
        """
        per = self.raw.get("per_method_latency_us") or {}
        return {
            method: {
                "count": int(h.get("count", 0)),
                **{k: round(h.get(k, 0) / 1000.0, 3) for k in ("p50", "p90", "p99", "p999", "max") if k in h},
            }
            for method, h in sorted(per.items())
        }

    def statuses(self) -> dict[str, int]:
        """Responses per ``<method>_<status>``."""
        return {k: v for k, v in sorted(self.counts.items()) if re.fullmatch(r"[a-z]+_[0-9]{3}", k)}


class Wrk:
    """Runs wrk with one of the bench/lua scripts against one server.

    Args:
        exe: Path of the wrk binary.
        url: Base URL of mq, e.g. ``http://127.0.0.1:8080``.
        log_dir: Where each run's raw wrk output is kept.
    """

    def __init__(self, exe: str, url: str, log_dir: Path) -> None:
        self.exe, self.url, self.log_dir = exe, url.rstrip("/"), log_dir
        self._n = 0

    def _cmd(self, script: str, clients: int, threads: int, duration: str) -> list[str]:
        return [
            self.exe,
            f"-t{threads}",
            f"-c{clients}",
            f"-d{duration}",
            "--timeout",
            "30s",
            "--latency",
            "-s",
            str(LUA_DIR / script),
            self.url + "/",
        ]

    def start(
        self, script: str, *, clients: int, threads: int | None, queue: str, quota: int = 0, batch: int = BATCH_SIZE
    ) -> subprocess.Popen[str]:
        """Start wrk for a long run (24 h); stop it with :meth:`finish`."""
        return self._popen(script, clients, threads, queue, quota, "24h", batch, BODY_BYTES)

    def run(
        self,
        script: str,
        *,
        clients: int,
        threads: int | None,
        queue: str,
        duration_s: float,
        batch: int = BATCH_SIZE,
        body_bytes: int = BODY_BYTES,
    ) -> WrkRun:
        """Run wrk for ``duration_s`` seconds (rounded up to whole seconds) and return its report.

        ``body_bytes``: size of each message body (default 1 KiB; the large-body step sends 64 KiB and 1 MiB).
        """
        seconds = max(1, math.ceil(duration_s))
        proc = self._popen(script, clients, threads, queue, 0, f"{seconds}s", batch, body_bytes)
        try:
            out, err = proc.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"wrk did not finish: {err[-2000:]}") from None
        return self._parse(proc, out, err)

    def finish(self, proc: subprocess.Popen[str]) -> WrkRun:
        """Stop a wrk started with :meth:`start` (SIGINT: it prints its summary) and return its report."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return self._parse(proc, out, err)

    def _popen(
        self,
        script: str,
        clients: int,
        threads: int | None,
        queue: str,
        quota: int,
        duration: str,
        batch: int,
        body_bytes: int,
    ) -> subprocess.Popen[str]:
        threads = clients if threads is None else min(threads, clients)
        env = dict(
            os.environ,
            MQB_QUEUE=queue,
            MQB_BODY_BYTES=str(body_bytes),
            MQB_QUOTA=str(quota),
            MQB_THREADS=str(threads),
            MQB_BATCH=str(batch),
        )
        cmd = self._cmd(script, clients, threads, duration)
        self._n += 1
        self._last_cmd = cmd
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def _parse(self, proc: subprocess.Popen[str], out: str, err: str) -> WrkRun:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / f"wrk-{self._n:02d}.txt").write_text(
            " ".join(str(a) for a in proc.args) + "\n--- stdout\n" + out + "--- stderr\n" + err  # type: ignore[union-attr]
        )
        for line in out.splitlines():
            if line.startswith("MQBENCH_JSON "):
                data = json.loads(line[len("MQBENCH_JSON ") :])
                return WrkRun(
                    duration_s=data["duration_us"] / 1e6,
                    requests=int(data["requests"]),
                    latency_us=data["latency_us"],
                    errors={k: int(v) for k, v in (data.get("errors") or {}).items()},
                    counts={k: int(v) for k, v in (data.get("counts") or {}).items()},
                    raw=data,
                )
        raise RuntimeError(f"wrk exited {proc.returncode} without a report: {out[-1500:]} {err[-1500:]}")


# -- the server ----------------------------------------------------------------


class Api:
    """Tiny blocking HTTP client for set-up and depth polling (not for load).

    ``timeout_s``: socket timeout of each request, in seconds.
    """

    def __init__(self, url: str, timeout_s: float = 60) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request, reconnecting once if the kept-alive connection was closed."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
                self._conn.request(method, path, body=body, headers=headers)
                resp = self._conn.getresponse()
                data = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def create_queue(self, queue: str) -> None:
        status, _, body = self.request("PUT", f"/{queue}")
        if status not in (200, 201):
            raise RuntimeError(f"PUT /{queue} answered {status}: {body[:200]!r}")

    def delete_queue(self, queue: str) -> None:
        self.request("DELETE", f"/{queue}")

    def depth(self, queue: str) -> int:
        """Ready messages of ``queue`` (GET /<queue>, "ready")."""
        status, _, body = self.request("GET", f"/{queue}")
        if status != 200:
            raise RuntimeError(f"GET /{queue} answered {status}: {body[:200]!r}")
        return int(json.loads(body)["ready"])

    def send(self, queue: str, body: bytes) -> None:
        status, _, data = self.request("POST", f"/{queue}/messages", body)
        if status != 201:
            raise RuntimeError(f"POST /{queue}/messages answered {status}: {data[:200]!r}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class Daemons:
    """mq, mq-mover and mq-reaper as subprocesses on one root; logs in ``log_dir``.

    MQ_* variables of the caller's environment are not passed on, so a run is
    configured only by its command line (recorded in the JSON).
    """

    def __init__(
        self, root: Path, log_dir: Path, workers: int | None, extra_mq_args: list[str], tree: Path | None = None
    ) -> None:
        self.root, self.log_dir = root, log_dir
        self.workers, self.extra = workers, extra_mq_args
        #: The source tree the daemons run (their working directory; on ``PYTHONPATH`` if given): :func:`mq_tree`.
        self.tree = tree
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.exit_codes: dict[str, int | None] = {}
        #: Seconds from each daemon's spawn to its readiness line (the last start).
        self.start_s: dict[str, float] = {}
        #: time.monotonic() of each daemon's last spawn.
        self.spawned_at: dict[str, float] = {}
        self._log_offset: dict[str, int] = {}

    @staticmethod
    def _exe(name: str) -> str:
        local = Path(sys.executable).parent / name
        if local.exists():
            return str(local)
        found = shutil.which(name)
        if not found:
            raise SystemExit(f"bench: console script {name!r} not found (pip install -e . in the venv)")
        return found

    def _spawn(self, name: str, args: list[str]) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        tree = self.tree or mq_tree(env.get("PYTHONPATH", ""))
        cmd = [self._exe(name), *args]
        log(f"starting {' '.join(cmd)}")
        # Appended, so a restart (the start-up step) keeps the first run's log; readiness is
        # looked for only after this offset.
        self._log_offset[name] = path.stat().st_size if path.exists() else 0
        with open(path, "ab") as fh:
            self.spawned_at[name] = time.monotonic()
            self.procs[name] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tree)
        return path

    def _wait_for(self, name: str, path: Path, pattern: re.Pattern[str] | str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        offset = self._log_offset.get(name, 0)
        while time.monotonic() < deadline:
            with open(path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
            m = pattern.search(text) if isinstance(pattern, re.Pattern) else (pattern if pattern in text else None)
            if m:
                self.start_s[name] = round(time.monotonic() - self.spawned_at[name], 3)
                return m.group(1) if isinstance(m, re.Match) else m
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited {self.procs[name].returncode} before ready:\n{text[-3000:]}")
            time.sleep(0.01)
        raise RuntimeError(f"{name} not ready after {timeout_s} s:\n{path.read_text(errors='replace')[-3000:]}")

    def start(self) -> str:
        """Start the three daemons and return mq's URL (from its readiness line)."""
        self.start_mq()
        self.start_helpers()
        log(f"mq ready at {self.url}")
        return self.url

    def start_mq(self, port: int = 0) -> str:
        """Start mq alone (``--port 0`` picks a free port; a restart passes the old one) and return its URL."""
        mq_args = ["--root", str(self.root), "--address", "127.0.0.1", "--port", str(port)]
        if self.workers is not None:
            mq_args += ["--workers", str(self.workers)]
        mq_log = self._spawn("mq", mq_args + self.extra)
        self.url = self._wait_for("mq", mq_log, READY_MQ)
        return self.url

    def start_helpers(self) -> None:
        """Start mq-mover and mq-reaper and wait until both are ready (times in :attr:`start_s`)."""
        self.spawn_helpers()
        self.wait_helpers()

    def spawn_helpers(self) -> None:
        """Spawn mq-mover and mq-reaper without waiting (:meth:`wait_helpers` waits)."""
        self._spawn("mq-mover", ["--root", str(self.root)])
        self._spawn("mq-reaper", ["--root", str(self.root)])

    def wait_helpers(self) -> None:
        """Wait until mq-mover and mq-reaper, spawned by :meth:`spawn_helpers`, logged their readiness."""
        self._wait_for("mq-mover", self.log_dir / "mq-mover.log", READY_MOVER)
        self._wait_for("mq-reaper", self.log_dir / "mq-reaper.log", READY_REAPER)

    def stop(self) -> dict[str, int | None]:
        """SIGTERM all three; return their exit codes (None if they had to be killed)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                self.exit_codes[name] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.exit_codes[name] = None
        return self.exit_codes

    def pids(self) -> dict[str, int]:
        """Process ids by short name (mq, mover, reaper)."""
        return {name.removeprefix("mq-"): proc.pid for name, proc in self.procs.items()}

    def check_alive(self) -> None:
        """Raise if a daemon died during the run."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited {proc.returncode} during the benchmark:\n{tail}")


# -- steps ---------------------------------------------------------------------


@dataclass
class Config:
    """Knobs of one run (recorded in the JSON)."""

    duration_s: float
    depth: int
    shallow_depth: int
    disk_threads: int
    send_clients: list[int]
    recv_clients: list[int]
    drain_clients: int
    drain: bool
    prefill_clients: int
    drain_timeout_s: float
    batch_size: int = BATCH_SIZE
    batch_send_clients: list[int] = field(default_factory=lambda: [1, 16, 64])
    batch_recv_clients: list[int] = field(default_factory=lambda: [1, 16])


class Bench:
    """The measurements, one method per step; results collect in :attr:`out`."""

    def __init__(self, cfg: Config, api: Api, wrk: Wrk, queues: dict[str, str], daemons: Daemons | None) -> None:
        self.cfg, self.api, self.wrk, self.q, self.daemons = cfg, api, wrk, queues, daemons
        self.out: dict[str, Any] = {}

    def _alive(self) -> None:
        if self.daemons is not None:
            self.daemons.check_alive()

    def _meter(self) -> CpuMeter:
        return CpuMeter(self.daemons.pids() if self.daemons is not None else {})

    @staticmethod
    def _cpu(meter: CpuMeter, ops: int) -> dict[str, float]:
        """CPU figures of a step, plus mq's CPU milliseconds per operation (request or cycle)."""
        cpu = meter.stop()
        if "mq_cpu_pct" in cpu and ops:
            cpu["mq_cpu_ms_per_op"] = round(cpu["mq_cpu_pct"] / 100 * cpu["wall_s"] * 1000 / ops, 3)
            cpu["daemons_cpu_ms_per_op"] = daemons_cpu_ms(cpu, ops)
        return cpu

    def sends(self) -> dict[str, Any]:
        """Durable sends/s and latency at each client count (wrk POST, 2 threads at most), one window each."""
        return {f"clients_{n}": self.send_window(n, self.cfg.duration_s) for n in self.cfg.send_clients}

    def send_window(self, clients: int, duration_s: float) -> dict[str, Any]:
        """One window of durable sends at ``clients`` connections (whole seconds); its JSON row."""
        log(f"sends: {clients} client(s) for {duration_s:g} s")
        before = self._fsync_rounds()
        meter = self._meter()
        run = self.wrk.run("post.lua", clients=clients, threads=2, queue=self.q["send"], duration_s=duration_s)
        cpu = self._cpu(meter, run.counts.get("sent", 0))
        rounds = self._fsync_rounds()
        self._alive()
        row = {
            "sends_per_s": round(run.rate("sent"), 1),
            "latency_ms": run.latency_ms(),
            "sent": run.counts.get("sent", 0),
            "duration_s": round(run.duration_s, 3),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "cpu": cpu,
            "sends_per_round": {
                kind: round(run.counts.get("sent", 0) / (rounds[kind] - before[kind]), 1)
                for kind in rounds
                if rounds[kind] > before.get(kind, 0)
            },
        }
        log(
            f"  {row['sends_per_s']} sends/s, p50 {run.latency_ms()['p50']} ms, "
            f"p99 {run.latency_ms()['p99']} ms, sends per round {row['sends_per_round']}"
        )
        return row

    def _fsync_rounds(self) -> dict[str, float]:
        """mq's fsync counts so far by kind (``file``, ``directory``, ``syncfs``: one a round), from ``GET /metrics``.

        Read around a step (not inside it): the sends per ``syncfs`` round and per directory fsync
        say how full the group commits were (an empty dict if the scrape fails).
        """
        body = self._metrics_body()
        found = re.findall(rb'^mq_storage_fsync_duration_seconds_count\{kind="(\w+)"\} (\S+)$', body, re.M)
        return {kind.decode(): float(count) for kind, count in found}

    def _metrics_body(self) -> bytes:
        """One ``GET /metrics``'s body (empty if the scrape fails)."""
        try:
            status, _, body = self.api.request("GET", "/metrics")
        except (OSError, http.client.HTTPException):
            return b""
        return body if status == 200 else b""

    def _gc_reading(self) -> dict[str, float]:
        """mq's garbage collections and seconds inside them so far, by generation (``collections_2``,
        ``pause_s_2``, ...), from one ``GET /metrics`` (an empty dict if it fails). Read between runs."""
        body = self._metrics_body()
        out = {}
        for name, key in ((b"python_gc_collections_total", "collections"), (b"mq_gc_pause_seconds_total", "pause_s")):
            for generation, value in re.findall(rb"^" + name + rb'\{generation="(\d)"\} (\S+)$', body, re.M):
                out[f"{key}_{generation.decode()}"] = float(value)
        return out

    def metrics_cost(self, clients: int = 64, pairs: int = 4, window_run_s: float = 60) -> dict[str, Any]:
        """Sends/s at ``clients`` without and with a ``GET /metrics`` every second (issue 15): three figures.

        - ``cost_windows`` (the bar's figure since stop 28): one send run of ``window_run_s`` seconds,
          a scrape a second in every other 2-s window; 1 - the median of each scraped window's sends
          over the mean of its unscraped neighbours' (:func:`bench.scrape_windows.scrape_windows`).
          Neighbouring windows are seconds apart, so the CPU's speed, which moves 1.2-1.5x between
          10-s runs on this VM, weighs on both alike.
        - ``cost`` (the bar's figure until stop 27, kept): ``pairs`` 10-s runs of each, in the order
          without/with, with/without, ...; 1 - median(with) / median(without). The runs of one variant
          spread 10-20 %, so one step's figure moved from -0.05 to +0.11 for the same code (stop 28).
        - ``cost_cpu``: mq's CPU milliseconds per scrape (:meth:`_idle_scrapes`; the loop's CPU per
          scrape under load was measured equal, stop 28) over the 1,000 ms of one core a second: what a
          scrape a second takes from the one core mq's Python runs on, without knock-on effects.

        Each run's CPU figures (mq, wrk, the bench and its scraper, machine busy, the CPU probe) and mq's
        garbage collections are in ``runs``. One scrape before the pairs is not counted (:meth:`_warmup_scrape`).
        """
        rates: dict[str, list[float]] = {"without": [], "with": []}
        cpu_ms: dict[str, list[float]] = {"without": [], "with": []}
        runs: list[dict[str, Any]] = []
        scrapes: list[float] = []
        scraper_cpu: list[float] = []
        scrape_bytes: list[int] = []
        warmup = self._warmup_scrape()
        gc_before = self._gc_reading()
        for i in range(pairs):
            for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
                log(f"metrics: sends at {clients} clients {mode} a scrape every second, {self.cfg.duration_s:g} s")
                stop = threading.Event()
                scraper = threading.Thread(
                    target=self._scrape_every_second, args=(stop, scrapes, scraper_cpu, scrape_bytes), daemon=True
                )
                if mode == "with":
                    scraper.start()
                meter = self._meter()
                run = self.wrk.run(
                    "post.lua", clients=clients, threads=2, queue=self.q["send"], duration_s=self.cfg.duration_s
                )
                cpu = self._cpu(meter, run.counts.get("sent", 0))
                stop.set()
                if mode == "with":
                    scraper.join()
                self._alive()
                gc_after = self._gc_reading()
                rates[mode].append(round(run.rate("sent"), 1))
                cpu_ms[mode].append(cpu.get("mq_cpu_ms_per_op", 0.0))
                runs.append(
                    {
                        "mode": mode,
                        "sends_per_s": rates[mode][-1],
                        **{k: cpu.get(k) for k in RUN_CPU_KEYS},
                        "gc": {k: round(v - gc_before.get(k, 0.0), 4) for k, v in gc_after.items()},
                    }
                )
                gc_before = gc_after
                log(
                    f"  {rates[mode][-1]} sends/s, mq CPU {cpu_ms[mode][-1]} ms per send, machine busy "
                    f"{cpu.get('machine_busy_pct')} %, bench {cpu.get('bench_cpu_pct')} %, "
                    f"probe {cpu.get('cpu_canary_ms')} ms"
                )
        without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
        log(f"metrics: sends at {clients} clients for {window_run_s:g} s, a scrape a second in every other 2-s window")
        api = Api(f"http://{self.api.host}:{self.api.port}")
        windows = scrape_windows(self.wrk, api, self._meter(), self.q["send"], clients, window_run_s)
        self._alive()
        log(f"  cost {windows['cost']} (windows), {1 - with_ / without if without else None} (runs)")
        idle = self._idle_scrapes()
        scrape_cpu = idle["idle_scrape_mq_cpu_ms"]
        return {
            "cost_cpu": round(scrape_cpu / 1000, 4) if scrape_cpu is not None else None,
            "clients": clients,
            "sends_per_s_without": rates["without"],
            "sends_per_s_with_scrape": rates["with"],
            "cost": round(1 - with_ / without, 4) if without else None,
            "cost_windows": windows["cost"],
            "windows": windows,
            "mq_cpu_ms_per_send_without": cpu_ms["without"],
            "mq_cpu_ms_per_send_with_scrape": cpu_ms["with"],
            "scrapes": len(scrapes),
            "scrape_ms_median": round(statistics.median(scrapes) * 1000, 1) if scrapes else None,
            "scraper_cpu_ms_median": round(statistics.median(scraper_cpu) * 1000, 2) if scraper_cpu else None,
            "scrape_bytes_median": statistics.median(scrape_bytes) if scrape_bytes else None,
            "runs": runs,
            **warmup,
            **idle,
        }

    def _warmup_scrape(self) -> dict[str, Any]:
        """One scrape before the pairs, not counted in them: its ms and mq's CPU ms.

        A Prometheus scrapes a target every 15 s (its default) for as long as the target lives, so
        the pairs measure the steady state. The first scrape after mq indexed the step's 10,000 new
        queues builds every queue's row and lines (0.45-0.57 s of mq's loop in stop 25); inside the
        first counted run it weighed on one sample of four (docs/performance.md, stop 26).
        """
        api = Api(f"http://{self.api.host}:{self.api.port}")
        try:
            meter = self._meter()
            started = time.perf_counter()
            status, _, _ = api.request("GET", "/metrics")
            if status != 200:
                raise RuntimeError(f"GET /metrics answered {status}")
            seconds = time.perf_counter() - started
            cpu = self._cpu(meter, 1)
        finally:
            api.close()
        log(f"metrics: warm-up scrape (not counted) {seconds * 1000:.0f} ms, mq CPU {cpu.get('mq_cpu_ms_per_op')} ms")
        return {"warmup_scrape_ms": round(seconds * 1000, 1), "warmup_scrape_mq_cpu_ms": cpu.get("mq_cpu_ms_per_op")}

    def _idle_scrapes(self, n: int = 20) -> dict[str, Any]:
        """``n`` scrapes in a row without other load: mq's CPU milliseconds per scrape and the median latency.

        The load-independent figure of the step: at one scrape a second, mq spends this many ms of CPU a second
        on scrapes (a share of the sends it could have served instead).
        """
        api = Api(f"http://{self.api.host}:{self.api.port}")
        seconds: list[float] = []
        try:
            api.request("GET", "/metrics")  # not counted: the first scrape after the sends reads what they changed
            meter = self._meter()
            for _ in range(n):
                started = time.perf_counter()
                status, _, _ = api.request("GET", "/metrics")
                if status != 200:
                    raise RuntimeError(f"GET /metrics answered {status}")
                seconds.append(time.perf_counter() - started)
            cpu = self._cpu(meter, n)
        finally:
            api.close()
        return {
            "idle_scrape_mq_cpu_ms": cpu.get("mq_cpu_ms_per_op"),
            "idle_scrape_ms_median": round(statistics.median(seconds) * 1000, 1),
        }

    def _scrape_every_second(
        self, stop: threading.Event, seconds: list[float], cpu_s: list[float], sizes: list[int]
    ) -> None:
        """Thread: ``GET /metrics`` once a second (own connection) until ``stop``; record each scrape's time (s),
        this thread's CPU for it (s: the scraper's own cost, in the bench's process) and its body's bytes."""
        api = Api(f"http://{self.api.host}:{self.api.port}")
        try:
            while not stop.is_set():
                started, cpu0 = time.perf_counter(), time.thread_time()
                status, _, body = api.request("GET", "/metrics")
                if status != 200:
                    raise RuntimeError(f"GET /metrics answered {status}")
                seconds.append(time.perf_counter() - started)
                cpu_s.append(time.thread_time() - cpu0)
                sizes.append(len(body))
                stop.wait(max(0.0, 1.0 - (time.perf_counter() - started)))
        finally:
            api.close()

    def prefill(self, queue: str, target: int, *, what: str, batch: bool = False) -> dict[str, Any]:
        """Bring ``queue`` to at least ``target`` ready messages with POSTs; return how long it took.

        Large fills use wrk (``prefill_clients`` connections, one per thread,
        each stopping after its exact share; with ``batch``, batch sends of
        ``batch_size`` messages, so a thread may overshoot its share by up to
        ``batch_size - 1``); small ones a plain loop of single sends.
        """
        have = self.api.depth(queue)
        missing = target - have
        t0 = time.monotonic()
        if missing <= 0:
            return {"queue_depth": have, "added": 0, "seconds": 0.0}
        log(f"prefill {what}: {have:,} -> {target:,} messages")
        if missing <= 1000:
            body = os.urandom(BODY_BYTES)
            for _ in range(missing):
                self.api.send(queue, body)
        else:
            per_request = self.cfg.batch_size if batch else 1
            clients = min(self.cfg.prefill_clients, math.ceil(missing / per_request))
            proc = self.wrk.start(
                "post_batch.lua" if batch else "post.lua",
                clients=clients,
                threads=clients,
                queue=queue,
                quota=missing,
                batch=self.cfg.batch_size,
            )
            last_depth, stalled_since = have, time.monotonic()
            report_t, report_depth = t0, have
            try:
                while True:
                    time.sleep(0.5)
                    depth = self.api.depth(queue)
                    now = time.monotonic()
                    if now - report_t >= 5.0:
                        rate = (depth - report_depth) / (now - report_t)
                        log(f"  prefill {what}: {depth:,}/{target:,} ({rate:,.0f}/s)")
                        report_t, report_depth = now, depth
                    if depth >= target:
                        break
                    if depth > last_depth:
                        stalled_since = now
                    elif now - stalled_since > 60:
                        raise RuntimeError(f"prefill of {queue} stalled at {depth}")
                    if proc.poll() is not None:
                        raise RuntimeError(f"wrk exited {proc.returncode} during prefill")
                    self._alive()
                    last_depth = depth
            finally:
                run = self.wrk.finish(proc)
            if run.counts.get("sent", 0) < missing:
                log(f"  warning: wrk saw {run.statuses()} during prefill")
        depth = self.api.depth(queue)
        seconds = time.monotonic() - t0
        log(f"  prefill {what} done: {depth:,} ready in {seconds:.1f} s ({(depth - have) / seconds:,.0f}/s)")
        return {"queue_depth": depth, "added": depth - have, "seconds": round(seconds, 1)}

    def receive_need(self, sends: dict[str, Any], clients: int, duration_s: float) -> int:
        """Ready messages a receive+delete window of ``duration_s`` at ``clients`` cannot run dry on.

        Twice what the sends managed at the same concurrency or more (``sends``: the send step's
        rows) over the window, at least 2,000.
        """
        ref = max((v["sends_per_s"] for k, v in sends.items() if int(k.split("_")[1]) >= clients), default=1000)
        return max(2000, int(2 * ref * duration_s) + 500)

    def receive_delete(self, sends: dict[str, Any]) -> dict[str, Any]:
        """Receive+delete cycles/s at each client count, from the queue the sends filled, one window each."""
        duration = self.cfg.duration_s
        return {
            f"clients_{n}": self.receive_window(n, duration, self.receive_need(sends, n, duration))
            for n in self.cfg.recv_clients
        }

    def receive_window(self, clients: int, duration_s: float, need: int) -> dict[str, Any]:
        """One window of receive+delete cycles at ``clients`` connections; its JSON row.

        The queue is topped up to ``need`` ready messages first (:meth:`receive_need`). If it
        still ran dry (204s), it is topped up to three times what was consumed and the window
        is run once more.
        """
        run, cpu = self._receive_run(clients, duration_s, need)
        empty = run.counts.get("empty", 0)
        if empty:
            need = max(need, 3 * run.counts.get("received", 0) + 1000)
            log(f"  queue ran dry ({empty} empty receives): topping up to {need:,} and running again")
            run, cpu = self._receive_run(clients, duration_s, need)
            empty = run.counts.get("empty", 0)
        row = {
            "cycles_per_s": round(run.rate("cycles"), 1),
            "requests_per_s": round(run.requests / run.duration_s, 1),
            "latency_ms": run.latency_ms(),
            "latency_by_method_ms": run.latency_by_method_ms(),
            "cycles": run.counts.get("cycles", 0),
            "empty_receives": empty,
            "duration_s": round(run.duration_s, 3),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "cpu": cpu,
        }
        log(f"  {row['cycles_per_s']} receive+delete/s, p50 {run.latency_ms()['p50']} ms per request")
        return row

    def _receive_run(self, clients: int, duration_s: float, need: int) -> tuple[WrkRun, dict[str, float]]:
        """Top the send queue up to ``need``, then run wrk's receive+delete; its report and CPU figures."""
        self.prefill(self.q["send"], need, what=f"receive+delete at {clients}")
        log(f"receive+delete: {clients} client(s) for {duration_s:g} s")
        meter = self._meter()
        run = self.wrk.run(
            "recv_delete.lua", clients=clients, threads=None, queue=self.q["send"], duration_s=duration_s
        )
        cpu = self._cpu(meter, run.counts.get("cycles", 0))
        self._alive()
        return run, cpu

    def batch_sends(self, sends: dict[str, Any]) -> dict[str, Any]:
        """Batch sends: messages/s at each client count (wrk POST /<q>/messages/batch, 2 threads at most).

        ``sends`` (the single-send results of the same run) gives each row its
        single-message rate and the ratio.
        """
        res: dict[str, Any] = {}
        size = self.cfg.batch_size
        for clients in self.cfg.batch_send_clients:
            log(f"batch sends: {clients} client(s), {size} messages per request, for {self.cfg.duration_s:g} s")
            meter = self._meter()
            run = self.wrk.run(
                "post_batch.lua",
                clients=clients,
                threads=2,
                queue=self.q["batch"],
                duration_s=self.cfg.duration_s,
                batch=size,
            )
            sent = run.counts.get("sent", 0)
            cpu = self._cpu(meter, run.counts.get("batches", 0))
            if "mq_cpu_pct" in cpu and sent:
                cpu["mq_cpu_ms_per_message"] = round(cpu["mq_cpu_pct"] / 100 * cpu["wall_s"] * 1000 / sent, 3)
                cpu["daemons_cpu_ms_per_message"] = daemons_cpu_ms(cpu, sent)
            self._alive()
            single = sends.get(f"clients_{clients}", {}).get("sends_per_s")
            row = {
                "messages_per_s": round(run.rate("sent"), 1),
                "requests_per_s": round(run.rate("batches"), 1),
                "messages_per_request": size,
                "single_sends_per_s": single,
                "batch_over_single": _ratio(run.rate("sent"), single or 0.0),
                "latency_ms": run.latency_ms(),
                "sent": sent,
                "failed_entries": run.counts.get("failed_entries", 0),
                "duration_s": round(run.duration_s, 3),
                "statuses": run.statuses(),
                "socket_errors": run.errors,
                "cpu": cpu,
            }
            res[f"clients_{clients}"] = row
            log(
                f"  {row['messages_per_s']} messages/s ({row['requests_per_s']} batches/s; single: {single}), "
                f"p50 {row['latency_ms']['p50']} ms, p99 {row['latency_ms']['p99']} ms per request"
            )
        return res

    def batch_receive_delete(self, batch_sends: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
        """Batch receive + batch delete: messages/s at each client count.

        One wrk connection per thread alternates ``GET /<q>/messages?max_messages=N``
        and ``POST /<q>/messages/delete`` with the receipt handles it got. The
        queue is topped up first (with batch sends) so it cannot run dry; a run
        that saw empty receives is repeated once on a fuller queue. ``single``
        (the single receive+delete results of the same run) gives the ratio.
        """
        res: dict[str, Any] = {}
        queue = self.q["batch"]
        size = self.cfg.batch_size
        for clients in self.cfg.batch_recv_clients:
            ref = max(
                (v["messages_per_s"] for k, v in batch_sends.items() if int(k.split("_")[1]) >= clients),
                default=5000,
            )
            need = max(5000, int(2 * ref * self.cfg.duration_s) + 500)
            for attempt in (1, 2):
                self.prefill(queue, need, what=f"batch receive+delete at {clients}", batch=True)
                log(f"batch receive+delete: {clients} client(s), up to {size} per receive, {self.cfg.duration_s:g} s")
                meter = self._meter()
                run = self.wrk.run(
                    "recv_delete_batch.lua",
                    clients=clients,
                    threads=None,
                    queue=queue,
                    duration_s=self.cfg.duration_s,
                    batch=size,
                )
                cycles = run.counts.get("cycles", 0)
                cpu = self._cpu(meter, run.counts.get("receives", 0) + run.counts.get("deletes", 0))
                if "mq_cpu_pct" in cpu and cycles:
                    cpu["mq_cpu_ms_per_message"] = round(cpu["mq_cpu_pct"] / 100 * cpu["wall_s"] * 1000 / cycles, 3)
                    cpu["daemons_cpu_ms_per_message"] = daemons_cpu_ms(cpu, cycles)
                self._alive()
                empty = run.counts.get("empty", 0)
                if empty == 0 or attempt == 2:
                    break
                need = max(need, 3 * run.counts.get("received", 0) + 5000)
                log(f"  queue ran dry ({empty} empty receives): topping up to {need:,} and running again")
            single_rate = single.get(f"clients_{clients}", {}).get("cycles_per_s")
            receives = run.counts.get("receives", 0)
            row = {
                "messages_per_s": round(run.rate("cycles"), 1),
                "requests_per_s": round(run.requests / run.duration_s, 1) if run.duration_s else 0.0,
                "single_receive_delete_per_s": single_rate,
                "batch_over_single": _ratio(run.rate("cycles"), single_rate or 0.0),
                "messages_per_receive": round(run.counts.get("received", 0) / receives, 2) if receives else None,
                "latency_ms": run.latency_ms(),
                "latency_by_method_ms": run.latency_by_method_ms(),
                "messages": cycles,
                "received": run.counts.get("received", 0),
                "empty_receives": empty,
                "short_batches": run.counts.get("short_batches", 0),
                "failed_entries": run.counts.get("failed_entries", 0),
                "duration_s": round(run.duration_s, 3),
                "statuses": run.statuses(),
                "socket_errors": run.errors,
                "cpu": cpu,
            }
            res[f"clients_{clients}"] = row
            log(
                f"  {row['messages_per_s']} messages/s received+deleted (single: {single_rate}), "
                f"{row['messages_per_receive']} per receive"
            )
        return res

    def cycles(self, queue: str, depth: int, label: str) -> dict[str, Any]:
        """One client's send->receive->delete cycles/s on ``queue`` held at ``depth``."""
        fill = self.prefill(queue, depth, what=f"{label} queue")
        start_depth = self.api.depth(queue)
        log(f"cycles: 1 client on the {label} queue ({start_depth:,} ready) for {self.cfg.duration_s:g} s")
        meter = self._meter()
        run = self.wrk.run("cycle.lua", clients=1, threads=1, queue=queue, duration_s=self.cfg.duration_s)
        cpu = self._cpu(meter, run.counts.get("cycles", 0))
        self._alive()
        res = {
            "depth": start_depth,
            "cycles_per_s": round(run.rate("cycles"), 1),
            "latency_ms": run.latency_ms(),
            "latency_by_method_ms": run.latency_by_method_ms(),
            "cycles": run.counts.get("cycles", 0),
            "empty_receives": run.counts.get("empty", 0),
            "duration_s": round(run.duration_s, 3),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "cpu": cpu,
            "prefill": fill,
        }
        log(f"  {res['cycles_per_s']} cycles/s at depth {start_depth:,}, p50 {run.latency_ms()['p50']} ms per request")
        return res

    def drain(self, queue: str) -> dict[str, Any]:
        """Receive+delete ``queue`` to empty; report the rate of each tenth of the drain.

        The depth (GET /<queue>) is polled every 0.2 s; the moment each tenth
        was crossed is interpolated between polls.
        """
        clients = self.cfg.drain_clients
        start_depth = self.api.depth(queue)
        log(f"drain: {start_depth:,} messages with {clients} clients")
        samples: list[tuple[float, int]] = [(0.0, start_depth)]
        t0, wall0 = time.monotonic(), time.time()
        meter = self._meter()
        proc = self.wrk.start("recv_delete.lua", clients=clients, threads=None, queue=queue)
        next_report = 5.0
        timed_out = False
        try:
            while True:
                time.sleep(0.2)
                depth = self.api.depth(queue)
                now = time.monotonic() - t0
                samples.append((now, depth))
                if depth == 0:
                    break
                if now >= next_report:
                    log(f"  drain: {depth:,} left after {now:.0f} s")
                    next_report += 5.0
                if now > self.cfg.drain_timeout_s:
                    log(f"  drain: stopping after {now:.0f} s with {depth:,} left (--drain-timeout)")
                    timed_out = True
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"wrk exited {proc.returncode} during the drain")
                self._alive()
        finally:
            run = self.wrk.finish(proc)
        cpu = self._cpu(meter, run.counts.get("cycles", 0))
        canary = [(t - t0, c) for t, c in meter.canary]  # (seconds into the drain, canary_ms), one a second
        end_t, end_depth = samples[-1]
        tenths = _tenths(samples, start_depth)
        rates = [r for r in tenths if r is not None]
        res = {
            "clients": clients,
            "depth_start": start_depth,
            "depth_end": end_depth,
            "seconds": round(end_t, 2),
            "mean_per_s": round((start_depth - end_depth) / end_t, 1) if end_t else 0.0,
            "tenths_per_s": tenths,
            "min_over_max_tenth": round(min(rates) / max(rates), 3) if rates else None,
            "last_over_first_tenth": round(rates[-1] / rates[0], 3) if len(rates) >= 2 else None,
            "timed_out": timed_out,
            "cycles_by_wrk": run.counts.get("cycles", 0),
            "latency_ms": run.latency_ms(),
            "latency_by_method_ms": run.latency_by_method_ms(),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "cpu": cpu,
            "per_second": _per_second(samples),
            "wall_start": round(wall0, 3),
            # Seconds (from the drain's start) in which requests took >= 200 ms, or receives answered 204.
            "slow_at_s": _events_at(run.counts, "slow_", wall0),
            "empty_at_s": _events_at(run.counts, "empty_", wall0),
            **_canary_figures(canary, samples, start_depth, tenths),
        }
        log(f"  drained {start_depth - end_depth:,} in {end_t:.1f} s; per tenth: {tenths}")
        return res


def _events_at(counts: dict[str, int], prefix: str, wall0: float) -> dict[str, int]:
    """Counts of the wrk script's ``<prefix>..._at_<epoch second>`` keys, keyed by
    ``"<method or event> <whole seconds after wall0>"``, in time order."""
    out: dict[tuple[int, str], int] = {}
    for key, n in counts.items():
        m = re.fullmatch(re.escape(prefix) + r"([a-z_]*?)_?at_([0-9]+)", key)
        if m:
            at = (int(m.group(2)) - int(wall0), m.group(1) or prefix.rstrip("_"))
            out[at] = out.get(at, 0) + n
    return {f"{what} {sec}": n for (sec, what), n in sorted(out.items())}


def _per_second(samples: list[tuple[float, int]]) -> list[int]:
    """Messages drained in each whole second of a drain, from its (seconds, depth) polls.

    Second ``k`` is [k, k+1) after the drain started; a second's figure is the
    fall of the depth between the last polls at or before its two ends. Lets a
    stall (a second or more with few messages) be lined up with vmstat's clock
    through the drain's ``wall_start``.
    """
    out: list[int] = []
    if not samples:
        return out
    last = samples[-1][0]
    i, depth_at = 0, samples[0][1]
    prev = depth_at
    for k in range(1, int(last) + 1):
        while i + 1 < len(samples) and samples[i + 1][0] <= k:
            i += 1
        depth_at = samples[i][1]
        out.append(prev - depth_at)
        prev = depth_at
    return out


#: Iterations of :func:`cpu_canary_ms`'s fixed piece of work (1.0-2.1 ms of CPU on this VM, by how fast its CPUs run).
CANARY_ITERATIONS = 20_000


def cpu_canary_ms() -> float:
    """Thread CPU time (ms) of a fixed piece of pure-Python work, the median of three runs.

    :class:`CpuMeter` runs it once a second during every step: the figure grows when
    the CPUs themselves get slower (another guest on the host's core, its
    caches, frequency), which a VM does not report as steal. Waiting for a CPU
    does not count (``time.thread_time``).
    """
    runs = []
    for _ in range(3):
        t0 = time.thread_time()
        total = 0
        for i in range(CANARY_ITERATIONS):
            total += i * i
        runs.append((time.thread_time() - t0) * 1000)
    return round(sorted(runs)[1], 3)


def _canary_figures(
    canary: list[tuple[float, float]], samples: list[tuple[float, int]], start: int, tenths: list[float | None]
) -> dict[str, Any]:
    """The drain's CPU-speed figures from its (seconds, canary ms) samples.

    Returns ``canary_ms_per_second`` (one a second, from the drain's start),
    ``canary_ms_by_tenth`` (median of each tenth), and
    ``tenths_per_s_at_median_speed``: each tenth's rate times its canary
    over the drain's median canary (what the tenth would have run at if
    the CPUs had kept the drain's median speed, assuming the rate is
    inversely proportional to the CPU time per unit of work: mq is CPU-bound
    in a drain) and the min/max of those. A diagnostic; the bar's figure
    stays ``min_over_max_tenth``.
    """
    if not canary:
        return {}
    median = statistics.median(c for _, c in canary)
    crossings = _crossings(samples, start)
    by_tenth: list[float | None] = []
    for a, b in itertools.pairwise(crossings):
        inside = [c for t, c in canary if a is not None and b is not None and a <= t < b]
        by_tenth.append(round(statistics.median(inside), 3) if inside else None)
    adjusted = [
        round(r * c / median, 1) if r is not None and c is not None and median > 0 else None
        for r, c in zip(tenths, by_tenth, strict=True)
    ]
    rates = [r for r in adjusted if r is not None]
    return {
        "canary_ms_per_second": [c for _, c in canary],
        "canary_ms_by_tenth": by_tenth,
        "tenths_per_s_at_median_speed": adjusted,
        "min_over_max_tenth_at_median_speed": round(min(rates) / max(rates), 3) if len(rates) >= 2 else None,
    }


def _crossings(samples: list[tuple[float, int]], start: int) -> list[float | None]:
    """Seconds at which the drain's depth first fell to ``start * (1 - k/10)``, k = 0..10 (None: never).

    Found by linear interpolation between the two (seconds, depth) polls around each level.
    """
    crossings: list[float | None] = [0.0]
    for k in range(1, 11):
        level = start * (10 - k) / 10
        when = None
        for (t1, d1), (t2, d2) in itertools.pairwise(samples):
            if d1 > level >= d2:
                when = t1 + (t2 - t1) * (d1 - level) / (d1 - d2)
                break
        crossings.append(when)
    return crossings


def _tenths(samples: list[tuple[float, int]], start: int) -> list[float | None]:
    """Rate (messages/s) of each tenth of a drain from (seconds, depth) samples.

    The time at which the depth first fell to ``start * (1 - k/10)`` is found
    by linear interpolation between the two polls around it (:func:`_crossings`);
    a tenth the drain never finished is None.
    """
    if start <= 0:
        return []
    crossings = _crossings(samples, start)
    out: list[float | None] = []
    for a, b in itertools.pairwise(crossings):
        if a is None or b is None or b <= a:
            out.append(None)
        else:
            out.append(round(start / 10 / (b - a), 1))
    return out


# -- main ----------------------------------------------------------------------


def _lock_root(root: Path) -> int:
    """Hold an exclusive lock for ``root`` (``<root>.lock`` beside it) for the whole run.

    Raises:
        SystemExit: Another bench run is using this root.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{root}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(
            f"bench: another run is using {root} (lock {root}.lock); wait or pass another --root"
        ) from None
    return fd


def _prepare_root(root: Path) -> float | None:
    """Make ``root`` a fresh, empty bench directory (only moves aside what the bench created).

    A previous root is renamed to ``ROOT.used-<time>``, not deleted: on ext4 without a journal
    (this project's VM) every create scans the inodes freed in its block group within the last
    60-300 s, so deleting a used root right before measuring made the run's sends slower
    (docs/performance.md, "Recycled message files"). :func:`_delete_used_roots` deletes them
    after the measurements.

    Returns:
        Seconds since the bench last deleted used roots on this path (from ``ROOT.deleted``), or None.
    """
    if root.exists():
        if not (root / MARKER).exists() and any(root.iterdir()):
            raise SystemExit(f"bench: {root} exists and was not made by the bench; pass an empty or new --root")
        aside = root.with_name(f"{root.name}.used-{time.time_ns()}")
        log(f"moving the previous bench root aside to {aside} (deleted after this run's measurements)")
        root.rename(aside)
    root.mkdir(parents=True)
    (root / MARKER).write_text("made by bench/run.py; removed by the next run\n")
    try:
        since = time.time() - float(root.with_name(f"{root.name}.deleted").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if since < EXT4_RECENT_DELETE_S:
        log(
            f"warning: the bench deleted used roots {since:.0f} s ago; on ext4 without a journal, creates "
            f"within {EXT4_RECENT_DELETE_S} s of a mass delete cost more kernel CPU (sends are skewed)"
        )
    return round(since, 1)


def _delete_used_roots(root: Path, *, including_root: bool) -> None:
    """Delete the ``ROOT.used-*`` roots moved aside (and ``root`` itself), noting the time in ``ROOT.deleted``."""
    doomed = sorted(root.parent.glob(f"{root.name}.used-*")) + ([root] if including_root else [])
    if not doomed:
        return
    for path in doomed:
        log(f"removing {path}")
        shutil.rmtree(path, ignore_errors=True)
    root.with_name(f"{root.name}.deleted").write_text(f"{time.time()} deleted {len(doomed)} bench root(s)\n")


def _disk_receive(
    disk_dir: Path,
    duration_s: float,
    args: argparse.Namespace,
    daemons: Daemons | None,
    thread_counts: list[int] | None = None,
) -> dict[str, Any]:
    """The receive+delete disk loop (issue 12 bar 3) alone, one window at each of ``thread_counts``.

    ``thread_counts``: default ``--disk-receive-threads``.
    """
    out: dict[str, Any] = {}
    for threads in args.disk_receive_threads if thread_counts is None else thread_counts:
        log(f"receive+delete disk loop: {threads} thread(s) for {duration_s:g} s in {disk_dir}")
        meter = CpuMeter(daemons.pids() if daemons is not None else {})
        row = receive_delete_loop(disk_dir, threads=threads, duration_s=duration_s, prefill=args.disk_receive_prefill)
        row["cpu"] = meter.stop()
        out[f"threads_{threads}"] = row
        note = " (prefill used up: window ended early)" if row["exhausted"] else ""
        log(f"  {row['msgs_per_s']} msgs/s, p99 {row['latency_ms']['p99']} ms{note}")
    return out


def _loop_window(disk_dir: Path, threads: int, duration_s: float, daemons: Daemons | None) -> dict[str, Any]:
    """One window of the durable-send disk loop (1 KiB) with its CPU figures; its files stay (``keep_files``)."""
    log(f"disk loop: {threads} thread(s) for {duration_s:g} s in {disk_dir}")
    meter = CpuMeter(daemons.pids() if daemons is not None else {})
    # keep_files: its files go with the root after the run, not between the windows it is compared with
    # (journal-less ext4 makes every create scan the inodes freed in the last minutes).
    row = disk_loop(disk_dir, threads=threads, duration_s=duration_s, keep_files=True)
    row["cpu"] = meter.stop()
    log(f"  {row['msgs_per_s']} msgs/s, p99 {row['latency_ms']['p99']} ms")
    return row


def _paired_sends(
    bench: Bench, disk_dir: Path, args: argparse.Namespace, daemons: Daemons | None, result: dict[str, Any]
) -> None:
    """The send step and the disk loop in alternating windows (:mod:`bench.windows`); fills ``result``.

    Sends at 1 client alternate with the 1-thread loop (bars 2 and 5), then the 16-client sends run
    one ``--duration`` window (bar 4's CPU, nothing to compare), then sends at 64 clients alternate
    with the ``--disk-threads`` loop (bar 1): ``--rounds`` rounds of ``--window`` seconds each.
    ``result["sends"]`` and ``result["disk_loop"]`` get one row per client/thread count under the
    old keys (:func:`bench.windows.summary_row`), ``result["pairs"]`` the paired ratios.
    """
    cfg, sends, loops = bench.cfg, {}, {}
    pairs = result.setdefault("pairs", {})
    for clients in cfg.send_clients:
        threads = {1: 1, 64: cfg.disk_threads}.get(clients)
        if threads is None:
            sends[f"clients_{clients}"] = bench.send_window(clients, cfg.duration_s)
            continue
        log(f"sends at {clients} client(s) against the {threads}-thread disk loop, {args.rounds} alternating rounds")
        loop_rows, mq_rows = alternate(
            args.rounds,
            lambda _r, t=threads: _loop_window(disk_dir, t, args.window, daemons),
            lambda _r, c=clients: bench.send_window(c, args.window),
        )
        loops[f"threads_{threads}"] = summary_row(loop_rows, "msgs_per_s")
        sends[f"clients_{clients}"] = summary_row(mq_rows, "sends_per_s")
        pairs[f"sends{clients}"] = paired(loop_rows, mq_rows, loop_rate="msgs_per_s", mq_rate="sends_per_s")
        log(f"  {_pairs_line(pairs[f'sends{clients}'])}")
    result["disk_loop"], result["sends"] = loops, sends


def _pairs_line(pair: dict[str, Any]) -> str:
    ratios = ", ".join(str(r["ratio"]) for r in pair["rounds"])
    p99s = ", ".join(str(r["p99_ratio"]) for r in pair["rounds"])
    return f"per-round ratios {ratios} (median {pair['ratio']}); p99 ratios {p99s} (median {pair['p99_ratio']})"


def _paired_receive(
    bench: Bench, disk_dir: Path, args: argparse.Namespace, daemons: Daemons | None, result: dict[str, Any]
) -> None:
    """Receive+delete at 1 and 16 clients alternating with its disk loop at 1 and 16 threads (bar 3).

    Per client count, mq's queue is first topped up for all ``--rounds`` windows, then the loop's
    directory is prefilled once (``--disk-receive-prefill`` files, then ``sync()``, which also writes
    back mq's top-up), then the windows alternate. Neither side creates a file inside a window and
    both unlink one per message (mq-reaper for mq), so each pays for the other's frees alike. The
    loop's leftover files stay (deleted with the root). Thread counts of ``--disk-receive-threads``
    that no client count matches run alone, as before.
    """
    cfg, sends = bench.cfg, result.get("sends", {})
    disk_rows, mq_rows_out = {}, {}
    pairs = result.setdefault("pairs", {})
    for clients in cfg.recv_clients:
        if clients not in args.disk_receive_threads:
            mq_rows_out[f"clients_{clients}"] = bench.receive_window(
                clients, cfg.duration_s, bench.receive_need(sends, clients, cfg.duration_s)
            )
            continue
        log(f"receive+delete at {clients} client(s) against its disk loop, {args.rounds} alternating rounds")
        bench.prefill(
            bench.q["send"],
            bench.receive_need(sends, clients, args.window * args.rounds),
            what=f"receive+delete at {clients}, all rounds",
        )
        rd = ReceiveDeleteDir(disk_dir, prefill=args.disk_receive_prefill)
        log(f"  receive+delete disk loop: {args.disk_receive_prefill:,} files prefilled in {rd.prefill_s:.1f} s")
        need = bench.receive_need(sends, clients, args.window)
        loop_rows, mq_rows = alternate(
            args.rounds,
            lambda _r, t=clients, d=rd: _receive_loop_window(d, t, args.window, daemons),
            lambda _r, c=clients, n=need: bench.receive_window(c, args.window, n),
        )
        disk_rows[f"threads_{clients}"] = summary_row(loop_rows, "msgs_per_s")
        mq_rows_out[f"clients_{clients}"] = summary_row(mq_rows, "cycles_per_s")
        pairs[f"receive{clients}"] = paired(loop_rows, mq_rows, loop_rate="msgs_per_s", mq_rate="cycles_per_s")
        log(f"  {_pairs_line(pairs[f'receive{clients}'])}")
    for threads in args.disk_receive_threads:
        if f"threads_{threads}" not in disk_rows:
            disk_rows[f"threads_{threads}"] = _disk_receive(disk_dir, cfg.duration_s, args, daemons, [threads])[
                f"threads_{threads}"
            ]
    result["disk_receive_loop"], result["receive_delete"] = disk_rows, mq_rows_out


def _receive_loop_window(
    rd: ReceiveDeleteDir, threads: int, duration_s: float, daemons: Daemons | None
) -> dict[str, Any]:
    """One window of the receive+delete disk loop on ``rd`` with its CPU figures."""
    log(f"receive+delete disk loop: {threads} thread(s) for {duration_s:g} s ({rd.prefill - rd.taken:,} files left)")
    meter = CpuMeter(daemons.pids() if daemons is not None else {})
    row = rd.window(threads, duration_s)
    row["cpu"] = meter.stop()
    note = " (prefill used up: window ended early)" if row["exhausted"] else ""
    log(f"  {row['msgs_per_s']} msgs/s, p99 {row['latency_ms']['p99']} ms{note}")
    return row


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _batches_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Messages/s of single and batch requests side by side, per client count (same run)."""
    out: dict[str, Any] = {}
    pairs = (
        ("sends", "sends", "sends_per_s", "batch_sends"),
        ("receive_delete", "receive_delete", "cycles_per_s", "batch_receive_delete"),
    )
    for label, single_key, single_field, batch_key in pairs:
        single, batch = result.get(single_key, {}), result.get(batch_key, {})
        rows = {}
        for key in sorted(set(single) | set(batch), key=lambda k: int(k.split("_")[1])):
            s = single.get(key, {}).get(single_field)
            b = batch.get(key, {}).get("messages_per_s")
            ratio = _ratio(b, s) if b is not None and s else None
            rows[key] = {"single_msgs_per_s": s, "batch_msgs_per_s": b, "batch_over_single": ratio}
        if rows:
            out[label] = rows
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="mq benchmark (issue 2): prints one JSON object on stdout.")
    p.add_argument("--url", help="measure this running mq (e.g. http://127.0.0.1:8080) instead of starting one")
    p.add_argument(
        "--root",
        default=str(REPO_DIR / "var" / "bench-root"),
        help="bench directory on the disk to measure (default ./var/bench-root); the mq root is ROOT/mq "
        "and the disk loop works in ROOT/diskloop. With --url, give the server's own disk.",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds per measured step (default 10; quick 3)")
    p.add_argument("--depth", type=int, default=None, help="deep queue depth (default 100000; quick 10000)")
    p.add_argument("--shallow-depth", type=int, default=100, help="shallow queue depth (default 100)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="3 s steps, a 10,000-deep queue and small scale steps (each --startup-*, --drain-depth, --scale-*, "
        "--longpoll-* default says its quick size)",
    )
    p.add_argument("--workers", type=int, default=None, help="mq --workers (default: mq's own default)")
    p.add_argument("--mq-arg", action="append", default=[], help="extra argument for mq (repeatable)")
    p.add_argument("--disk-threads", type=int, default=64, help="threads of the disk loop (default 64; 1 also runs)")
    p.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma-separated steps to run (default all: {','.join(STEPS)}); e.g. --steps sends to tune --workers",
    )
    p.add_argument(
        "--disk-receive-threads",
        default="1,16",
        help="threads of the receive+delete disk loop (step disk_receive), comma-separated (default 1,16)",
    )
    p.add_argument(
        "--disk-receive-prefill",
        type=int,
        default=None,
        help="ready files the receive+delete disk loop writes first, per thread count, for all its --rounds "
        "windows (default 120000; quick 20000); if its threads use them up a window ends early ('exhausted')",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"alternating rounds (a disk-loop window and an mq window each) of bars 1, 2, 3, 5 and the large "
        f"bodies; a bar is the median of the per-round ratios (default {DEFAULT_ROUNDS}; bench/windows.py)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="seconds of each alternated window (default 5; quick 2)",
    )
    p.add_argument(
        "--startup-messages",
        type=int,
        default=None,
        help="step startup: ready messages written (directly with mqcore's Store, no HTTP, in parallel) before "
        "mq is restarted and its first receive timed (default 1000000; quick 20000)",
    )
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="step startup: drop the page cache (root only) before restarting mq; default: warm cache",
    )
    p.add_argument(
        "--startup-keep",
        default=None,
        help="step startup: a directory (on the root's filesystem) that keeps the filled queue between runs: "
        "moved in before the step and back after it, so alternating runs skip the 1,000,000-message fill",
    )
    p.add_argument(
        "--drain-depth",
        type=int,
        default=None,
        help="step drain: messages in the drained queue (default 1000000; quick 20000); filled directly like "
        "--startup-messages (the startup step's queue is reused), or with wrk POSTs when measuring --url",
    )
    p.add_argument(
        "--scale-queues",
        type=int,
        default=None,
        help="step queues: queues of the 'many' round (default 10000; quick 1000), against 10 queues",
    )
    p.add_argument("--scale-queue-messages", type=int, default=10, help="step queues: messages per queue (default 10)")
    p.add_argument(
        "--metrics-queues",
        type=int,
        default=None,
        help="step metrics: first fill this many more queues of --scale-queue-messages directly and receive once "
        "on each, so the scrapes see an mq holding them all (default: 10000, issue 12's many-queue case; quick 0)",
    )
    p.add_argument(
        "--scale-samples",
        type=int,
        default=None,
        help="step queues: timed GET / and receives per round (default 500; quick 200)",
    )
    p.add_argument(
        "--longpoll-receivers",
        type=int,
        default=None,
        help="step longpoll: concurrent long-polling receivers, one connection each (default 1000; quick 200; "
        "mq's --max-connections, default 1024, must exceed it: raise it with --mq-arg)",
    )
    p.add_argument(
        "--longpoll-queues", type=int, default=None, help="step longpoll: queues they wait on (default 100; quick 20)"
    )
    p.add_argument(
        "--longpoll-idle",
        type=float,
        default=None,
        help="step longpoll: seconds mq's CPU is measured while all wait (default 25, longer than the 20 s "
        "wait so each receiver polls again inside it; quick: --duration)",
    )
    p.add_argument(
        "--longpoll-messages",
        type=int,
        default=None,
        help="step longpoll: messages sent one at a time to timed waiting receivers (default 300; quick 50)",
    )
    p.add_argument(
        "--large-sizes",
        default="65536,1048576",
        help="step large: body sizes in bytes, comma-separated (default 65536,1048576; at most mq --max-message-size)",
    )
    p.add_argument(
        "--large-clients",
        type=int,
        default=16,
        help="step large: wrk connections, and threads of the disk loop at the same size (default 16)",
    )
    p.add_argument("--no-drain", action="store_true", help="skip the drain step")
    p.add_argument("--drain-clients", type=int, default=16, help="receive+delete clients for the drain (default 16)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=7200,
        help="give up draining after this many seconds (default 7200: the 1,000,000-message drain takes ~25 minutes)",
    )
    p.add_argument("--prefill-clients", type=int, default=64, help="wrk connections for prefills (default 64)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE,
        help=f"messages per batch send / batch receive (default {BATCH_SIZE}; at most mq --max-batch-messages)",
    )
    p.add_argument("--keep-root", action="store_true", help="leave the bench root in place afterwards")
    p.add_argument("--no-install", action="store_true", help="never apt-get install wrk")
    p.add_argument("--output", help="also write the JSON here (default bench/results/<time>.json)")
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 3.0 if args.quick else 10.0
    if args.depth is None:
        args.depth = 10_000 if args.quick else 100_000
    quick_or_full = {
        "disk_receive_prefill": (20_000, 120_000),
        "window": (2, 5),
        "startup_messages": (20_000, 1_000_000),
        "drain_depth": (20_000, 1_000_000),
        "scale_queues": (1_000, 10_000),
        "scale_samples": (200, 500),
        "longpoll_receivers": (200, 1_000),
        "longpoll_queues": (20, 100),
        "longpoll_messages": (50, 300),
        # The queues step deletes its 10,000 queues again: the scrape's cost with many queues needs its own.
        "metrics_queues": (0, 10_000),
    }
    for name, (quick, full) in quick_or_full.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.longpoll_idle is None:
        args.longpoll_idle = args.duration if args.quick else 25.0
    if args.rounds < 1 or args.window < 1:
        p.error("--rounds and --window must be >= 1")
    args.disk_receive_threads = [int(x) for x in str(args.disk_receive_threads).split(",") if x]
    args.large_sizes = [int(x) for x in str(args.large_sizes).split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark; print the JSON; exit 0 (1 if a step failed)."""
    args = parse_args(argv)
    steps = set(args.steps.split(","))
    unknown = steps - set(STEPS)
    if unknown:
        raise SystemExit(f"bench: unknown --steps {sorted(unknown)}; choose among {','.join(STEPS)}")
    wrk_exe = ensure_wrk(not args.no_install)
    # The longpoll step holds a connection per receiver, and the daemons inherit this limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    root = Path(args.root).resolve()
    started = datetime.datetime.now(datetime.UTC)
    own_server = args.url is None
    _lock_root(root)
    since_delete: float | None = None
    if own_server:
        since_delete = _prepare_root(root)
    else:
        root.mkdir(parents=True, exist_ok=True)
    log_dir = REPO_DIR / "var" / "bench-logs" / f"{started:%Y%m%dT%H%M%SZ}"
    tag = "" if own_server else f"-{os.getpid()}"
    queues = {
        "send": f"bench-send{tag}",
        "batch": f"bench-batch{tag}",
        "shallow": f"bench-shallow{tag}",
        "deep": f"bench-deep{tag}",
    }
    cfg = Config(
        duration_s=args.duration,
        depth=args.depth,
        shallow_depth=args.shallow_depth,
        disk_threads=args.disk_threads,
        send_clients=[1, 16, 64],
        recv_clients=[1, 16],
        drain_clients=args.drain_clients,
        drain=not args.no_drain,
        prefill_clients=args.prefill_clients,
        drain_timeout_s=args.drain_timeout,
        batch_size=args.batch_size,
    )
    result: dict[str, Any] = {
        "benchmark": "mq issue 2",
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(root, wrk_exe),
        "loadavg_at_start": _loadavg(),
        # ext4 without a journal: creates within 300 s of a mass delete are slower (docs/performance.md).
        "seconds_since_bench_deleted_roots": since_delete,
        "config": {
            "steps": sorted(steps, key=STEPS.index),
            "body_bytes": BODY_BYTES,
            "batch_size": cfg.batch_size,
            "duration_s": cfg.duration_s,
            "deep_depth": cfg.depth,
            "drain_depth": args.drain_depth,
            "startup_messages": args.startup_messages,
            "scale_queues": args.scale_queues,
            "metrics_queues": args.metrics_queues,
            "longpoll_receivers": args.longpoll_receivers,
            "longpoll_queues": args.longpoll_queues,
            "large_sizes": args.large_sizes,
            "rounds": args.rounds,
            "window_s": args.window,
            "pairs": "mq and its disk loop in alternating windows (loop mq | mq loop | ...), a bar the median "
            "of the per-round ratios (bench/windows.py)",
            "shallow_depth": cfg.shallow_depth,
            "server": "own (mq + mq-mover + mq-reaper started by the bench)" if own_server else args.url,
            "mq_workers": args.workers if args.workers is not None else "mq default",
            "mq_extra_args": args.mq_arg,
            "root": str(root),
            "load_generator": "wrk + bench/lua (sends and batch sends: 2 threads; receive/cycles/batch receive: "
            "one connection per thread)",
        },
    }
    daemons: Daemons | None = None
    api: Api | None = None
    failed = None
    try:
        disk_dir = root / "diskloop"
        dl: dict[str, Any] = {}
        # With the sends, the disk loop runs in windows alternated with them (_paired_sends); alone, here.
        alone = "disk" in steps and "sends" not in steps
        for threads in sorted({1, cfg.disk_threads}) if alone else ():
            log(f"disk loop: {threads} thread(s) for {cfg.duration_s:g} s in {disk_dir}")
            meter = CpuMeter({})
            # keep_files: its files go with the root after the run, not between the steps it measures.
            dl[f"threads_{threads}"] = disk_loop(disk_dir, threads=threads, duration_s=cfg.duration_s, keep_files=True)
            dl[f"threads_{threads}"]["cpu"] = meter.stop()
            log(f"  {dl[f'threads_{threads}']['msgs_per_s']} msgs/s")
        if dl:
            result["disk_loop"] = dl
        if own_server:
            daemons = Daemons(root / "mq", log_dir, args.workers, args.mq_arg)
            url = daemons.start()
        else:
            url = args.url
        result["config"]["url"] = url
        api = Api(url)
        for q in queues.values():
            api.create_queue(q)
        bench = Bench(cfg, api, Wrk(wrk_exe, url, log_dir / "wrk"), queues, daemons)
        if "sends" in steps and "disk" in steps:
            _paired_sends(bench, disk_dir, args, daemons, result)
        elif "sends" in steps:
            result["sends"] = bench.sends()
        if "batch_sends" in steps:
            result["batch_sends"] = bench.batch_sends(result.get("sends", {}))
        if "disk_receive" in steps and "receive" in steps:
            _paired_receive(bench, disk_dir, args, daemons, result)
        elif "disk_receive" in steps:
            result["disk_receive_loop"] = _disk_receive(disk_dir, cfg.duration_s, args, daemons)
        elif "receive" in steps:
            result["receive_delete"] = bench.receive_delete(result.get("sends", {}))
        if "batch_receive" in steps:
            result["batch_receive_delete"] = bench.batch_receive_delete(
                result.get("batch_sends", {}), result.get("receive_delete", {})
            )
        if "cycles" in steps:
            result["cycles"] = {"shallow": bench.cycles(queues["shallow"], cfg.shallow_depth, "shallow")}
            result["cycles"]["deep"] = bench.cycles(queues["deep"], cfg.depth, "deep")
        scale = Scale(bench, root / "mq", disk_dir, args)
        if "startup" in steps:
            result["startup"] = scale.startup()
            url = daemons.url if daemons is not None else url
        if "drain" in steps and cfg.drain:
            if own_server:
                have = api.depth(BIG_QUEUE) if "startup" in steps else 0
                if have < args.drain_depth:
                    log(f"drain: writing {args.drain_depth - have:,} messages into {BIG_QUEUE} (direct, no HTTP)")
                    result["drain_prefill"] = fill(root / "mq", [(BIG_QUEUE, args.drain_depth - have)])
                result["drain"] = bench.drain(BIG_QUEUE)
            else:
                bench.prefill(queues["deep"], args.drain_depth, what="drain queue")
                result["drain"] = bench.drain(queues["deep"])
        if "queues" in steps:
            result["queues"] = scale.queues() if own_server else {"skipped": "needs the bench's own server"}
        if "longpoll" in steps:
            result["longpoll"] = scale.longpoll()
        if "large" in steps:
            result["large"] = scale.large()
        if "metrics" in steps:
            extra = scale.extra_queues(args.metrics_queues) if args.metrics_queues and own_server else None
            result["metrics_scrape"] = bench.metrics_cost()
            result["metrics_scrape"]["extra_queues"] = extra
            result["metrics_scrape"]["queues_held"] = len(os.listdir(scale.mq_root / "queues")) if own_server else None
    except (RuntimeError, OSError) as exc:
        failed = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {failed}")
        result["error"] = failed
    finally:
        if api is not None and not own_server:
            for q in queues.values():
                with contextlib.suppress(OSError, http.client.HTTPException):
                    api.delete_queue(q)
        if api is not None:
            api.close()
        if daemons is not None:
            log("stopping the daemons")
            result["daemon_exit_codes"] = daemons.stop()
            result["logs"] = str(log_dir)

    sends64 = result.get("sends", {}).get("clients_64", {}).get("sends_per_s", 0.0)
    loop64 = result.get("disk_loop", {}).get(f"threads_{cfg.disk_threads}", {})
    runs = [w["msgs_per_s"] for w in loop64.get("windows", [loop64] if loop64 else [])]
    disk64 = round(statistics.median(runs), 1) if runs else 0.0
    shallow = result.get("cycles", {}).get("shallow", {}).get("cycles_per_s", 0.0)
    deep = result.get("cycles", {}).get("deep", {}).get("cycles_per_s", 0.0)
    # Bar 1: the median of the per-round ratios of the alternated windows (bench.windows).
    r1, r2 = result.get("pairs", {}).get("sends64", {}).get("ratio"), _ratio(deep, shallow)
    result["bars"] = {
        "sends64_over_disk_loop64": {
            "value": r1,
            "from": "pairs.sends64: median over rounds of sends at 64 clients / the disk loop's window beside it",
            "sends64_per_s": sends64,
            "disk_loop64_per_s": disk64,
            "disk_loop64_runs": runs,
            "bar": BAR_SENDS_OVER_DISK,
            "met": r1 is not None and r1 >= BAR_SENDS_OVER_DISK,
        },
        "cycles_deep_over_shallow": {
            "value": r2,
            "bar": BAR_DEEP_OVER_SHALLOW,
            "met": r2 is not None and r2 >= BAR_DEEP_OVER_SHALLOW,
        },
        "metrics_scrape_cost_at_64_clients": {  # since stop 28 the windowed figure (Bench.metrics_cost)
            "value": result.get("metrics_scrape", {}).get("cost_windows"),
            "value_of_runs": result.get("metrics_scrape", {}).get("cost"),
            "value_of_cpu": result.get("metrics_scrape", {}).get("cost_cpu"),
            "bar": BAR_METRICS_COST,
            "met": result.get("metrics_scrape", {}).get("cost_windows") is not None
            and result["metrics_scrape"]["cost_windows"] <= BAR_METRICS_COST,
        },
        "drain_min_over_max_tenth": {
            "value": result.get("drain", {}).get("min_over_max_tenth"),
            "bar": BAR_DRAIN_MIN_OVER_MAX_TENTH,
            "compare": ">=",
            "met": None
            if result.get("drain", {}).get("min_over_max_tenth") is None
            else result["drain"]["min_over_max_tenth"] >= BAR_DRAIN_MIN_OVER_MAX_TENTH,
            "depth": result.get("drain", {}).get("depth_start"),
            "note": "issue 12: slowest tenth >= 0.8x the fastest, on a 1,000,000-message queue (--drain-depth)",
        },
        **issue12_bars(result),
    }
    result["batches_summary"] = _batches_summary(result)
    result["loadavg_at_end"] = _loadavg()
    result["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = json.dumps(result, indent=2)
    out_path = Path(args.output) if args.output else BENCH_DIR / "results" / f"{started:%Y%m%dT%H%M%SZ}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text + "\n")
    log(f"results saved to {out_path}")
    if own_server:
        _delete_used_roots(root, including_root=not args.keep_root and failed is None)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
