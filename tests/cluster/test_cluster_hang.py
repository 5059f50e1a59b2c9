"""A filesystem that stops answering: the host's GlusterFS FUSE client stopped (SIGSTOP), as an NFS hard mount whose
server went away (docs/cluster.md, "A filesystem that stops answering").

As a user sees it: while the FUSE client does not answer, ``/healthz`` answers 503 ``filesystem_stalled`` (JSON,
naming the call that waits and the threads blocked in the filesystem) and ``/readyz`` 503; a SIGTERM then still
stops mq (one process and ``--processes 2``), mq-mover and mq-reaper within ``--stop-timeout``: mq exits non-zero
with one log line naming the stuck threads and their calls. Every send answered 201 before or during the stall is
on the volume afterwards; a send not answered may fail.

The FUSE client always gets SIGCONT (``finally``): the session's volume serves the next modules.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import Gluster, Host, start_hosts

from tests.conftest import PLAIN_HTTP, Daemon, Daemons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

#: ``--stop-timeout`` of the daemons here (MQ_STOP_TIMEOUT), seconds.
STOP_TIMEOUT = 4
#: Exit code of a stop cut short by the filesystem (daemons._stopguard.EXIT_STUCK).
EXIT_STUCK = 69
QUEUE = "hang"


@pytest.fixture(scope="module")
def stalled(gluster: Gluster) -> Iterator[tuple[Host, Daemon, Daemons]]:
    """Host 1's full stack plus an ``mq --processes 2`` on the same root (both through mount h1)."""
    daemons = Daemons()
    env = {"MQ_STOP_TIMEOUT": str(STOP_TIMEOUT)}
    try:
        (host,) = start_hosts(daemons, gluster, "hang", hosts=1, env=env)
        supervisor = daemons.start(
            "mq", "--root", host.root, "--port", "0", "--address", "127.0.0.6", "--processes", "2", env=env
        )
        yield host, supervisor, daemons
    finally:
        for daemon in daemons.started:  # the test stops them; after a failure, whatever still runs
            if daemon.running:
                daemon.kill()


def _send(url: str, body: bytes, outcomes: list[str | int | None]) -> None:
    """One send; its message id (201), its status, or None when the connection ended without an answer."""
    try:
        reply = httpx.post(f"{url}/{QUEUE}/messages", content=body, timeout=60, verify=PLAIN_HTTP)
    except httpx.HTTPError:
        outcomes.append(None)
        return
    outcomes.append(reply.headers["X-Message-Id"] if reply.status_code == 201 else reply.status_code)


def _exited_or_gave_up(daemon: Daemon, timeout: float = STOP_TIMEOUT + 30) -> None:
    """Wait until ``daemon`` exited or logged that it exits without its stuck threads.

    A thread whose request the FUSE client had already read before it was stopped is in an uninterruptible
    wait: the process cannot finish exiting, even on SIGKILL, until the client answers (docs/cluster.md).

    Raises:
        AssertionError: Neither within ``timeout`` seconds (the stop ignored SIGTERM).
    """
    deadline = time.monotonic() + timeout
    while daemon.running and "exiting without" not in daemon.log:
        assert time.monotonic() < deadline, f"{daemon.name} ignored SIGTERM\n{daemon.log_tail()}"
        time.sleep(0.1)


def test_a_brief_stall_under_the_probe_deadline_leaves_healthz_and_readyz_ok(
    gluster: Gluster, stalled: tuple[Host, Daemon, Daemons]
) -> None:
    # A filesystem that is slow but answers (here: the FUSE client stopped for 1.5 s, under the probes' 5 s) is
    # not a stall: a /healthz arriving while /readyz's probe waits on it waits for that probe, then answers 200.
    host, _, _ = stalled
    url = host.stack.url
    replies: dict[str, httpx.Response] = {}

    def get(route: str) -> None:
        replies[route] = httpx.get(f"{url}/{route}", timeout=60, verify=PLAIN_HTTP)

    fuse = gluster.fuse_pid(host.index)
    os.kill(fuse, signal.SIGSTOP)
    try:
        probes = [threading.Thread(target=get, args=(route,), daemon=True) for route in ("readyz", "healthz")]
        for probe in probes:
            probe.start()
            time.sleep(0.5)  # /readyz's probe is under way when /healthz comes
        time.sleep(0.5)
    finally:
        os.kill(fuse, signal.SIGCONT)
    for probe in probes:
        probe.join(60)
    assert replies["healthz"].status_code == 200, replies["healthz"].text
    assert replies["readyz"].status_code == 200, replies["readyz"].text


