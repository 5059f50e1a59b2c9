"""Per-second samples beside a drain: each daemon thread's user and system CPU, D states, a CPU-speed canary.

Usage: ``python3 bench/drain_sampler.py ROOT > samples.jsonl`` (stop it with SIGTERM/SIGINT). ROOT is a
string of the daemons' command lines (the bench root): processes whose command line holds it and names
``mq``, ``mq-mover`` or ``mq-reaper`` are sampled, and ``wrk``'s processes too.

One JSON object a second: ``t`` (Unix time, s); per role (``mq``, ``mover``, ``reaper``, ``wrk``) a dict
``"<tid>": [user_ms, system_ms, d_samples]`` of the threads that ran (``d_samples``: how many of the 10
samples of that second found the thread in state ``D``); ``iowait_pct`` and ``busy_pct`` of the machine;
``Dirty`` and ``Writeback`` (MiB); ``canary_ms``: the thread CPU time of a fixed piece of Python work run once
a second (it grows if the CPUs themselves get slower: frequency, a neighbour on the host, caches), the
median of three. Extends the lead's ``/work/lead20/sampler.py`` (stop 20).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def find(root: str) -> dict[str, str]:
    """Map pid -> role of the daemons under ``root`` and of wrk."""
    out: dict[str, str] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                line = b" ".join(f.read().split(b"\0")).decode(errors="replace")
        except OSError:
            continue
        if line.startswith("wrk ") or "/wrk " in line:
            out[p] = "wrk"
        elif root in line and "python" in line:
            if "mover" in line:
                out[p] = "mover"
            elif "reaper" in line:
                out[p] = "reaper"
            elif "daemons." in line or "/mq " in line or "bin/mq" in line:
                out[p] = "mq"
    return out


def stat(pid: str, tid: str) -> tuple[int, int, str] | None:
    """(utime, stime) in ticks and the state letter of one thread, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    fields = st[st.rindex(")") + 2 :].split()
    return int(fields[11]), int(fields[12]), fields[0]


def canary() -> float:
    """Thread CPU (ms) of a fixed piece of work, the median of three."""
    runs = []
    for _ in range(3):
        t0 = time.thread_time()
        total = 0
        for i in range(20_000):
            total += i * i
        runs.append((time.thread_time() - t0) * 1000)
    return round(sorted(runs)[1], 3)


def meminfo() -> dict[str, int]:
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            if k in ("Dirty", "Writeback"):
                m[k] = int(v.split()[0]) // 1024
    return m


def cpu() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def main() -> None:
    root = sys.argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    prev: dict[tuple[str, str], tuple[int, int]] = {}
    prevcpu = cpu()
    procs = find(root)
    while True:
        dstates: dict[tuple[str, str], int] = {}
        for _ in range(10):
            time.sleep(0.1)
            for pid in procs:
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    s = stat(pid, tid)
                    if s and s[2] == "D":
                        dstates[(pid, tid)] = dstates.get((pid, tid), 0) + 1
        rec: dict[str, object] = {"t": round(time.time(), 1)}
        procs = find(root)
        for pid, role in procs.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            out = rec.setdefault(role, {})
            assert isinstance(out, dict)
            for tid in tids:
                s = stat(pid, tid)
                if s is None:
                    continue
                u0, s0 = prev.get((pid, tid), (s[0], s[1]))
                prev[(pid, tid)] = (s[0], s[1])
                du, ds, d = (s[0] - u0) * 1000 // TICK, (s[1] - s0) * 1000 // TICK, dstates.get((pid, tid), 0)
                if du or ds or d:
                    key = tid if tid != pid else f"{tid}(main)"
                    out[key] = [du, ds, d]
        c = cpu()
        delta = [a - b for a, b in zip(c, prevcpu, strict=True)]
        prevcpu = c
        tot = sum(delta) or 1
        rec["iowait_pct"] = round(100 * delta[4] / tot, 1)
        rec["busy_pct"] = round(100 * (tot - delta[3] - delta[4]) / tot, 1)
        rec["steal_pct"] = round(100 * delta[7] / tot, 1) if len(delta) > 7 else 0.0
        rec.update(meminfo())
        rec["canary_ms"] = canary()
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
