"""Health of the ``mq`` daemon: ``GET /healthz``, ``GET /readyz`` and the free-space floor of sends.

``/healthz`` (liveness) answers 200 while the event loop runs and the root's filesystem answers a
``stat`` of the root within :data:`PROBE_DEADLINE_SECONDS`; while it does not (a GlusterFS FUSE
client or an NFS server that stopped answering: every request that touches the files hangs), 503
``filesystem_stalled`` naming the call that waits, for how long, and the threads blocked in the
filesystem (:func:`daemons._stopguard.blocked_threads`). ``/readyz``
(readiness) checks the root: it is writable, a probe file is written,
fsynced and unlinked within :data:`PROBE_DEADLINE_SECONDS`, and the free
bytes of its filesystem are above ``--min-free-bytes`` (and free inodes above
0). Any failed check gives 503 with the check's name. Every probe runs on the probe thread, never
on the event loop (a hung filesystem must not hang the loop), one at a time: a request that finds
an earlier probe running waits for it within that probe's deadline, and once a probe is past its
deadline every request answers 503 at once.

Sends are refused with 507 ``insufficient_storage`` + Retry-After while the
free bytes are below ``--min-free-bytes`` (> 0), before the disk is actually
full: receives, deletes and the daemons' renames keep the room they need.
The free space is read with ``statvfs`` at most every
:data:`FREE_SPACE_REFRESH_SECONDS`, so a send pays one clock read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from daemons._stopguard import blocked_threads
from mqcore.errors import InsufficientStorage

#: Longest a readiness probe (write, fsync, unlink of a small file in the root) may take, in seconds.
PROBE_DEADLINE_SECONDS = 5.0
#: How often a send re-reads the free space of the root's filesystem, at most, in seconds.
FREE_SPACE_REFRESH_SECONDS = 0.5
#: Retry-After of a send refused below the free-space floor, in seconds.
FLOOR_RETRY_AFTER_SECONDS = 5
#: Name prefix of the probe files (in the root itself: no daemon lists it).
PROBE_PREFIX = ".mq-readyz-"


def free_space(root: str) -> tuple[int, int]:
    """(free bytes, free inodes) of ``root``'s filesystem, as an unprivileged process may use them.

    Raises:
        OSError: ``statvfs`` failed.
    """
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize, st.f_favail


class Health:
    """The readiness checks and the free-space floor of one root.

    Args:
        root: The root directory.
        min_free_bytes: The floor (``--min-free-bytes``); 0 = sends are never refused for space.
    """

    def __init__(self, root: str, min_free_bytes: int) -> None:
        self.root = root
        self.min_free_bytes = min_free_bytes
        self._next_read = 0.0
        self._below: int | None = None
        self._probe_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mq-readyz")
        self._probe: asyncio.Future[Any] | None = None
        self._probe_started = 0.0
        self._probe_name = ""
        self._numbers = itertools.count()
        #: Conditions readiness does not fail on but an operator must see (e.g. a root on ext4 without a
        #: journal, :func:`mqcore.fsinfo.journal_warning`): ``warnings`` of every ``/readyz`` answer.
        self.warnings: list[str] = []

    def check_send(self) -> None:
        """Refuse a send while the free bytes are below the floor (no-op when the floor is 0).

        Raises:
            InsufficientStorage: Below ``min_free_bytes`` at the last reading (507, Retry-After).
        """
        if not self.min_free_bytes:
            return
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + FREE_SPACE_REFRESH_SECONDS
            try:
                free = free_space(self.root)[0]
            except OSError:
                free = 0
            self._below = free if free < self.min_free_bytes else None
        if self._below is not None:
            raise InsufficientStorage(
                f"the root's filesystem has {self._below} bytes free, below the floor of "
                f"{self.min_free_bytes} (--min-free-bytes); sends resume when space is freed",
                retry_after_seconds=FLOOR_RETRY_AFTER_SECONDS,
                free_bytes=self._below,
                min_free_bytes=self.min_free_bytes,
            )

    def _write_probe(self) -> None:
        path = os.path.join(self.root, f"{PROBE_PREFIX}{os.getpid()}-{next(self._numbers)}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.write(fd, b"ready\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            os.unlink(path)

    def _readiness(self) -> dict[str, dict[str, Any]]:
        """The readiness checks' file work (on the probe thread)."""
        out: dict[str, dict[str, Any]] = {"writable": {"ok": os.access(self.root, os.W_OK | os.X_OK)}}
        started = time.perf_counter()
        try:
            self._write_probe()
            out["probe"] = {"ok": True, "seconds": round(time.perf_counter() - started, 6)}
        except OSError as exc:
            out["probe"] = {"ok": False, "error": f"write + fsync failed: {exc.strerror or exc}"}
        try:
            free, inodes = free_space(self.root)
            out["free_space"] = {
                "ok": free > self.min_free_bytes and inodes > 0,
                "free_bytes": free,
                "free_inodes": inodes,
                "min_free_bytes": self.min_free_bytes,
            }
        except OSError as exc:
            out["free_space"] = {"ok": False, "error": exc.strerror or str(exc)}
        return out

    def _answers(self) -> bool:
        """True once a ``stat`` of the root returned, with an error too (a lost mount answers ENOTCONN at once)."""
        with contextlib.suppress(OSError):
            os.stat(self.root)
        return True

    async def checks(self) -> dict[str, dict[str, Any]]:
        """Run every readiness check; ``{name: {"ok": bool, ...facts}}`` for writable, probe, free_space.

        A probe that has not answered within :data:`PROBE_DEADLINE_SECONDS` (or one still running from before)
        gives ``{"stalled": {"ok": False, "error": ..., "seconds": ...}}`` instead.
        """
        result = await self._run_probe("write + fsync of a probe file in the root", self._readiness)
        return result if isinstance(result, dict) else {"stalled": self.stall()}

    async def _run_probe(self, name: str, fn: Any) -> Any:
        """``fn()`` on the probe thread within the deadline; None if it (or the one before) did not answer.

        A probe still running from an earlier request is waited for until its own deadline first (one probe
        at a time): a slow but answering ``fsync`` of ``/readyz`` does not make a ``/healthz`` beside it 503.
        """
        while (earlier := self._probe) is not None and not earlier.done():
            left = PROBE_DEADLINE_SECONDS - (time.monotonic() - self._probe_started)
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(asyncio.shield(earlier), left)
            except TimeoutError:
                return None
        self._probe_started, self._probe_name = time.monotonic(), name
        self._probe = asyncio.get_running_loop().run_in_executor(self._probe_thread, fn)
        try:
            return await asyncio.wait_for(asyncio.shield(self._probe), PROBE_DEADLINE_SECONDS)
        except TimeoutError:
            return None

    def stall(self) -> dict[str, Any]:
        """What hangs while a probe is outstanding: the probe, its age in seconds, the threads blocked in files."""
        seconds = time.monotonic() - self._probe_started
        threads = [b.text() for b in blocked_threads(self.root).values()]
        return {
            "ok": False,
            "error": f"the root's filesystem has not answered a {self._probe_name} for {seconds:.0f} s",
            "seconds": round(seconds, 1),
            "blocked_threads": threads,
        }

    def close(self) -> None:
        """Stop the probe thread (does not wait for a hung probe)."""
        self._probe_thread.shutdown(wait=False)

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: 200 ``{"status": "ok"}`` while the process serves and its root's filesystem answers.

        503 ``{"error": "filesystem_stalled", "message", "details": {"seconds", "blocked_threads"}}`` (and
        Retry-After) while a ``stat`` of the root (or an earlier probe) has not answered within
        :data:`PROBE_DEADLINE_SECONDS`.
        """
        if await self._run_probe("stat of the root", self._answers) is not None:
            return web.json_response({"status": "ok"})
        stall = self.stall()
        return web.json_response(
            {"error": "filesystem_stalled", "message": stall["error"], "details": stall},
            status=503,
            headers={"Retry-After": str(FLOOR_RETRY_AFTER_SECONDS)},
        )

    async def readyz(self, request: web.Request) -> web.Response:
        """``GET /readyz``: 200 when every check passes, else 503 ``{"error": "not_ready", "failed": [...]}``.

        Either answer has ``warnings`` (:attr:`warnings`) when there are any.
        """
        checks = await self.checks()
        failed = [name for name, result in checks.items() if not result["ok"]]
        more = {"warnings": self.warnings} if self.warnings else {}
        if failed:
            return web.json_response(
                {
                    "error": "not_ready",
                    "message": f"readiness check failed: {', '.join(failed)}",
                    "details": {"failed": failed, "checks": checks},
                    **more,
                },
                status=503,
                headers={"Retry-After": str(FLOOR_RETRY_AFTER_SECONDS)},
            )
        return web.json_response({"status": "ready", "checks": checks, **more})
