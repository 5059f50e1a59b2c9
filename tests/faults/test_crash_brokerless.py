"""kill -9 of brokerless clients (docs/protocol.md section 16.1): nothing acknowledged is lost.

Real processes, real SIGKILL, real files: each client is a small Python script run with
``sys.executable`` that uses :class:`mqcore.client.LocalClient` on a temp root, printing what it
was told (message ids of acknowledged sends, receives and acks) on stdout, flushed, only after the
call returned. The checks are a total-queue checker's (Jepsen; shared/notes/fault-testing.md):
every acknowledged send is received (lost = 0), nothing is received that was never sent, and
duplicates are counted and must each be explained by a consumer that died (or lost its lease)
before its ack.

- Producers killed mid-stream; the queue is then drained brokerless with no daemon running
  (no mq-mover, no mq-reaper); a file a killed sender left in ``new/`` blocks nothing and is
  removed by one start-up sweep of the real mq-reaper with ``--new-grace 0.001`` (0 is refused).
- Consumers killed mid-lease while a running stack's HTTP consumer takes the same queue.
- Two brokerless consumers and an HTTP consumer on one root, long visibility timeout, no kills:
  each message is received exactly once.

No marker: nothing here needs root or a special filesystem.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mqcore import model
from mqcore.client import BatchEntry, Client, LocalClient
from mqcore.errors import MQError
from mqcore.names import parse_in_flight_name, parse_new_name

logger = logging.getLogger(__name__)

#: The repository root (the scripts import mqcore from here).
REPO = Path(__file__).resolve().parents[2]
#: How long a script may take to import mqcore and print "ready", in seconds (never a speed test).
READY_TIMEOUT_SECONDS = 20.0
#: Most messages one consumer receive asks for (bounds the receives a kill can hide).
MAX_RECEIVE = 5

#: A producer: numbered messages ``<producer>-<n>``, singles and batches (some delayed 1 s).
#: ``try A B`` before the call, ``ack N ID`` per message after it returned, ``fail N ERROR``;
#: a pause of up to 40 ms between calls.
PRODUCER = """
import random, sys, time
from mqcore.client import BatchEntry, LocalClient

root, queue, producer, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = LocalClient(root)
print("ready", flush=True)
while True:
    if random.random() < 0.4:
        numbers = [n]
        print(f"try {n} {n}", flush=True)
        results = [client.send(queue, f"{producer}-{n}", delay_seconds=1 if n % 7 == 0 else None)]
    else:
        numbers = list(range(n, n + random.randint(2, 12)))
        print(f"try {numbers[0]} {numbers[-1]}", flush=True)
        entries = [BatchEntry(f"{producer}-{k}", delay_seconds=1 if k % 7 == 0 else None) for k in numbers]
        results = client.send_batch(queue, entries, batch_size=random.randint(1, 5))
    lines = []
    for k, result in zip(numbers, results, strict=True):
        if isinstance(result, str):
            lines.append(f"ack {k} {result}\\n")
        else:
            lines.append(f"fail {k} {type(result).__name__}:{result}\\n")
    print("".join(lines), end="", flush=True)
    n = numbers[-1] + 1
    time.sleep(random.uniform(0, 0.04))  # a producer with other work: keeps the drain short
"""

#: A consumer: ``got ID RC BODY`` per message once receive returned, then for each, after some
#: "work": ``acking ID RC``, the delete, ``ack ID RC`` (or ``lost-lease ID RC SECONDS ERROR`` with
#: the seconds since the receive started). Mode ``forever``, or ``until-empty`` (waits for a line
#: on stdin, stops at the first receive that got nothing).
CONSUMER = """
import random, sys, time
from mqcore.client import LocalClient
from mqcore.errors import MQError

root, queue, mode = sys.argv[1], sys.argv[2], sys.argv[4]
visibility, max_work_ms, most = int(sys.argv[3]), int(sys.argv[5]), int(sys.argv[6])
client = LocalClient(root)
print("ready", flush=True)
if mode == "until-empty":
    sys.stdin.readline()
while True:
    started = time.monotonic()
    messages = client.receive(
        queue, max_messages=random.randint(1, most), wait_time_seconds=1, visibility_timeout_seconds=visibility
    )
    if not messages:
        if mode == "until-empty":
            break
        continue
    print("".join(f"got {m.message_id} {m.receive_count} {m.body.decode()}\\n" for m in messages), end="", flush=True)
    for m in messages:
        time.sleep(random.uniform(0, max_work_ms / 1000))
        print(f"acking {m.message_id} {m.receive_count}", flush=True)
        try:
            client.ack(m)
        except MQError as exc:
            elapsed = time.monotonic() - started
            print(f"lost-lease {m.message_id} {m.receive_count} {elapsed:.3f} {exc.code}", flush=True)
        else:
            print(f"ack {m.message_id} {m.receive_count}", flush=True)
