"""mqctl end to end: the installed console script as a subprocess, against a real stack or a root folder.

Every test runs ``.venv/bin/mqctl`` (the script next to ``sys.executable``),
as a user would, and checks what a user sees: stdout (only data), stderr
(progress bars, notes, ``mqctl: <code>: <message>`` errors) and the exit code
(sysexits.h, docs/mqctl.md). The HTTP tests share one stack (mq, mq-mover,
mq-reaper: ``shared_stack``) and each uses its own queue names; the
brokerless tests (``--root``) work on a fresh folder under ``tmp_path``, or on
the running stack's own root. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The installed console script (the same venv as the interpreter running the tests).
MQCTL = Path(sys.executable).with_name("mqctl")
#: Longest one mqctl run may take, in seconds (a hang fails the test instead of stalling the suite).
RUN_TIMEOUT_SECONDS = 60.0

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 64
EXIT_DATAERR = 65
EXIT_NOINPUT = 66
EXIT_UNAVAILABLE = 69
EXIT_IOERR = 74
EXIT_TEMPFAIL = 75


@dataclass
class Run:
    """What one mqctl run printed and returned."""

    args: list[str]
    code: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        """stdout as text."""
        return self.stdout.decode("utf-8")

    @property
    def lines(self) -> list[str]:
        """stdout's lines."""
        return self.out.splitlines()

    def json(self) -> object:
        """stdout parsed as one JSON value."""
        return json.loads(self.stdout)

    def json_lines(self) -> list[dict[str, object]]:
        """stdout parsed as JSON lines."""
        return [json.loads(line) for line in self.lines]

    def __str__(self) -> str:
        head = f"mqctl {' '.join(self.args)} -> {self.code}"
        return f"{head}\nstdout: {self.stdout[:2000]!r}\nstderr: {self.stderr[-2000:]}"


def environment() -> dict[str, str]:
    """The test's environment without MQ_* variables (they would change mqctl's target)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}


def mqctl(*args: str | os.PathLike[str], stdin: bytes | None = None, expect: int | None = EXIT_OK) -> Run:
    """Run mqctl with ``args`` and wait for it; check the exit code when ``expect`` is not None."""
    argv = [os.fspath(a) for a in args]
    proc = subprocess.run(
        [str(MQCTL), *argv],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=environment(),
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))
    if expect is not None:
        assert run.code == expect, str(run)
    return run


def error_line(run: Run, code: str) -> str:
    """The ``mqctl: <code>: ...`` line of ``run``'s stderr (the test fails if there is none)."""
    for line in run.stderr.splitlines():
        if line.startswith(f"mqctl: {code}: "):
            return line
    raise AssertionError(f"no 'mqctl: {code}: ...' line on stderr\n{run}")


def wait_until(predicate, *, timeout: float = 15.0, message: str = "condition not met"):
    """Call ``predicate`` every 0.1 s until it returns a truthy value; return it (fail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {message}"
        time.sleep(0.1)


async def create(stack, queue: str, **attributes: object) -> None:
    """Create ``queue`` over HTTP (test setup; the ``queues create`` command has its own test)."""
    body = json.dumps(attributes).encode() if attributes else None
    reply = await stack.request("PUT", f"/{queue}", data=body)
    assert reply.status == 201, f"PUT /{queue} -> {reply.status} {reply.body!r}"


async def stats(stack, queue: str) -> dict[str, object]:
    """The queue's statistics over HTTP (``GET /{queue}``)."""
    reply = await stack.request("GET", f"/{queue}")
    assert reply.status == 200, f"GET /{queue} -> {reply.status} {reply.body!r}"
    return reply.json


