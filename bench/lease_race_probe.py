"""Probe: can two hosts on a shared filesystem both lease one ready message? (issue 14's one double delivery)

Each "host" is a spawned process on its own mount of one volume (docs/cluster.md), running
the protocol's own lease (:meth:`mqcore.protocol.Store.lease`); barriers line the hosts up
so that each race takes the shape asked for:

- ``stale-open``: host B opens ``queues/Q/ID.0`` (as step 1 of a lease does), host A then
  leases the message to the end, and only then, ``--gap-ms`` later, host B renames the name
  it opened to a ``delay/`` name of its own (step 3 of a lease after a stall: the shape of the
  slow brokerless receive in the CI failure). On a filesystem whose rename is a
  compare-and-swap, B's rename fails with ENOENT/ESTALE every time.
- ``concurrent``: both hosts run :meth:`Store.lease` on the same name at once (host B
  ``0..--gap-ms`` ms later, at random).

Afterwards every message must be in ``delay/`` exactly once (looked at through a third
mount); a race in which both hosts were handed the message, or that left two ``delay/``
names for one message, is a double delivery. ``--burn N`` runs N busy-looping processes
beside the races (the load of a shared CI machine).

Usage (as root, with the volume up: ``bash scripts/gluster.sh up``)::

    python bench/lease_race_probe.py --mounts /tmp/mq-gluster/hosts/h1 /tmp/mq-gluster/hosts/h2 \
        /tmp/mq-gluster/hosts/h3 --mode stale-open --races 200 --gap-ms 0 50 500 --burn 4
"""

from __future__ import annotations

import argparse
import errno
import json
import multiprocessing
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqcore.names import MessageId, QueueName, in_flight_name, new_lease_token, parse_in_flight_name, ready_name
from mqcore.protocol import SendEntry, Store

VISIBILITY_MS = 600_000


def _burn(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _host(
    role: str, root: str, queue: str, ids: list[str], mode: str, gaps: list[float], barrier: Any, out: Any
) -> None:
    store = Store(root)
    name = QueueName(queue)
    rng = random.Random(hash(role))
    results: list[dict[str, Any]] = []
    try:
        for i, mid in enumerate(ids):
            gap = gaps[i % len(gaps)]
            src = os.path.join(store.layout.queue_dir(name), ready_name(MessageId(mid), 0))
            rec: dict[str, Any] = {"i": i, "gap_ms": gap}
            if mode == "stale-open":
                barrier.wait(60)
                if role == "B":
                    try:
                        fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError as exc:
                        fd, rec["open"] = -1, errno.errorcode[exc.errno or 0]
                    barrier.wait(60)  # opened
                    barrier.wait(60)  # A has leased it
                    time.sleep(gap / 1000)
                    target = store.layout.delay_path(
                        in_flight_name(store.clock() + VISIBILITY_MS, name, MessageId(mid), 1, new_lease_token())
                    )
                    if fd >= 0:
                        try:
                            os.rename(src, target)
                            rec["rename"] = "ok"
                            rec["got"] = mid
                        except OSError as exc:
                            rec["rename"] = errno.errorcode[exc.errno or 0]
                        finally:
                            os.close(fd)
                else:
                    barrier.wait(60)  # B opened
                    message = store.lease(name, ready_name(MessageId(mid), 0), VISIBILITY_MS)
                    rec["got"] = None if message is None else message.message_id
                    barrier.wait(60)
            else:
                barrier.wait(60)
                if role == "B" and gap:
                    time.sleep(rng.uniform(0, gap) / 1000)
                message = store.lease(name, ready_name(MessageId(mid), 0), VISIBILITY_MS)
                rec["got"] = None if message is None else message.message_id
            results.append(rec)
    except BaseException as exc:  # noqa: BLE001 - reported
        results.append({"error": repr(exc)})
        barrier.abort()
    out.put((role, results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mounts", nargs=3, required=True, help="three mounts of one volume (A, B, checker)")
    p.add_argument("--root", default="leaseprobe", help="mq root directory on the volume")
    p.add_argument("--mode", choices=["stale-open", "concurrent"], default="stale-open")
    p.add_argument("--races", type=int, default=100)
    p.add_argument("--gap-ms", type=float, nargs="+", default=[0.0])
    p.add_argument("--burn", type=int, default=0, help="busy-looping processes beside the races")
    p.add_argument("--output", help="write the summary as JSON here")
    args = p.parse_args()

    roots = [str(Path(m) / args.root) for m in args.mounts]
    checker = Store(roots[2])
    queue = QueueName(f"q{int(time.time())}")
    checker.create_queue(queue)
    ids = [str(i) for i in checker.send_batch(queue, [SendEntry(b"m%d" % i) for i in range(args.races)])]
    time.sleep(0.5)  # new names visible through the other mounts (3-9 ms measured)

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    barrier = ctx.Barrier(2)
    out: Any = ctx.Queue()
    hosts = [
        ctx.Process(target=_host, args=(role, roots[i], queue, ids, args.mode, args.gap_ms, barrier, out))
        for i, role in enumerate(("A", "B"))
    ]
    started = time.monotonic()
    for h in hosts:
        h.start()
    runs = dict(out.get(timeout=1800) for _ in hosts)
    for h in hosts:
        h.join(30)
    stop.set()
    for b in burners:
        b.join(10)
    elapsed = time.monotonic() - started

    errors = [r["error"] for rs in runs.values() for r in rs if "error" in r]
    both = [
        ids[i]
        for i in range(min(len(runs["A"]), len(runs["B"])))
        if runs["A"][i].get("got") and runs["B"][i].get("got")
    ]
    time.sleep(0.5)
    in_delay = Counter(
        item.message_id
        for item in (parse_in_flight_name(n) for n in os.listdir(checker.layout.delay))
        if item is not None and item.queue == queue
    )
    twice = sorted(m for m, n in in_delay.items() if n > 1)
    missing = sorted(set(ids) - set(in_delay))
    by_gap: dict[str, Counter[str]] = {}
    for r in runs["B"]:
        if "i" in r:
            by_gap.setdefault(str(r["gap_ms"]), Counter())[
                str(r.get("rename", r.get("open", "got" if r.get("got") else "none")))
            ] += 1
    summary = {
        "mode": args.mode,
        "races": args.races,
        "gaps_ms": args.gap_ms,
        "burn": args.burn,
        "seconds": round(elapsed, 1),
        "handed_to_both": both,
        "two_delay_names": twice,
        "not_in_delay": missing,
        "host_b_outcomes_by_gap": {g: dict(c) for g, c in by_gap.items()},
        "errors": errors[:5],
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