print("done", flush=True)
"""


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class Proc:
    """One run of a client script: stdout lines collected by a thread, stderr in a file.

    Only complete lines count: a line torn by SIGKILL is dropped.
    """

    def __init__(self, tag: str, script: Path, args: list[str], log_dir: Path, *, stdin: bool = False) -> None:
        self.tag = tag
        self.killed = False
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._stderr_path = log_dir / f"{tag}.stderr"
        with open(self._stderr_path, "wb") as stderr:
            self.popen = subprocess.Popen(
                [sys.executable, str(script), *args],
                cwd=REPO,
                env=_child_env(),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self._reader = threading.Thread(target=self._read, name=f"{tag}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:
            for raw in self.popen.stdout:
                if not raw.endswith(b"\n"):
                    break  # torn by the kill
                line = raw.decode().rstrip("\n")
                if line == "ready":
                    self._ready.set()
                else:
                    self.lines.append(line)

    @property
    def stderr(self) -> str:
        """What the script wrote on stderr so far."""
        return self._stderr_path.read_text(errors="replace")

    def wait_ready(self) -> Proc:
        """Wait for the script's ``ready`` line.

        Raises:
            AssertionError: It exited or stayed silent for READY_TIMEOUT_SECONDS.
        """
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self._ready.wait(0.02):
            assert self.popen.poll() is None, f"{self.tag} exited with {self.popen.returncode}\n{self.stderr}"
            assert time.monotonic() < deadline, f"{self.tag} not ready after {READY_TIMEOUT_SECONDS} s\n{self.stderr}"
        return self

    def go(self) -> None:
        """Write the line an ``until-empty`` consumer waits for."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(b"go\n")
        self.popen.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the script, which must still be running (it never stops by itself), and wait for it.

        Raises:
            AssertionError: It had already exited (a crash of the script: its stderr is shown).
        """
        code = self.popen.poll()
        assert code is None, f"{self.tag} exited by itself with {code} before its kill\n{self.stderr}"
        self.popen.send_signal(signal.SIGKILL)
        assert self.popen.wait(20) == -signal.SIGKILL
        self._reader.join(10)
        self.killed = True

    def wait_exit(self, timeout_seconds: float) -> int:
        """Wait for the script to exit by itself; return its exit status."""
        code = self.popen.wait(timeout_seconds)
        self._reader.join(10)
        return code

    def cleanup(self) -> None:
        """Kill the script if it still runs (teardown)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(20)
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        self._reader.join(10)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """A list to put every started script in; those still running at teardown are killed."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.cleanup()


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _names(directory: Path) -> list[str]:
    """Sorted entry names of ``directory`` without metadata files (``.attributes``...)."""
    try:
        return sorted(n for n in os.listdir(directory) if not n.startswith("."))
    except FileNotFoundError:
        return []


def _delay_names(root: Path, queue: str) -> list[str]:
    """The ``delay/`` names of ``queue`` (in flight or delayed)."""
    return [n for n in _names(root / "delay") if (item := parse_in_flight_name(n)) and item.queue == queue]


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "big")


# -- 1. producers killed mid-stream ---------------------------------------------------------------


@dataclass
class ProducerRun:
    """What one run of a producer said: numbers tried, numbers acknowledged (-> id), failures."""

    tried: set[int] = field(default_factory=set)
    acked: dict[int, str] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    in_call_at_kill: bool = False


def _parse_producer(proc: Proc) -> ProducerRun:
    run = ProducerRun()
    last_try: tuple[int, int] | None = None
    for line in proc.lines:
        kind, *rest = line.split(" ", 2)
        if kind == "try":
            last_try = (int(rest[0]), int(rest[1]))
            run.tried.update(range(last_try[0], last_try[1] + 1))
        elif kind == "ack":
            run.acked[int(rest[0])] = rest[1]
        elif kind == "fail":
            run.failed.append(line)
        else:
            raise AssertionError(f"{proc.tag}: unexpected line {line!r}")
    run.in_call_at_kill = last_try is not None and last_try[1] not in run.acked and not run.failed
    return run


def test_producers_killed_mid_stream_lose_no_acknowledged_message(tmp_path, procs, daemons):
    seed = _seed()
    rng = random.Random(seed)
    root = tmp_path / "root"
    queue = "crash-producers"
    with LocalClient(root) as admin:
        assert admin.create_queue(queue)
    script = _script(tmp_path, "producer.py", PRODUCER)
    producers = ["p0", "p1", "p2"]
    next_number = dict.fromkeys(producers, 0)
    runs: dict[str, list[Proc]] = {p: [] for p in producers}

    def start(producer: str) -> None:
        proc = Proc(
            f"{producer}-{len(runs[producer])}",
            script,
            [str(root), queue, producer, str(next_number[producer])],
            tmp_path,
        )
        procs.append(proc)
        runs[producer].append(proc)

    for p in producers:
        start(p)
    for p in producers:
        runs[p][-1].wait_ready()
    # Kill each producer at a random moment of its stream, restart it numbering on; 3 rounds. Every
    # other kill waits for a "try" line first, so it lands inside a send (between calls otherwise).
    rounds = 3
    kills = 0
    for round_number in range(rounds):
        for p in rng.sample(producers, len(producers)):
            time.sleep(rng.uniform(0.05, 0.3))
            proc = runs[p][-1]
            kills += 1
            if kills % 2:
                deadline = time.monotonic() + 2
                while not (proc.lines and proc.lines[-1].startswith("try")) and time.monotonic() < deadline:
                    time.sleep(0.0005)
            proc.kill()
            tried = _parse_producer(proc).tried
            next_number[p] = max(tried, default=next_number[p] - 1) + 1
            if round_number < rounds - 1:
                start(p)
                runs[p][-1].wait_ready()

    # What the producers were told.
    acked: dict[str, str] = {}  # message id -> body
    tried_bodies: set[str] = set()
    failures: list[str] = []
    mid_call = 0
    for p in producers:
        for proc in runs[p]:
            run = _parse_producer(proc)
            assert "Traceback" not in proc.stderr, f"{proc.tag} raised\n{proc.stderr}"
            failures += [f"{proc.tag}: {line}" for line in run.failed]
            tried_bodies.update(f"{p}-{n}" for n in run.tried)
            acked.update({message_id: f"{p}-{n}" for n, message_id in run.acked.items()})
            mid_call += run.in_call_at_kill
    context = f"seed={seed} acked={len(acked)} tried={len(tried_bodies)} kills mid-call={mid_call}"
    assert not failures, f"sends failed on a healthy disk ({context}): {failures[:5]}"
    assert len(acked) > 100, f"too little load to mean anything ({context})"
    assert mid_call > 0, f"no kill landed inside a send ({context})"

    # Nothing on disk is torn: every file of the queue (ready, delayed) decodes to a body that was sent.
    for path in [root / "queues" / queue / n for n in _names(root / "queues" / queue)] + [
        root / "delay" / n for n in _delay_names(root, queue)
    ]:
        try:
            _, body = model.decode(path.read_bytes())
        except model.CorruptMessage as exc:
            raise AssertionError(f"corrupt message file {path} ({context}): {exc}") from None
        assert body.decode() in tried_bodies, f"{path} holds a body never sent: {body!r} ({context})"

    # Files in new/ left by senders killed before their publish: allowed (mq-reaper's sweep_new), never delivered.
    leftovers = _names(root / "new")
    leftover_ids = set()
    for name in leftovers:
        parsed = parse_new_name(name)
        assert parsed is not None and parsed[0] == queue, f"foreign entry in new/: {name}"
        leftover_ids.add(parsed[1])
    context += f" left in new/={len(leftovers)} (allowed: mq-reaper's sweep_new removes them)"
    assert not leftover_ids & set(acked), f"acknowledged sends still in new/ ({context}): {leftover_ids & set(acked)}"

    # Drain brokerless with no daemon running: delayed messages come due by the receive itself.
    received: dict[str, str] = {}
    duplicates: list[str] = []
    with LocalClient(root) as client:
        while messages := client.receive(queue, max_messages=10, wait_time_seconds=2, visibility_timeout_seconds=60):
            for m in messages:
                if m.message_id in received:
                    duplicates.append(m.message_id)
                received[m.message_id] = m.body.decode()
                client.ack(m)
        context += f" received={len(received)}"
        lost = set(acked) - set(received)
        assert not lost, f"{len(lost)} acknowledged messages lost ({context}): {sorted(lost)[:5]}"
        assert not duplicates, (
            f"a message was received twice within its visibility timeout ({context}): {duplicates[:5]}"
        )
        changed = {i for i in acked if received[i] != acked[i]}
        assert not changed, f"bodies changed ({context}): {sorted(changed)[:5]}"
        strangers = {i: b for i, b in received.items() if b not in tried_bodies}
        assert not strangers, f"received messages that were never sent ({context}): {list(strangers.items())[:5]}"
        by_body = collections.Counter(received.values())
        twice = [b for b, n in by_body.items() if n > 1]
        assert not twice, f"one send became several messages ({context}): {twice[:5]}"
        assert not leftover_ids & set(received), f"a file from new/ was delivered ({context})"
        assert _names(root / "queues" / queue) == [], f"ready messages left after the drain ({context})"
        assert _delay_names(root, queue) == [], f"delay/ files left after the drain ({context})"
        assert _names(root / "remove") == [], f"remove/ not empty: corrupt files moved aside? ({context})"
        # The leftovers in new/ block nothing: the queue still takes and gives messages.
        after = client.send(queue, "after the crashes")
        [again] = client.receive(queue, wait_time_seconds=0)
        assert (again.message_id, again.body) == (after, b"after the crashes")
        client.ack(again)

    # One start-up sweep of the real mq-reaper (it prints its readiness line after sweeping new/) with a
    # grace period of 1 ms (0 is refused as a setting) removes what the dead senders left.
    reaper = daemons.start("mq-reaper", "--root", root, "--new-grace", "0.001")
    assert _names(root / "new") == [], (
        f"mq-reaper --new-grace 0.001 left files in new/ (there were {len(leftovers)} after the kills: {leftovers[:5]})"
        f"\n{reaper.log_tail()}"
    )
    assert reaper.stop() == 0, reaper.log_tail()
    logger.info("producers killed mid-stream: %s", context)


# -- 2 and 3: consumers ---------------------------------------------------------------------------


@dataclass
class Delivery:
    """One observed receive of a message: who got it and how it ended."""

    consumer: str
    message_id: str
    receive_count: int
    body: str
    killed: bool
    acking: bool = False
    acked: bool = False
    lost_lease_seconds: float | None = None


def _deliveries(tag: str, lines: list[str], killed: bool) -> list[Delivery]:
    """Parse a consumer's lines (``got``/``acking``/``ack``/``lost-lease``) into its deliveries."""
    out: dict[tuple[str, int], Delivery] = {}
    for line in lines:
        kind, *rest = line.split(" ")
        if kind == "done":
            continue
        key = (rest[0], int(rest[1]))
        if kind == "got":
            assert key not in out, f"{tag}: one receive ({key}) delivered twice to the same consumer"
            out[key] = Delivery(tag, key[0], key[1], rest[2], killed)
        elif kind == "acking":
            out[key].acking = True
        elif kind == "ack":
            out[key].acked = True
        elif kind == "lost-lease":
            out[key].lost_lease_seconds = float(rest[2])
        else:
            raise AssertionError(f"{tag}: unexpected line {line!r}")
    return list(out.values())