class Follower:
    """A ``mqctl tail`` (or any long-running mqctl) in the background, read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(MQCTL), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment(),
        )
        self.stdout = b""
        self.stderr = b""

    def _read(self, timeout: float) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
            sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
            for key, _ in sel.select(timeout):
                chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if key.data == "out":
                    self.stdout += chunk
                else:
                    self.stderr += chunk

    def wait_for(self, predicate, what: str, timeout: float = 15.0) -> None:
        """Read its output until ``predicate(self)`` holds (fail if it exits first or after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if self.proc.poll() is not None:
                self.finish()
                assert predicate(self), f"mqctl exited {self.proc.returncode} before {what}: {self}"
                return
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self}"
            self._read(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig``, read the rest of the output and return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.finish()

    def finish(self) -> int:
        """Wait for the exit, read the rest of the output and return the exit code."""
        out, err = self.proc.communicate(timeout=RUN_TIMEOUT_SECONDS)
        self.stdout += out
        self.stderr += err
        return self.proc.returncode

    def kill(self) -> None:
        """Kill it if it still runs (test teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=RUN_TIMEOUT_SECONDS)

    def __str__(self) -> str:
        return f"stdout: {self.stdout[-2000:]!r}\nstderr: {self.stderr[-2000:]!r}"


@pytest.fixture
def stack(shared_stack):
    """The shared stack (mq, mq-mover, mq-reaper); tests use their own queue names."""
    return shared_stack


@pytest.fixture
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port that was just free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- queues -----------------------------------------------------------------------------------------------


async def test_queues_create_list_attributes_stats_delete(stack, queue):
    url, dlq = stack.url, f"{queue}-dlq"
    created = mqctl("--url", url, "queues", "create", dlq)
    assert created.stdout == b"" and f"created queue {dlq}" in created.stderr
    attrs = ["--attr", "visibility_timeout_seconds=45", "--attr", f"dead_letter_queue={dlq}"]
    mqctl("--url", url, "queues", "create", queue, *attrs)
    assert "already exists" in mqctl("--url", url, "queues", "create", queue).stderr
    conflict = mqctl("--url", url, "queues", "create", queue, "--attr", "visibility_timeout_seconds=46", expect=1)
    error_line(conflict, "queue_name_exists")

    assert mqctl("--url", url, "queues", "list", "--prefix", queue).lines == [queue, dlq]

    attributes = mqctl("--url", url, "queues", "attributes", queue).json()
    assert attributes["visibility_timeout_seconds"] == 45  # JSON value: an int
    assert attributes["dead_letter_queue"] == dlq  # not JSON: a string
    assert attributes["max_receive_count"] == 5  # SMQ's default once a dead-letter queue is set
    changed = mqctl("--url", url, "queues", "attributes", queue, "--set", "capacity=100", "--set", "delay_seconds=0")
    assert changed.json()["capacity"] == 100
    reset = mqctl("--url", url, "queues", "attributes", queue, "--set", "capacity=null").json()
    assert reset["capacity"] is None and reset["visibility_timeout_seconds"] == 45

    await stack.send(queue, b"one")
    queue_stats = mqctl("--url", url, "queues", "stats", queue).json()
    assert queue_stats["queue"] == queue
    assert (queue_stats["ready"], queue_stats["in_flight"], queue_stats["delayed"]) == (1, 0, 0)
    assert queue_stats["attributes"]["dead_letter_queue"] == dlq

    deleted = mqctl("--url", url, "queues", "delete", queue)
    assert deleted.stdout == b"" and f"deleted queue {queue}" in deleted.stderr
    assert mqctl("--url", url, "queues", "list", "--prefix", queue).lines == [dlq]
    gone = mqctl("--url", url, "queues", "stats", queue, expect=EXIT_NOINPUT)
    assert queue in error_line(gone, "queue_not_found")


# -- send and receive -------------------------------------------------------------------------------------


async def test_send_argument_and_stdin_then_receive_json_and_delete(stack, queue):
    url = stack.url
    await create(stack, queue)
    first = mqctl("--url", url, "send", queue, "hello world", "--attr", "tenant=acme").out.strip()
    second = mqctl("--url", url, "send", queue, stdin=b"\x00\xff\xfe raw").out.strip()
    third = mqctl("--url", url, "send", queue, "-", "--content-type", "application/json", stdin=b'{"n": 3}').out.strip()
    assert first < second < third  # message ids, which sort in send order

    received = mqctl("--url", url, "receive", queue, "--count", "3", "--json").json_lines()
    assert [m["message_id"] for m in received] == [first, second, third]
    assert received[0]["body"] == "hello world"
    assert received[0]["attributes"] == {"tenant": "acme"}
    assert received[0]["content_type"].startswith("text/plain")
    assert "body" not in received[1] and received[1]["body_base64"] == "AP/+IHJhdw=="  # not UTF-8
    assert received[2]["body"] == '{"n": 3}' and received[2]["content_type"] == "application/json"
    for message in received:
        assert message["receive_count"] == 1 and message["receipt_handle"] and message["sent_ms"] > 0
    assert (await stats(stack, queue))["in_flight"] == 3  # without --delete they stay in flight

    await stack.send(queue, b"line a")
    await stack.send(queue, b"line b")
    bodies = mqctl("--url", url, "receive", queue, "--count", "5", "--delete")
    assert bodies.lines == ["line a", "line b"]  # what was ready: the three in flight are not
    after = await stats(stack, queue)
    assert (after["ready"], after["in_flight"]) == (0, 3)
    assert mqctl("--url", url, "receive", queue, "--wait", "0").stdout == b""  # nothing ready: no output, exit 0


async def test_receive_wait_long_polls_until_a_message_arrives(stack, queue):
    await create(stack, queue)
    waiting = Follower("--url", stack.url, "receive", queue, "--wait", "15", "--delete")
    try:
        time.sleep(0.5)
        assert waiting.proc.poll() is None, f"receive --wait returned before any message: {waiting}"
        await stack.send(queue, b"worth the wait")
        assert waiting.finish() == EXIT_OK, str(waiting)
    finally:
        waiting.kill()
    assert waiting.stdout == b"worth the wait\n"
    assert (await stats(stack, queue))["ready"] == 0


async def test_send_a_file_of_1000_lines_in_order_with_a_progress_bar(stack, queue, tmp_path):
    url = stack.url
    await create(stack, queue)
    lines = [f"line {i:04d} ünïcode" for i in range(1000)]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    run = mqctl("--url", url, "send", queue, "--file", path, "--progress")
    assert run.stdout == b"", "the progress bar and the summary belong on stderr"
    assert "1000/1000" in run.stderr, run.stderr
    assert f"sent 1000 messages to {queue}" in run.stderr
    assert (await stats(stack, queue))["ready"] == 1000

    received = mqctl("--url", url, "receive", queue, "--count", "1000", "--delete")
    assert received.lines == lines
    assert (await stats(stack, queue))["ready"] == 0


async def test_send_lines_from_stdin_prints_ids_and_no_bar_when_not_a_terminal(stack, queue):
    url = stack.url
    await create(stack, queue)
    run = mqctl("--url", url, "send", queue, "--file", "-", "--ids", stdin=b"a\r\nb\n\nc")
    ids = run.lines
    assert len(ids) == 4 and ids == sorted(ids)
    assert "msg/s" not in run.stderr and "%|" not in run.stderr  # stderr is a pipe: no bar unless --progress
    received = mqctl("--url", url, "receive", queue, "--count", "10", "--json", "--delete").json_lines()
    assert [m["body"] for m in received] == ["a", "b", "", "c"]
    assert [m["message_id"] for m in received] == ids


# -- tail and purge ---------------------------------------------------------------------------------------


async def test_tail_prints_new_messages_and_consumes_nothing(stack, queue):
    await create(stack, queue)
    await stack.send(queue, b"before the tail")
    tail = Follower("--url", stack.url, "tail", queue, "--interval", "0.2")
    try:
        tail.wait_for(lambda f: b"following queue" in f.stderr, "tail to start")
        await stack.send(queue, b"after 1")
        await stack.send(queue, b"after 2")
        tail.wait_for(lambda f: f.stdout.count(b"\n") >= 2, "two messages")
        assert tail.stop() == EXIT_OK, str(tail)  # SIGTERM ends a tail cleanly
    finally:
        tail.kill()
    assert tail.stdout == b"after 1\nafter 2\n"
    after = await stats(stack, queue)
    assert (after["ready"], after["in_flight"]) == (3, 0), "tail must not receive anything"
    first = await stack.receive(queue)
    assert first.body == b"before the tail" and first.header("X-Receive-Count") == "1"


async def test_tail_from_start_json_lines(stack, queue):
    await create(stack, queue)
    sent = await stack.send(queue, b"already there")
    tail = Follower("--url", stack.url, "tail", queue, "--from-start", "--json", "--interval", "0.2")
    try:
        tail.wait_for(lambda f: b"\n" in f.stdout, "the existing message")
        assert tail.stop(signal.SIGINT) == EXIT_OK, str(tail)
    finally:
        tail.kill()
    (line,) = tail.stdout.decode().splitlines()
    message = json.loads(line)
    assert message["message_id"] == sent and message["body"] == "already there"
    assert message["state"] == "ready" and message["receive_count"] == 0


async def test_purge_prints_how_many_were_removed(stack, queue):
    await create(stack, queue)
    for body in (b"1", b"2", b"3"):
        await stack.send(queue, body)
    assert mqctl("--url", stack.url, "purge", queue).out == "3\n"
    assert (await stats(stack, queue))["ready"] == 0


# -- dead letters and redrive -----------------------------------------------------------------------------


async def test_dead_letters_then_redrive_wait_moves_them_back(stack, queue, wait):
    url, dlq = stack.url, f"{queue}-dlq"
    await create(stack, dlq)
    await create(stack, queue, dead_letter_queue=dlq, max_receive_count=1)
    await stack.send(queue, b"poison 1")
    await stack.send(queue, b"poison 2")
    # One receive each, released at once: over max_receive_count, mq-mover dead-letters them.
    assert mqctl("--url", url, "receive", queue, "--count", "2", "--visibility-timeout", "0").lines == [
        "poison 1",
        "poison 2",
    ]

    async def dead_lettered() -> bool:
        return (await stats(stack, dlq))["ready"] == 2

    await wait(dead_lettered, message="messages reach the dead-letter queue")

    listed = mqctl("--url", url, "dead-letters", queue, "--json").json_lines()
    assert [m["body"] for m in listed] == ["poison 1", "poison 2"]
    assert all(m["source_queue"] == queue and m["receive_count"] == 1 and m["queue"] == dlq for m in listed)
    assert mqctl("--url", url, "dead-letters", queue, "--limit", "1").lines == ["poison 1"]
    assert mqctl("--url", url, "dead-letters", dlq, "--self").lines == ["poison 1", "poison 2"]
    error_line(mqctl("--url", url, "dead-letters", dlq, expect=EXIT_NOINPUT), "no_dead_letter_queue")

    run = mqctl("--url", url, "redrive", dlq, "--wait", "--progress")
    task = run.json()
    assert task["state"] == "completed" and task["moved"] == 2, str(run)
    assert f"redrive {dlq}" in run.stderr  # the bar
    assert (await stats(stack, dlq))["ready"] == 0
    assert mqctl("--url", url, "redrive", dlq, "--status").json()["state"] == "completed"
    back = mqctl("--url", url, "receive", queue, "--count", "2", "--json", "--delete").json_lines()
    assert [m["body"] for m in back] == ["poison 1", "poison 2"]
    assert [m["receive_count"] for m in back] == [1, 1]  # a redrive resets the receive count
    error_line(mqctl("--url", url, "redrive", dlq, "--cancel", expect=EXIT_ERROR), "redrive_not_running")


# -- exit codes -------------------------------------------------------------------------------------------


async def test_exit_codes_for_server_errors(stack, queue):
    url = stack.url
    missing = mqctl("--url", url, "send", queue, "x", expect=EXIT_NOINPUT)
    assert queue in error_line(missing, "queue_not_found")
    assert missing.stdout == b""
    mqctl("--url", url, "tail", queue, expect=EXIT_NOINPUT)
    error_line(mqctl("--url", url, "queues", "create", "no spaces", expect=EXIT_DATAERR), "invalid_queue_name")
    bad_attribute = mqctl("--url", url, "queues", "create", queue, "--attr", "colour=blue", expect=EXIT_DATAERR)
    error_line(bad_attribute, "invalid_attribute")


async def test_queue_full_exits_75(stack, queue):
    url = stack.url
    await create(stack, queue, capacity=2, capacity_wait_seconds=0)
    await stack.send(queue, b"one")
    await stack.send(queue, b"two")
    error_line(mqctl("--url", url, "--retries", "0", "send", queue, "three", expect=EXIT_TEMPFAIL), "queue_full")
    assert mqctl("--url", url, "receive", queue, "--delete").lines == ["one"]

    bulk = mqctl("--url", url, "--retries", "0", "send", queue, "--file", "-", stdin=b"a\nb\nc\n", expect=EXIT_TEMPFAIL)
    assert "line 2" in error_line(bulk, "queue_full")  # line 1 fitted, lines 2 and 3 did not
    assert "mqctl: queue_full: line 3: " in bulk.stderr
    assert "sent 1 message of the first 3 lines" in bulk.stderr
    assert (await stats(stack, queue))["ready"] == 2


def test_unreachable_server_exits_69(closed_port_url):
    run = mqctl("--url", closed_port_url, "--retries", "0", "queues", "list", expect=EXIT_UNAVAILABLE)
    error_line(run, "connection_failed")
    assert run.stdout == b""


def test_unreachable_server_is_one_line_and_retries_show_with_verbose(closed_port_url):
    run = mqctl("--url", closed_port_url, "--retries", "2", "queues", "list", expect=EXIT_UNAVAILABLE)
    assert run.stderr.splitlines() == [error_line(run, "connection_failed")]
    assert f"the server at {closed_port_url} is not answering" in run.stderr
    verbose = mqctl("--url", closed_port_url, "--retries", "2", "-v", "queues", "list", expect=EXIT_UNAVAILABLE)
    assert len([line for line in verbose.stderr.splitlines() if line.startswith("mqctl: warning: retrying")]) == 2
    assert f"the server at {closed_port_url} is not answering" in error_line(verbose, "connection_failed")


@pytest.mark.parametrize(
    "args",
    [
        ["--no-such-option", "queues", "list"],
        ["send"],
        ["receive", "q", "--count", "0"],
        ["queues", "create", "q", "--attr", "no-equals-sign"],
        ["frobnicate"],
        ["redrive", "q", "--status", "--cancel"],
        ["send", "q", "body", "--file", "f.txt"],
        ["--url", "127.0.0.1:8080", "queues", "list"],
    ],
)
def test_usage_errors_exit_64(args, closed_port_url):
    run = mqctl("--url", closed_port_url, *args, expect=EXIT_USAGE)
    error_line(run, "usage")
    assert run.stdout == b""


def test_url_and_root_together_is_a_usage_error(tmp_path, closed_port_url):
    run = mqctl("--url", closed_port_url, "--root", tmp_path, "queues", "list", expect=EXIT_USAGE)
    assert "--url and --root" in error_line(run, "usage")


def test_missing_file_exits_74(tmp_path, closed_port_url):
    run = mqctl("--url", closed_port_url, "send", "q", "--file", tmp_path / "missing.txt", expect=EXIT_IOERR)
    assert "missing.txt" in error_line(run, "io_error")


# -- brokerless -------------------------------------------------------------------------------------------


def test_brokerless_on_a_fresh_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"m{i}\n" for i in range(25)))

    mqctl("--root", root, "queues", "create", "jobs", "--attr", "visibility_timeout_seconds=60")
    assert mqctl("--root", root, "queues", "list").lines == ["jobs"]
    mqctl("--root", root, "send", "jobs", "--file", lines)
    single = mqctl("--root", root, "send", "jobs", "last").out.strip()
    assert mqctl("--root", root, "queues", "stats", "jobs").json()["ready"] == 26

    received = mqctl("--root", root, "receive", "jobs", "--count", "26", "--json", "--delete").json_lines()
    assert [m["body"] for m in received] == [f"m{i}" for i in range(25)] + ["last"]
    assert received[-1]["message_id"] == single
    assert mqctl("--root", root, "queues", "stats", "jobs").json()["ready"] == 0
    error_line(mqctl("--root", root, "receive", "nope", expect=EXIT_NOINPUT), "queue_not_found")
    error_line(mqctl("--root", root, "send", "bad name", "x", expect=EXIT_DATAERR), "invalid_queue_name")


def test_brokerless_missing_root_is_a_usage_error(tmp_path):
    run = mqctl("--root", tmp_path / "nowhere", "queues", "list", expect=EXIT_USAGE)
    error_line(run, "usage")


async def test_brokerless_on_a_running_stack_root(stack, queue):
    """A message sent without the server is received through it, and the other way round."""
    await create(stack, queue)
    mqctl("--root", stack.root, "send", queue, "written on disk")
    assert mqctl("--url", stack.url, "receive", queue, "--wait", "5", "--delete").lines == ["written on disk"]
    await stack.send(queue, b"sent over HTTP")
    assert mqctl("--root", stack.root, "receive", queue, "--delete").lines == ["sent over HTTP"]
