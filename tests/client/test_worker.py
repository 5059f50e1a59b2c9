"""The Worker (SMQ's worker base) against real queues: a real stack over HTTP and, brokerless, a temp root.

Every test that is cheap to run twice runs with ``Client`` on a stack shared by the module
(mq + mq-mover + mq-reaper as subprocesses) and with ``LocalClient`` on its own temp root (no
daemons: its receives redeliver and dead-letter due messages themselves). The SIGTERM test runs
the worker as a real subprocess. Retry backoffs are 1 s, so the module stays well under a minute.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqcore.client import Client, LocalClient, Message
from mqcore.client.worker import Worker, retry_backoff_seconds
from mqcore.errors import QueueNotFound
from mqcore.names import partition_of

#: How long a test waits for something that should happen within a second or two, in seconds.
SETTLE_TIMEOUT_SECONDS = 30.0


@pytest.fixture(params=["http", "local"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Client | LocalClient]:
    """A sync client: ``Client`` on the module's shared stack, or ``LocalClient`` on a temp root."""
    if request.param == "http":
        stack = request.getfixturevalue("shared_stack")
        made: Client | LocalClient = Client(stack.url)
    else:
        root = tmp_path / "brokerless"
        root.mkdir()
        made = LocalClient(root)
    with made:
        yield made


@pytest.fixture
def http_client(shared_stack) -> Iterator[Client]:
    """``Client`` on the module's shared stack (for the tests that run over HTTP only)."""
    with Client(shared_stack.url) as made:
        yield made


def worker(queue: str, handler: Callable[[Message], object], client, **options) -> Worker:
    """A Worker with short polls and backoffs (and no signal handlers: tests run it in threads too)."""
    options.setdefault("wait_time_seconds", 1)
    options.setdefault("retry_backoff_seconds", 1)
    options.setdefault("install_signal_handlers", False)
    return Worker(queue, handler, client=client, **options)


def counts(client, queue: str) -> tuple[int, int, int]:
    """(ready, in flight, delayed) messages of a queue."""
    stats = client.queue_stats(queue)
    return stats["ready"], stats["in_flight"], stats["delayed"]


class Recorder:
    """A handler that records each message it is called with (thread-safe), then runs ``then``."""

    def __init__(self, then: Callable[[Message], object] | None = None) -> None:
        self.calls: list[Message] = []
        self.lock = threading.Lock()
        self.then = then

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls.append(message)
        if self.then is not None:
            self.then(message)

    @property
    def ids(self) -> list[str]:
        with self.lock:
            return [m.message_id for m in self.calls]


def test_backoff_doubles_per_receive_up_to_the_maximum():
    assert [retry_backoff_seconds(n, 1, 300) for n in (1, 2, 3, 4, 10, 1000)] == [1, 2, 4, 8, 300, 300]
    assert retry_backoff_seconds(1, 0.3, 10) == 1  # rounded up to whole seconds
    assert retry_backoff_seconds(1, 0, 10) == 0


def test_success_acks_every_message_and_empties_the_queue(client, queue, caplog):
    client.create_queue(queue)
    sent = [client.send(queue, f"job {i}") for i in range(5)]
    handler = Recorder()

    with caplog.at_level(logging.INFO, logger="mqcore.client.worker"):
        stats = worker(queue, handler, client).run(until_empty=True)

    assert sorted(handler.ids) == sorted(sent)
    assert sorted(m.text() for m in handler.calls) == [f"job {i}" for i in range(5)]
    assert (stats.received, stats.acked, stats.failed, stats.dead_lettered) == (5, 5, 0, 0)
    assert counts(client, queue) == (0, 0, 0)
    assert "no dead-letter queue" in caplog.text


def test_until_empty_on_an_empty_queue_returns_with_nothing_done(client, queue):
    client.create_queue(queue)
    stats = worker(queue, Recorder(), client).run(until_empty=True)
    assert stats.received == stats.acked == 0


