"""The Python floor of issue 12's bars 1-3: the best an asyncio Python server can do on this machine.

A deliberately generous server (uvloop and a bare ``asyncio.Protocol``: no HTTP library, the end of
the headers and ``Content-Length`` found by hand, keep-alive, preformatted answers in the wire shape
bench/lua/post.lua and recv_delete.lua parse) that does per request exactly the durable file work of
mq (docs/protocol.md 6.2, 6.3, 6.5, 6.7) and nothing else: no ids beyond a counter, no JSON, no checks.
The same wrk scripts as bench/run.py drive it, against the same disk loops (bench/disk_loop.py), in ONE
run, alternating: per scenario and round the disk loop, a variant of the floor, the disk loop, the next
variant, ..., the disk loop (each variant's reference is the mean of the two disk loops around it; the
order of the variants rotates from round to round), rounds repeated, sends first (all rounds), then
receive+delete (whose unlinks would otherwise slow the next creates on this VM's journal-less ext4).

The file work per request:

- send (``POST /bench/messages``): ``open(new/bench.ID, O_CREAT|O_EXCL)``, ``write`` the body, ``fsync``,
  ``close``, ``rename`` into ``queues/bench/ID.0``, ``fsync(queues/bench)``, then 201;
- receive (``GET``): the oldest name from an in-memory list (the ready files listed at start-up),
  ``open``, ``rename`` into ``delay/``, ``read``, ``close``, then 200 with the body and ``X-Message-Id``
  (204 when the list is empty);
- delete (``DELETE /bench/messages/ID``): ``rename`` ``delay/ID`` into ``remove/``, ``fsync(remove/)``,
  200, ``unlink``.

Variants (``--send-variants``, ``--receive-variants``):

- ``inline``: all of it on the event loop thread, one request at a time per process, except the
  delete's ``unlink``, handed to a reaper thread (mq's unlinks are mq-reaper's, in another process);
- ``pool``: one hand-off per request to a thread pool that does the request's whole file work,
  each request with its own directory fsync (the disk loop's work plus HTTP; a delete is answered
  after its fsync, before its unlink);
- ``group``: sends: one hand-off to the pool for the file (create, write, fsync, close, rename), then
  a group commit of the directory fsync across concurrent sends (one syncer thread; a send arriving
  while a round runs waits for the next round; the loop is woken once per round: mq's
  ``DirSyncer.sync_later``). Receive+delete: the receive and the delete's rename on the loop, the
  fsync of ``remove/`` group-committed the same way, the unlinks handed to the reaper thread after
  the answers.

- ``syncfs``: sends only (receive+delete as ``group``): mq's ``--file-sync syncfs`` shape. One hand-off to
  the pool for the file without its fsync (create, write, close), then a group commit of ``syncfs`` on a
  descriptor of the root held open (one syncer thread, rounds as ``group``'s), whose thread renames the
  round's files into the queue and leaves them with the directory's group commit (as ``group``), which
  wakes the loop once per round.

``--mq NAME=TREE`` adds mq itself to the send scenarios, alternated with the floor and the disk loop:
mq, mq-mover and mq-reaper from source tree TREE (``PYTHONPATH`` and working directory; ``-`` is this
tree), on a fresh root with a queue ``bench``, extra ``mq`` arguments by ``--mq-arg NAME=ARG``; its
``syncfs`` and directory fsync rounds are counted from ``GET /metrics`` before and after.

With ``--processes N`` each variant also runs as N processes sharing the port (``SO_REUSEPORT``) in
the 16- and 64-client scenarios (suffix ``_pN``). What it prints is one JSON object: per bar and
variant the floor's rate over the disk loop's (median over the rounds), the server's CPU per
operation (from /proc), wrk's, and the machine's busy/steal/other CPU during each measurement.

    .venv/bin/python bench/python_floor.py --rounds 3 --seconds 5 --output /tmp/floor.json

The root (default a fresh ``/var/tmp/mq-floor-<time>``) must be on the disk to measure (never tmpfs);
it is removed at the end unless ``--keep-root``. Send files are kept until the end and recycled (by
rename) as the ready files of the receive+delete scenarios, so the run creates and deletes few
files beyond what it measures (docs/performance.md, "Issue 12's bars measured quiet, and what
journal-less ext4 does to creates").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import itertools
import json
import os
import queue as queue_mod
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bars import BAR_RECEIVE_OVER_DISK_RECEIVE, BAR_SENDS1_OVER_DISK1
from bench.disk_loop import disk_loop, receive_delete_loop
from bench.run import (
    BAR_SENDS_OVER_DISK,
    BODY_BYTES,
    REPO_DIR,
    Api,
    CpuMeter,
    Daemons,
    Wrk,
    _descendants,
    _loadavg,
    ensure_wrk,
    log,
    machine_info,
)

#: The queue name the wrk scripts address (MQB_QUEUE).
QUEUE = "bench"
VARIANTS = ("inline", "pool", "group", "syncfs")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

_OK_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
_CREATED = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nX-Message-Id: "
_RECEIVED = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Message-Id: "


# -- the server ------------------------------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """One keep-alive connection: requests parsed by hand, answered one at a time, in order."""

    __slots__ = ("buf", "busy", "server", "transport")

    def __init__(self, server: _Floor) -> None:
        self.server = server
        self.buf = b""
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TCPTransport is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._next()

    def finish(self, answer: bytes) -> None:
        """Send the answer of the request handed off (on the loop) and go on with any buffered request."""
        assert self.transport is not None
        self.transport.write(answer)
        self.busy = False
        if self.buf:
            self._next()

    def _next(self) -> None:
        assert self.transport is not None
        data = self.buf
        while data and not self.busy:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                break
            i = data.find(b"\r\nContent-Length:", 0, end)
            if i < 0:
                i = data[:end].lower().find(b"\r\ncontent-length:")
            length = int(data[i + 17 : data.find(b"\r\n", i + 2)]) if i >= 0 else 0
            total = end + 4 + length
            if len(data) < total:
                break
            sp = data.find(b" ")
            method, path = data[:sp], data[sp + 1 : data.find(b" ", sp + 1)]
            body = data[end + 4 : total]
            data = data[total:]
            answer = self.server.handle(self, method, path, body)
            if answer is None:
                self.busy = True  # handed off: finish() answers it
            else:
                self.transport.write(answer)
        self.buf = data


class _Reaper:
    """mq-reaper's part, off the loop: one thread unlinking the paths handed over, in arrival order."""

    def __init__(self) -> None:
        self.paths: queue_mod.SimpleQueue[str] = queue_mod.SimpleQueue()
        threading.Thread(target=self._run, name="floor-reaper", daemon=True).start()

    def add(self, path: str) -> None:
        self.paths.put(path)

    def _run(self) -> None:
        get = self.paths.get
        while True:
            path = get()
            try:
                os.unlink(path)
            except OSError:
                pass


