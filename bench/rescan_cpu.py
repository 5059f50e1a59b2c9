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

Usage::

    .venv/bin/python bench/rescan_cpu.py [--names 1000000] [--rounds 3] [--popped 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

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
    diff = snapshot.compare(listing)
    out["worker_compare_s"] = time.perf_counter() - t
    t = time.perf_counter()
    new.apply_rescan(diff)
    out["loop_apply_s"] = time.perf_counter() - t
    out["loop_after_s"] = out["loop_snapshot_s"] + out["loop_apply_s"]
    assert len(old) == len(new) == len(listed)
    return out


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
    print(json.dumps({"names": args.names, "rounds": args.rounds, "median_s": medians}, indent=1))


if __name__ == "__main__":
    main()
