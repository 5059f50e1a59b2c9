"""``mq --processes N``: N mq processes serving one port on one root (docs/api.md "Several mq processes").

One asyncio process saturates about one core. With ``--processes N`` (N > 1)
the process that was started (by systemd, mq-stack or a shell) becomes a
*supervisor* that serves no request itself. It binds the port once and starts
N *workers*, each a full mq (``daemons.front.serve``) on the same root:

- **Listening.** By default every worker binds ``--address``/``--port`` itself
  with ``SO_REUSEPORT`` and the kernel spreads new connections over the
  workers by a hash of the connection's addresses (each worker has its own
  accept queue). The supervisor holds a bound, non-listening socket with
  ``SO_REUSEPORT`` on that port for its whole life: with ``--port 0`` it
  chooses the one port all workers then share, and a restarted worker finds
  the port still reserved. Under socket activation (``mq.socket``) the workers
  share the one listening socket systemd passed instead (``SO_REUSEPORT``
  cannot be added to it); docs/performance.md compares the two ways.
- **Readiness.** Each worker reports on a pipe when it listens; the supervisor
  logs the one line ``mq listening on http://HOST:PORT`` (what mq-stack,
  bench/run.py and the tests wait for) and sends systemd ``READY=1`` only when
  all N listen. Workers have no ``NOTIFY_SOCKET``: only the supervisor (the
  unit's main process, ``NotifyAccess=main``) talks to systemd.
- **Watchdog.** Each worker writes a heartbeat on its pipe every
  :data:`HEARTBEAT_SECONDS` from its event loop. The supervisor pings
  ``WATCHDOG=1`` only while every worker's last heartbeat is younger than
  ``WatchdogSec``, so one blocked worker loop gets the unit restarted, as a
  blocked loop of a single mq does. ``STATUS=`` sums the workers' figures.
- **Signals.** SIGTERM/SIGINT: ``STOPPING=1``, SIGTERM to every worker (each
  finishes its in-flight requests, as a single mq does), exit 0 once all
  exited 0. SIGHUP is passed on (the workers reread ``--auth-file``).
- **A worker that dies** (crash, SIGKILL, OOM) is restarted after
  :data:`RESTART_DELAY_SECONDS`; the others keep serving. More than
  :data:`MAX_RESTARTS` deaths within :data:`RESTART_WINDOW_SECONDS` stop
  everything with exit 70 (systemd's ``Restart=on-failure`` then restarts the
  unit). A worker that fails before it ever listened (a bad auth file, TLS
  key, address) stops everything with its exit code (78: configuration).
  Workers get SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``).
- **Metrics.** Each worker also serves its own registry on a Unix socket in a
  private directory of the supervisor; the worker that answers ``GET
  /metrics`` adds its siblings' counters and histograms to its own
  (``daemons._procmetrics``), so ``/metrics`` gives totals over all processes.

Messages need no coordination between workers: the protocol already lets
several daemons share a root (docs/protocol.md sections 8-10). What does
change is said in docs/api.md: a receive first reads the inotify events
already queued for this worker, so a message whose 201 a client holds is
receivable through every worker; and a send takes its id only after the
newest millisecond any worker acknowledged (``daemons._idorder``), so
sequential sends keep their order whichever workers serve them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click
from aiohttp import web

from daemons import _idorder, _listen, _runtime, _savers, _watchdog
from daemons._settings import MAX_PROCESSES, Settings
from mqcore.errors import ConfigError
from mqcore.protocol import _rounds

if TYPE_CHECKING:
    from daemons._broker import Broker

logger = logging.getLogger("mq.processes")

#: Environment variable that makes ``python -m daemons.front`` a worker (JSON, see :class:`WorkerLink`).
WORKER_ENV = "MQ_PROCESS_WORKER"
#: Seconds between a worker's heartbeats to the supervisor.
HEARTBEAT_SECONDS = 1.0
#: Seconds before a worker that died is started again.
RESTART_DELAY_SECONDS = 0.5
#: More worker deaths than this within RESTART_WINDOW_SECONDS stop the supervisor (exit 70).
MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0
#: Seconds the supervisor's own stop bound exceeds its workers' ``--stop-timeout``: a worker exits (69 if stuck in
#: the filesystem) within its bound, one still there a second later is killed (SIGKILL).
STOP_MARGIN_SECONDS = 3.0
#: The file of the supervisor's directory where the workers share their newest acknowledged id (daemons._idorder).
ACKED_FILE = "acked"
#: The file of the workers' shared ``syncfs`` rounds in the supervisor's directory (:mod:`mqcore.protocol._rounds`).
SYNCFS_ROUNDS_FILE = "syncfs-rounds"
#: ``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; what ``--processes auto`` starts)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def parse_processes(value: str | int) -> int:
    """The number of ``--processes``: a count, or ``auto`` = :func:`usable_cpus`.

    Raises:
        ConfigError: Neither a whole number nor ``auto`` (the range is checked by Settings).
    """
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    if text == "auto":
        return min(usable_cpus(), MAX_PROCESSES)
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"processes must be a number or auto, got {value!r}", key="processes") from None


class ProcessCount(click.ParamType[int]):
    """click type of ``--processes``: a whole number, or ``auto`` (:func:`usable_cpus`)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_processes(value)
        except ConfigError as exc:
            self.fail(exc.message, param, ctx)


