"""Large bodies' file sync by itself: files/s of a syncfs round (with or without early writeback) or of file fsyncs.

``--threads`` writer threads each loop: create a file (O_EXCL), write ``--body-bytes`` with one
``writev`` (a 64-byte head and the body, as a message file), and by ``--forms``:

- ``plain``: close it, leave it with mq's own ``syncfs`` group commit (``Disk.syncfs_later``, the rounds
  mq's savers join) and wait for its round;
- ``early``: the same after ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` (its writeback started at once;
  tried for mq at stop 21, not kept);
- ``fsync``: fsync it (mq's savers with file fsyncs; ``--fsync-threads 8``: only 8 write then, as mq's
  8 savers),

then unlink it. The forms alternate every ``--slice`` seconds within one run, so a drift of the disk's
rate over minutes falls on all alike; each form's files/s and latency (p50, p99) are summed over its
slices. No rename and no directory fsync (every form would pay them alike).

    .venv/bin/python bench/file_sync_size.py --root /var/tmp/<you>-fs --body-bytes 65536 \
        --forms plain,fsync --fsync-threads 8

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from mqcore.protocol._fs import Disk

_SYNC_FILE_RANGE = ctypes.CDLL(None, use_errno=True).sync_file_range
_SYNC_FILE_RANGE.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def start_writeback(fd: int) -> None:
    """``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writing the file's dirty pages back, no wait."""
    _SYNC_FILE_RANGE(fd, 0, 0, 2)


#: The forms (the module's docstring).
FORMS = ("plain", "early", "fsync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="a new directory on the disk to measure (removed after)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--body-bytes", type=int, default=65_536)
    ap.add_argument("--seconds", type=float, default=20.0, help="the whole run, both forms")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of one form before the next one's")
    ap.add_argument("--fsync-threads", type=int, default=0, help="threads writing in fsync slices (0: all)")
    ap.add_argument("--forms", default="plain,early", help=f"the forms to alternate, comma-separated, of {FORMS}")
    args = ap.parse_args()
    forms = args.forms.split(",")
    root = Path(args.root)
    root.mkdir(parents=True)
    disk = Disk()
    disk.use_syncfs(str(root))
    head, body = b"h" * 64, os.urandom(args.body_bytes)
    started = time.monotonic()
    stop = started + args.seconds
    counts = {form: 0 for form in forms}
    latencies: dict[str, list[float]] = {form: [] for form in forms}
    lock = threading.Lock()

    def form_now(now: float) -> str:
        return forms[int((now - started) / args.slice) % len(forms)]

    def writer(n: int) -> None:
        k = 0
        while (now := time.monotonic()) < stop:
            form = form_now(now)
            if form == "fsync" and args.fsync_threads and n >= args.fsync_threads:
                time.sleep(0.01)  # an idle thread in this slice (mq: only --workers savers fsync at once)
                continue
            path = str(root / f"{n}.{k}")
            k += 1
            t0 = time.perf_counter()
            epoch = disk.syncfs_epoch()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.writev(fd, (head, body))
            if form == "early":
                start_writeback(fd)
            if form == "fsync":
                os.fsync(fd)
            os.close(fd)
            if form != "fsync":
                done = threading.Event()
                disk.syncfs_later(lambda error, done=done: done.set(), epoch)
                done.wait()
            seconds = time.perf_counter() - t0
            with lock:
                counts[form] += 1
                latencies[form].append(seconds)
            os.unlink(path)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shutil.rmtree(root)
    half = args.seconds / len(forms)
    out = {
        "threads": args.threads,
        "body_bytes": args.body_bytes,
        "seconds_per_form": half,
        "loadavg": os.getloadavg(),
    }
    for form in forms:
        lat = sorted(latencies[form]) or [0.0]
        out[form] = {
            "files_per_s": round(counts[form] / half, 1),
            "mb_per_s": round(counts[form] * args.body_bytes / half / 1e6, 2),
            "p50_ms": round(statistics.median(lat) * 1e3, 3),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
        }
    for form in forms[1:]:
        out[f"{form}_over_{forms[0]}"] = round(out[form]["files_per_s"] / out[forms[0]]["files_per_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
