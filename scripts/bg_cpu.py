"""CPU of mq-mover and mq-reaper per receive+delete cycle, without mq in the way (issue 12).

Starts ``mq-mover`` and ``mq-reaper`` (``python -m daemons.mover`` / ``daemons.reaper``
from CODE, so main's checkout can be measured against a branch), then does
receive+delete cycles through :class:`mqcore.protocol.Store` at a fixed rate,
exactly the renames mq makes (``queues/Q/ID.0`` -> ``delay/...``, then
``delay/...`` -> ``remove/Q.ID`` with the fsync of ``remove/``), and waits until
the reaper has emptied ``remove/``. The CPU of each daemon (all its threads,
nanoseconds from ``/proc/PID/task/*/schedstat``) over the cycles is divided by
the number of cycles. Far less noisy than the HTTP bench on a shared machine::

    .venv/bin/python scripts/bg_cpu.py /work/mq-base /dev/shm/bg-base 800 6
    .venv/bin/python scripts/bg_cpu.py . /dev/shm/bg-new 800 6

Arguments: CODE ROOT RATE SECONDS [VISIBILITY_MS]. ROOT is wiped first and after.
Prints one line: ``cycles=N rate=R/s mover_ms=M reaper_ms=R remove_left=0``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, in seconds."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # the thread ended meanwhile
    return total / 1e9


def main(argv: list[str]) -> int:
    """Run one measurement; returns the exit code."""
    code, root, rate, seconds = os.path.abspath(argv[0]), argv[1], float(argv[2]), float(argv[3])
    visibility_ms = int(argv[4]) if len(argv) > 4 else 30_000
    sys.path.insert(0, code)
    from mqcore.names import QueueName
    from mqcore.protocol import Store

    shutil.rmtree(root, ignore_errors=True)
    store = Store(root)
    queue = QueueName("bench")
    store.create_queue(queue)
    total = int(rate * seconds)
    ids = [store.send(queue, b"x" * 1024) for _ in range(total)]
    env = dict(os.environ, PYTHONPATH=code)
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"daemons.{name}", "--root", root], env=env, cwd=code, stderr=subprocess.DEVNULL
        )
        for name in ("mover", "reaper")
    }
    try:
        time.sleep(3)  # both ready (their start-up scans are of empty directories)
        before = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        start = time.monotonic()
        done = 0
        while done < total:
            due = min(total, int((time.monotonic() - start) * rate))
            while done < due:
                got = store.lease(queue, f"{ids[done]}.0", visibility_ms)
                assert got is not None
                store.delete(queue, got.message_id, in_flight_hint=[got.in_flight_name], list_ready=False)
                done += 1
            time.sleep(0.002)
        elapsed = time.monotonic() - start
        remove = os.path.join(root, "remove")
        for _ in range(200):
            if not os.listdir(remove):
                break
            time.sleep(0.05)
        per = {name: (cpu_seconds(p.pid) - before[name]) * 1000 / done for name, p in procs.items()}
        sys.stdout.write(
            f"cycles={done} rate={done / elapsed:.0f}/s mover_ms={per['mover']:.4f} "
            f"reaper_ms={per['reaper']:.4f} remove_left={len(os.listdir(remove))}\n"
        )
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