# -- the worker side -----------------------------------------------------------


class WorkerLink:
    """What a worker knows of its supervisor: its number, the port, the pipe and the metrics directory.

    Args:
        index: This worker's number, 0 to ``count - 1``.
        count: Workers in all.
        port: The port to bind with ``SO_REUSEPORT`` (ignored with ``socket_fd``).
        link_fd: Write end of the pipe to the supervisor (lines ``ready`` and ``beat Q R``).
        socket_fd: An inherited listening socket to serve instead of binding, or None.
        directory: Where every worker's metrics socket is (``<index>.sock``).
        heartbeat_seconds: Seconds between heartbeats (shorter than the supervisor's watchdog interval).
    """

    def __init__(
        self,
        index: int,
        count: int,
        port: int,
        link_fd: int,
        socket_fd: int | None,
        directory: str,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
    ) -> None:
        self.index, self.count, self.port = index, count, port
        self.link_fd, self.socket_fd, self.directory = link_fd, socket_fd, directory
        self.heartbeat_seconds = heartbeat_seconds
        with contextlib.suppress(OSError):
            os.set_blocking(link_fd, False)  # a supervisor that stops reading must not block this loop

    @property
    def name(self) -> str:
        """``mq[i/N]``: how this worker names itself in log lines."""
        return f"mq[{self.index + 1}/{self.count}]"

    def socket(self) -> socket.socket | None:
        """The inherited listening socket (shared mode), or None (bind ``port`` with ``SO_REUSEPORT``)."""
        if self.socket_fd is None:
            return None
        sock = socket.socket(fileno=self.socket_fd)
        sock.setblocking(False)
        return sock

    def metrics_path(self, index: int) -> str:
        """The Unix socket on which worker ``index`` serves its own metrics."""
        return os.path.join(self.directory, f"{index}.sock")

    def siblings(self) -> list[str]:
        """The metrics sockets of the other workers."""
        return [self.metrics_path(i) for i in range(self.count) if i != self.index]

    def send(self, line: str) -> None:
        """One line to the supervisor (a non-blocking pipe write of a few bytes; dropped if the pipe is full)."""
        with contextlib.suppress(OSError):  # full, or the supervisor is gone (PR_SET_PDEATHSIG stops us)
            os.write(self.link_fd, (line + "\n").encode())

    async def serving(self, broker: Broker, runner: web.AppRunner, url: str) -> asyncio.Task[None]:
        """The worker listens: serve its metrics socket, tell the supervisor, start the heartbeats.

        Returns:
            The heartbeat task; cancelling it also closes the metrics socket.
        """
        from daemons._procmetrics import combiner, own_metrics_app

        broker.metrics.combine = combiner(self.siblings())
        private = web.AppRunner(own_metrics_app(broker.metrics.registry), handle_signals=False, access_log=None)
        await private.setup()
        path = self.metrics_path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by the worker this one replaces
        await web.UnixSite(private, path).start()
        logger.info("%s serving on %s (pid %d)", self.name, url, os.getpid())
        self.send("ready")
        return asyncio.create_task(self._heartbeats(broker, runner, private))

    async def _heartbeats(self, broker: Broker, runner: web.AppRunner, private: web.AppRunner) -> None:
        try:
            while True:
                server = runner.server
                requests = server.requests_count if server is not None else 0
                queues = sum(len(fetcher.queues) for fetcher in broker.queues.fetchers)
                self.send(f"beat {queues} {requests}")
                await asyncio.sleep(self.heartbeat_seconds)
        finally:
            await private.cleanup()


