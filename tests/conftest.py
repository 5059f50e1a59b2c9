"""Fixtures that run the real daemons as subprocesses and talk to them over real HTTP.

Each daemon is started as ``python -m daemons.<module> --root ROOT ...`` (``mq`` on
``--port 0``), and is ready once its readiness line appears on stderr (the team
contract: ``mq listening on http://HOST:PORT``, ``mq-mover ready``, ``mq-reaper
ready``). A thread keeps draining stderr into a buffer for the life of the process,
so the pipe never fills and every assertion can show the log. At teardown every
daemon still running gets SIGTERM and must exit 0 (STYLE.md, Tests; dramatiq
``test_cli``). Nothing is mocked: real files under ``tmp_path``, real sockets on
127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
import yarl

#: The repository root (the daemons are imported from here).
REPO = Path(__file__).resolve().parent.parent

#: How long a daemon may take to print its readiness line, in seconds (generous: never a speed test). 15 s
#: was too little once under CI's heaviest minutes (GlusterFS and Spark tests at once): an mq had not even
#: printed its settings line (its imports) after 15 s, and one module's 22 tests errored at setup.
READY_TIMEOUT_SECONDS = 45.0
#: How long a daemon may take to exit after SIGTERM, in seconds.
STOP_TIMEOUT_SECONDS = 20.0

_MQ_URL_RE = re.compile(r"mq listening on (https?://[^\s/]+)")

#: Environment every daemon of the tests starts with (a test's own ``env`` still wins). ``import aiohttp`` makes two
#: client TLS contexts at import (aiohttp.connector), each parsing the system's CA bundle: ~50 ms of CPU apiece with
#: OpenSSL 3, ~0.1 s of every mq start's ~0.7 s, and ~200 mq starts a run. No daemon ever verifies a TLS peer (mq's
#: only client connections are its ``--processes`` siblings' metrics over Unix sockets, in plain HTTP; ``--tls-cert``
#: serves TLS without asking for client certificates), so OpenSSL's default CA locations point at nothing here and
#: the contexts load no certificates (docs/performance.md, "Fewer daemon start-up costs", stop 29).
DAEMON_ENV = {"SSL_CERT_FILE": "/nonexistent/mq-tests-no-ca-file", "SSL_CERT_DIR": "/nonexistent/mq-tests-no-ca-dir"}

#: ``verify=`` for the tests' httpx clients of plain-HTTP URLs: a TLS context that trusts no CA, made once. httpx's
#: default (``verify=True``) builds a context from certifi's bundle for every client, ~55 ms of CPU each, and
#: ``httpx.get()`` and its siblings make a client per call (about a thousand a run, most in tests/cluster; stop 30
#: in docs/performance.md). A plain-HTTP client never uses it; a TLS peer would be refused. mq's own clients do
#: the same (``mqcore/client/_http.py``).
PLAIN_HTTP = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class DaemonError(AssertionError):
    """A daemon did not start, did not stop cleanly, or misbehaved; the message carries its log."""


class Daemon:
    """One daemon subprocess with its stderr captured.

    Args:
        name: ``mq``, ``mq-mover`` or ``mq-reaper`` (selects module and readiness line).
        args: Command-line arguments after the module (``--root`` etc.).
        env: Extra environment variables (``MQ_*`` from the outer environment are dropped; :data:`DAEMON_ENV` is set
            first).
    """

    MODULES: ClassVar[dict[str, str]] = {
        "mq": "daemons.front",
        "mq-mover": "daemons.mover",
        "mq-reaper": "daemons.reaper",
    }
    READY: ClassVar[dict[str, str]] = {
        "mq": "mq listening on http",
        "mq-mover": "mq-mover ready",
        "mq-reaper": "mq-reaper ready",
    }

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
        self.env.update(DAEMON_ENV)
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self.starts = 0
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        #: Set at the readiness line or at the end of stderr (the process exited), whichever comes first.
        self._settled = threading.Event()
        self._reader: threading.Thread | None = None
        self._terminated = False

    # -- lifecycle -----------------------------------------------------------

    @property
    def command(self) -> list[str]:
        """The argv the daemon is started with."""
        return [sys.executable, "-m", self.MODULES[self.name], *self.args]

    def start(self) -> Daemon:
        """Start the process and wait for its readiness line.

        Raises:
            DaemonError: It exited or stayed silent for ``READY_TIMEOUT_SECONDS``.
        """
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> Daemon:
        """Start the process without waiting (pair with :meth:`wait_ready`)."""
        assert not self.running, f"{self.name} is already running"
        self.starts += 1
        self._append(f"--- test harness: start #{self.starts}: {' '.join(self.command)}")
        self._ready.clear()
        self._settled = threading.Event()  # one per process: a late end of the last one's stderr must not count
        self.url = None
        self._terminated = False
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._reader = threading.Thread(
            target=self._drain, args=(self.proc, self._settled), name=f"{self.name}-stderr", daemon=True
        )
        self._reader.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> Daemon:
        """Wait for the readiness line of the process started by :meth:`spawn`.

        Args:
            timeout: Seconds to wait at most (default ``READY_TIMEOUT_SECONDS``).
        Raises:
            DaemonError: It exited or stayed silent for ``timeout`` seconds.
        """
        assert self.proc is not None and self._reader is not None
        timeout = READY_TIMEOUT_SECONDS if timeout is None else timeout
        deadline = time.monotonic() + timeout
        # Woken at once by the readiness line or the end of stderr; the 0.5 s turns only look for an exit
        # whose stderr stays open (a child holding it), instead of 100 wake-ups a second per daemon.
        while not self._ready.is_set():
            self._settled.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            if self._ready.is_set():
                break
            # The readiness line sets _ready and then _settled: a line read just after the check above
            # leaves both set, which is a start, not an end of stderr.
            ended = self._settled.is_set() and not self._ready.is_set()
            if ended:  # its stderr ended: the process is exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise DaemonError(f"{self.name} exited with {self.proc.returncode} before ready\n{self.log}")
            if ended:
                raise DaemonError(f"{self.name} closed its stderr before ready\n{self.log}")
            if time.monotonic() > deadline:
                raise DaemonError(f"{self.name} not ready after {timeout} s\n{self.log}")
        return self

    async def astart(self) -> Daemon:
        """:meth:`start` from a thread, so concurrent clients in the event loop keep running."""
        return await asyncio.to_thread(self.start)

    def _drain(self, proc: subprocess.Popen[bytes], settled: threading.Event) -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._append(line)
                if not self._ready.is_set() and self.READY[self.name] in line:
                    if self.name == "mq":
                        match = _MQ_URL_RE.search(line)
                        if match:
                            self.url = match.group(1)
                    self._ready.set()
                    settled.set()
        settled.set()

    def _append(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    @property
    def running(self) -> bool:
        """True while the current process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        """Pid of the current process."""
        assert self.proc is not None
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` (default SIGKILL), wait for the exit and return the exit status."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(STOP_TIMEOUT_SECONDS)
        if self._reader is not None:
            self._reader.join(5)
        self._append(f"--- test harness: sent signal {signal.Signals(sig).name}, exit status {code}")
        return code

    def restart(self) -> Daemon:
        """Kill -9 the process if it still runs, then start it again with the same arguments."""
        if self.running:
            self.kill()
        return self.start()

    async def arestart(self) -> Daemon:
        """:meth:`restart` from a thread."""
        return await asyncio.to_thread(self.restart)

    def terminate(self) -> None:
        """Send SIGTERM without waiting (:meth:`stop` then waits for the exit without signalling again)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self) -> int:
        """SIGTERM and wait; return the exit status (0 expected). Kill -9 on timeout.

        Raises:
            DaemonError: It did not exit within ``STOP_TIMEOUT_SECONDS``.
        """
        assert self.proc is not None
        if self.proc.poll() is not None:
            return self.proc.returncode
        if not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DaemonError(f"{self.name} ignored SIGTERM for {STOP_TIMEOUT_SECONDS} s\n{self.log}") from None
        if self._reader is not None:
            self._reader.join(5)
        self._append(f"--- test harness: SIGTERM, exit status {code}")
        return code

    @property
    def log(self) -> str:
        """Everything the daemon wrote to stderr (all starts), one line per event."""
        with self._lock:
            return "\n".join(self._lines)

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of :attr:`log` (for assertion messages)."""
        with self._lock:
            return "\n".join(self._lines[-lines:])


@dataclass
class Reply:
    """What the client saw: status, headers, body bytes (and JSON if the body is JSON)."""

    status: int
    headers: dict[str, str]
    body: bytes
    content_type: str | None

    @property
    def json(self) -> Any:
        """The body parsed as JSON (raises if it is not JSON)."""
        import json

        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """A response header, case-insensitive."""
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class Stack:
    """mq, mq-mover and mq-reaper on one root.

    Attributes:
        root: The root directory.
        mq: The HTTP front end (``mq.url`` is its current base URL; it changes on restart).
        mover: mq-mover (None if not started).
        reaper: mq-reaper (None if not started).
    """

    root: Path
    mq: Daemon
    mover: Daemon | None
    reaper: Daemon | None
    session: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """Base URL of mq, e.g. ``http://127.0.0.1:40123``.

        Raises:
            aiohttp.ClientConnectionError: mq is between a kill and its readiness line.
        """
        if not self.mq.url:
            raise aiohttp.ClientConnectionError("mq is not running (being restarted?)")
        return self.mq.url

    def daemons(self) -> list[Daemon]:
        """The daemons of this stack."""
        return [d for d in (self.mq, self.mover, self.reaper) if d is not None]

    def logs(self) -> str:
        """The tail of every daemon's log, for assertion messages."""
        return "\n".join(f"===== {d.name} =====\n{d.log_tail()}" for d in self.daemons())

    def files(self, sub: str) -> list[str]:
        """Sorted names in ``root/sub`` (``new``, ``delay``, ``remove``, ``queues/Q``); [] if missing.

        A queue directory's metadata files (``.attributes``, ``.purge``, ...) are not messages and are left out.
        """
        try:
            return sorted(n for n in os.listdir(self.root / sub) if not n.startswith("."))
        except FileNotFoundError:
            return []

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: Any = None,
        headers: dict[str, str] | None = None,
        skip_auto_headers: Sequence[str] = (),
    ) -> Reply:
        """Send one HTTP request to mq; ``path`` is sent exactly as given (no normalisation).

        Raises:
            aiohttp.ClientError, asyncio.TimeoutError: Transport failures (e.g. mq was killed).
        """
        assert self.session is not None, "use the stack fixtures, which attach a session"
        url = yarl.URL(self.url + path, encoded=True)
        async with self.session.request(
            method, url, data=data, headers=headers, skip_auto_headers=skip_auto_headers
        ) as resp:
            body = await resp.read()
            return Reply(resp.status, dict(resp.headers), body, resp.headers.get("Content-Type"))

    # -- shorthands ----------------------------------------------------------

    async def create_queue(self, queue: str) -> None:
        """PUT /queue, asserting 201."""
        reply = await self.request("PUT", f"/{queue}")
        assert reply.status == 201, f"PUT /{queue} -> {reply.status} {reply.body!r}\n{self.logs()}"

    async def send(self, queue: str, body: bytes, content_type: str | None = None) -> str:
        """POST a message, asserting 201 and an X-Message-Id; return the id."""
        headers = {"Content-Type": content_type} if content_type else None
        reply = await self.request(
            "POST",
            f"/{queue}/messages",
            data=body,
            headers=headers,
            skip_auto_headers=() if content_type else ("Content-Type",),
        )
        assert reply.status == 201, f"POST -> {reply.status} {reply.body[:300]!r}\n{self.logs()}"
        message_id = reply.header("X-Message-Id")
        assert message_id, f"201 without X-Message-Id: {reply.headers}"
        return message_id

    async def receive(self, queue: str) -> Reply:
        """GET /queue/messages (200 or 204 expected; anything else fails)."""
        reply = await self.request("GET", f"/{queue}/messages")
        assert reply.status in (200, 204), f"GET messages -> {reply.status} {reply.body[:300]!r}\n{self.logs()}"
        return reply

    async def delete(self, queue: str, message_id: str) -> Reply:
        """DELETE /queue/messages/id (status not checked)."""
        return await self.request("DELETE", f"/{queue}/messages/{message_id}")


async def wait_for(
    predicate: Callable[[], Awaitable[Any]] | Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return that value.

    Raises:
        AssertionError: Still falsy after ``timeout`` seconds (with ``message``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout} s: {text}")
        await asyncio.sleep(interval)


@pytest.fixture
def wait() -> Callable[..., Awaitable[Any]]:
    """The :func:`wait_for` poller, for tests (conftest is not imported directly)."""
    return wait_for


class Daemons:
    """The daemons a fixture started; :meth:`stop_all` stops them at teardown."""

    def __init__(self) -> None:
        self.started: list[Daemon] = []

    def spawn(self, name: str, *args: str | os.PathLike[str], env: dict[str, str] | None = None) -> Daemon:
        """Start a daemon without waiting for readiness."""
        daemon = Daemon(name, [os.fspath(a) for a in args], env)
        self.started.append(daemon)
        return daemon.spawn()

    def start(self, name: str, *args: str | os.PathLike[str], env: dict[str, str] | None = None) -> Daemon:
        """Start a daemon and wait until it is ready."""
        return self.spawn(name, *args, env=env).wait_ready()

    def stop_all(self) -> None:
        """SIGTERM every daemon still running (last started first); each must exit 0.

        All get their SIGTERM before the first is waited for, so they stop in parallel.

        Raises:
            DaemonError: Some daemon exited non-zero or hung (all are stopped anyway).
        """
        failures = []
        for daemon in reversed(self.started):
            if daemon.running:
                daemon.terminate()
        for daemon in reversed(self.started):
            if not daemon.running:
                continue
            try:
                code = daemon.stop()
            except DaemonError as exc:
                failures.append(str(exc))
                continue
            if code != 0:
                failures.append(f"{daemon.name} exited {code} on SIGTERM (expected 0)\n{daemon.log_tail(80)}")
        if failures:
            raise DaemonError("\n\n".join(failures))

    def stack(
        self,
        root: Path,
        *,
        visibility_timeout: int = 30,
        peers: int | None = None,
        max_message_size: int | None = None,
        mq_args: Sequence[str] = (),
        mover_args: Sequence[str] = (),
        reaper_args: Sequence[str] = (),
        mover: bool = True,
        reaper: bool = True,
        env: dict[str, str] | None = None,
        ready_timeout: float | None = None,
    ) -> Stack:
        """Start mq (+ mq-mover + mq-reaper) on ``root`` in parallel; wait until all are ready (each at most
        ``ready_timeout`` seconds, default ``READY_TIMEOUT_SECONDS``)."""
        root.mkdir(parents=True, exist_ok=True)
        args = ["--root", str(root), "--port", "0", "--visibility-timeout", str(visibility_timeout)]
        if peers is not None:
            args += ["--peers", str(peers)]
        if max_message_size is not None:
            args += ["--max-message-size", str(max_message_size)]
        front = self.spawn("mq", *args, *mq_args, env=env)
        mov = self.spawn("mq-mover", "--root", root, *mover_args, env=env) if mover else None
        rea = self.spawn("mq-reaper", "--root", root, *reaper_args, env=env) if reaper else None
        for daemon in (front, mov, rea):
            if daemon is not None:
                daemon.wait_ready(ready_timeout)
        return Stack(root=root, mq=front, mover=mov, reaper=rea)


@pytest.fixture
def daemons() -> Iterator[Daemons]:
    """Start single daemons: ``daemons.start("mq", "--root", root, "--port", "0")``.

    Every daemon still running at teardown gets SIGTERM and must exit 0.
    """
    started = Daemons()
    yield started
    started.stop_all()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One aiohttp client session (30 s total timeout per request)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


StackFactory = Callable[..., Stack]


@pytest.fixture
def stack_factory(tmp_path: Path, daemons: Daemons, http: aiohttp.ClientSession) -> StackFactory:
    """Start a stack with custom options: ``stack_factory(visibility_timeout=1, peers=2, ...)``.

    Keyword options (see :meth:`Daemons.stack`): ``root`` (default ``tmp_path / "root"``),
    ``visibility_timeout`` (seconds, default 30), ``peers``, ``max_message_size`` (bytes),
    ``mq_args``, ``mover_args``, ``reaper_args``, ``mover``/``reaper`` (False leaves it out), ``env``.
    The returned stack's HTTP helpers use this test's client session.
    """

    def factory(*, root: Path | None = None, **options: Any) -> Stack:
        stack = daemons.stack(root or tmp_path / "root", **options)
        stack.session = http
        return stack

    return factory


@pytest.fixture
def stack(request: pytest.FixtureRequest, stack_factory: StackFactory) -> Stack:
    """A fresh full stack on ``tmp_path / "root"``; parametrize indirectly to pass options, e.g.
    ``@pytest.mark.parametrize("stack", [{"visibility_timeout": 1}], indirect=True)``."""
    options = getattr(request, "param", None) or {}
    return stack_factory(**options)


@pytest.fixture(scope="module")
def _module_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = Daemons()
    try:
        yield started.stack(tmp_path_factory.mktemp("shared") / "root")
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def module_daemons() -> Iterator[Daemons]:
    """:class:`Daemons` for a module's shared daemons (e.g. two nodes on one root): stopped, each
    exiting 0, when the module's tests are done. Tests sharing them use their own queue names."""
    started = Daemons()
    yield started
    started.stop_all()


class StackCache:
    """Stacks shared by a module's tests, one per set of options (see :func:`module_stacks`)."""

    def __init__(self, daemons: Daemons, base: Path) -> None:
        self._daemons = daemons
        self._base = base
        self._stacks: dict[str, Stack] = {}

    def get(self, options: dict[str, Any], session: aiohttp.ClientSession) -> Stack:
        """The module's stack started with ``options`` (started on first use), with ``session``."""
        key = repr(sorted(options.items()))
        if key not in self._stacks:
            root = self._base / f"stack{len(self._stacks)}" / "root"
            self._stacks[key] = self._daemons.stack(root, **options)
        return dataclasses.replace(self._stacks[key], session=session)


@pytest.fixture(scope="module")
def module_stacks(module_daemons: Daemons, tmp_path_factory: pytest.TempPathFactory) -> StackCache:
    """One stack per set of options, shared by the tests of a module that ask for the same options:
    ``module_stacks.get({"visibility_timeout": 1}, http)``. Such tests use their own queue names and
    must not stop, kill or restart the daemons."""
    return StackCache(module_daemons, tmp_path_factory.mktemp("stacks"))


@pytest.fixture
def shared_stack(_module_stack: Stack, http: aiohttp.ClientSession) -> Stack:
    """A full stack with default options shared by the tests of one module (start-up paid once).

    Tests using it must use their own queue names (the ``queue`` fixture) and must not
    assume other queues' files are absent.
    """
    return dataclasses.replace(_module_stack, session=http)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name unique to the test (not created)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:80]


# -- a small real filesystem for disk-full tests (shared/notes/fault-testing.md) -----------------


def fault_unavailable(reason: str) -> None:
    """Skip a fault test locally; fail it under CI=true, where the fault suite must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"fault test cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def mount_tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """A function ``mount(dir, options)`` that mounts a tmpfs (e.g. ``size=1m``) on a new ``dir``.

    Every mount is lazily unmounted at teardown. Needs root; without it (or
    without a working ``mount``) the test is skipped, or fails under CI=true.
    """
    mounted: list[Path] = []

    def mount(mount_point: Path, options: str) -> Path:
        mount_point.mkdir()
        if os.geteuid() != 0:
            fault_unavailable("mounting a tmpfs needs root")
        try:
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            fault_unavailable(f"mount failed: {exc}")
        if result.returncode != 0:
            fault_unavailable(f"mount -t tmpfs failed: {result.stderr.decode(errors='replace').strip()}")
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in reversed(mounted):
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30, check=False)


# -- running in parallel (scripts/test.sh: pytest -n N --dist loadgroup, pytest-xdist) ------------------------

#: Test folders whose modules share one expensive session fixture, so all their tests must run in one worker:
#: the Spark standalone cluster and session, the GlusterFS volume (one per machine: glusterd listens on
#: 127.0.0.2:24007), Chromium. They go first, in this order, since they take longest.
SHARED_SESSION_FOLDERS = ("spark", "cluster", "browser")


def xdist_group_of(nodeid: str) -> str:
    """The group a test runs in under ``--dist loadgroup``: its heavy folder (SHARED_SESSION_FOLDERS) or its module.

    A module's tests stay in one worker, so its module-scoped stacks start once and its tests keep their order.
    """
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SHARED_SESSION_FOLDERS:
        return f"tests/{parts[1]}"
    return path


#: Modules run first in their heavy folder's worker: the first test there also pays for the folder's session
#: fixture (a Spark cluster and session: 25-95 s), so it should be a short one with time to spare in its timeout.
FIRST_IN_GROUP = ("tests/spark/test_source.py",)

#: Seconds the slowest ordinary modules took in a loaded parallel run (stop 23; ~0.8x that on a quiet day). In a
#: parallel run they start first after the heavy folders, longest first, and the rest follow by their number of
#: tests: a long module started last would run on alone while the other workers idle (stop 23's run started the
#: 70 s packaging test at 664 s and the 61 s power-cut test at 722 s of 784 s; docs/performance.md).
SLOW_MODULES = {
    "tests/cli/test_mqctl.py": 150,
    "tests/fuzz/test_api_fuzz.py": 100,
    "tests/integration/test_processes.py": 80,
    "tests/packaging/test_wheel.py": 70,
    "tests/faults/test_crash_restart.py": 70,
    "tests/faults/test_power_cut.py": 60,
    "tests/integration/test_http_api.py": 60,
    "tests/integration/test_delivery.py": 60,
    "tests/client/test_conformance.py": 55,
    "tests/client/test_worker.py": 47,
    "tests/integration/test_file_sync.py": 43,
    "tests/client/test_http_client.py": 37,
    "tests/faults/test_crash_sqs.py": 36,
    "tests/docs/test_readme.py": 36,
    "tests/integration/test_sqs_messages.py": 31,
    "tests/faults/test_crash_brokerless.py": 29,
    "tests/unit/test_index.py": 28,
}

#: Modules whose tests bound a wall-clock latency tightly (tens of milliseconds: a long poll woken by a send, a
#: delayed message due at its deadline). In a parallel run they go last, in one worker, once every other worker
#: is done, so the run's own Spark, GlusterFS and daemon load never delays what they time.
SERIAL_MODULES = ("tests/integration/test_sqs_long_polling.py", "tests/integration/test_background_mover.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` groups by :func:`xdist_group_of` (pytest-xdist's own loadgroup needs ``xdist_group``
    marks, which it cannot apply under pytest 9), in the order the workers collected the tests (see
    :func:`pytest_collection_modifyitems`), and runs SERIAL_MODULES alone at the end."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

        def add_node_collection(self, node: Any, collection: Any) -> None:
            # Schemathesis' items (tests/fuzz: one per API operation) share one node id under pytest 9; xdist
            # tracks work by node id and would run only the first. Number the repeats, so each one runs.
            seen: dict[str, int] = {}
            unique = []
            for nodeid in collection:
                seen[nodeid] = seen.get(nodeid, 0) + 1
                unique.append(nodeid if seen[nodeid] == 1 else f"{nodeid}#{seen[nodeid]}")
            super().add_node_collection(node, unique)

        def _reschedule(self, node: Any) -> None:
            if not self.workqueue or any(scope not in SERIAL_MODULES for scope in self.workqueue):
                super()._reschedule(node)
                return
            # Only the serial modules are left. A worker's last test runs once it gets more work or is told to
            # stop: every worker but one stops; the last one gets them all once the others have finished.
            if node.shutting_down:
                node = next((n for n in self.nodes if not n.shutting_down), None)
                if node is None:
                    return
            elif self._pending_of(self.assigned_work[node]) > 2:
                return
            elif any(not n.shutting_down for n in self.nodes if n is not node):
                node.shutdown()
                return
            if any(self._pending_of(work) for other, work in self.assigned_work.items() if other is not node):
                return
            while self.workqueue:
                self._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the collection order: the heavy groups first
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup``, order the work: the heavy folders first, then SLOW_MODULES (longest first), then
    the larger modules, SERIAL_MODULES last (stable)."""
    if not getattr(config.option, "loadgroup", False):  # set by pytest-xdist on its workers
        return
    groups = {id(item): xdist_group_of(item.nodeid) for item in items}
    sizes: dict[str, int] = {}
    for group in groups.values():
        sizes[group] = sizes.get(group, 0) + 1

    def rank(item: pytest.Item) -> tuple[int, int, int]:
        group = groups[id(item)]
        heavy = [f"tests/{folder}" for folder in SHARED_SESSION_FOLDERS]
        if group in heavy:
            return (heavy.index(group), 0 if item.nodeid.split("::")[0] in FIRST_IN_GROUP else 1, 0)
        return (len(heavy) + (group in SERIAL_MODULES), -SLOW_MODULES.get(group, 0), -sizes[group])

    items.sort(key=rank)
