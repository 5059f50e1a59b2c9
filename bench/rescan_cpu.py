"""CPU of one periodic rescan of a deep queue's index: on the event loop, and on the worker thread.

mq lists each indexed queue again on its turn of the periodic rescan (every
30 x ``--rescan-interval`` = 5 minutes for a queue watched by inotify) and
brings its ready index in line with the listing. Until stop 20 the loop did
that with ``ReadyIndex.drop_unlisted`` and then ``update`` of every listed
name: over a second at 1,000,000 ready messages in which no request was
served (issue 12, docs/performance.md "Draining 1,000,000 messages"). Now the
loop takes a ``snapshot`` (a dict copy), a worker thread compares the listing
with it (``IndexSnapshot.compare``) and the loop applies the differences
(``apply_rescan``). No files: names are made in memory (the listing's parse,
``Listing``, runs on the worker thread in both versions and is timed apart).

The comparison is a second or two of CPU on a saver; a thread that holds the
GIL that long makes every thread back from a system call wait for it up to the
switch interval (5 ms) each time. The last three figures are the ``os.stat``
calls per second of one thread alone, beside a comparison without pauses, and
beside one with the daemon's pause (2 ms every 1,024 names).

Usage::

    .venv/bin/python bench/rescan_cpu.py [--names 1000000] [--rounds 3] [--popped 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from daemons._queues import RESCAN_PAUSE_SECONDS  # noqa: E402
from mqcore.index import Listing, ReadyIndex  # noqa: E402
from mqcore.names import IdGenerator, ready_name  # noqa: E402


def _received(names: list[str], popped: int) -> ReadyIndex:
    """An index of ``names`` whose ``popped`` oldest were received since."""
    index = ReadyIndex(Listing(names))
    for _ in range(popped):
        index.pop_oldest()
    return index


def _round(names: list[str], popped: int) -> dict[str, float]:
    """One rescan each way of an index of ``names`` of which ``popped`` were received before the listing."""
    listed = names[popped:]
    out: dict[str, float] = {}
    t = time.perf_counter()
    listing = Listing(listed)
    out["worker_listing_parse_s"] = time.perf_counter() - t

    old, new = _received(names, popped), _received(names, popped)
    t = time.perf_counter()
    mark = old.mark()
    old.drop_unlisted(mark, listing)
    old.update(listing)
    out["loop_before_s"] = time.perf_counter() - t

    t = time.perf_counter()
    snapshot = new.snapshot()
    out["loop_snapshot_s"] = time.perf_counter() - t
    t = time.perf_counter()
    diff = snapshot.compare(listed)
    out["worker_compare_s"] = time.perf_counter() - t
    t = time.perf_counter()
    new.apply_rescan(diff)
    out["loop_apply_s"] = time.perf_counter() - t
    out["loop_after_s"] = out["loop_snapshot_s"] + out["loop_apply_s"]
    assert len(old) == len(new) == len(listed)
    return out


def _syscalls_beside(work: Callable[[], object] | None, seconds: float) -> float:
    """``os.stat`` calls per second of one thread (each releases and takes back the GIL, as a fetcher's
    lease does) while another thread runs ``work`` (None: nothing beside it, for ``seconds``)."""
    done = threading.Event()
    count = 0

    def syscalls() -> None:
        nonlocal count
        stat = os.stat
        while not done.is_set():
            stat(".")
            count += 1

    thread = threading.Thread(target=syscalls)
    t = time.perf_counter()
    thread.start()
    if work is None:
        time.sleep(seconds)
    else:
        work()
    done.set()
    thread.join()
    return count / (time.perf_counter() - t)


def _gil(names: list[str], popped: int) -> dict[str, float]:
    """The syscall thread's rate alone, beside a compare without pauses, and beside the daemon's."""
    snapshot = _received(names, popped).snapshot()
    listed = names[popped:]
    return {
        "syscalls_per_s_alone": _syscalls_beside(None, 1.0),
        "syscalls_per_s_beside_compare": _syscalls_beside(lambda: snapshot.compare(listed), 0),
        "syscalls_per_s_beside_compare_paused": _syscalls_beside(
            lambda: snapshot.compare(listed, pause=lambda: time.sleep(RESCAN_PAUSE_SECONDS)), 0
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=1_000_000, help="ready messages in the index")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--popped", type=int, default=1000, help="names received between the index and the listing")
    args = parser.parse_args()
    gen = IdGenerator()
    names = [ready_name(gen.next_id(), 0) for _ in range(args.names)]
    rounds = [_round(names, args.popped) for _ in range(args.rounds)]
    medians = {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}
    gil = [_gil(names, args.popped) for _ in range(args.rounds)]
    medians.update({k: round(statistics.median(r[k] for r in gil)) for k in gil[0]})
    print(json.dumps({"names": args.names, "rounds": args.rounds, "median_s": medians}, indent=1))


if __name__ == "__main__":
    main()
