"""The floor of issue 12's large-body bar: HTTP over loopback plus the disk loop's file work, without mq.

The bar: sends of 1 MiB (and 64 KiB) bodies at 16 clients reach 0.8x the 16-thread send disk loop's MB/s
(bench/disk_loop.py) at the same size. The disk loop writes one body buffer that never leaves its cache; a
server first has to take every body off a loopback TCP connection (wrk's copy into the socket, the loopback's
own work, the copy out of it), and on a 2-core machine that CPU is taken from the file work. This bench
measures what that costs at the least, with a server far simpler than mq:

- ``threads``: one thread per connection, blocking sockets; the request head read into a scratch buffer, the
  body with ``recv_into`` straight into one buffer of its ``Content-Length`` (kept per connection), then the
  disk loop's system calls: ``open(O_CREAT|O_EXCL)``, one ``write``, ``fsync``, ``close``, ``rename``,
  ``fsync`` of the directory; a preformatted 201. No HTTP library, no event loop, no ids, no checks.

The same wrk script as bench/run.py's large step (``post.lua``, 2 threads, ``--clients`` connections) drives it,
alternating with the disk loop in one run: disk loop, floor, disk loop, floor, ..., disk loop; each floor
round's reference is the mean of the disk loops around it. It prints one JSON object (per size: the rounds'
ratios and their median, the server's and wrk's CPU per message, the machine's busy share)::

    .venv/bin/python bench/large_floor.py --root /var/tmp/large-floor --sizes 1048576 --rounds 3 --seconds 3

The root must be on the disk to measure; files are kept until the end (deleting them between rounds makes the
next creates slower on this VM's journal-less ext4), then the root is removed unless ``--keep-root``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.disk_loop import disk_loop
from bench.run import CpuMeter, Wrk, ensure_wrk, log

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_CREATED = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nX-Message-Id: %d\r\n\r\n"


def _serve_connection(conn: socket.socket, root: str, tag: str, dfd: int) -> None:
    """Answer one connection's sends until it closes (the ``threads`` variant)."""
    head = bytearray(65536)
    view = memoryview(head)
    have = 0
    body = bytearray(0)
    n = 0
    new, ready = f"{root}/new/", f"{root}/queues/bench/"
    with conn, contextlib.suppress(OSError):  # wrk's connections are reset when a round ends
        while True:
            end = head.find(b"\r\n\r\n", 0, have)
            if end < 0:
                got = conn.recv_into(view[have:])
                if not got:
                    return
                have += got
                continue
            i = head.lower().find(b"\r\ncontent-length:", 0, end)
            length = int(head[i + 17 : head.find(b"\r\n", i + 2)]) if i >= 0 else 0
            start = end + 4
            if len(body) != length:
                body = bytearray(length)
            taken = min(have - start, length)
            body[:taken] = view[start : start + taken]
            rest = have - start - taken
            view[:rest] = view[start + taken : have]
            have = rest
            bview = memoryview(body)
            while taken < length:
                got = conn.recv_into(bview[taken:])
                if not got:
                    return
                taken += got
            n += 1
            name = f"{tag}-{n}"
            fd = os.open(new + name, _CREATE, 0o644)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(new + name, ready + name + ".0")
            os.fsync(dfd)
            conn.sendall(_CREATED % n)


def serve(root: str, port: int) -> None:
    """The ``threads`` server: accept on 127.0.0.1:``port``, a thread per connection; prints ``ready``."""
    dfd = os.open(f"{root}/queues/bench", _DIR)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    os.write(1, b"ready\n")
    k = 0
    while True:
        conn, _ = sock.accept()
        k += 1
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_connection, args=(conn, root, f"c{k}", dfd), daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def floor_round(root: Path, wrk_exe: str, clients: int, size: int, seconds: float, log_dir: Path) -> dict[str, Any]:
    """One wrk run of the floor server on a fresh directory under ``root``: sends/s, MB/s, CPU per message."""
    for sub in ("new", "queues/bench"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(root), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True, text=True)
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("ready"):
            raise RuntimeError("large_floor: the server did not start")
        wrk = Wrk(wrk_exe, f"http://127.0.0.1:{port}", log_dir)
        meter = CpuMeter({"floor": proc.pid})
        run = wrk.run("post.lua", clients=clients, threads=2, queue="bench", duration_s=seconds, body_bytes=size)
        cpu = meter.stop()
    finally:
        proc.kill()
        proc.wait()
    sent = run.counts.get("sent", 0)
    rate = sent / run.duration_s if run.duration_s else 0.0
    return {
        "sends_per_s": round(rate, 1),
        "mb_per_s": round(rate * size / 1e6, 2),
        "latency_ms": run.latency_ms(),
        "statuses": run.statuses(),
        "floor_cpu_ms_per_msg": round(cpu["floor_cpu_pct"] * 10 / rate, 3) if rate else None,
        "wrk_cpu_ms_per_msg": round(cpu["wrk_cpu_pct"] * 10 / rate, 3) if rate else None,
        "cpu": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default="/var/tmp/large-floor", help="fresh directory on the disk to measure")
    p.add_argument("--sizes", default="1048576", help="body sizes in bytes, comma-separated (default 1048576)")
    p.add_argument("--clients", type=int, default=16, help="wrk connections and disk-loop threads (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="floor rounds per size, each between two disk loops")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default 3)")
    p.add_argument("--keep-root", action="store_true", help="leave the root in place")
    p.add_argument("--output", help="also write the JSON here")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=False)
    wrk_exe = ensure_wrk(False)
    out: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds, "load_at_start": os.getloadavg()}
    try:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            loops: list[dict[str, Any]] = []
            floors: list[dict[str, Any]] = []

            def one_loop(size: int = size, loops: list[dict[str, Any]] = loops) -> None:
                d = root / f"diskloop-{size}-{len(loops)}"
                d.mkdir()
                loops.append(
                    disk_loop(d, threads=args.clients, duration_s=args.seconds, body_bytes=size, keep_files=True)
                )
                log(f"large_floor: disk loop {size:,} B: {loops[-1]['mb_per_s']} MB/s")

            one_loop()
            for r in range(args.rounds):
                floors.append(floor_round(root / f"floor-{size}-{r}", wrk_exe, args.clients, size, args.seconds, root))
                log(f"large_floor: floor {size:,} B: {floors[-1]['mb_per_s']} MB/s ({floors[-1]['cpu']})")
                one_loop()
            ratios = [
                round(f["mb_per_s"] / ((loops[i]["mb_per_s"] + loops[i + 1]["mb_per_s"]) / 2), 3)
                for i, f in enumerate(floors)
            ]
            out[f"bytes_{size}"] = {
                "floor_over_disk_loop": ratios,
                "median": statistics.median(ratios),
                "floor": floors,
                "disk_loops": loops,
            }
            log(f"large_floor: {size:,} B: floor / disk loop {ratios} (median {statistics.median(ratios)})")
    finally:
        out["load_at_end"] = os.getloadavg()
        if not args.keep_root:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