class HttpConsumer(threading.Thread):
    """The HTTP consumer: the same loop as CONSUMER over :class:`Client` against a running mq."""

    def __init__(self, url: str, queue: str, visibility_seconds: int, max_work_ms: int, *, until_empty: bool) -> None:
        super().__init__(name="http-consumer", daemon=True)
        self.url, self.queue, self.visibility_seconds = url, queue, visibility_seconds
        self.max_work_ms, self.until_empty = max_work_ms, until_empty
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        rng = random.Random()
        try:
            with Client(self.url) as client:
                while not self.stop.is_set():
                    started = time.monotonic()
                    messages = client.receive(
                        self.queue,
                        max_messages=rng.randint(1, MAX_RECEIVE),
                        wait_time_seconds=1,
                        visibility_timeout_seconds=self.visibility_seconds,
                    )
                    if not messages and self.until_empty:
                        return
                    self.lines += [f"got {m.message_id} {m.receive_count} {m.body.decode()}" for m in messages]
                    for m in messages:
                        time.sleep(rng.uniform(0, self.max_work_ms / 1000))
                        self.lines.append(f"acking {m.message_id} {m.receive_count}")
                        try:
                            client.ack(m)
                        except MQError as exc:
                            elapsed = time.monotonic() - started
                            self.lines.append(f"lost-lease {m.message_id} {m.receive_count} {elapsed:.3f} {exc.code}")
                        else:
                            self.lines.append(f"ack {m.message_id} {m.receive_count}")
        except Exception as exc:  # noqa: BLE001 - the test thread asserts on it
            self.error = exc