def worker_from_environment() -> tuple[Settings, WorkerLink] | None:
    """The settings and link of this process if the supervisor started it as a worker, else None.

    The variable is removed, so nothing this worker starts takes itself for a worker.
    """
    raw = os.environ.pop(WORKER_ENV, None)
    if raw is None:
        return None
    data = json.loads(raw)
    _die_with_parent(int(data["parent"]))
    settings = Settings(**data["settings"])
    _idorder.ACKED = _idorder.AckedIds(os.path.join(data["directory"], ACKED_FILE), settings.processes, data["index"])
    _savers.SHARED_ROUNDS = os.path.join(data["directory"], SYNCFS_ROUNDS_FILE)
    link = WorkerLink(
        data["index"],
        settings.processes,
        data["port"],
        data["link_fd"],
        data["socket_fd"],
        data["directory"],
        data["heartbeat_seconds"],
    )
    return settings, link


def _die_with_parent(parent: int) -> None:
    """Get SIGTERM when the supervisor dies, and stop at once if it already has (Linux prctl)."""
    import ctypes  # here: only ``mq --processes`` workers need it

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(_runtime.EXIT_OK)


def run_worker(serve: Callable[..., Awaitable[int]], settings: Settings, link: WorkerLink) -> int:
    """Run one worker: ``serve(settings, link=link)`` on uvloop; its exit code.

    Raises nothing: a configuration error is logged and is exit 78, as for a single mq.
    """
    _runtime.setup_logging(settings.log_level, prefix=f"{link.name} ")
    try:
        return _runtime.run(
            lambda: serve(settings, link=link), stop_timeout_seconds=settings.stop_timeout_seconds, root=settings.root
        )
    except ConfigError as exc:
        logger.error("config error: %s", exc.message)
        return _runtime.EXIT_CONFIG


# -- the supervisor side ----------------------------------------------------------


