"""CPU of mq's receive+delete work in one process, without HTTP (issue 12, stop 22).

End-to-end A/Bs of a cycle on this 2-core VM swing 10-30 % with the other engineers' load, more
than a cut of a few microseconds. This measures the part of a cycle mq's own Python decides: a
:class:`daemons._broker.Broker` on a fresh root (tmpfs), ``--messages`` messages stored first, then
per cycle what a raw ``GET /<queue>/messages`` and ``DELETE /<queue>/messages/<id>`` do past the
HTTP parsing (``daemons._http.receive_of`` and ``delete_of``, the 200's head as ``daemons._wire``
formats it), one at a time on one uvloop loop: the lone receive and delete of one client, their
file work inline on the loop thread as mq does it on a local filesystem. The process's CPU time
(user + system) per cycle over ``--cycles`` cycles, the best of ``--repeats``.

Run it once per code tree (``PYTHONPATH``), alternated::

    for i in 1 2 3; do for t in /work/mq-base22 /work/mq-recv; do
        PYTHONPATH=$t .venv/bin/python bench/recv_cpu.py --root /dev/shm/recv-cpu; done; done
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

QUEUE = "recvcpu"


async def _run(args: argparse.Namespace) -> dict[str, object]:
    from daemons import _http, _wire
    from daemons._broker import Broker
    from daemons._settings import Settings

    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    broker = Broker(Settings(root=str(root)))
    await broker.start()
    head = getattr(_wire, "_received_fields", None)
    best: float | None = None
    try:
        broker.store.create_queue(QUEUE)
        body = os.urandom(args.body_bytes)
        for _ in range(args.messages):
            broker.store.send(QUEUE, body)
        per_repeat = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            if args.batch:
                await _batch_cycles(broker, args.cycles, args.batch)
                spent = (time.process_time() - t0) / (args.cycles * args.batch) * 1e6
                per_repeat.append(round(spent, 2))
                best = spent if best is None else min(best, spent)
                continue
            for _ in range(args.cycles):
                messages, _ = await _http.receive_of(broker, QUEUE, None)
                message = messages[0]
                if head is not None:
                    fields = head(message)
                else:
                    fields = "".join([f"{k}: {v}\r\n" for k, v in _http.received_headers(message).items()]).encode()
                _wire._head(200, 1, fields, message.body, b"")
                await _http.delete_of(broker, QUEUE, message.message_id, None)
            spent = (time.process_time() - t0) / args.cycles * 1e6
            per_repeat.append(round(spent, 2))
            best = spent if best is None else min(best, spent)
    finally:
        await broker.close()
        shutil.rmtree(root, ignore_errors=True)
    unit = "us_per_message" if args.batch else "us_per_cycle"
    return {"tree": os.environ.get("PYTHONPATH", ""), unit: round(best or 0.0, 2), "repeats": per_repeat}


async def _batch_cycles(broker: object, cycles: int, batch: int) -> None:
    """``cycles`` batch receives of ``batch`` messages (JSON form) and their batch deletes by receipt handle."""
    import re

    from multidict import MultiDict

    from daemons import _batches, _http

    query = MultiDict({"max_messages": str(batch)})
    handle_re = re.compile(rb'"receipt_handle": "([^"]*)"')
    for _ in range(cycles):
        _, answer = await _http.receive_of(broker, QUEUE, query)  # type: ignore[arg-type]
        assert answer is not None
        # The JSON answer's text (stop 24 on), or an aiohttp response (a tree from before: the A/B's base).
        text: Any = answer.encode() if isinstance(answer, str) else answer.body  # type: ignore[attr-defined]
        handles = handle_re.findall(text)
        entries = b",".join(b'{"id":"%d","receipt_handle":"%s"}' % (i, h) for i, h in enumerate(handles))
        request = b'{"entries":[' + entries + b"]}"

        async def read(limit: int, request: bytes = request) -> bytes:
            return request

        await _batches.delete_batch_of(broker, QUEUE, None, read)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Run it; print one JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="a fresh directory (tmpfs), deleted afterwards")
    p.add_argument("--cycles", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--body-bytes", type=int, default=1024)
    p.add_argument(
        "--batch", type=int, default=0, help="N > 0: batch receives of N (JSON) and batch deletes; CPU per message"
    )
    args = p.parse_args(argv)
    args.messages = args.cycles * args.repeats * max(1, args.batch) + 10
    import uvloop

    print(json.dumps(uvloop.run(_run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
