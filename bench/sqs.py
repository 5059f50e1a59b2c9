"""boto3 over mq's SQS protocol against the native batch endpoints: the bar of issue 13.

Bar: boto3's SendMessageBatch and ReceiveMessage + DeleteMessageBatch through mq reach at least
0.8x the messages/s of the same work through the native batch endpoints (``POST
/<queue>/messages/batch``; ``GET /<queue>/messages?max_messages=10`` + ``POST
/<queue>/messages/delete``), measured in one run. Both sides are Python clients with one
keep-alive connection per thread (boto3's own pool; ``http.client`` for the native API), batches
of 10 bodies of 1 KiB; the two are measured in alternating rounds on the same server and the
medians compared. Sends run for ``--duration`` seconds; receive+delete drains the queue (what the
sends left plus ``--prefill`` messages sent natively, untimed) and is timed until it is empty.
Each step also records CPU ms per message of the client (this process) and of ``mq``.

Starts its own ``mq`` + ``mq-mover`` on a fresh root on the real disk (default
``./var/bench-sqs-root``) and prints one JSON object on stdout. Usage, from the repository root::

    .venv/bin/python bench/sqs.py                 # 3 rounds of 5 s per step and side
    .venv/bin/python bench/sqs.py --rounds 5 --duration 10 --threads 8
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import botocore.config

BODY = "x" * 1024
BATCH = 10


def log(message: str) -> None:
    print(f"[bench/sqs] {message}", file=sys.stderr, flush=True)


def start_stack(root: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    mq = subprocess.Popen(
        [sys.executable, "-m", "daemons.front", "--root", str(root), "--port", "0"], stderr=subprocess.PIPE
    )
    mover = subprocess.Popen([sys.executable, "-m", "daemons.mover", "--root", str(root)], stderr=subprocess.DEVNULL)
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


class Native:
    """The native batch endpoints over one keep-alive connection."""

    def __init__(self, url: str, queue: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.queue = queue
        entry = {"body_base64": base64.b64encode(BODY.encode()).decode()}
        self.batch = json.dumps({"messages": [entry] * BATCH}).encode()

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        answer = self.conn.getresponse()
        data = answer.read()
        assert answer.status < 300, (answer.status, data[:200])
        return json.loads(data)

    def send(self) -> int:
        return len(self._call("POST", f"/{self.queue}/messages/batch", self.batch)["successful"])

    def receive_delete(self) -> int:
        messages = self._call("GET", f"/{self.queue}/messages?max_messages={BATCH}")["messages"]
        if messages:
            entries = [{"id": str(i), "receipt_handle": m["receipt_handle"]} for i, m in enumerate(messages)]
            self._call("POST", f"/{self.queue}/messages/delete", json.dumps({"entries": entries}).encode())
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

    def send(self) -> int:
        return len(self.client.send_message_batch(QueueUrl=self.url, Entries=self.entries)["Successful"])

    def receive_delete(self) -> int:
        messages = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=BATCH).get("Messages", [])
        if messages:
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
        return len(messages)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    workers: list[Any], op: Callable[[Any], int], seconds: float | None, server_pid: int
) -> tuple[float, float, float]:
    """``(messages/s, client CPU ms per message, mq CPU ms per message)`` of ``op`` in one thread per worker.

    With ``seconds`` the threads run that long; with None each runs until ``op`` handles no
    message (the queue is drained).
    """
    counts = [0] * len(workers)
    stop = time.monotonic() + (seconds or 0)

    def run(i: int) -> None:
        while seconds is None or time.monotonic() < stop:
            done = op(workers[i])
            counts[i] += done
            if seconds is None and not done:
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    started = time.monotonic()
    cpu = time.process_time()
    server_cpu = _cpu_seconds(server_pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = max(1, sum(counts))
    client_ms = (time.process_time() - cpu) * 1000 / total
    server_ms = (_cpu_seconds(server_pid) - server_cpu) * 1000 / total
    return total / (time.monotonic() - started), client_ms, server_ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="var/bench-sqs-root", help="fresh root on the real disk (removed first)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per step (default 3)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per step and side in a round (default 5)")
    p.add_argument("--threads", type=int, default=4, help="client threads per side (default 4)")
    p.add_argument(
        "--prefill",
        type=int,
        default=4000,
        help="messages added before each receive+delete step, drained (default 4000)",
    )
    args = p.parse_args(argv)
    procs, url = start_stack(Path(args.root))
    try:
        sides: dict[str, Any] = {}
        for name, cls in (("native", Native), ("boto3", Boto3)):
            queue = f"bench-{name}"
            conn = http.client.HTTPConnection(*urllib.parse.urlsplit(url).netloc.split(":"))
            conn.request("PUT", f"/{queue}")
            conn.getresponse().read()
            sides[name] = [cls(url, queue) for _ in range(args.threads)]
        figures: dict[str, dict[str, list[float]]] = {
            "send": {"native": [], "boto3": []},
            "receive_delete": {"native": [], "boto3": []},
        }
        client_cpu: dict[str, dict[str, list[float]]] = {k: {"native": [], "boto3": []} for k in figures}
        server_cpu: dict[str, dict[str, list[float]]] = {k: {"native": [], "boto3": []} for k in figures}
        for round_ in range(args.rounds):
            order = ("native", "boto3") if round_ % 2 == 0 else ("boto3", "native")
            for name in order:
                rate, cpu_ms, mq_ms = measure(sides[name], lambda w: w.send(), args.duration, procs[0].pid)
                figures["send"][name].append(round(rate, 1))
                client_cpu["send"][name].append(round(cpu_ms, 3))
                server_cpu["send"][name].append(round(mq_ms, 3))
                log(f"round {round_ + 1} send {name}: {rate:.0f} msg/s, CPU ms/msg client {cpu_ms:.2f} mq {mq_ms:.2f}")
            for name in order:
                prefill = Native(url, f"bench-{name}")
                for _ in range(args.prefill // BATCH):
                    prefill.send()
                rate, cpu_ms, mq_ms = measure(sides[name], lambda w: w.receive_delete(), None, procs[0].pid)
                figures["receive_delete"][name].append(round(rate, 1))
                client_cpu["receive_delete"][name].append(round(cpu_ms, 3))
                server_cpu["receive_delete"][name].append(round(mq_ms, 3))
                log(
                    f"round {round_ + 1} receive+delete {name}: {rate:.0f} msg/s, CPU ms/msg {cpu_ms:.2f} / {mq_ms:.2f}"
                )
        summary = {
            step: {
                "native_median": statistics.median(sides_["native"]),
                "boto3_median": statistics.median(sides_["boto3"]),
                "ratio": round(statistics.median(sides_["boto3"]) / statistics.median(sides_["native"]), 3),
                "bar": 0.8,
            }
            for step, sides_ in figures.items()
        }
        for step in summary.values():
            step["passes"] = step["ratio"] >= step["bar"]
        result = {
            "threads": args.threads,
            "batch": BATCH,
            "body_bytes": len(BODY),
            "rounds": args.rounds,
            "duration_seconds": args.duration,
            "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
            "figures": figures,
            "client_cpu_ms_per_message": client_cpu,
            "mq_cpu_ms_per_message": server_cpu,
            "summary": summary,
        }
        print(json.dumps(result, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        shutil.rmtree(args.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
