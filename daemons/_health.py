"""Health of the ``mq`` daemon: ``GET /healthz``, ``GET /readyz`` and the free-space floor of sends.

``/healthz`` answers 200 while the event loop runs (liveness). ``/readyz``
(readiness) checks the root: it is writable, a probe file is written,
fsynced and unlinked within :data:`PROBE_DEADLINE_SECONDS`, and the free
bytes of its filesystem are above ``--min-free-bytes`` (and free inodes above
0). Any failed check gives 503 with the check's name.

Sends are refused with 507 ``insufficient_storage`` + Retry-After while the
free bytes are below ``--min-free-bytes`` (> 0), before the disk is actually
full: receives, deletes and the daemons' renames keep the room they need.
The free space is read with ``statvfs`` at most every
:data:`FREE_SPACE_REFRESH_SECONDS`, so a send pays one clock read.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

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
        self._probe: asyncio.Future[None] | None = None
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

    async def checks(self) -> dict[str, dict[str, Any]]:
        """Run every readiness check; ``{name: {"ok": bool, ...facts}}`` for writable, probe, free_space."""
        out: dict[str, dict[str, Any]] = {}
        out["writable"] = {"ok": os.access(self.root, os.W_OK | os.X_OK)}
        out["probe"] = await self._run_probe()
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

    async def _run_probe(self) -> dict[str, Any]:
        if self._probe is not None and not self._probe.done():
            return {"ok": False, "error": "the previous probe has not finished (storage hung?)"}
        started = time.perf_counter()
        self._probe = asyncio.get_running_loop().run_in_executor(self._probe_thread, self._write_probe)
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), PROBE_DEADLINE_SECONDS)
        except TimeoutError:
            return {"ok": False, "error": f"write + fsync took over {PROBE_DEADLINE_SECONDS} s"}
        except OSError as exc:
            return {"ok": False, "error": f"write + fsync failed: {exc.strerror or exc}"}
        return {"ok": True, "seconds": round(time.perf_counter() - started, 6)}

    def close(self) -> None:
        """Stop the probe thread (does not wait for a hung probe)."""
        self._probe_thread.shutdown(wait=False)

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: 200 ``{"status": "ok"}`` while the process serves."""
        return web.json_response({"status": "ok"})

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