def test_a_handler_failing_twice_is_retried_until_it_succeeds(client, queue, caplog):
    client.create_queue(queue)
    message_id = client.send(queue, b"flaky")

    def flaky(message: Message) -> None:
        if message.receive_count < 3:
            raise RuntimeError(f"boom on receive {message.receive_count}")

    handler = Recorder(flaky)
    with caplog.at_level(logging.WARNING, logger="mqcore.client.worker"):
        stats = worker(queue, handler, client).run(until_empty=True)

    assert [(m.message_id, m.receive_count) for m in handler.calls] == [
        (message_id, 1),
        (message_id, 2),
        (message_id, 3),
    ]
    assert all(m.body == b"flaky" for m in handler.calls)
    assert (stats.received, stats.failed, stats.retried, stats.acked) == (3, 2, 2, 1)
    assert counts(client, queue) == (0, 0, 0)
    # Each failure is logged with its exception.
    assert "boom on receive 1" in caplog.text
    assert "boom on receive 2" in caplog.text


def test_a_message_that_always_fails_lands_in_the_dead_letter_queue(client, queue):
    queue = queue[:70]
    dead_letter_queue = f"{queue}-dlq"
    client.create_queue(dead_letter_queue)
    client.create_queue(queue, {"dead_letter_queue": dead_letter_queue, "max_receive_count": 2})
    message_id = client.send(queue, b"\x00poison\xff", content_type="application/x-poison", attributes={"k": "v"})

    def always_fails(message: Message) -> None:
        raise ValueError("cannot handle this")

    handler = Recorder(always_fails)
    w = worker(queue, handler, client)
    stats = w.run(until_empty=True)

    assert [m.receive_count for m in handler.calls] == [1, 2]
    assert (stats.failed, stats.retried, stats.dead_lettered, stats.acked) == (2, 1, 1, 0)
    assert counts(client, queue) == (0, 0, 0)
    failed = w.failed()
    assert [m.message_id for m in failed] == [message_id]
    (dead,) = failed
    assert dead.queue == dead_letter_queue
    assert dead.body == b"\x00poison\xff"
    assert dead.content_type == "application/x-poison"
    assert dict(dead.attributes) == {"k": "v"}
    assert dead.source_queue == queue
    assert dead.receive_count == 2

    assert w.clear_failed() == 1
    assert w.failed() == []
    assert counts(client, dead_letter_queue) == (0, 0, 0)


def test_failed_is_empty_without_a_dead_letter_queue(client, queue):
    client.create_queue(queue)
    w = worker(queue, Recorder(), client)
    assert w.failed() == []
    assert w.clear_failed() == 0


def test_a_slow_handler_keeps_its_message_by_extending_the_lease(client, queue):
    client.create_queue(queue, {"visibility_timeout_seconds": 2})
    message_id = client.send(queue, b"slow")
    started = threading.Event()

    def slow_handler(message: Message) -> None:
        started.set()
        time.sleep(5)  # well past the 2 s visibility timeout

    slow, other = Recorder(slow_handler), Recorder()
    slow_worker, other_worker = worker(queue, slow, client), worker(queue, other, client)
    result: list[object] = []
    slow_thread = threading.Thread(target=lambda: result.append(slow_worker.run(until_empty=True)))
    slow_thread.start()
    assert started.wait(SETTLE_TIMEOUT_SECONDS)
    # Another worker polls the queue all the while the slow handler runs.
    other_thread = threading.Thread(target=other_worker.run)
    other_thread.start()
    slow_thread.join(SETTLE_TIMEOUT_SECONDS)
    other_worker.stop()
    other_thread.join(SETTLE_TIMEOUT_SECONDS)
    assert not slow_thread.is_alive() and not other_thread.is_alive()

    assert [(m.message_id, m.receive_count) for m in slow.calls] == [(message_id, 1)]
    assert other.calls == []  # never redelivered: the lease was extended
    (stats,) = result
    assert stats.acked == 1
    assert stats.extended >= 1
    assert counts(client, queue) == (0, 0, 0)


def test_concurrency_processes_every_message_exactly_once(client, queue):
    client.create_queue(queue)
    sent = client.send_batch(queue, [f"m{i}" for i in range(40)])
    assert all(isinstance(message_id, str) for message_id in sent)
    barrier = threading.Barrier(4, timeout=SETTLE_TIMEOUT_SECONDS)
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            first_four = len(handler.calls) <= 4
        try:
            if first_four:  # the first four handlers meet: all four threads work at once
                barrier.wait()
        finally:
            with lock:
                running[0] -= 1

    handler = Recorder(handle)
    stats = worker(queue, handler, client, concurrency=4).run(until_empty=True)

    assert sorted(handler.ids) == sorted(sent)
    assert len(handler.ids) == len(set(handler.ids)) == 40
    assert running[1] == 4
    assert (stats.received, stats.acked, stats.failed) == (40, 40, 0)
    assert counts(client, queue) == (0, 0, 0)