def test_consumers_killed_mid_lease_lose_nothing_beside_a_running_stack(tmp_path, procs, daemons):
    seed = _seed()
    rng = random.Random(seed)
    visibility = 2
    stack = daemons.stack(tmp_path / "root", visibility_timeout=visibility)
    root = stack.root
    queue = "crash-consumers"
    total = 500
    with Client(stack.url) as client:
        assert client.create_queue(queue)
        results = client.send_batch(queue, [f"m-{i}" for i in range(total)])
    assert all(isinstance(r, str) for r in results), results
    sent = dict(zip(results, (f"m-{i}" for i in range(total)), strict=True))

    script = _script(tmp_path, "consumer.py", CONSUMER)
    runs: list[Proc] = []

    def start(slot: int) -> Proc:
        proc = Proc(
            f"c{slot}-{len(runs)}",
            script,
            [str(root), queue, str(visibility), "forever", "40", str(MAX_RECEIVE)],
            tmp_path,
        )
        procs.append(proc)
        runs.append(proc)
        return proc

    current = [start(0), start(1)]
    for proc in current:
        proc.wait_ready()
    http = HttpConsumer(stack.url, queue, visibility, 40, until_empty=False)
    http.start()
    kills = 6
    for _ in range(kills):
        time.sleep(rng.uniform(0.2, 0.5))
        slot = rng.randrange(len(current))
        current[slot].kill()
        current[slot] = start(slot).wait_ready()

    def collect() -> list[Delivery]:
        out = _deliveries("http", list(http.lines), killed=False)
        for proc in runs:
            out += _deliveries(proc.tag, list(proc.lines), proc.killed)
        return out

    def settled() -> tuple[bool, str]:
        deliveries = collect()
        confirmed = {d.message_id for d in deliveries if d.acked}
        dying = {d.message_id for d in deliveries if d.killed and d.acking and not d.acked}
        with LocalClient(root) as local:
            stats = local.queue_stats(queue)
        counts = (stats["ready"], stats["in_flight"], stats["delayed"])
        missing = set(sent) - confirmed - dying
        done = not missing and counts == (0, 0, 0)
        return done, f"not acked={len(missing)} ready/in flight/delayed={counts}"

    deadline = time.monotonic() + 30
    while not (state := settled())[0]:
        assert http.error is None, f"HTTP consumer failed: {http.error!r}\n{stack.logs()}"
        assert time.monotonic() < deadline, f"seed={seed}: the queue did not drain: {state[1]}\n{stack.logs()}"
        time.sleep(0.1)
    http.stop.set()
    http.join(30)
    assert not http.is_alive() and http.error is None, f"HTTP consumer failed: {http.error!r}"
    for proc in current:
        proc.kill()
    for proc in runs:
        assert "Traceback" not in proc.stderr, f"{proc.tag} raised\n{proc.stderr}"

    deliveries = collect()
    by_id: dict[str, list[Delivery]] = collections.defaultdict(list)
    for d in deliveries:
        by_id[d.message_id].append(d)
    strangers = set(by_id) - set(sent)
    assert not strangers, f"received messages never sent: {sorted(strangers)[:5]}"
    wrong = [d for d in deliveries if d.body != sent[d.message_id]]
    assert not wrong, f"bodies changed: {wrong[:3]}"
    per_receive = collections.Counter((d.message_id, d.receive_count) for d in deliveries)
    twice = [key for key, n in per_receive.items() if n > 1]
    assert not twice, f"one receive (id, receive count) went to two consumers: {twice[:5]}"
    # A delete succeeds once per message: after it the message has no file left to delete.
    acks = collections.Counter(d.message_id for d in deliveries if d.acked)
    assert max(acks.values()) == 1, f"a message was deleted twice: {[i for i, n in acks.items() if n > 1][:5]}"
    # A lease cannot be lost within its visibility timeout (0.5 s of slack for clock granularity).
    early = [d for d in deliveries if d.lost_lease_seconds is not None and d.lost_lease_seconds < visibility - 0.5]
    assert not early, f"acks refused within the visibility timeout: {early[:3]}"
    # Lost = sent, never confirmed acked, and not being acked by a consumer that died in its ack.
    dying = {d.message_id for d in deliveries if d.killed and d.acking and not d.acked}
    lost = set(sent) - set(acks) - dying
    killed_runs = sum(proc.killed for proc in runs) - len(current)  # the final kills found idle consumers
    died_holding = [d for d in deliveries if d.killed and not d.acked]
    context = (
        f"seed={seed} sent={total} deliveries={len(deliveries)} kills mid-stream={killed_runs} "
        f"deliveries held by a killed consumer={len(died_holding)} died while acking={len(dying)}"
    )
    assert not lost, f"{len(lost)} messages lost ({context}): {sorted(lost)[:5]}"
    assert died_holding, f"no kill landed while a consumer held a message ({context})"

    # Duplicates: every receive of a message but its last must be explained.
    duplicates = 0
    slow = 0
    unseen = 0
    unexplained = []
    for ds in by_id.values():
        top = max(d.receive_count for d in ds)
        if top == 1:
            continue
        duplicates += 1
        seen = {d.receive_count: d for d in ds}
        for count in range(1, top):
            d = seen.get(count)
            if d is None:
                unseen += 1  # a consumer killed between its receive and its "got" line
            elif d.killed and not d.acked:
                continue  # the consumer died before its ack
            elif d.lost_lease_seconds is not None:
                slow += 1  # its lease ended before its ack (a stall longer than the visibility timeout)
            else:
                unexplained.append(d)
    context += f" duplicates={duplicates} (lease lost by a slow consumer={slow}, receives not seen={unseen})"
    assert not unexplained, (
        f"redelivered although acked or still held by a live consumer ({context}): {unexplained[:3]}"
    )
    assert unseen <= killed_runs * MAX_RECEIVE, f"more unseen receives than killed consumers could hide ({context})"

    # The queue is empty everywhere: no ready file, no delay/ file of the queue, nothing left in new/.
    assert _names(root / "queues" / queue) == [], context
    assert _delay_names(root, queue) == [], context
    assert _names(root / "new") == [], context
    with LocalClient(root) as local:
        stats = local.queue_stats(queue)
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0), (stats, context)
    logger.info("consumers killed mid-lease: %s", context)


