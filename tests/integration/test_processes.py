"""``mq --processes 2``: two worker processes on one port and root keep the guarantees of docs/api.md
"Several mq processes".

Every request here goes over a new TCP connection, so the kernel (SO_REUSEPORT) hands the requests
of one test to both workers at random; each test checks from the workers' logs that both served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.conftest import PLAIN_HTTP, REPO, Daemon, DaemonError, Daemons, Stack, wait_for

#: Seconds a stack of ``mq --processes 2`` may take to start: three interpreters import mq at once
#: (supervisor, then both workers in parallel), twice the work of a single mq, on a machine that a
#: parallel test run saturates. The conftest's 15 s is for one.
START_SECONDS = 60.0


def ready(daemon: Daemon) -> Daemon:
    """Wait up to START_SECONDS for the readiness line of a spawned daemon."""
    deadline = time.monotonic() + START_SECONDS
    while Daemon.READY[daemon.name] not in daemon.log or (daemon.name == "mq" and daemon.url is None):
        if not daemon.running or time.monotonic() > deadline:
            raise DaemonError(f"{daemon.name} did not get ready\n{daemon.log}")
        time.sleep(0.05)
    return daemon.wait_ready()


def start(daemons: Daemons, name: str, *args: str | Path, env: dict[str, str] | None = None) -> Daemon:
    """Spawn ``name`` and wait up to START_SECONDS for its readiness line."""
    return ready(daemons.spawn(name, *args, env=env))


def stack_of_two(daemons: Daemons, root: Path) -> Stack:
    """mq --processes 2, mq-mover and mq-reaper on ``root``, started in parallel."""
    root.mkdir(parents=True, exist_ok=True)
    front = daemons.spawn("mq", "--root", root, "--port", "0", "--processes", "2")
    mover = daemons.spawn("mq-mover", "--root", root)
    reaper = daemons.spawn("mq-reaper", "--root", root)
    return Stack(root=root, mq=ready(front), mover=ready(mover), reaper=ready(reaper))


@pytest.fixture
async def fresh() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session that opens a new connection for every request (so requests spread over the workers)."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        yield session


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A bound AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(15)
    with sock:
        yield sock


@pytest.fixture
def two(_two: Stack, fresh: aiohttp.ClientSession) -> Stack:
    """The module's stack with ``mq --processes 2`` (shared; each test uses its own queues)."""
    return dataclasses.replace(_two, session=fresh)


