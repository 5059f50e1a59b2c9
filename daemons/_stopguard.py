"""A stop that ends within ``--stop-timeout`` even when a thread is stuck in the filesystem.

A GlusterFS FUSE client that stops answering, or an NFS hard mount whose server went away,
leaves a thread in a system call (``stat``, ``open``, ``fsync``...) that no signal but SIGKILL
ends. A daemon that joins such a thread on its way out (its savers, ``asyncio.to_thread``'s
pool at the loop's close, ``threading._shutdown``) then ignores SIGTERM until systemd's
``TimeoutStopSec`` kills it, with nothing in the log saying why (issue 12, stop 21).

Two parts, both threads of their own, so neither needs the event loop nor the main thread
(either may be the one stuck):

- :class:`StopGuard` is armed by the first SIGTERM or SIGINT. If the process still runs
  ``timeout_seconds`` later it logs one line naming the threads blocked in the filesystem, the
  call each is in and for how long (:func:`blocked_threads`), and exits at once with
  :data:`EXIT_STUCK` (``os._exit``: joining them would wait for ever). Whatever a blocked thread was
  doing was never answered: a send is answered 201 only after its fsyncs returned.
- :func:`forward_signals` takes SIGTERM and SIGINT off every other thread (``pthread_sigmask``)
  and waits for them in its own thread (``sigwait``): a signal is then seen, the guard armed
  and the loop told, even while the main thread is blocked in a system call (a thread in a FUSE
  call takes a pending signal only when the call returns).

Thread states come from ``/proc/self/task``: a thread counts as blocked in the filesystem while it
is inside one of the file system calls of :data:`FILE_SYSCALLS` (x86_64 numbers; on other
machines the call is named by number) or sleeps uninterruptibly (state ``D``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("mq.runtime")

#: Exit code of a stop cut short by the guard (sysexits.h EX_UNAVAILABLE: the filesystem did not answer).
EXIT_STUCK = 69
#: Default of ``--stop-timeout`` in seconds for mq, 5 s below its unit's ``TimeoutStopSec`` (systemd/mq.service).
DEFAULT_STOP_TIMEOUT_SECONDS = 15.0
#: mq-mover's default (its unit: TimeoutStopSec=30).
MOVER_STOP_TIMEOUT_SECONDS = 25.0
#: mq-reaper's default (its unit: TimeoutStopSec=60; an expiry sweep finishes the queue it lists).
REAPER_STOP_TIMEOUT_SECONDS = 50.0
#: Seconds between two looks at the threads while a stop is under way (how long a call was seen stuck).
SAMPLE_SECONDS = 0.5
#: The stop signals.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

#: x86_64 system calls on files: number -> (name, which argument is a path (1-6) or 0, which is a file descriptor or 0).
FILE_SYSCALLS: dict[int, tuple[str, int, int]] = {
    0: ("read", 0, 1), 1: ("write", 0, 1), 2: ("open", 1, 0), 3: ("close", 0, 1), 4: ("stat", 1, 0),
    5: ("fstat", 0, 1), 6: ("lstat", 1, 0), 17: ("pread", 0, 1), 18: ("pwrite", 0, 1), 21: ("access", 1, 0),
    74: ("fsync", 0, 1), 75: ("fdatasync", 0, 1), 76: ("truncate", 1, 0), 77: ("ftruncate", 0, 1),
    78: ("getdents", 0, 1), 82: ("rename", 1, 0), 83: ("mkdir", 1, 0), 84: ("rmdir", 1, 0), 85: ("creat", 1, 0),
    86: ("link", 1, 0), 87: ("unlink", 1, 0), 89: ("readlink", 1, 0), 137: ("statfs", 1, 0), 138: ("fstatfs", 0, 1),
    217: ("getdents", 0, 1), 254: ("inotify_add_watch", 2, 0), 257: ("open", 2, 0), 258: ("mkdir", 2, 0),
    262: ("stat", 2, 0), 263: ("unlink", 2, 0), 264: ("rename", 2, 0), 265: ("link", 2, 0), 269: ("access", 2, 0),
    285: ("fallocate", 0, 1), 306: ("syncfs", 0, 1), 316: ("rename", 2, 0), 332: ("stat", 2, 0),
    439: ("access", 2, 0),
}  # fmt: skip


@dataclass(frozen=True)
class Blocked:
    """One thread blocked in the filesystem.

    Attributes:
        thread: The thread's name (``mq-saver-0``, ``MainThread``...).
        call: The system call and its file, e.g. ``stat of queues/a`` (paths relative to the root).
        where: The innermost Python frame, e.g. ``read_json (mqcore/protocol/_fs.py:571)``, or "".
    """

    thread: str
    call: str
    where: str

    def text(self) -> str:
        """``thread: call in where``, one item of a log line."""
        return f"{self.thread}: {self.call}" + (f" in {self.where}" if self.where else "")


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def _memory_string(address: int) -> str:
    """The NUL-terminated string at ``address`` of this process ("?" if unreadable)."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return "?"
    try:
        for size in (1024, 128):  # a shorter read if the longer one crosses into an unmapped page
            with contextlib.suppress(OSError, OverflowError):
                return os.pread(fd, size, address).split(b"\0", 1)[0].decode("utf-8", "replace")
        return "?"
    finally:
        os.close(fd)


