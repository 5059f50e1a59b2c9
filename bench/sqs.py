"""boto3 over mq's SQS protocol against the native batch endpoints: the bar of issue 13.

Bar: boto3's SendMessageBatch and ReceiveMessage + DeleteMessageBatch through mq reach at least
0.8x the messages/s of the same work through the native batch endpoints (``POST
/<queue>/messages/batch``; ``GET /<queue>/messages?max_messages=10`` + ``POST
/<queue>/messages/delete``), measured in one run. Both sides are Python clients with one
keep-alive connection per thread (boto3's own pool; ``http.client`` for the native API), batches
of 10 bodies of 1 KiB; the two are measured in alternating rounds on the same server and the
medians compared. Sends run for ``--duration`` seconds; receive+delete drains the queue, purged of
what the sends left and filled with ``--prefill`` messages sent natively (untimed; the same number
for both sides), and is timed until it is empty. Each step also records CPU ms per message of the
client (this process) and of ``mq``; receive+delete also the messages per receive call and the
client's wall ms per receive and per delete call (``receive_calls``).

Starts its own ``mq`` + ``mq-mover`` on a fresh root on the real disk (default
``./var/bench-sqs-root``) and prints one JSON object on stdout. Usage, from the repository root::

    .venv/bin/python bench/sqs.py                 # 3 rounds of 5 s per step and side
    .venv/bin/python bench/sqs.py --rounds 5 --duration 10 --threads 8
    .venv/bin/python bench/sqs.py --pin --client-processes 2   # the bar's figure (docs/performance.md)

``--pin`` stands in for clients on other hosts on a 2-core machine: ``mq`` and ``mq-mover`` run
on CPU 0 only and every client thread and process on CPU 1 only, the same for both sides, so a
client's CPU no longer takes cycles from mq. ``--client-processes N`` spreads the client threads
over N processes (one GIL each). Both are recorded in the JSON, with the share of a core each
side's clients and ``mq`` kept busy in each round (``*_cores_busy``): a side whose clients are
near 1.0 when pinned was limited by its clients, not by mq. ``--mq-cpu-quota CORES`` (root: a
cgroup v1 ``cpu`` quota) gives mq and mq-mover at most that many cores, so mq, not the clients'
core, is the limit of both sides (a boto3 consumer needs ~5x the client CPU per message of
``http.client``; docs/performance.md "SQS receive + delete: what limits the boto3 side")::

    .venv/bin/python bench/sqs.py --threads 8 --pin --client-processes 4 --mq-cpu-quota 0.5
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import boto3
import botocore.config

BODY = "x" * 1024
BATCH = 10


def log(message: str) -> None:
    print(f"[bench/sqs] {message}", file=sys.stderr, flush=True)


#: With ``--pin``: the CPU of mq and mq-mover, and the CPU of every client thread and process.
MQ_CPU, CLIENT_CPU = 0, 1


def _pin_to_mq_cpu() -> None:
    """preexec_fn of the daemons with ``--pin``: before exec, so every thread they start inherits it."""
    os.sched_setaffinity(0, {MQ_CPU})


#: Where ``--mq-cpu-quota`` puts mq and mq-mover: a cgroup (v1) of the ``cpu`` controller, one per bench run.
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


def limit_cpu(pids: list[int], cores: float) -> Path:
    """Put ``pids`` in a new cgroup whose CPU time is at most ``cores`` cores (CFS quota); its directory.

    Raises:
        SystemExit: No writable cgroup v1 ``cpu`` controller (needs root).
    """
    group = CPU_CGROUP / f"bench-sqs-{os.getpid()}"
    try:
        group.mkdir()
        period = 100_000
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(period * cores)))
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))  # every thread of the process moves with it
    except OSError as exc:
        raise SystemExit(f"--mq-cpu-quota needs a writable cgroup v1 cpu controller at {CPU_CGROUP}: {exc}") from None
    return group


def start_stack(root: Path, pin: bool = False) -> tuple[list[subprocess.Popen[bytes]], str]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    preexec = _pin_to_mq_cpu if pin else None
    mq = subprocess.Popen(
        [sys.executable, "-m", "daemons.front", "--root", str(root), "--port", "0"],
        stderr=subprocess.PIPE,
        preexec_fn=preexec,
    )
    mover = subprocess.Popen(
        [sys.executable, "-m", "daemons.mover", "--root", str(root)], stderr=subprocess.DEVNULL, preexec_fn=preexec
    )
    assert mq.stderr is not None
    while True:
        line = mq.stderr.readline().decode()
        if not line:
            raise SystemExit("mq exited before it was ready")
        match = re.search(r"mq listening on (http://[^\s/]+)", line)
        if match:
            threading.Thread(target=_drain, args=(mq.stderr,), daemon=True).start()
            return [mq, mover], match.group(1)


def _drain(stream: Any) -> None:
    """Read mq's log to the end so its pipe never fills."""
    for _ in stream:
        pass


