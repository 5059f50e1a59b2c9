"""Two "hosts" racing for one file name in lockstep: each a process of its own on its own FUSE mount.

The two GlusterFS failure paths the protocol handles (docs/protocol.md 13.2, 13.3) show only when two
hosts touch one name within the same few milliseconds: an ``O_EXCL`` create that says ``EEXIST``
(with the kernel's caches off, now and then with no file left at all), and an open or rename of a
file another host has just moved (``ENOENT`` or ``ESTALE``). Daemons collide that closely only by
chance, so here each host is a spawned process (it shares nothing with the test but the volume)
running the protocol itself (:class:`mqcore.protocol.Store`, what mq and the brokerless clients run)
on its own mount, and a barrier releases both hosts into each race at once. Each host counts what
:data:`mqcore.protocol.STORAGE_HOOKS` reports: the hook behind mq's ``mq_storage_races_lost_total``,
called by exactly those recovery paths.
"""

from __future__ import annotations

import multiprocessing
import queue as queues
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqcore.names import MessageId, QueueName, ready_name
from mqcore.protocol import STORAGE_HOOKS, Store

#: Longest a whole race run may take, seconds.
RUN_TIMEOUT = 120


@dataclass
class HostRun:
    """What one host did in a run of races.

    Attributes:
        host: Its index in the run.
        got: Per race, the message id the host was told it stored ("send") or received ("receive"),
            None for a receive that came back empty-handed.
        races: ``"step/ERRNO"`` -> how many lost races the protocol reported and recovered from.
        error: The exception that ended the host's run early, or None.
    """

    host: int
    got: list[MessageId | None] = field(default_factory=list)
    races: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def lost(self, step: str) -> int:
        """Lost races reported for ``step`` (``create``, ``open``, ``rename``), any errno."""
        return sum(n for key, n in self.races.items() if key.startswith(step + "/"))


def race(
    roots: Sequence[Path],
    queue: str,
    mode: str,
    items: Sequence[str],
    *,
    visibility_ms: int = 600_000,
    stagger_ms: Sequence[float] = (0,),
) -> list[HostRun]:
    """Run one race per item, every host in it at once; return each host's :class:`HostRun`.

    Args:
        roots: One mq root per host, each on its own mount of one volume (the same directory).
        queue: An existing queue of that root.
        mode: ``"send"``: each item is a message id, and every host sends a message under it
            (``write_new`` with that id; once every host has, ``publish``); ``"receive"``: each item is the id of a
            ready message (receive count 0) and every host leases it.
        items: The races' ids, in order.
        visibility_ms: Visibility timeout of the receives, in ms.
        stagger_ms: In race ``i``, host ``i % len(roots)`` starts ``stagger_ms[i % len(stagger_ms)]`` ms after
            the others (so that some races find the file already moved, others meet it in mid-move).
    Raises:
        AssertionError: A host failed or the run took longer than :data:`RUN_TIMEOUT`.
    """
    ctx = multiprocessing.get_context("spawn")  # nothing of the test process's threads or state
    barrier = ctx.Barrier(len(roots))
    results: Any = ctx.Queue()
    hosts = [
        ctx.Process(
            target=_host,
            args=(str(root), queue, mode, list(items), visibility_ms, list(stagger_ms), barrier, results, i),
        )
        for i, root in enumerate(roots)
    ]
    for p in hosts:
        p.start()
    runs: dict[int, HostRun] = {}
    try:
        while len(runs) < len(hosts):
            run: HostRun = results.get(timeout=RUN_TIMEOUT)
            runs[run.host] = run
    except queues.Empty:
        raise AssertionError(f"race run not done after {RUN_TIMEOUT} s; finished: {sorted(runs)}") from None
    finally:
        for p in hosts:
            p.join(10)
            if p.is_alive():
                p.kill()
    failed = [r for r in runs.values() if r.error]
    assert not failed, f"a host failed: {failed[0].error}"
    return [runs[i] for i in range(len(hosts))]


def _host(
    root: str,
    queue: str,
    mode: str,
    items: list[str],
    visibility_ms: int,
    stagger_ms: list[float],
    barrier: threading.Barrier,
    results: Any,
    index: int,
) -> None:
    """One host's side of :func:`race` (in a spawned process)."""
    run = HostRun(index)
    races: Counter[str] = Counter()
    STORAGE_HOOKS.on_race = lambda step, errno_name: races.update([f"{step}/{errno_name}"])
    try:
        store = Store(root)
        name = QueueName(queue)
        for i, item in enumerate(items):
            barrier.wait(60)
            if i % barrier.parties == index and stagger_ms[i % len(stagger_ms)]:
                time.sleep(stagger_ms[i % len(stagger_ms)] / 1000)
            if mode == "send":
                pending = store.write_new(name, f"h{index}-{i}".encode(), message_id=MessageId(item))
                # Nobody publishes before both creates are done: a create after the winner's publish would find
                # ``new/Q.ID`` gone and rightly succeed (ids are never reused in real sends, so that is no race).
                barrier.wait(60)
                store.publish(pending)
                run.got.append(pending.message_id)
            else:
                message = store.lease(name, ready_name(MessageId(item), 0), visibility_ms)
                run.got.append(None if message is None else message.message_id)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
        run.error = f"host {index}: {exc!r}"
        barrier.abort()
    run.races = dict(races)
    results.put(run)