def _shorten(path: str, root: str) -> str:
    return path[len(root) + 1 :] or "." if root and path.startswith(root + "/") else path


def _call(syscall: str, root: str) -> str | None:
    """``stat of queues/a`` for the ``/proc/.../syscall`` line of a thread in a file system call, else None."""
    fields = syscall.split()
    if not fields or not fields[0].lstrip("-").isdigit():
        return None  # "running"
    number = int(fields[0])
    if platform.machine() != "x86_64":
        return f"system call {number}"
    if number not in FILE_SYSCALLS:
        return None
    name, path_arg, fd_arg = FILE_SYSCALLS[number]
    if path_arg:
        return f"{name} of {_shorten(_memory_string(int(fields[path_arg], 16)), root)}"
    try:
        target = os.readlink(f"/proc/self/fd/{int(fields[fd_arg], 16)}")  # the kernel's name: no file system call
    except (OSError, ValueError):
        return None
    if not target.startswith("/"):
        return None  # a socket, pipe, eventfd: not the filesystem
    return f"{name} of {_shorten(target, root)}"


def _where(frame: object) -> str:
    code = getattr(frame, "f_code", None)
    if code is None:
        return ""
    filename = code.co_filename
    for top in ("mqcore", "daemons"):
        marker = f"{os.sep}{top}{os.sep}"
        if marker in filename:
            filename = top + os.sep + filename.split(marker, 1)[1]
    return f"{code.co_qualname} ({filename}:{getattr(frame, 'f_lineno', 0)})"


def blocked_threads(root: str = "") -> dict[int, Blocked]:
    """The threads of this process now blocked in the filesystem, by native thread id.

    Args:
        root: Paths under it are named relative to it ("" = absolute paths).
    Returns:
        ``{native id: Blocked}``; empty where ``/proc`` is not there.
    """
    threads = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
    frames = sys._current_frames()
    out: dict[int, Blocked] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid_text in tids:
        tid = int(tid_text)
        if tid == threading.get_native_id():
            continue
        try:
            stat = _read(f"/proc/self/task/{tid}/stat")
            call = _call(_read(f"/proc/self/task/{tid}/syscall"), root)
        except OSError:
            continue  # the thread ended meanwhile
        if call is None and stat[stat.rindex(")") + 2 :][:1] != "D":
            continue
        thread = threads.get(tid)
        frame = frames.get(thread.ident) if thread is not None and thread.ident is not None else None
        name = thread.name if thread is not None else f"thread {tid}"
        out[tid] = Blocked(name, call or "uninterruptible sleep", _where(frame))
    return out