def test_a_stalled_filesystem_fails_healthz_and_sigterm_still_stops_every_daemon_nothing_acknowledged_lost(
    gluster: Gluster, stalled: tuple[Host, Daemon, Daemons]
) -> None:
    host, supervisor, _ = stalled
    url = host.stack.url
    assert httpx.put(f"{url}/{QUEUE}", timeout=30, verify=PLAIN_HTTP).status_code == 201
    before = httpx.post(f"{url}/{QUEUE}/messages", content=b"before", timeout=30, verify=PLAIN_HTTP)
    assert before.status_code == 201, before.text
    acked = [before.headers["X-Message-Id"]]
    assert httpx.get(f"{url}/healthz", timeout=30, verify=PLAIN_HTTP).json() == {"status": "ok"}

    fuse = gluster.fuse_pid(host.index)
    outcomes: list[str | int | None] = []
    os.kill(fuse, signal.SIGSTOP)
    try:
        senders = [
            threading.Thread(target=_send, args=(target, body, outcomes), daemon=True)
            for target, body in ((url, b"during"), (supervisor.url, b"during-processes"))
        ]
        for sender in senders:
            sender.start()
        health = httpx.get(f"{url}/healthz", timeout=60, verify=PLAIN_HTTP)  # the stat probe's deadline (5 s), then 503
        assert health.status_code == 503, health.text
        assert health.headers.get("Retry-After")
        body = health.json()
        assert body["error"] == "filesystem_stalled", body
        assert "has not answered" in body["message"], body
        assert body["details"]["blocked_threads"], body
        ready = httpx.get(f"{url}/readyz", timeout=60, verify=PLAIN_HTTP)  # the probe still hangs: at once
        assert ready.status_code == 503, ready.text
        assert ready.json()["details"]["failed"] == ["stalled"], ready.text

        stack = [*host.stack.daemons(), supervisor]
        for daemon in stack:
            daemon.terminate()
        for daemon in stack:  # each exits, or gives up on its stuck threads, within its --stop-timeout
            _exited_or_gave_up(daemon)
    finally:
        os.kill(fuse, signal.SIGCONT)
    codes = {daemon: daemon.stop() for daemon in stack}  # a thread the FUSE client had taken ends only now
    for sender in senders:
        sender.join(60)

    mq = host.stack.mq
    assert codes[mq] == EXIT_STUCK, mq.log_tail()
    assert "blocked in the filesystem" in mq.log and "exiting without" in mq.log, mq.log_tail()
    assert f"--stop-timeout {STOP_TIMEOUT}" in mq.log, mq.log_tail()
    assert codes[supervisor] != 0, supervisor.log_tail()
    assert "blocked in the filesystem" in supervisor.log, supervisor.log_tail()  # a worker's line
    if "no thread is in a file system call" in supervisor.log:  # its own guard gave up: on which worker, said
        assert "waiting for mq process" in supervisor.log, supervisor.log_tail()
    for daemon in (host.stack.mover, host.stack.reaper):  # stuck only if a rescan was under way
        assert daemon is not None
        assert codes[daemon] in (0, EXIT_STUCK), daemon.log_tail()
        assert codes[daemon] == 0 or "blocked in the filesystem" in daemon.log, daemon.log_tail()

    # Nothing acknowledged is lost: every id answered 201 (before the stall or during it) is a file of the queue.
    acked += [o for o in outcomes if isinstance(o, str)]
    stored = {name.split(".", 1)[0] for name in os.listdir(host.root / "queues" / QUEUE) if not name.startswith(".")}
    assert set(acked) <= stored, (acked, stored, outcomes)
