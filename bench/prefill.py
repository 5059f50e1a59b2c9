"""Fill queues fast for the scale steps of issue 12, without the HTTP path.

A million messages sent through mq at ~1,000 durable sends/s would take a
quarter of an hour, so the scale steps write their messages with mq's own
protocol code instead: :class:`mqcore.protocol.Store` with ``fsync=False``,
whose ``send`` writes ``new/Q.ID`` (O_EXCL) and renames it to
``queues/Q/ID.0`` (docs/protocol.md 6.2) — the same files, names and header
as a send through mq, only without the two fsyncs per message. Several
processes write in parallel (one ``Store`` and id generator each; ids stay
unique by their random bits and sort by send time), and one ``sync()`` at
the end writes everything back before the measurement starts.

It is safe while mq runs on the root: a file only appears in a queue by the
rename, complete, as with any sender.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from mqcore.names import check_queue_name
from mqcore.protocol import Store

#: Processes that write in parallel by default (one per usable core).
DEFAULT_PROCESSES = max(1, len(os.sched_getaffinity(0)))


def _fill_part(root: str, work: list[tuple[str, int]], body: bytes) -> int:
    """Worker: send ``count`` messages to each ``queue`` of ``work`` with a non-fsyncing Store; return how many."""
    store = Store(root, fsync=False)
    done = 0
    try:
        for queue, count in work:
            name = check_queue_name(queue)
            for _ in range(count):
                store.send(name, body)
            done += count
    finally:
        store.close()
    return done


def _split(work: list[tuple[str, int]], parts: int) -> list[list[tuple[str, int]]]:
    """Cut ``work`` into ``parts`` lists of about the same number of messages (one queue may be split)."""
    total = sum(count for _, count in work)
    share = -(-total // parts) if total else 0
    out: list[list[tuple[str, int]]] = [[] for _ in range(parts)]
    i, room = 0, share
    for queue, count in work:
        while count > 0:
            take = min(count, room)
            out[i].append((queue, take))
            count -= take
            room -= take
            if room == 0 and i < parts - 1:
                i, room = i + 1, share
    return [part for part in out if part]


def fill(
    root: str | os.PathLike[str],
    work: list[tuple[str, int]],
    *,
    body_bytes: int = 1024,
    processes: int = DEFAULT_PROCESSES,
    create: bool = True,
) -> dict[str, Any]:
    """Send ``count`` messages of ``body_bytes`` to each queue of ``work``, in parallel, then ``sync()``.

    Args:
        root: The mq root directory (``ROOT/queues/...``).
        work: ``[(queue, count), ...]``; queues are created first (default
            attributes) when ``create`` and missing.
        body_bytes: Bytes per body (random, the same for every message).
        processes: Worker processes (forked), each with its own Store.
        create: Create missing queues (with ``Store.create_queue``).

    Returns:
        ``{"messages", "queues", "processes", "write_s", "sync_s", "per_s", "how"}``;
        ``per_s`` counts the writing only, not the ``sync()``.

    Raises:
        OSError: A write failed (e.g. disk full).
        mqcore.errors.MQError: A queue name is invalid or a queue does not exist.
    """
    root = os.fspath(root)
    body = os.urandom(body_bytes)
    t0 = time.perf_counter()
    if create:
        store = Store(root, fsync=False)
        try:
            for queue, _ in work:
                name = check_queue_name(queue)
                if not store.queue_exists(name):
                    store.create_queue(name)
        finally:
            store.close()
    parts = _split([(q, c) for q, c in work if c > 0], max(1, processes))
    if len(parts) <= 1:
        done = sum(_fill_part(root, part, body) for part in parts)
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(len(parts)) as pool:
            done = sum(pool.starmap(_fill_part, [(root, part, body) for part in parts]))
    write_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    os.sync()
    sync_s = time.perf_counter() - t1
    return {
        "messages": done,
        "queues": len(work),
        "processes": len(parts),
        "write_s": round(write_s, 2),
        "sync_s": round(sync_s, 2),
        "per_s": round(done / write_s, 1) if write_s else 0.0,
        "how": "mqcore Store(fsync=False).send in parallel processes (new/ then rename into queues/Q/), "
        "one sync() at the end; not through HTTP",
    }
