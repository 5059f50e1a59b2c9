"""CPU of starting each daemon and mqctl: what the test suite pays a few hundred times per run.

For each variant (a directory holding ``mqcore/`` and ``daemons/``, put first on ``PYTHONPATH``), in
alternating rounds (A B A B ...), it runs:

- ``python -m daemons.front|mover|reaper --help``: CPU (user + sys, from ``wait4``) of the whole process;
- each daemon started on a fresh root (``mq`` on ``--port 0``) up to its readiness line: CPU of its
  threads at that line (``/proc/PID/task/*/schedstat``, nanoseconds), then SIGTERM and the CPU of the
  whole life (``wait4``), start to exit;
- ``python -m mqcore.ctl --help``, ``--root DIR queues list`` and ``--url URL queues list`` (against one
  ``mq`` of the first variant, started once).

It prints one JSON object: per variant and figure, the median and every sample in milliseconds of CPU.
Usage, from the repository root (the variants' sources should be byte-compiled, as ``scripts/test.sh``
does, or every run pays for compiling them)::

    .venv/bin/python bench/startup_cpu.py --variant before=/tmp/main-copy --variant after=. --rounds 5

No bars: a figure for docs/performance.md ("Daemon start-up and the test suite's load").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DAEMONS = {
    "mq": ("daemons.front", ["--port", "0"], "mq listening on http"),
    "mq-mover": ("daemons.mover", [], "mq-mover ready"),
    "mq-reaper": ("daemons.reaper", [], "mq-reaper ready"),
}


def _env(path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env["PYTHONPATH"] = os.path.abspath(path)
    return env


def _rusage_ms(proc: subprocess.Popen[Any]) -> float:
    """Wait for ``proc`` and return its CPU (user + sys) in milliseconds (from ``wait4``)."""
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _threads_cpu_ms(pid: int) -> float:
    """CPU of every thread of ``pid`` so far, in milliseconds (``schedstat``: nanoseconds on a CPU)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e6


def run_once(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """CPU in ms of a command that runs to its end (its output discarded)."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _rusage_ms(proc)


def spawn_ready(name: str, env: dict[str, str], cwd: str, root: str) -> tuple[subprocess.Popen[str], str | None]:
    """Start daemon ``name`` on ``root`` and read its stderr up to its readiness line.

    Returns:
        (the process, mq's URL or None).
    Raises:
        RuntimeError: It exited before its readiness line.
    """
    module, args, ready = DAEMONS[name]
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--root", root, *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if ready in line:
            match = re.search(r"(http://[^\s/]+)", line)
            return proc, match.group(1) if match else None
    raise RuntimeError(f"{name} exited before ready: {proc.wait()}")


def stop(proc: subprocess.Popen[str]) -> float:
    """SIGTERM ``proc``, read its stderr to the end and return the CPU of its whole life in ms.

    Raises:
        RuntimeError: It exited non-zero.
    """
    assert proc.stderr is not None
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()  # to the end: its last lines must not meet a closed pipe
    proc.stderr.close()
    total = _rusage_ms(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args} exited {proc.returncode} on SIGTERM")
    return total


def start_once(name: str, env: dict[str, str], cwd: str, root: str) -> tuple[float, float]:
    """Start daemon ``name`` on ``root`` to its readiness line, then stop it.

    Returns:
        (CPU at the readiness line in ms, CPU of the whole life in ms).
    """
    proc, _url = spawn_ready(name, env, cwd, root)
    at_ready = _threads_cpu_ms(proc.pid)
    return at_ready, stop(proc)


def main() -> int:
    """Run the rounds and print the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=DIR (DIR holds mqcore/, daemons/)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=None, help="directory for the roots (default: a temporary one)")
    opts = parser.parse_args()
    variants = dict(v.split("=", 1) for v in opts.variant)
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    work = opts.work or tempfile.mkdtemp(prefix="mq-startup-cpu-")
    Path(work).mkdir(parents=True, exist_ok=True)
    ctl_root = os.path.join(work, "ctl-root")
    os.makedirs(os.path.join(ctl_root), exist_ok=True)
    first = next(iter(variants.values()))
    server, url = spawn_ready("mq", _env(first), work, ctl_root)
    assert url, "the mq for mqctl did not start"
    runs = 0
    try:
        for round_no in range(opts.rounds):
            for name, path in variants.items():
                env = _env(path)
                add = samples[name].setdefault
                for daemon, (module, _args, _ready) in DAEMONS.items():
                    add(f"{daemon} --help", []).append(run_once([sys.executable, "-m", module, "--help"], env, work))
                    runs += 1
                    root = os.path.join(work, f"r{runs}")
                    at_ready, total = start_once(daemon, env, work, root)
                    add(f"{daemon} start to ready", []).append(at_ready)
                    add(f"{daemon} start to exit", []).append(total)
                ctl = [sys.executable, "-m", "mqcore.ctl"]
                add("mqctl --help", []).append(run_once([*ctl, "--help"], env, work))
                for flag, target in (("--root", ctl_root), ("--url", url)):
                    argv = [*ctl, flag, target, "queues", "list"]
                    add(f"mqctl {flag} queues list", []).append(run_once(argv, env, work))
                print(f"round {round_no + 1} {name} done", file=sys.stderr)
    finally:
        stop(server)
    result = {
        "unit": "ms of CPU (user + sys) per process",
        "rounds": opts.rounds,
        "loadavg": os.getloadavg(),
        "variants": {
            name: {
                figure: {"median": round(statistics.median(values), 1), "samples": [round(v, 1) for v in values]}
                for figure, values in figures.items()
            }
            for name, figures in samples.items()
        },
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