def test_brokerless_and_http_consumers_receive_each_message_exactly_once(tmp_path, procs, daemons):
    stack = daemons.stack(tmp_path / "root", visibility_timeout=120)
    root = stack.root
    queue = "mixed-consumers"
    total = 600
    with LocalClient(root) as local:
        assert local.create_queue(queue)
        results = local.send_batch(queue, [BatchEntry(f"m-{i}") for i in range(total)], batch_size=100)
    assert all(isinstance(r, str) for r in results), results
    sent = dict(zip(results, (f"m-{i}" for i in range(total)), strict=True))

    script = _script(tmp_path, "consumer.py", CONSUMER)
    consumers = [
        Proc(f"b{i}", script, [str(root), queue, "600", "until-empty", "2", str(MAX_RECEIVE)], tmp_path, stdin=True)
        for i in range(2)
    ]
    procs.extend(consumers)
    for proc in consumers:
        proc.wait_ready()
    http = HttpConsumer(stack.url, queue, 600, 2, until_empty=True)
    http.start()
    for proc in consumers:
        proc.go()
    for proc in consumers:
        code = proc.wait_exit(30)
        assert code == 0, f"{proc.tag} exited with {code}\n{proc.stderr}"
    http.join(30)
    assert not http.is_alive() and http.error is None, f"HTTP consumer failed: {http.error!r}\n{stack.logs()}"

    deliveries = _deliveries("http", http.lines, killed=False)
    for proc in consumers:
        deliveries += _deliveries(proc.tag, proc.lines, killed=False)
    per_consumer = collections.Counter(d.consumer for d in deliveries)
    context = f"received per consumer: {dict(per_consumer)}"
    counts = collections.Counter(d.message_id for d in deliveries)
    twice = [
        (i, [(d.consumer, d.receive_count) for d in deliveries if d.message_id == i])
        for i, n in counts.items()
        if n > 1
    ]
    assert not twice, f"messages received twice while leased ({context}): {twice[:5]}"
    assert set(counts) == set(sent), f"missing={len(set(sent) - set(counts))} strangers={set(counts) - set(sent)}"
    assert all(d.receive_count == 1 and d.body == sent[d.message_id] for d in deliveries), context
    assert all(d.acked for d in deliveries), f"acks refused: {[d for d in deliveries if not d.acked][:3]}"
    assert set(per_consumer) == {"http", "b0", "b1"}, f"a consumer got nothing, so nothing was mixed ({context})"
    assert _names(root / "queues" / queue) == [] and _delay_names(root, queue) == [], context
    logger.info("mixed consumers: %s", context)