class StopGuard:
    """Exit a stop that has not ended ``timeout_seconds`` after it began (see the module's docstring).

    Args:
        timeout_seconds: The bound (``--stop-timeout``), seconds from the first stop signal.
        root: The daemon's root (paths in the log line are relative to it).
    """

    def __init__(self, timeout_seconds: float, root: str = "") -> None:
        self.timeout_seconds = timeout_seconds
        self.root = root
        #: What else a stop may be waiting for, named in the give-up line when no thread of this process is in
        #: the filesystem (the ``--processes`` supervisor: its workers that have not exited); "" = nothing.
        self.waiting_for: Callable[[], str] = lambda: ""
        self._armed = threading.Event()
        self._lock = threading.Lock()

    def arm(self) -> None:
        """Start the countdown (the first call only; any thread, a signal handler too)."""
        with self._lock:
            if self._armed.is_set():
                return
            self._armed.set()
            threading.Thread(target=self._watch, name="mq-stop-guard", daemon=True).start()

    def _watch(self) -> None:
        started = time.monotonic()
        deadline = started + self.timeout_seconds
        seen: dict[tuple[int, Blocked], float] = {}  # a blocked thread's call -> when first seen
        while True:
            now = time.monotonic()
            current = {(tid, b): seen.get((tid, b), now) for tid, b in blocked_threads(self.root).items()}
            seen = current
            if now >= deadline:
                break
            time.sleep(min(SAMPLE_SECONDS, deadline - now))
        self._give_up(seen, time.monotonic() - started)

    def _give_up(self, seen: dict[tuple[int, Blocked], float], waited: float) -> None:
        now = time.monotonic()
        if seen:
            longest = max(now - first for first in seen.values())
            listed = "; ".join(
                f"{b.text()} ({now - first:.0f} s)" for (_, b), first in sorted(seen.items(), key=lambda i: i[1])
            )
            logger.error(
                "stop: %d thread%s blocked in the filesystem for at least %.0f s (%s); exiting without %s after %.0f s "
                "(--stop-timeout %g), exit %d",
                len(seen), "" if len(seen) == 1 else "s", longest, listed, "it" if len(seen) == 1 else "them",
                waited, self.timeout_seconds, EXIT_STUCK,
            )  # fmt: skip
        else:
            try:
                waiting = self.waiting_for()
            except Exception:  # the line must still be written and the process must still exit
                logger.exception("stop: what the stop waits for could not be told")
                waiting = ""
            logger.error(
                "stop: not finished %.0f s after the stop signal (--stop-timeout %g) and no thread is in a file "
                "system call%s; exiting, exit %d",
                waited, self.timeout_seconds, f"; waiting for {waiting}" if waiting else "", EXIT_STUCK,
            )  # fmt: skip
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        _close_sockets()
        os._exit(EXIT_STUCK)


def _close_sockets() -> None:
    """Close this process's sockets (the listening port first of all).

    A thread in a FUSE request the client had already read waits uninterruptibly: the process cannot
    finish exiting, SIGKILL included, until the client answers, and its open files stay open until then.
    Closing the sockets now frees the port for a new mq at once. Files are left alone: closing one on
    the stuck filesystem would block here too (FUSE's flush).
    """
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    os.close(int(name))


def forward_signals(on_signal: Callable[[signal.Signals], None]) -> None:
    """Take SIGTERM and SIGINT off this thread (and the threads it starts later); call ``on_signal`` from a thread of
    their own for each.

    Call it from the main thread before the daemon starts its worker threads: they inherit the blocked signals.
    A child process unblocks them first thing (``daemons.stop_early_on_signals``).
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def wait() -> None:
        while True:
            sig = signal.sigwait(STOP_SIGNALS)
            try:
                on_signal(signal.Signals(sig))
            except Exception:  # the next signal must still be taken
                logger.exception("stop signal %s not handled", sig)

    threading.Thread(target=wait, name="mq-signals", daemon=True).start()