class CallStats:
    """What one worker's receive+delete calls did: calls, messages, the wall time of receives and deletes."""

    def __init__(self) -> None:
        self.receives = self.messages = self.deletes = 0
        self.receive_s = self.delete_s = 0.0

    def note(self, messages: int, receive_s: float, delete_s: float) -> None:
        self.receives += 1
        self.messages += messages
        self.receive_s += receive_s
        if messages:
            self.deletes += 1
            self.delete_s += delete_s

    def take(self) -> list[float]:
        """``[receives, messages, deletes, receive_s, delete_s]`` since the last take (then reset)."""
        out = [self.receives, self.messages, self.deletes, self.receive_s, self.delete_s]
        self.receives = self.messages = self.deletes = 0
        self.receive_s = self.delete_s = 0.0
        return out


def call_figures(totals: list[float]) -> dict[str, float]:
    """Messages per receive call and the client's wall ms per receive and per delete call."""
    receives, messages, deletes, receive_s, delete_s = totals
    return {
        "messages_per_receive": messages / max(1, receives),
        "receive_ms": receive_s * 1000 / max(1, receives),
        "delete_ms": delete_s * 1000 / max(1, deletes),
    }


class Native:
    """The native batch endpoints over one keep-alive connection."""

    def __init__(self, url: str, queue: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.queue = queue
        entry = {"body_base64": base64.b64encode(BODY.encode()).decode()}
        self.batch = json.dumps({"messages": [entry] * BATCH}).encode()
        self.calls = CallStats()

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        answer = self.conn.getresponse()
        data = answer.read()
        assert answer.status < 300, (answer.status, data[:200])
        return json.loads(data)

    def send(self) -> int:
        return len(self._call("POST", f"/{self.queue}/messages/batch", self.batch)["successful"])

    def receive_delete(self) -> int:
        started = time.perf_counter()
        messages = self._call("GET", f"/{self.queue}/messages?max_messages={BATCH}")["messages"]
        received = time.perf_counter()
        if messages:
            entries = [{"id": str(i), "receipt_handle": m["receipt_handle"]} for i, m in enumerate(messages)]
            self._call("POST", f"/{self.queue}/messages/delete", json.dumps({"entries": entries}).encode())
        self.calls.note(len(messages), received - started, time.perf_counter() - received)
        return len(messages)


class Boto3:
    """The same work through boto3 and mq's SQS protocol."""

    def __init__(self, url: str, queue: str) -> None:
        self.client = boto3.client(
            "sqs",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            config=botocore.config.Config(retries={"max_attempts": 1}, max_pool_connections=1),
        )
        self.url = f"{url}/000000000000/{queue}"
        self.entries = [{"Id": str(i), "MessageBody": BODY} for i in range(BATCH)]
        self.calls = CallStats()

    def send(self) -> int:
        return len(self.client.send_message_batch(QueueUrl=self.url, Entries=self.entries)["Successful"])

    def receive_delete(self) -> int:
        started = time.perf_counter()
        messages = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=BATCH).get("Messages", [])
        received = time.perf_counter()
        if messages:
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
        self.calls.note(len(messages), received - started, time.perf_counter() - received)
        return len(messages)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_threads(workers: list[Any], step: str, seconds: float | None) -> tuple[int, list[float]]:
    """Run ``step`` ("send" or "receive_delete") in one thread per worker; the messages handled and call totals.

    With ``seconds`` the threads run that long; with None each runs until the step handles no
    message (the queue is drained).
    """
    counts = [0] * len(workers)
    stop = time.monotonic() + (seconds or 0)

    def run(i: int) -> None:
        op = getattr(workers[i], step)
        while seconds is None or time.monotonic() < stop:
            done = op()
            counts[i] += done
            if seconds is None and not done:
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), _sum_calls([w.calls.take() for w in workers])