@pytest.fixture(scope="module")
def _two(module_daemons: Daemons, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return stack_of_two(module_daemons, tmp_path_factory.mktemp("two") / "root")


def workers(stack: Stack) -> list[int]:
    """Pids of the supervisor's worker processes."""
    children = f"/proc/{stack.mq.pid}/task/{stack.mq.pid}/children"
    with open(children) as fh:
        return [int(pid) for pid in fh.read().split()]


async def served_by_both(stack: Stack, queue: str) -> None:
    """Both workers indexed ``queue`` (each logs ``indexed queue=Q`` when it first serves it)."""

    def both() -> bool:
        return all(re.search(rf"mq\[{i}/2\].*indexed queue={queue} ", stack.mq.log) for i in (1, 2))

    assert await wait_for(both, timeout=5), f"one worker served every request of {queue}\n{stack.logs()}"


async def test_a_message_acknowledged_by_one_process_is_received_through_any(two: Stack, queue: str) -> None:
    # Eight clients at once keep both workers busy: a receive may be read before the inotify
    # event of the send it follows, unless the worker reads its queued events first.
    async def client(k: int) -> None:
        name = f"{queue[:70]}_{k}"
        await two.create_queue(name)
        for _ in range(4):  # new connections each round: another pair of workers, often
            async with aiohttp.ClientSession() as sending, aiohttp.ClientSession() as receiving:
                producer = dataclasses.replace(two, session=sending)  # keep-alive: one worker for the round
                consumer = dataclasses.replace(two, session=receiving)
                for i in range(10):
                    body = f"m{i}".encode()
                    message_id = await producer.send(name, body)
                    reply = await consumer.receive(name)
                    assert reply.status == 200, f"message {i} of {name} acknowledged but the receive found it empty"
                    assert (reply.body, reply.header("X-Message-Id")) == (body, message_id)
                    assert (await consumer.delete(name, message_id)).status == 200

    await asyncio.gather(*(client(k) for k in range(8)))
    await served_by_both(two, f"{queue[:70]}_0")


async def test_a_sequential_consumer_sees_the_sequential_producers_order(two: Stack, queue: str) -> None:
    await two.create_queue(queue)
    sent = [await two.send(queue, f"{i}".encode()) for i in range(60)]
    received = []
    for _ in sent:
        reply = await two.receive(queue)
        assert reply.status == 200
        received.append(reply.header("X-Message-Id"))
    assert received == sent
    assert (await two.receive(queue)).status == 204
    await served_by_both(two, queue)


async def test_concurrent_consumers_across_processes_never_get_one_message_twice(two: Stack, queue: str) -> None:
    await two.create_queue(queue)
    sent = set()
    for start in range(0, 200, 10):
        entries = [{"body": f"{i}"} for i in range(start, start + 10)]
        reply = await two.request("POST", f"/{queue}/messages/batch", data=aiohttp_json(entries))
        assert reply.status == 200, reply.body
        sent.update(result["message_id"] for result in reply.json["successful"])
    assert len(sent) == 200
    got: list[str] = []

    async def consume() -> None:
        empty = 0
        while empty < 3:
            reply = await two.request("GET", f"/{queue}/messages?max_messages=10")
            messages = reply.json["messages"]
            empty = 0 if messages else empty + 1
            for message in messages:
                got.append(message["message_id"])

    await asyncio.gather(*(consume() for _ in range(8)))
    assert len(got) == len(set(got)), "a message was handed to two consumers within its visibility timeout"
    assert set(got) == sent
    await served_by_both(two, queue)


def aiohttp_json(entries: list[dict[str, str]]) -> bytes:
    """A batch send's JSON body."""
    return json.dumps({"entries": entries}).encode()


async def test_long_polls_wake_in_whichever_process_holds_them(two: Stack, queue: str) -> None:
    await two.create_queue(queue)
    polls = [
        asyncio.create_task(two.request("GET", f"/{queue}/messages?max_messages=1&wait_time_seconds=20"))
        for _ in range(6)
    ]
    await asyncio.sleep(1)  # the polls are waiting
    started = time.monotonic()
    for i in range(6):
        await two.send(queue, f"{i}".encode())
    replies = await asyncio.gather(*polls)
    assert time.monotonic() - started < 10, "a long poll was not woken by a send through the other process"
    assert sorted(len(reply.json["messages"]) for reply in replies) == [1] * 6
    await served_by_both(two, queue)


async def test_metrics_are_totals_over_the_processes(two: Stack, queue: str) -> None:
    await two.create_queue(queue)
    for i in range(20):
        await two.send(queue, f"{i}".encode())
    await served_by_both(two, queue)
    for _ in range(4):  # whichever worker answers the scrape
        text = (await two.request("GET", "/metrics")).body.decode()
        assert re.search(rf'^mq_messages_sent_total\{{queue="{queue}"\}} 20\.0$', text, re.M), text
        assert re.search(r"^mq_processes 2\.0$", text, re.M)
        assert re.search(rf'^mq_queue_messages_ready\{{queue="{queue}"\}} 20\.0$', text, re.M)


async def test_sigkill_of_a_worker_under_load_loses_no_acknowledged_message_and_sigterm_stops_all(
    daemons: Daemons, tmp_path, fresh: aiohttp.ClientSession
) -> None:
    stack = dataclasses.replace(stack_of_two(daemons, tmp_path / "root"), session=fresh)
    queue = "load"
    await stack.create_queue(queue)
    acknowledged: set[str] = set()
    received: set[str] = set()
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            try:
                acknowledged.add(await stack.send(queue, b"x"))
            except (aiohttp.ClientError, AssertionError):
                pass  # the connection went to the killed worker: not acknowledged

    async def consume() -> None:
        while not stop.is_set():
            try:
                reply = await stack.request("GET", f"/{queue}/messages?max_messages=10")
                for message in reply.json["messages"]:
                    received.add(message["message_id"])
                    await stack.delete(queue, message["message_id"])
            except aiohttp.ClientError:
                pass

    tasks = [asyncio.create_task(produce()) for _ in range(4)] + [asyncio.create_task(consume()) for _ in range(2)]
    await asyncio.sleep(1.5)
    victim = workers(stack)[0]
    os.kill(victim, signal.SIGKILL)
    assert await wait_for(lambda: "starting it again" in stack.mq.log, timeout=10), stack.logs()
    assert await wait_for(lambda: len(workers(stack)) == 2 and victim not in workers(stack), timeout=20)
    await asyncio.sleep(1.5)  # load through the restarted worker too
    stop.set()
    await asyncio.gather(*tasks)
    assert len(acknowledged) > 20, f"the load barely ran\n{stack.logs()}"
    # A message leased by the killed worker comes back after its visibility timeout (30 s): it is
    # on disk, in delay/ under its id, so nothing acknowledged is lost.
    names = stack.files(f"queues/{queue}") + stack.files("delay")
    missing = {i for i in acknowledged - received if not any(i in name for name in names)}
    assert not missing, f"{len(missing)} acknowledged messages neither received nor on disk\n{stack.logs()}"
    pids = workers(stack)
    assert stack.mq.stop() == 0, stack.logs()
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "a worker outlived its supervisor's SIGTERM"


def test_only_the_supervisor_talks_to_systemd_and_a_stopped_worker_stops_the_pings(
    daemons: Daemons, tmp_path, notify_socket: socket.socket
) -> None:
    env = {"NOTIFY_SOCKET": notify_socket.getsockname(), "WATCHDOG_USEC": "400000"}  # ping every 0.2 s
    supervisor = start(daemons, "mq", "--root", tmp_path / "root", "--port", "0", "--processes", "2", env=env)
    assert notify_socket.recv(4096) == b"READY=1"  # once, after both workers listen
    for _ in range(3):
        ping = notify_socket.recv(4096).decode().split("\n")
        assert ping[0] == "WATCHDOG=1", ping
        assert re.fullmatch(r"STATUS=serving: 2 processes, \d+ queues active, [0-9.]+ requests/s", ping[1]), ping
    worker = workers(Stack(root=tmp_path, mq=supervisor, mover=None, reaper=None))[1]
    os.kill(worker, signal.SIGSTOP)  # its event loop sends no heartbeat: as good as blocked
    try:
        time.sleep(1.0)
        notify_socket.settimeout(0.01)
        with contextlib.suppress(TimeoutError):
            while True:  # what was sent before the stop
                notify_socket.recv(4096)
        notify_socket.settimeout(1.0)
        with pytest.raises(TimeoutError):
            notify_socket.recv(4096)
    finally:
        os.kill(worker, signal.SIGCONT)
    notify_socket.settimeout(15)
    assert notify_socket.recv(4096).decode().startswith("WATCHDOG=1")
    assert supervisor.stop() == 0, supervisor.log
    messages = []
    notify_socket.settimeout(0.5)
    with contextlib.suppress(TimeoutError):
        while True:
            messages.append(notify_socket.recv(4096).decode())
    assert "STOPPING=1" in messages, messages
    assert "READY=1" not in messages, "a worker talked to systemd"


def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_exit_code(daemons: Daemons, tmp_path) -> None:
    missing = str(tmp_path / "missing.pem")
    args = ["--root", tmp_path / "root", "--port", "0", "--processes", "2", "--tls-cert", missing, "--tls-key", missing]
    supervisor = daemons.spawn("mq", *args)
    assert supervisor.proc is not None
    assert supervisor.proc.wait(60) == 78, supervisor.log  # EX_CONFIG, as a single mq: systemd does not retry it
    assert "cannot load --tls-cert" in supervisor.log


def test_under_socket_activation_the_workers_share_systemds_socket(tmp_path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQ_", "LISTEN_"))} | {"LISTEN_FDS": "1"}
    command = [sys.executable, "-m", "daemons.front", "--root", str(tmp_path / "root"), "--processes", "2"]
    # sh sets LISTEN_PID to its own pid, which exec hands on to mq (as systemd does); the socket is fd 3.
    proc = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", *command], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(3,),
        preexec_fn=lambda: os.dup2(listener.fileno(), 3), close_fds=True,
    )  # fmt: skip
    listener.close()  # mq holds it now
    lines: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        with proc.stderr:
            lines.extend(raw.decode(errors="replace") for raw in proc.stderr)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        while not any("mq listening on" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        assert f"mq listening on http://127.0.0.1:{port} " in "".join(lines)
        assert "one shared socket" in "".join(lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, verify=PLAIN_HTTP) as client:
            assert client.put("/activated").status_code == 201
        for i in range(30):  # a new connection each
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, verify=PLAIN_HTTP) as client:
                assert client.post("/activated/messages", content=f"{i}".encode()).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        reader.join(5)
    assert code == 0, "".join(lines)