def _bind(address: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket bound to ``address``:``port`` (port 0: any free port).

    ``listen`` False: a bound, non-listening socket with ``SO_REUSEPORT`` that
    reserves the port for the workers' ``SO_REUSEPORT`` sockets. True: a
    listening socket the workers share.

    Raises:
        ConfigError: The address does not resolve or the port cannot be bound.
    """
    try:
        infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if not listen:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            if listen:
                sock.listen(1024)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise ConfigError(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
    return sock


@dataclasses.dataclass(eq=False)
class _Worker:
    """The supervisor's view of one worker."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    beat_at: float = 0.0
    queues: int = 0
    requests: int = 0
    requests_before: int = 0
    """Requests served by the earlier incarnations of this worker (the status line's rate stays right)."""
    reader: asyncio.Task[None] | None = None


class Supervisor:
    """Start and watch ``settings.processes`` workers on one port (see the module docstring).

    Args:
        settings: The checked settings (``processes`` > 1).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workers = [_Worker(i) for i in range(settings.processes)]
        self.stop = asyncio.Event()
        self.exits: asyncio.Queue[_Worker] = asyncio.Queue()
        self.stopping = False
        self.directory = ""
        self.port = settings.port
        self.socket: socket.socket | None = None
        self.shared = False
        self._deaths: list[float] = []
        #: systemd's watchdog interval (half of WatchdogSec) for this process, or None.
        self.watchdog_interval = _watchdog.interval_seconds()
        #: Workers beat several times per watchdog interval, so one late beat never stops the pings.
        self.heartbeat_seconds = min(HEARTBEAT_SECONDS, (self.watchdog_interval or HEARTBEAT_SECONDS) / 4)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit code (0 after a clean stop)."""
        _runtime.install_stop_signals(self.stop)
        _runtime.install_reload_signal(lambda: self._signal_all(signal.SIGHUP))
        inherited = _listen.inherited_socket()
        self.shared = inherited is not None
        if inherited is not None:
            self.socket = inherited
        else:
            self.socket = _bind(self.settings.address, self.settings.port, listen=self.shared)
        host, self.port = self.socket.getsockname()[:2]
        _runtime.describe_stop_wait(self._not_exited)
        self.directory = tempfile.mkdtemp(prefix="mq-processes-")
        _idorder.create(os.path.join(self.directory, ACKED_FILE), len(self.workers))
        _rounds.create(os.path.join(self.directory, SYNCFS_ROUNDS_FILE))
        try:
            code = await self._start_all()
            if code is None:
                code = await self._serve(host)
        finally:
            code_at_stop = await self._stop_all()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.socket.close()
        return code if code else code_at_stop

    def _not_exited(self) -> str:
        """The workers that have not exited, for the stop guard's give-up line ("" if none); any thread."""
        left = []
        for worker in self.workers:
            proc = worker.proc
            if proc is None or proc.returncode is not None:
                continue
            try:
                with open(f"/proc/{proc.pid}/stat", "rb") as f:
                    state = f.read().rpartition(b")")[2].split()[0].decode()
            except (OSError, IndexError):
                continue  # gone meanwhile
            left.append(f"mq process {worker.index + 1} (pid {proc.pid}, state {state})")
        if not left:
            return ""
        return ", ".join(left) + " (a process in an uninterruptible file system call exits only when it is answered)"

    async def _start_all(self) -> int | None:
        """Start every worker and wait until all listen; None when they do, else the exit code."""
        for worker in self.workers:
            await self._spawn(worker)
        everyone = asyncio.ensure_future(self._all_ready())
        stopped = asyncio.ensure_future(self.stop.wait())
        died = asyncio.ensure_future(self.exits.get())
        waits: list[asyncio.Future[Any]] = [everyone, stopped, died]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (everyone, stopped, died):
                task.cancel()
        if died.done() and not died.cancelled():
            worker = died.result()
            code = worker.proc.returncode if worker.proc is not None else None
            logger.error("mq process %d exited with %s before it was listening; stopping", worker.index + 1, code)
            return code if code is not None and code > 0 else _runtime.EXIT_SOFTWARE
        if self.stop.is_set():
            return _runtime.EXIT_OK
        return None

    async def _all_ready(self) -> None:
        for worker in self.workers:
            await worker.ready.wait()

    async def _serve(self, host: str) -> int:
        settings = self.settings
        scheme = "https" if settings.tls_cert else "http"
        host_text = f"[{host}]" if ":" in host else host
        logger.info(
            "mq listening on %s://%s:%d root=%s workers=%d processes=%d (%s)",
            scheme, host_text, self.port, settings.root, settings.workers, settings.processes,
            "one shared socket" if self.shared else "SO_REUSEPORT",
        )  # fmt: skip
        _runtime.sd_notify("READY=1")
        watchdog = asyncio.create_task(self._watchdog())
        try:
            while True:
                stopped = asyncio.ensure_future(self.stop.wait())
                died = asyncio.ensure_future(self.exits.get())
                await asyncio.wait([stopped, died], return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if not died.done():
                    died.cancel()
                    return _runtime.EXIT_OK
                worker = died.result()
                if not await self._restart(worker):
                    return _runtime.EXIT_SOFTWARE
        finally:
            watchdog.cancel()

    async def _restart(self, worker: _Worker) -> bool:
        """A worker died while serving: start it again; False if it died too often (the supervisor stops)."""
        code = worker.proc.returncode if worker.proc is not None else None
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_SECONDS] + [now]
        if len(self._deaths) > MAX_RESTARTS:
            logger.error(
                "mq process %d exited with %s: %d deaths in %.0f s; stopping every process",
                worker.index + 1, code, len(self._deaths), RESTART_WINDOW_SECONDS,
            )  # fmt: skip
            return False
        logger.error("mq process %d exited with %s; starting it again", worker.index + 1, code)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), RESTART_DELAY_SECONDS)
        if not self.stop.is_set():
            await self._spawn(worker)
        return True

    async def _spawn(self, worker: _Worker) -> None:
        """Start (or restart) ``worker``: ``python -m daemons.front`` with the settings in :data:`WORKER_ENV`."""
        read_fd, write_fd = os.pipe()
        fds = [write_fd]
        socket_fd = None
        if self.shared:
            assert self.socket is not None
            socket_fd = self.socket.fileno()
            fds.append(socket_fd)
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env[WORKER_ENV] = json.dumps(
            {
                "settings": dataclasses.asdict(self.settings),
                "index": worker.index,
                "port": self.port,
                "link_fd": write_fd,
                "socket_fd": socket_fd,
                "directory": self.directory,
                "parent": os.getpid(),
                "heartbeat_seconds": self.heartbeat_seconds,
            }
        )
        worker.ready.clear()
        worker.requests_before += worker.requests
        worker.requests = 0
        worker.beat_at = time.monotonic()
        try:
            worker.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "daemons.front", env=env, pass_fds=fds, stdin=asyncio.subprocess.DEVNULL
            )
        finally:
            os.close(write_fd)
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb"))
        worker.reader = asyncio.create_task(self._follow(worker, worker.proc, reader))

    async def _follow(self, worker: _Worker, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader) -> None:
        """Read ``worker``'s pipe until it closes, then report the worker's exit."""
        async for raw in reader:
            parts = raw.decode(errors="replace").split()
            worker.beat_at = time.monotonic()
            if parts[:1] == ["ready"]:
                worker.ready.set()
            elif parts[:1] == ["beat"] and len(parts) == 3:
                worker.queues, worker.requests = int(parts[1]), int(parts[2])
        await proc.wait()
        if not self.stopping:
            await self.exits.put(worker)

    def _signal_all(self, sig: signal.Signals) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(sig)

    async def _stop_all(self) -> int:
        """SIGTERM every worker and wait (SIGKILL a second after their ``--stop-timeout``); 0 if all stopped cleanly."""
        self.stopping = True
        running = {w for w in self.workers if w.proc is not None and w.proc.returncode is None}
        self._signal_all(signal.SIGTERM)
        code = _runtime.EXIT_OK
        clean = (0, -signal.SIGTERM, -signal.SIGINT)  # a worker killed by SIGTERM before it set up its handlers
        wait = self.settings.stop_timeout_seconds + 1  # a worker stuck in the filesystem exits 69 at its own bound
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait  # one for all: they were signalled together, so they stop in parallel
        for worker in self.workers:
            proc = worker.proc
            if proc is None:
                continue
            try:
                rc = await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                logger.error("mq process %d did not stop in %.0f s; killing it", worker.index + 1, wait)
                proc.kill()
                rc = await proc.wait()
            if rc not in clean and worker in running:  # one that died before is reported already
                logger.error("mq process %d exited with %s while stopping", worker.index + 1, rc)
                code = _runtime.EXIT_SOFTWARE
            if worker.reader is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.reader
        logger.info("stopped (%d processes)", len(self.workers))
        return code

    async def _watchdog(self) -> None:
        """systemd's watchdog and status line for all workers (as :func:`daemons._watchdog.run` for one mq)."""
        if not os.environ.get("NOTIFY_SOCKET"):
            return
        interval = self.watchdog_interval
        rate = _watchdog.Rate()
        while True:
            now = time.monotonic()
            alive = all(interval is None or now - w.beat_at < 2 * interval for w in self.workers)
            requests = sum(w.requests_before + w.requests for w in self.workers)
            queues = max((w.queues for w in self.workers), default=0)
            line = (
                f"STATUS=serving: {len(self.workers)} processes, {queues} queues active, "
                f"{rate.update(requests):.1f} requests/s"
            )
            if interval is None:
                _runtime.sd_notify(line)
            elif alive:
                _runtime.sd_notify(f"WATCHDOG=1\n{line}")
            else:
                logger.error("an mq process sent no heartbeat for %.0f s: not pinging the watchdog", 2 * interval)
            await asyncio.sleep(interval if interval is not None else _watchdog.STATUS_INTERVAL_SECONDS)


async def supervise(settings: Settings) -> int:
    """Run ``settings.processes`` workers until stopped (the ``mq --processes N`` entry); the exit code."""
    return await Supervisor(settings).run()