def _sum_calls(totals: list[list[float]]) -> list[float]:
    return [sum(t[i] for t in totals) for i in range(5)]


def client_process(conn: multiprocessing.connection.Connection, url: str, threads: int) -> None:
    """A client process (``--client-processes``): its own workers of both sides, driven over ``conn``.

    Receives ``(side, step, seconds)`` and answers ``(messages, CPU seconds of this process, call
    totals)``; None ends it.
    """
    sides = {name: [cls(url, f"bench-{name}") for _ in range(threads)] for name, cls in SIDES}
    conn.send("ready")
    while (command := conn.recv()) is not None:
        side, step, seconds = command
        cpu = time.process_time()
        done, calls = run_threads(sides[side], step, seconds)
        conn.send((done, time.process_time() - cpu, calls))


class Clients:
    """The client side of the bench: threads in this process, or ``processes`` processes of threads each."""

    def __init__(self, url: str, threads: int, processes: int) -> None:
        self.children: list[tuple[multiprocessing.process.BaseProcess, multiprocessing.connection.Connection]] = []
        self.sides: dict[str, list[Any]] = {}
        if processes <= 1:
            self.sides = {name: [cls(url, f"bench-{name}") for _ in range(threads)] for name, cls in SIDES}
            return
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        for i in range(processes):
            here, there = context.Pipe()
            share = threads // processes + (1 if i < threads % processes else 0)
            child = context.Process(target=client_process, args=(there, url, share), daemon=True)
            child.start()
            self.children.append((child, here))
        for _, conn in self.children:
            assert conn.recv() == "ready"

    def run(self, side: str, step: str, seconds: float | None) -> tuple[int, float, list[float]]:
        """``(messages, client CPU seconds, call totals)`` of one step of one side on every client."""
        if not self.children:
            cpu = time.process_time()
            done, calls = run_threads(self.sides[side], step, seconds)
            return done, time.process_time() - cpu, calls
        for _, conn in self.children:
            conn.send((side, step, seconds))
        answers = [conn.recv() for _, conn in self.children]
        return sum(a[0] for a in answers), sum(a[1] for a in answers), _sum_calls([a[2] for a in answers])

    def close(self) -> None:
        for child, conn in self.children:
            conn.send(None)
            child.join(timeout=30)


def measure(clients: Clients, side: str, step: str, seconds: float | None, server_pid: int) -> dict[str, float]:
    """One step of one side: messages/s, CPU ms per message of the clients and of mq, cores each kept busy."""
    started = time.monotonic()
    server_cpu = _cpu_seconds(server_pid)
    done, client_cpu, calls = clients.run(side, step, seconds)
    wall = time.monotonic() - started
    server_cpu = _cpu_seconds(server_pid) - server_cpu
    total = max(1, done)
    return {
        "rate": total / wall,
        "client_ms": client_cpu * 1000 / total,
        "mq_ms": server_cpu * 1000 / total,
        "client_cores_busy": client_cpu / wall,
        "mq_cores_busy": server_cpu / wall,
        "messages": done,
        **call_figures(calls),
    }


SIDES: tuple[tuple[str, type], ...] = (("native", Native), ("boto3", Boto3))