def test_partitioned_workers_split_the_queue_by_message_id(client, queue):
    client.create_queue(queue)
    sent = client.send_batch(queue, [f"m{i}" for i in range(30)])
    handlers = [Recorder() for _ in range(3)]
    workers = [worker(queue, handlers[i], client, partition=i, partitions=3) for i in range(3)]
    results: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, workers[i].run(until_empty=True))) for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SETTLE_TIMEOUT_SECONDS)
    assert sorted(results) == [0, 1, 2]

    seen = [id_ for h in handlers for id_ in h.ids]
    assert sorted(seen) == sorted(sent)  # every message, exactly once
    for partition, handler in enumerate(handlers):
        assert {partition_of(id_, 3) for id_ in handler.ids} <= {partition}
    assert counts(client, queue) == (0, 0, 0)


def test_run_on_a_missing_queue_raises_queue_not_found(client, queue):
    with pytest.raises(QueueNotFound):
        worker(queue, Recorder(), client).run(until_empty=True)


def test_worker_arguments_are_checked():
    with pytest.raises(ValueError, match="partition"):
        Worker("q", print, client="http://127.0.0.1:1", partition=1)
    with pytest.raises(ValueError, match="partition"):
        Worker("q", print, client="http://127.0.0.1:1", partition=3, partitions=3)
    with pytest.raises(ValueError, match="concurrency"):
        Worker("q", print, client="http://127.0.0.1:1", concurrency=0)
    with pytest.raises(ValueError, match="wait_time_seconds"):
        Worker("q", print, client="http://127.0.0.1:1", wait_time_seconds=21)


def test_stop_lets_the_running_handler_finish_and_ack(http_client, queue):
    client = http_client
    client.create_queue(queue)
    first = client.send(queue, b"first")
    client.send(queue, b"second")
    started, go = threading.Event(), threading.Event()

    def blocking(message: Message) -> None:
        started.set()
        assert go.wait(SETTLE_TIMEOUT_SECONDS)

    handler = Recorder(blocking)
    w = worker(queue, handler, client)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(w.run()))
    thread.start()
    assert started.wait(SETTLE_TIMEOUT_SECONDS)
    w.stop()
    go.set()
    thread.join(SETTLE_TIMEOUT_SECONDS)
    assert not thread.is_alive()

    (stats,) = result
    assert handler.ids == [first]
    assert stats.acked == 1
    assert counts(client, queue) == (1, 0, 0)  # the second message was never received


def test_stop_before_run_makes_run_return_at_once(http_client, queue):
    http_client.create_queue(queue)
    http_client.send(queue, b"untouched")
    w = worker(queue, Recorder(), http_client)
    w.stop()
    assert w.run().received == 0
    assert counts(http_client, queue) == (1, 0, 0)


WORKER_SCRIPT = """
import dataclasses, json, logging, sys, time
from pathlib import Path
from mqcore.client.worker import Worker

url, queue, marks = sys.argv[1], sys.argv[2], Path(sys.argv[3])
logging.basicConfig(level=logging.INFO)
logging.getLogger("httpx").setLevel(logging.WARNING)

def handle(message):
    (marks / "started").write_text(message.message_id)
    time.sleep(3)
    (marks / "finished").write_text(message.message_id)

stats = Worker(queue, handle, client=url, wait_time_seconds=1).run()
print(json.dumps(dataclasses.asdict(stats)))
"""


def test_sigterm_lets_the_running_handler_finish_then_exits_0(http_client, shared_stack, queue, tmp_path):
    http_client.create_queue(queue)
    message_id = http_client.send(queue, b"in progress at SIGTERM")
    script = tmp_path / "worker_script.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), shared_stack.url, queue, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
        while not (tmp_path / "started").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the handler never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=SETTLE_TIMEOUT_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "finished").read_text() == message_id
    stats = json.loads(out)
    assert (stats["received"], stats["acked"]) == (1, 1)
    assert "stopping on SIGTERM" in err.decode()
    assert counts(http_client, queue) == (0, 0, 0)