class _Rounds:
    """A group commit with its own thread: :meth:`add` (any thread) queues an item; the thread runs rounds,
    each taking everything queued (so a round starts after every add it covers) and calling :meth:`_round`."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()
        self.pending: list[Any] = []
        self.leading = False
        self.rounds = 0
        self.wake: queue_mod.SimpleQueue[None] = queue_mod.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def add(self, item: Any) -> None:
        with self.lock:
            self.pending.append(item)
            if self.leading:
                return
            self.leading = True
        self.wake.put(None)

    def _run(self) -> None:
        while True:
            self.wake.get()
            while True:
                with self.lock:
                    batch, self.pending = self.pending, []
                    if not batch:
                        self.leading = False
                        break
                self.rounds += 1
                self._round(batch)

    def _round(self, batch: list[Any]) -> None:
        raise NotImplementedError


class _GroupSync(_Rounds):
    """Group commit of one directory's fsync (mq's ``DirSyncer.sync_later`` shape), with its own thread.

    :meth:`add` (any thread) queues ``(conn, answer, path_to_unlink_or_None)``; a round fsyncs the
    directory, wakes the loop ONCE to answer the round, then hands the round's paths to the reaper
    (unlinked after the answers).
    """

    def __init__(self, dfd: int, loop: asyncio.AbstractEventLoop, reaper: _Reaper | None = None) -> None:
        self.dfd, self.loop, self.reaper = dfd, loop, reaper
        super().__init__("floor-syncer")

    def _round(self, batch: list[tuple[_Conn, bytes, str | None]]) -> None:
        try:
            os.fsync(self.dfd)
            ok = True
        except OSError:
            ok = False
        self.loop.call_soon_threadsafe(_answer_round, batch, ok)
        if self.reaper is not None:
            for _, _, path in batch:
                if path is not None:
                    self.reaper.add(path)


def _answer_round(batch: list[tuple[_Conn, bytes, str | None]], ok: bool) -> None:
    for conn, answer, _ in batch:
        conn.finish(answer if ok else _UNAVAILABLE)


class _FsSync(_Rounds):
    """Group commit of ``syncfs`` (mq's ``FsSyncer.sync_later`` shape), with its own thread; then the renames.

    :meth:`add` (any thread) queues ``(conn, answer, src, dst)`` of a file written and closed without its
    fsync; a round calls ``syncfs`` on the root, renames each file into place and leaves it with the
    directory's group commit ``then`` (which answers). A failed round answers 503 and unlinks its files.
    """

    def __init__(self, root_fd: int, then: _GroupSync, loop: asyncio.AbstractEventLoop) -> None:
        import ctypes

        self.syncfs = ctypes.CDLL(None, use_errno=True).syncfs
        self.root_fd, self.then, self.loop = root_fd, then, loop
        super().__init__("floor-syncfs")

    def _round(self, batch: list[tuple[_Conn, bytes, str, str]]) -> None:
        if self.syncfs(self.root_fd) != 0:
            for _, _, src, _ in batch:
                with contextlib.suppress(OSError):
                    os.unlink(src)
            self.loop.call_soon_threadsafe(_answer_round, [(c, a, None) for c, a, _, _ in batch], False)
            return
        for conn, answer, src, dst in batch:
            os.rename(src, dst)
            self.then.add((conn, answer, None))


class _Pool:
    """Threads taking ``(job, conn, arg)``; a job returns the answer (sent on the loop) or None (it answers later)."""

    def __init__(self, threads: int, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.jobs: queue_mod.SimpleQueue[tuple[Callable[[_Conn, bytes], bytes | None], _Conn, bytes]] = (
            queue_mod.SimpleQueue()
        )
        for i in range(threads):
            threading.Thread(target=self._run, name=f"floor-pool-{i}", daemon=True).start()

    def submit(self, job: Callable[[_Conn, bytes], bytes | None], conn: _Conn, arg: bytes) -> None:
        self.jobs.put((job, conn, arg))

    def _run(self) -> None:
        get, call = self.jobs.get, self.loop.call_soon_threadsafe
        while True:
            job, conn, arg = get()
            try:
                answer = job(conn, arg)
            except FileNotFoundError:
                answer = _NOT_FOUND
            except OSError:
                answer = _UNAVAILABLE
            if answer is not None:
                call(conn.finish, answer)


class _Floor:
    """The file work of one worker process; :meth:`handle` runs or hands off one parsed request."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, root: Path, variant: str, index: int, workers: int, pool_threads: int
    ) -> None:
        self.loop, self.variant = loop, variant
        self.new, self.ready = str(root / "new"), str(root / "queues" / QUEUE)
        self.delay, self.remove = str(root / "delay"), str(root / "remove")
        self.tag = f"{index}-"
        self.counter = itertools.count()
        # Held open for the process's life (mq opens the directory per fsync round: a little more work).
        self.ready_fd = os.open(self.ready, _DIR)
        self.remove_fd = os.open(self.remove, _DIR)
        # This worker's share of the ready files listed at start-up, oldest first.
        names = sorted(os.listdir(self.ready))
        self.names = collections.deque(name.encode() for name in names[index::workers])
        self.pool = _Pool(pool_threads, loop) if variant != "inline" else None
        grouped = variant in ("group", "syncfs")
        self.send_sync = _GroupSync(self.ready_fd, loop) if grouped else None
        self.root_fd = os.open(str(root), _DIR)
        self.fs_sync = _FsSync(self.root_fd, self.send_sync, loop) if self.send_sync and variant == "syncfs" else None
        self.reaper = _Reaper() if variant != "pool" else None
        self.remove_sync = _GroupSync(self.remove_fd, loop, self.reaper) if grouped else None

    def handle(self, conn: _Conn, method: bytes, path: bytes, body: bytes) -> bytes | None:
        """The answer of a request done at once (on the loop), or None when handed off (answered later).

        ``GET /_rounds`` (the bench, not wrk): the group commits' rounds so far, ``directory syncfs``.
        """
        if path == b"/_rounds":
            counts = b"%d %d" % (
                self.send_sync.rounds if self.send_sync else 0,
                self.fs_sync.rounds if self.fs_sync else 0,
            )
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(counts), counts)
        try:
            if method == b"POST":
                if self.pool is None:
                    return self._write_publish(conn, body)
                if self.fs_sync is not None:
                    self.pool.submit(self._write_unsynced, conn, body)
                    return None
                self.pool.submit(self._write_publish if self.send_sync is None else self._write_join, conn, body)
                return None
            if method == b"GET":
                if not self.names:
                    return _NO_CONTENT
                name = self.names.popleft()
                if self.variant == "pool":
                    assert self.pool is not None
                    self.pool.submit(self._lease, conn, name)
                    return None
                return self._lease(conn, name)
            if method == b"DELETE":
                msg_id = path[path.rfind(b"/") + 1 :]
                if self.variant == "inline":
                    return self._remove_inline(conn, msg_id)
                if self.variant == "pool":
                    assert self.pool is not None
                    self.pool.submit(self._remove_pooled, conn, msg_id)
                    return None
                assert self.remove_sync is not None
                removed = f"{self.remove}/{msg_id.decode()}"
                os.rename(f"{self.delay}/{msg_id.decode()}", removed)
                self.remove_sync.add((conn, _OK_EMPTY, removed))
                return None
            return _NOT_FOUND
        except FileNotFoundError:
            return _NOT_FOUND
        except OSError:
            return _UNAVAILABLE

    # -- the file work (on the loop or a pool thread)

    def _write_new(self, body: bytes) -> bytes:
        """Steps 3-7 of docs/protocol.md 6.2 (create, write, fsync, close, rename); returns the 201."""
        name = f"{self.tag}{next(self.counter)}"
        src = f"{self.new}/{QUEUE}.{name}"
        fd = os.open(src, _CREATE, 0o644)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(src, f"{self.ready}/{name}.0")
        return _CREATED + name.encode() + b"\r\n\r\n"

    def _write_unsynced(self, conn: _Conn, body: bytes) -> None:
        """Steps 3-5 without the fsync (create, write, close); then its round, rename, directory fsync."""
        name = f"{self.tag}{next(self.counter)}"
        src = f"{self.new}/{QUEUE}.{name}"
        fd = os.open(src, _CREATE, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        assert self.fs_sync is not None
        self.fs_sync.add((conn, _CREATED + name.encode() + b"\r\n\r\n", src, f"{self.ready}/{name}.0"))

    def _write_publish(self, conn: _Conn, body: bytes) -> bytes:
        answer = self._write_new(body)
        os.fsync(self.ready_fd)
        return answer

    def _write_join(self, conn: _Conn, body: bytes) -> None:
        answer = self._write_new(body)
        assert self.send_sync is not None
        self.send_sync.add((conn, answer, None))

    def _lease(self, conn: _Conn, msg_id: bytes) -> bytes:
        """docs/protocol.md 6.3 without the checks: open, rename into delay/, read, close; returns the 200."""
        name = msg_id.decode()
        ready = f"{self.ready}/{name}"
        fd = os.open(ready, _READ)
        try:
            os.rename(ready, f"{self.delay}/{name}")
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        return b"%s%s\r\nContent-Length: %d\r\n\r\n%s" % (_RECEIVED, msg_id, len(data), data)

    def _remove_inline(self, conn: _Conn, msg_id: bytes) -> bytes:
        """6.5 on the loop (rename into remove/, fsync remove/), the unlink (6.7) handed to the reaper thread."""
        name = msg_id.decode()
        removed = f"{self.remove}/{name}"
        os.rename(f"{self.delay}/{name}", removed)
        os.fsync(self.remove_fd)
        assert self.reaper is not None
        self.reaper.add(removed)
        return _OK_EMPTY

    def _remove_pooled(self, conn: _Conn, msg_id: bytes) -> None:
        """The same on a pool thread, answering right after the fsync (the unlink comes after the answer)."""
        name = msg_id.decode()
        removed = f"{self.remove}/{name}"
        os.rename(f"{self.delay}/{name}", removed)
        os.fsync(self.remove_fd)
        self.loop.call_soon_threadsafe(conn.finish, _OK_EMPTY)
        try:
            os.unlink(removed)
        except OSError:
            pass


def _serve_worker(index: int, args: argparse.Namespace) -> None:
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    floor = _Floor(loop, Path(args.serve_root), args.variant, index, args.workers, args.pool_threads)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(1024)
    loop.run_until_complete(loop.create_server(lambda: _Conn(floor), sock=sock))
    os.write(1, b"ready %d\n" % index)  # one write: the workers share the pipe
    loop.run_forever()


def serve(args: argparse.Namespace) -> None:
    """The server (a child of the bench): ``--workers`` processes on one port, forked before any loop or thread."""
    for index in range(1, args.workers):
        if os.fork() == 0:
            try:
                _serve_worker(index, args)
            finally:
                os._exit(1)
    _serve_worker(0, args)


# -- the bench ---------------------------------------------------------------------------------------------------

#: Receive+delete figures assumed before any is measured (msgs/s), to size the ready files of the first round.
_GUESS_PER_S = {1: 2_500.0, 16: 6_000.0}


class Scenario:
    """One bar's measurement: a kind of work (``send`` or ``receive``) at a number of clients (= disk loop threads)."""

    def __init__(self, key: str, kind: str, clients: int, bar_key: str, bar: float) -> None:
        self.key, self.kind, self.clients, self.bar_key, self.bar = key, kind, clients, bar_key, bar


SCENARIOS = (
    Scenario("send1", "send", 1, "bar2_sends1_over_disk_loop1", BAR_SENDS1_OVER_DISK1),
    Scenario("send64", "send", 64, "bar1_sends64_over_disk_loop64", BAR_SENDS_OVER_DISK),
    Scenario("receive1", "receive", 1, "bar3_receive_delete1_over_disk_receive_loop1", BAR_RECEIVE_OVER_DISK_RECEIVE),
    Scenario(
        "receive16", "receive", 16, "bar3_receive_delete16_over_disk_receive_loop16", BAR_RECEIVE_OVER_DISK_RECEIVE
    ),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_root(path: Path) -> Path:
    """Create a floor server's directories (``new``, ``queues/bench``, ``delay``, ``remove``) under ``path``."""
    for sub in ("new", f"queues/{QUEUE}", "delay", "remove"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    return path


class FloorServer:
    """The floor server as a child process group (``--workers`` processes on one port).

    Args:
        root: A directory made by :func:`make_root`.
        variant: One of :data:`VARIANTS`.
        workers: Processes sharing the port (>= 1).
        pool_threads: Threads of each process's pool (variants ``pool`` and ``group``).
        log_path: Where the server's stderr goes.

    Raises:
        RuntimeError: The server did not report ready within 60 s (its stderr is in ``log_path``).
    """

    def __init__(self, root: Path, variant: str, workers: int, pool_threads: int, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            "--serve-root",
            str(root),
            "--variant",
            variant,
            "--workers",
            str(workers),
            "--pool-threads",
            str(pool_threads),
            "--port",
            str(self.port),
        ]
        with open(log_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True, text=True)
        ready, deadline = 0, time.monotonic() + 60
        assert self.proc.stdout is not None
        while ready < workers:
            line = self.proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"python_floor: the {variant} server did not start; see {log_path}")
            ready += line.startswith("ready ")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGKILL the server's process group (its own session) and reap it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Spare:
    """Files the send scenarios left, handed out (by rename) as ready files of the receive scenarios.

    Recycling them spares the run as many creates and, at the end, as many deletes (on this VM's
    journal-less ext4 every create pays for the inodes freed in the last 60-300 s). When they run out,
    :meth:`top_up` writes new ones (without fsync; one ``sync()`` after, as the disk loop's prefill does).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seq = itertools.count()
        self._files = self._scan()
        self.recycled = self.created = 0

    def _scan(self) -> Iterator[str]:
        for pattern in (f"floor-send/*/queues/{QUEUE}", "diskloop/run-*/queues/diskloop"):
            for d in sorted(self.root.glob(pattern)):
                for entry in os.scandir(d):
                    yield entry.path

    def top_up(self, ready_dir: Path, target: int) -> int:
        """Bring ``ready_dir`` to ``target`` files, named in arrival order; returns how many there are."""
        have = sum(1 for _ in os.scandir(ready_dir))
        body = os.urandom(BODY_BYTES)
        while have < target:
            name = str(ready_dir / f"{next(self.seq):012d}")
            src = next(self._files, None)
            if src is not None:
                os.rename(src, name)
                self.recycled += 1
            else:
                fd = os.open(name, _CREATE, 0o644)
                try:
                    os.write(fd, body)
                finally:
                    os.close(fd)
                self.created += 1
            have += 1
        os.sync()
        return have


class FloorBench:
    """The alternating rounds: disk loop, every floor variant, disk loop again, per scenario and round."""

    def __init__(self, args: argparse.Namespace, root: Path, wrk_exe: str) -> None:
        self.args, self.root, self.wrk_exe = args, root, wrk_exe
        self.duration = float(args.seconds)
        self.spare = Spare(root)
        self.log_dir = root / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.best_per_s: dict[str, float] = {}
        self.disk_receive_per_s: dict[int, float] = {}

    def variants(self, sc: Scenario) -> list[tuple[str, str, int]]:
        """``(name, variant, workers)`` to measure in ``sc``.

        At one client every chosen variant in one process; above one client the chosen variants also
        listed in ``--single-process-many`` in one process, and every chosen variant in ``--processes``.
        """
        chosen = self.args.send_variants if sc.kind == "send" else self.args.receive_variants
        if sc.clients == 1:
            return [(v, v, 1) for v in chosen]
        out = [(v, v, 1) for v in chosen if v in self.args.single_process_many]
        if self.args.processes > 1:
            out += [(f"{v}_p{self.args.processes}", v, self.args.processes) for v in chosen]
        if sc.kind == "send":
            out += [(name, "mq", 1) for name in self.args.mq]
        return out

    def scenario(self, sc: Scenario, rnd: int) -> dict[str, Any]:
        """One round of one scenario: disk loop, variant, disk loop, variant, ..., disk loop.

        Each variant is compared with the mean of the two disk loops around it (the disk's rate drifts
        within minutes on this VM); the variants' order is rotated from round to round.
        """
        variants = self.variants(sc)
        k = rnd % len(variants)
        disks = [self.disk(sc)]
        row: dict[str, Any] = {"floor": {}}
        for name, variant, workers in variants[k:] + variants[:k]:
            cell = self.floor(sc, rnd, name, variant, workers)
            disks.append(self.disk(sc))
            around = [float(disks[-2]["msgs_per_s"]), float(disks[-1]["msgs_per_s"])]
            ref = statistics.mean(around)
            cell["disk_loop_per_s"] = round(ref, 1)
            cell["disk_loop_drift"] = round(max(around) / min(around), 2) if min(around) else None
            cell["over_disk_loop"] = round(cell["per_s"] / ref, 3) if ref else None
            row["floor"][name] = cell
        row["disk_loops"] = disks
        row["disk_per_s"] = round(statistics.median(float(d["msgs_per_s"]) for d in disks), 1)
        log(
            f"round {rnd + 1} {sc.key}: disk loops "
            + " / ".join(f"{float(d['msgs_per_s']):,.0f}" for d in disks)
            + "/s; "
            + ", ".join(f"{n} {c['per_s']:,.0f}/s ({c['over_disk_loop']}x)" for n, c in row["floor"].items())
        )
        return row

    def disk(self, sc: Scenario) -> dict[str, Any]:
        """The disk loop of ``sc`` (durable sends, or receive+delete) at ``sc.clients`` threads, in this process."""
        meter = CpuMeter({})
        if sc.kind == "send":
            # keep_files: its files become ready files of the receive scenarios (Spare), deleted only at the end.
            res = disk_loop(self.root / "diskloop", threads=sc.clients, duration_s=self.duration, keep_files=True)
        else:
            # Sized on the best rate measured so far (a guess before the first): a loop that runs out ends its
            # window early and still reports its own rate ("exhausted").
            est = self.disk_receive_per_s.get(sc.clients, _GUESS_PER_S.get(sc.clients, 6_000.0))
            prefill = int(est * self.duration * 1.3) + 1000
            res = receive_delete_loop(
                self.root / "diskloop-receive", threads=sc.clients, duration_s=self.duration, prefill=prefill
            )
            rate = float(str(res["msgs_per_s"]))
            self.disk_receive_per_s[sc.clients] = max(self.disk_receive_per_s.get(sc.clients, 0.0), rate)
        res["cpu"] = meter.stop()
        return res

    def floor(self, sc: Scenario, rnd: int, name: str, variant: str, workers: int) -> dict[str, Any]:
        """One wrk run of the floor server (variant, workers) in ``sc``; its rate and CPU per operation."""
        if variant == "mq":
            return self.mq(sc, rnd, name)
        out: dict[str, Any] = {}
        if sc.kind == "send":
            froot = make_root(self.root / "floor-send" / f"r{rnd + 1}-{sc.key}-{name}")
        else:
            froot = make_root(self.root / "floor-receive" / f"r{rnd + 1}-{sc.key}")
            est = max(self.best_per_s.get(sc.key, 0.0), self.disk_receive_per_s.get(sc.clients, 0.0))
            need = int(est * self.duration * (1.5 if workers == 1 else 2.5)) + 1000
            out["ready_at_start"] = self.spare.top_up(froot / "queues" / QUEUE, need)
        server = FloorServer(froot, variant, workers, self.args.pool_threads, self.log_dir / "floor-server.log")
        try:
            wrk = Wrk(self.wrk_exe, server.url, self.log_dir / "wrk")
            meter = CpuMeter({"floor": server.pid})
            script, threads = ("post.lua", 2) if sc.kind == "send" else ("recv_delete.lua", None)
            rounds0 = floor_rounds(server.url) if workers == 1 else None
            run = wrk.run(script, clients=sc.clients, threads=threads, queue=QUEUE, duration_s=self.duration)
            cpu = meter.stop()
            if rounds0 is not None and sc.kind == "send" and run.counts.get("sent"):
                rounds = {k: v - rounds0[k] for k, v in floor_rounds(server.url).items()}
                out["rounds"] = rounds
                out["rounds_per_s"] = {k: round(v / run.duration_s, 1) for k, v in rounds.items()}
                out["sends_per_round"] = {k: round(run.counts["sent"] / v, 2) for k, v in rounds.items() if v}
        finally:
            server.stop()
        ops = run.counts.get("sent" if sc.kind == "send" else "cycles", 0)
        per_s = ops / run.duration_s if run.duration_s else 0.0
        self.best_per_s[sc.key] = max(self.best_per_s.get(sc.key, 0.0), per_s)
        out.update(
            variant=variant,
            workers=workers,
            per_s=round(per_s, 1),
            ops=ops,
            latency_ms=run.latency_ms(),
            statuses=run.statuses(),
            socket_errors=run.errors,
            server_cpu_ms_per_op=_ms_per_op(cpu, "floor_cpu_pct", ops),
            wrk_cpu_ms_per_op=_ms_per_op(cpu, "wrk_cpu_pct", ops),
            cpu=cpu,
        )
        if sc.kind == "receive":
            out["empty_receives"] = run.counts.get("empty", 0)
            out["ran_dry"] = out["empty_receives"] > 0
        return out

    def mq(self, sc: Scenario, rnd: int, name: str) -> dict[str, Any]:
        """One wrk run of mq (``--mq NAME=TREE``: mq, mq-mover, mq-reaper on a fresh root) in the send scenario ``sc``.

        Besides the floor's figures: the group commits' rounds (``GET /metrics``), and the CPU of mq's
        threads split into each process's main thread (the event loop) and its other threads (savers,
        syncers), with the loop threads' context switches (wake-ups) per send.
        """
        tree = self.args.mq[name]
        root = self.root / "mq-send" / f"r{rnd + 1}-{sc.key}-{name}"
        root.mkdir(parents=True, exist_ok=True)
        extra = self.args.mq_args.get(name, [])
        daemons = Daemons(root / "mq", self.log_dir / f"mq-{name}", None, extra, None if tree == "-" else Path(tree))
        try:
            api = Api(daemons.start())
            api.create_queue(QUEUE)
            api.close()
            port = int(daemons.url.rsplit(":", 1)[1])
            rounds0, threads0 = mq_rounds(port), _threads(daemons.pids()["mq"])
            wrk = Wrk(self.wrk_exe, daemons.url, self.log_dir / "wrk")
            meter = CpuMeter(daemons.pids())
            run = wrk.run("post.lua", clients=sc.clients, threads=2, queue=QUEUE, duration_s=self.duration)
            cpu = meter.stop()
            rounds1, threads1 = mq_rounds(port), _threads(daemons.pids()["mq"])
            daemons.check_alive()
        finally:
            daemons.stop()
        ops = run.counts.get("sent", 0)
        per_s = ops / run.duration_s if run.duration_s else 0.0
        self.best_per_s[sc.key] = max(self.best_per_s.get(sc.key, 0.0), per_s)
        daemons_pct = sum(cpu.get(f"{k}_cpu_pct", 0.0) for k in ("mq", "mover", "reaper"))
        out: dict[str, Any] = {
            "variant": "mq",
            "tree": str(REPO_DIR) if tree == "-" else tree,
            "mq_args": extra,
            "workers": 1,
            "per_s": round(per_s, 1),
            "ops": ops,
            "latency_ms": run.latency_ms(),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "server_cpu_ms_per_op": _ms_per_op({**cpu, "daemons_cpu_pct": daemons_pct}, "daemons_cpu_pct", ops),
            "wrk_cpu_ms_per_op": _ms_per_op(cpu, "wrk_cpu_pct", ops),
            "cpu": cpu,
        }
        if ops:
            rounds = {k: rounds1.get(k, 0.0) - rounds0.get(k, 0.0) for k in rounds1}
            out["rounds"] = rounds
            out["rounds_per_s"] = {k: round(v / run.duration_s, 1) for k, v in rounds.items()}
            out["sends_per_round"] = {k: round(ops / v, 2) for k, v in rounds.items() if v}
            loop = sum(v[0] - threads0.get(t, (0, 0))[0] for t, v in threads1.items() if v[2])
            rest = sum(v[0] - threads0.get(t, (0, 0))[0] for t, v in threads1.items() if not v[2])
            switches = sum(v[1] - threads0.get(t, (0, 0))[1] for t, v in threads1.items() if v[2])
            tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
            out["loop_cpu_ms_per_op"] = round(loop * tick_ms / ops, 3)
            out["other_threads_cpu_ms_per_op"] = round(rest * tick_ms / ops, 3)
            out["loop_switches_per_op"] = round(switches / ops, 3)
        return out


def floor_rounds(url: str) -> dict[str, float]:
    """A one-process floor server's group-commit rounds so far (``GET /_rounds``): ``directory``, ``syncfs``."""
    api = Api(url)
    try:
        _, _, body = api.request("GET", "/_rounds")
    finally:
        api.close()
    directory, syncfs = body.split()
    return {"directory": float(directory), "syncfs": float(syncfs)}


def mq_rounds(port: int) -> dict[str, float]:
    """mq's group-commit rounds so far by kind (``syncfs``, ``directory``, ``file``): ``GET /metrics`` counts."""
    api = Api(f"http://127.0.0.1:{port}")
    try:
        _, _, body = api.request("GET", "/metrics")
    finally:
        api.close()
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("mq_storage_fsync_duration_seconds_count{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = out.get(kind, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _threads(pid: int) -> dict[str, tuple[int, int, bool]]:
    """Per thread of ``pid`` and its descendants, by ``pid/tid``: (CPU ticks, voluntary switches, main thread?)."""
    out: dict[str, tuple[int, int, bool]] = {}
    for p in _descendants(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
                status = Path(f"/proc/{p}/task/{tid}/status").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            switches = sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt"))
            out[f"{p}/{tid}"] = (int(fields[11]) + int(fields[12]), switches, tid == str(p))
    return out


#: Rounds whose two disk loops around a variant differ by at most this factor count as "steady".
STEADY_DRIFT = 1.5


def _ms_per_op(cpu: dict[str, float], key: str, ops: int) -> float | None:
    return round(cpu[key] / 100 * cpu["wall_s"] * 1000 / ops, 3) if ops and key in cpu else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per bar: the disk loop's median, and per variant the medians over the rounds (ratio, rate, CPU per op)."""
    bars: dict[str, Any] = {}
    for sc in SCENARIOS:
        rows = rounds.get(sc.key)
        if not rows:
            continue
        variants: dict[str, Any] = {}
        for name in rows[0]["floor"]:
            cells = [row["floor"][name] for row in rows if name in row["floor"]]
            ratios = [c["over_disk_loop"] for c in cells]
            steady = [c["over_disk_loop"] for c in cells if (c["disk_loop_drift"] or 99) <= STEADY_DRIFT]
            variants[name] = {
                "over_disk_loop_median": _median(ratios),
                "over_disk_loop_rounds": ratios,
                "disk_loop_drift_rounds": [c["disk_loop_drift"] for c in cells],
                "over_disk_loop_median_steady": _median(steady),
                "steady_rounds": len(steady),
                "per_s_median": _median([c["per_s"] for c in cells]),
                "server_cpu_ms_per_op_median": _median([c["server_cpu_ms_per_op"] for c in cells]),
                "wrk_cpu_ms_per_op_median": _median([c["wrk_cpu_ms_per_op"] for c in cells]),
                "other_cpu_pct_median": _median([c["cpu"]["other_cpu_pct"] for c in cells]),
                "steal_pct_median": _median([c["cpu"]["steal_pct"] for c in cells]),
                "ran_dry_rounds": sum(1 for c in cells if c.get("ran_dry")),
            }
            for key in ("loop_cpu_ms_per_op", "other_threads_cpu_ms_per_op", "loop_switches_per_op"):
                if any(key in c for c in cells):
                    variants[name][f"{key}_median"] = _median([c.get(key) for c in cells])
            if any("sends_per_round" in c for c in cells):
                variants[name]["rounds_per_s"] = [c.get("rounds_per_s") for c in cells]
                variants[name]["sends_per_round"] = [c.get("sends_per_round") for c in cells]
        floors = [n for n in variants if n not in rows[0]["floor"] or rows[0]["floor"][n]["variant"] != "mq"]
        best = max(floors or variants, key=lambda n: variants[n]["over_disk_loop_median"] or 0.0)
        top = variants[best]["over_disk_loop_median"]
        disk_rows = [d for r in rows for d in r["disk_loops"]]
        bars[sc.bar_key] = {
            "bar": sc.bar,
            "clients": sc.clients,
            "disk_loop_per_s_median": _median([r["disk_per_s"] for r in rows]),
            "disk_loop_per_s_rounds": [r["disk_per_s"] for r in rows],
            "disk_loop_cpu_ms_per_msg_median": _median([d.get("cpu_ms_per_msg") for d in disk_rows]),
            "disk_loop_other_cpu_pct_median": _median([d["cpu"]["other_cpu_pct"] for d in disk_rows]),
            "variants": variants,
            "best_variant": best,
            "best_over_disk_loop_median": top,
            "reachable": top is not None and top >= sc.bar,
        }
    return bars


def _table(bars: dict[str, Any]) -> str:
    lines = ["bar / variant: floor over disk loop (median, rounds), floor /s, server CPU ms/op, wrk CPU ms/op"]
    for key, b in bars.items():
        lines.append(f"{key} (bar {b['bar']}, disk loop {b['disk_loop_per_s_median']}/s): best {b['best_variant']}")
        for name, v in b["variants"].items():
            lines.append(
                f"  {name:10s} {v['over_disk_loop_median']} {v['over_disk_loop_rounds']} steady "
                f"{v['over_disk_loop_median_steady']} ({v['steady_rounds']}) {v['per_s_median']}/s "
                f"server {v['server_cpu_ms_per_op_median']} wrk {v['wrk_cpu_ms_per_op_median']}"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--root", help="fresh directory on the disk to measure (default /var/tmp/mq-floor-<time>)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per scenario (default 3)")
    p.add_argument("--seconds", type=float, default=5, help="seconds per measurement (default 5)")
    p.add_argument(
        "--scenarios",
        default=",".join(sc.key for sc in SCENARIOS),
        help="comma-separated, among " + ",".join(sc.key for sc in SCENARIOS) + " (default all)",
    )
    p.add_argument("--send-variants", default="inline,pool,group", help="among inline,pool,group")
    p.add_argument("--receive-variants", default="inline,pool,group", help="among inline,pool,group")
    p.add_argument(
        "--processes", type=int, default=2, help="also run each variant as N processes at 16/64 clients (1: never)"
    )
    p.add_argument(
        "--single-process-many",
        default="pool,group",
        help="variants also run in ONE process at 16/64 clients (default pool,group; inline there is one "
        "fsync at a time, the 1-thread disk loop's rate)",
    )
    p.add_argument(
        "--mq",
        action="append",
        default=[],
        metavar="NAME=TREE",
        help="also measure mq from source tree TREE (- = this tree) in the send scenarios above one client",
    )
    p.add_argument("--mq-arg", action="append", default=[], metavar="NAME=ARG", help="an extra mq argument of NAME")
    p.add_argument("--pool-threads", type=int, default=64, help="threads per server process (default 64)")
    p.add_argument("--keep-root", action="store_true", help="leave the root in place (default: removed at the end)")
    p.add_argument("--output", help="also write the JSON here")
    p.add_argument("--no-install", action="store_true", help="never apt-get install wrk")
    # The server (a child of the bench).
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-root", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="inline", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for attr in ("send_variants", "receive_variants", "single_process_many"):
        value = [v for v in getattr(args, attr).split(",") if v]
        if set(value) - set(VARIANTS):
            p.error(f"--{attr.replace('_', '-')}: choose among {','.join(VARIANTS)}")
        setattr(args, attr, value)
    args.mq = dict(item.split("=", 1) for item in args.mq)
    mq_args: dict[str, list[str]] = {}
    for item in args.mq_arg:
        name, arg = item.split("=", 1)
        mq_args.setdefault(name, []).append(arg)
    args.mq_args = mq_args
    keys = {sc.key for sc in SCENARIOS}
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    if set(args.scenarios) - keys:
        p.error(f"--scenarios: choose among {','.join(sorted(keys))}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the rounds (sends first, then receive+delete); print one JSON object."""
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    wrk_exe = ensure_wrk(not args.no_install)
    started = datetime.datetime.now(datetime.UTC)
    root = Path(args.root or f"/var/tmp/mq-floor-{started:%Y%m%dT%H%M%S}").resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"python_floor: {root} is not empty; pass a fresh --root")
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "the Python floor of issue 12's bars 1-3 (bench/python_floor.py)",
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(root, wrk_exe),
        "loadavg_at_start": _loadavg(),
        "config": {
            "root": str(root),
            "seconds": args.seconds,
            "rounds": args.rounds,
            "send_variants": args.send_variants,
            "receive_variants": args.receive_variants,
            "processes": args.processes,
            "single_process_many": args.single_process_many,
            "steady_drift": STEADY_DRIFT,
            "pool_threads": args.pool_threads,
            "body_bytes": BODY_BYTES,
            "load_generator": "wrk + bench/lua/post.lua (2 threads) and recv_delete.lua (one connection per thread)",
        },
    }
    bench = FloorBench(args, root, wrk_exe)
    rounds: dict[str, list[dict[str, Any]]] = {}
    loads: list[list[float]] = []
    try:
        for kind in ("send", "receive"):
            for rnd in range(args.rounds):
                loads.append(_loadavg())
                for sc in SCENARIOS:
                    if sc.kind == kind and sc.key in args.scenarios:
                        rounds.setdefault(sc.key, []).append(bench.scenario(sc, rnd))
    except (RuntimeError, OSError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {result['error']}")
    result["rounds"] = rounds
    result["loadavg_per_round"] = loads
    result["ready_files"] = {"recycled_from_sends": bench.spare.recycled, "created": bench.spare.created}
    result["bars"] = summarize(rounds)
    result["loadavg_at_end"] = _loadavg()
    result["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = json.dumps(result, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    log("\n" + _table(result["bars"]))
    if not args.keep_root:
        log(f"removing {root}")
        shutil.rmtree(root, ignore_errors=True)
    print(text)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