def refill(url: str, queue: str, count: int) -> None:
    """Purge ``queue`` (what the send step left) and send ``count`` messages to it natively (untimed).

    Every receive+delete step, of either side, then drains the same number of messages.
    """
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", f"/{queue}/purge")
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
    conn.close()
    time.sleep(0.01)  # the next ids sort after the purge's threshold
    senders = [Native(url, queue) for _ in range(4)]
    batches = count // BATCH
    threads = [
        threading.Thread(target=lambda w=w, n=n: [w.send() for _ in range(n)])
        for n, w in zip([batches // 4 + (1 if i < batches % 4 else 0) for i in range(4)], senders, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="var/bench-sqs-root", help="fresh root on the real disk (removed first)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per step (default 3)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per step and side in a round (default 5)")
    p.add_argument("--threads", type=int, default=4, help="client threads per side (default 4)")
    p.add_argument(
        "--prefill",
        type=int,
        default=12000,
        help="messages in the queue at the start of each receive+delete step, drained (default 12000)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help=f"mq and mq-mover on CPU {MQ_CPU} only, every client on CPU {CLIENT_CPU} only (clients as on other hosts)",
    )
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the client threads of each side over this many processes (default 1: threads of this one)",
    )
    p.add_argument(
        "--mq-cpu-quota",
        type=float,
        default=None,
        metavar="CORES",
        help="mq and mq-mover get at most this many cores (cgroup CPU quota, root): mq, not the clients, the limit",
    )
    args = p.parse_args(argv)
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs two CPUs")
    procs, url = start_stack(Path(args.root), pin=args.pin)
    if args.pin:
        os.sched_setaffinity(0, {CLIENT_CPU})  # before the client threads and processes start: they inherit it
    clients: Clients | None = None
    group: Path | None = None
    try:
        if args.mq_cpu_quota:
            group = limit_cpu([proc.pid for proc in procs], args.mq_cpu_quota)
        for name, _ in SIDES:
            conn = http.client.HTTPConnection(*urllib.parse.urlsplit(url).netloc.split(":"))
            conn.request("PUT", f"/bench-{name}")
            conn.getresponse().read()
        clients = Clients(url, args.threads, args.client_processes)
        kinds = (
            "rate",
            "client_ms",
            "mq_ms",
            "client_cores_busy",
            "mq_cores_busy",
            "messages",
            "messages_per_receive",
            "receive_ms",
            "delete_ms",
        )
        steps = ("send", "receive_delete")
        figures: dict[str, dict[str, dict[str, list[float]]]] = {
            kind: {step: {"native": [], "boto3": []} for step in steps} for kind in kinds
        }
        for round_ in range(args.rounds):
            order = ("native", "boto3") if round_ % 2 == 0 else ("boto3", "native")
            for step in steps:
                for name in order:
                    if step == "receive_delete":
                        refill(url, f"bench-{name}", args.prefill)
                    got = measure(clients, name, step, args.duration if step == "send" else None, procs[0].pid)
                    for kind in kinds:
                        figures[kind][step][name].append(round(got[kind], 1 if kind == "rate" else 3))
                    calls = (
                        f", {got['messages_per_receive']:.2f} msg/receive, ms per receive "
                        f"{got['receive_ms']:.2f} per delete {got['delete_ms']:.2f}"
                        if step == "receive_delete"
                        else ""
                    )
                    log(
                        f"round {round_ + 1} {step} {name}: {got['rate']:.0f} msg/s, CPU ms/msg client "
                        f"{got['client_ms']:.3f} mq {got['mq_ms']:.3f}, cores busy client "
                        f"{got['client_cores_busy']:.2f} mq {got['mq_cores_busy']:.2f}{calls}"
                    )
        summary: dict[str, dict[str, Any]] = {}
        for step in steps:
            rates, mq_ms = figures["rate"][step], figures["mq_ms"][step]
            ratio = statistics.median(rates["boto3"]) / statistics.median(rates["native"])
            summary[step] = {
                "native_median": statistics.median(rates["native"]),
                "boto3_median": statistics.median(rates["boto3"]),
                "ratio": round(ratio, 3),
                "bar": 0.8,
                "passes": ratio >= 0.8,
                # mq's CPU per message, native / SQS: the rate ratio when mq alone is the limit.
                "mq_cpu_ratio": round(statistics.median(mq_ms["native"]) / statistics.median(mq_ms["boto3"]), 3),
            }
        result = {
            "threads": args.threads,
            "client_processes": args.client_processes,
            "pinned": args.pin,
            "mq_cpu_quota": args.mq_cpu_quota,
            "batch": BATCH,
            "body_bytes": len(BODY),
            "rounds": args.rounds,
            "duration_seconds": args.duration,
            "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
            "figures": figures["rate"],
            "client_cpu_ms_per_message": figures["client_ms"],
            "mq_cpu_ms_per_message": figures["mq_ms"],
            "client_cores_busy": figures["client_cores_busy"],
            "mq_cores_busy": figures["mq_cores_busy"],
            "messages": figures["messages"],
            "receive_calls": {
                "messages_per_receive": figures["messages_per_receive"]["receive_delete"],
                "receive_ms": figures["receive_ms"]["receive_delete"],
                "delete_ms": figures["delete_ms"]["receive_delete"],
            },
            "summary": summary,
        }
        print(json.dumps(result, indent=2))
    finally:
        if clients is not None:
            clients.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        if group is not None:
            group.rmdir()
        shutil.rmtree(args.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
