"""What the daemons tell systemd and take from it, with real sockets instead of systemd: the
notify protocol (READY=1, WATCHDOG=1 pings with STATUS= lines) on a real AF_UNIX datagram socket,
and socket activation (LISTEN_FDS) with a real inherited listening socket, across a restart of mq
that loses no connection attempt."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PLAIN_HTTP, REPO, Daemons

#: Longest any wait here may take, in seconds.
BOUND_SECONDS = 15.0


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A bound AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(BOUND_SECONDS)
    with sock:
        yield sock


def _messages(sock: socket.socket, count: int) -> list[str]:
    return [sock.recv(4096).decode() for _ in range(count)]


@pytest.mark.parametrize("name", ["mq", "mq-mover", "mq-reaper"])
def test_ready_then_watchdog_pings_with_status(
    name: str, daemons: Daemons, notify_socket: socket.socket, tmp_path: Path
) -> None:
    env = {"NOTIFY_SOCKET": notify_socket.getsockname(), "WATCHDOG_USEC": "200000"}  # ping every 0.1 s
    args = ["--root", tmp_path / "root"] + (["--port", "0"] if name == "mq" else [])
    daemon = daemons.start(name, *args, env=env)
    first = notify_socket.recv(4096).decode()
    assert first == "READY=1", first
    started = time.monotonic()
    pings = _messages(notify_socket, 5)
    elapsed = time.monotonic() - started
    for ping in pings:
        lines = ping.split("\n")
        assert lines[0] == "WATCHDOG=1" and lines[1].startswith("STATUS="), ping
    if name == "mq":
        assert re.fullmatch(r"STATUS=serving: \d+ queues active, [0-9.]+ requests/s", pings[-1].split("\n")[1])
    assert elapsed < BOUND_SECONDS
    # A stopped (blocked) process sends no ping: what makes systemd restart it.
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)
        notify_socket.settimeout(0.01)
        while True:  # drain what was sent before the stop
            try:
                notify_socket.recv(4096)
            except TimeoutError:
                break
        notify_socket.settimeout(0.5)
        with pytest.raises(TimeoutError):
            notify_socket.recv(4096)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    notify_socket.settimeout(BOUND_SECONDS)
    assert notify_socket.recv(4096).decode().startswith("WATCHDOG=1")


def test_without_watchdog_usec_only_status_lines_are_sent(
    daemons: Daemons, notify_socket: socket.socket, tmp_path: Path
) -> None:
    daemons.start("mq", "--root", tmp_path / "root", "--port", "0", env={"NOTIFY_SOCKET": notify_socket.getsockname()})
    assert notify_socket.recv(4096) == b"READY=1"
    assert notify_socket.recv(4096).decode().startswith("STATUS=serving:")


def _spawn_activated(
    listener: socket.socket, root: Path, log: list[str]
) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """mq started as systemd would: the listening socket as fd 3, LISTEN_FDS=1, LISTEN_PID=its pid."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQ_", "LISTEN_"))}
    env["LISTEN_FDS"] = "1"
    fd = listener.fileno()

    def as_fd_3() -> None:
        os.dup2(fd, 3)

    # sh sets LISTEN_PID to its own pid, which exec hands on to the daemon (as systemd does).
    proc = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", sys.executable, "-m", "daemons.front", "--root", str(root)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        pass_fds=(3,), preexec_fn=as_fd_3, close_fds=True,
    )  # fmt: skip
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for raw in proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                log.append(line)
                if "mq listening on" in line:
                    ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    if not ready.wait(BOUND_SECONDS):
        proc.kill()
        raise AssertionError("\n".join(log))
    return proc, reader  # join the reader after the exit: it closes the pipe


def test_socket_activation_serves_the_inherited_socket_and_a_restart_loses_no_connection(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log: list[str] = []
    proc, reader = _spawn_activated(listener, tmp_path / "root", log)
    try:
        assert any("socket activation: serving the socket systemd passed" in line for line in log), log
        assert any(f"mq listening on http://127.0.0.1:{port}" in line for line in log), log
        assert httpx.put(f"{url}/activated", timeout=BOUND_SECONDS, verify=PLAIN_HTTP).status_code == 201
        # mq goes away; the socket stays (held by "systemd", here this test): a client connects meanwhile.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(BOUND_SECONDS) == 0
        reader.join(BOUND_SECONDS)
        waiting = socket.create_connection(("127.0.0.1", port), timeout=BOUND_SECONDS)  # queued in the backlog
        with waiting:
            waiting.sendall(b"GET /activated HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            proc, reader = _spawn_activated(listener, tmp_path / "root", log)
            answer = b""
            while chunk := waiting.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(BOUND_SECONDS) == 0, "\n".join(log)
        reader.join(BOUND_SECONDS)
        listener.close()


@pytest.mark.parametrize("module", ["daemons.front", "daemons.mover", "daemons.reaper"])
def test_a_second_stop_signal_during_shutdown_still_exits_0(tmp_path: Path, module: str) -> None:
    """Ctrl-C reaches every daemon of mq-stack, then mq-stack sends SIGTERM to the ones still running.

    A SIGTERM that lands after the daemon logged "stopped" (while the interpreter shuts down) must
    not turn the clean exit into "killed by signal 15" (this failed a CI run of the README's stack).
    """
    args = [sys.executable, "-m", module, "--root", str(tmp_path)]
    if module == "daemons.front":
        args += ["--port", "0"]
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                if re.search(r"mq listening on|ready root=", line):
                    break
            proc.send_signal(signal.SIGINT)
            for line in proc.stderr:
                if re.search(r"\bstopped\b", line):
                    break
            time.sleep(0.005)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(BOUND_SECONDS) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def _catches(pid: int, sig: signal.Signals) -> bool:
    """True once process ``pid`` has a handler of its own for ``sig`` (``SigCgt`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as fh:
        mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.parametrize("name", ["mq", "mq-mover", "mq-reaper"])
def test_a_stop_signal_while_the_daemon_starts_exits_0(name: str, daemons: Daemons, tmp_path: Path) -> None:
    """systemd (or a test fixture) may stop a daemon that is still starting: it exits 0, not "killed by signal 15".

    The SIGTERM is sent as soon as the process has a handler for it (the first of our code, the ``daemons``
    package, is being imported: the interpreter's own start-up before that cannot be covered), which is long
    before the daemon's modules are imported and it is ready.
    """
    args = ["--root", tmp_path / "root"] + (["--port", "0"] if name == "mq" else [])
    daemon = daemons.spawn(name, *args)
    deadline = time.monotonic() + BOUND_SECONDS
    while not _catches(daemon.pid, signal.SIGTERM):
        assert daemon.running and time.monotonic() < deadline, daemon.log
        time.sleep(0.001)
    assert daemon.kill(signal.SIGTERM) == 0, daemon.log  # sends it, waits for the exit and the last log line
    assert daemon.READY[name] not in daemon.log, "the daemon was ready before the signal: the test missed its start-up"
