"""Probe: a brick that stalls past ``network.ping-timeout`` while hosts lease (issue 14's one double delivery).

Host A (mount 1) leases K ready messages while one brick is stopped (SIGSTOP) for
``--stall`` seconds; host B (mount 2) had opened the same K files before (``--b-opens``) or
not, and after the brick is continued (SIGCONT) and ``--wait`` seconds more, B leases the same
K names: B renames what it opened, or runs :meth:`Store.lease` by name. On a compare-and-swap
rename every one of B's renames fails (A has them all). Counts B's successes and the
``delay/`` names per message (through mount 3), and the client logs' disconnects.

Usage (as root, volume up, MQ_GLUSTER_STATE set as for scripts/gluster.sh)::

    python bench/lease_stall_probe.py --state /tmp/mq-gluster --k 20 --stall 8 --brick 3
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqcore.names import MessageId, QueueName, in_flight_name, new_lease_token, parse_in_flight_name, ready_name
from mqcore.protocol import SendEntry, Store

VISIBILITY_MS = 600_000


def brick_pid(state: Path, brick: int) -> int:
    for path in (state / "run" / "vols" / "mqvol").glob(f"*bricks-b{brick}.pid"):
        return int(path.read_text().strip())
    raise FileNotFoundError(brick)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state", type=Path, default=Path(os.environ.get("MQ_GLUSTER_STATE", "/tmp/mq-gluster")))
    p.add_argument("--root", default="stallprobe")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--stall", type=float, default=8.0, help="seconds the brick is stopped (0: no stall)")
    p.add_argument("--brick", type=int, default=3)
    p.add_argument("--wait", type=float, default=0.0, help="seconds between the brick's continue and B's leases")
    p.add_argument("--b-opens", action="store_true", help="B opens the files before the stall and renames them after")
    args = p.parse_args()

    mounts = [args.state / "hosts" / f"h{i}" for i in (1, 2, 3)]
    a, b, checker = (Store(str(m / args.root)) for m in mounts)
    queue = QueueName(f"s{int(time.time() * 1000) % 10**9}")
    checker.create_queue(queue)
    ids = [str(i) for i in checker.send_batch(queue, [SendEntry(b"m%d" % i) for i in range(args.k)])]
    time.sleep(0.5)
    names = [ready_name(MessageId(i), 0) for i in ids]
    fds: dict[str, int] = {}
    if args.b_opens:
        for n in names:
            fds[n] = os.open(os.path.join(b.layout.queue_dir(queue), n), os.O_RDONLY)
    a_got: list[str | None] = []
    a_times: list[float] = []

    def lease_a() -> None:
        for n in names:
            t = time.monotonic()
            try:
                m = a.lease(queue, n, VISIBILITY_MS)
                a_got.append(None if m is None else m.message_id)
            except Exception as exc:  # noqa: BLE001
                a_got.append(f"error {exc!r}")
            a_times.append(round(time.monotonic() - t, 2))

    pid = brick_pid(args.state, args.brick) if args.stall else 0
    if pid:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    thread = threading.Thread(target=lease_a)
    thread.start()
    if pid:
        time.sleep(args.stall)
        os.kill(pid, signal.SIGCONT)
    thread.join(120)
    a_done = time.monotonic() - t0
    time.sleep(args.wait)
    b_out: Counter[str] = Counter()
    b_got = []
    for n in names:
        if args.b_opens:
            target = b.layout.delay_path(
                in_flight_name(b.clock() + VISIBILITY_MS, queue, MessageId(n[:-2]), 1, new_lease_token())
            )
            try:
                os.rename(os.path.join(b.layout.queue_dir(queue), n), target)
                b_out["ok"] += 1
                b_got.append(n[:-2])
            except OSError as exc:
                b_out[errno.errorcode[exc.errno or 0]] += 1
            os.close(fds[n])
        else:
            try:
                m = b.lease(queue, n, VISIBILITY_MS)
                b_out["ok" if m else "none"] += 1
                if m:
                    b_got.append(m.message_id)
            except Exception as exc:  # noqa: BLE001
                b_out[repr(exc)[:80]] += 1
    time.sleep(1)
    in_delay = Counter(
        it.message_id
        for it in (parse_in_flight_name(x) for x in os.listdir(checker.layout.delay))
        if it is not None and it.queue == queue
    )
    summary = {
        "k": args.k,
        "stall": args.stall,
        "brick": args.brick,
        "wait": args.wait,
        "b_opens": args.b_opens,
        "a_got": sum(1 for g in a_got if g and not str(g).startswith("error")),
        "a_errors": [g for g in a_got if g and str(g).startswith("error")][:3],
        "a_lease_seconds": a_times[:5],
        "a_done_after": round(a_done, 1),
        "b_outcomes": dict(b_out),
        "handed_to_both": sorted(set(b_got) & {g for g in a_got if g}),
        "two_delay_names": sorted(m for m, c in in_delay.items() if c > 1),
        "not_in_delay": sorted(set(ids) - set(in_delay)),
        "ready_after": sorted(os.listdir(checker.layout.queue_dir(queue))),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
