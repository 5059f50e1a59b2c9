"""Probe: free-running consumers on every host's mount compete for one queue, as brokerless receives do.

Each round, ``--batch`` messages are sent through host 3's mount; then one process per host
(mounts 1-3, ``--consumers`` threads each) loops: list the queue directory, sort, lease names
in order with :meth:`mqcore.protocol.Store.lease` until one succeeds (one message per receive,
as the cluster test's consumers), until the listing is empty. A message handed out twice in a
round is a double delivery (visibility is 10 minutes: nothing is redelivered meanwhile).
``--burn N`` runs N busy-looping processes beside (the load of a shared CI machine).

Usage (as root, volume up)::

    python bench/lease_compete_probe.py --mounts H1 H2 H3 --rounds 10 --batch 200 --burn 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lease_race_probe import VISIBILITY_MS, _burn  # the same busy loop and visibility as the barrier races

from mqcore.names import QueueName
from mqcore.protocol import SendEntry, Store


def _consumer(root: str, queue: str, threads: int, out: Any) -> None:
    store = Store(root)
    name = QueueName(queue)
    got: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def loop(t: int) -> None:
        qdir = store.layout.queue_dir(name)
        while True:
            names = sorted(n for n in os.listdir(qdir) if not n.startswith("."))
            if not names:
                return
            for n in names:
                m = store.lease(name, n, VISIBILITY_MS)
                if m is not None:
                    with lock:
                        got.append((m.message_id, m.receive_count, f"{root[-20:]}#{t}"))
                    break

    ts = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(got)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mounts", nargs=3, required=True)
    p.add_argument("--root", default="competeprobe")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--consumers", type=int, default=2, help="threads per host")
    p.add_argument("--burn", type=int, default=0)
    args = p.parse_args()
    roots = [str(Path(m) / args.root) for m in args.mounts]
    sender = Store(roots[2])
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    started = time.monotonic()
    total, doubles = 0, []
    for r in range(args.rounds):
        queue = QueueName(f"c{int(time.time() * 1000) % 10**9}r{r}")
        sender.create_queue(queue)
        for k in range(0, args.batch, 10):
            sender.send_batch(queue, [SendEntry(b"m%d" % (k + j)) for j in range(10)])
        time.sleep(0.3)
        out: Any = ctx.Queue()
        procs = [ctx.Process(target=_consumer, args=(root, queue, args.consumers, out)) for root in roots]
        for pr in procs:
            pr.start()
        got = [d for _ in procs for d in out.get(timeout=600)]
        for pr in procs:
            pr.join(30)
        counts = Counter(mid for mid, _, _ in got)
        total += len(counts)
        doubles += [[d for d in got if d[0] == mid] for mid, c in counts.items() if c > 1]
        print(f"round {r}: {len(counts)} messages, {len(got)} deliveries, doubles so far {len(doubles)}", flush=True)
    stop.set()
    print(
        json.dumps(
            {
                "messages": total,
                "doubles": doubles[:10],
                "n_doubles": len(doubles),
                "seconds": round(time.monotonic() - started, 1),
                "loadavg": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
