"""A/B of mq's idle CPU with long pollers waiting (issue 12, stop 24): main's tree against this one.

Per round, each variant in turn (order rotated per round) starts the three daemons on its own
fresh root under ``--root`` from its code tree (``--base`` through ``PYTHONPATH``, or this tree),
creates ``--queues`` queues, and measures mq's CPU (from /proc, % of a core) in three windows:

- ``floor``: no receiver at all, ``--floor-seconds``;
- ``wait20``: ``--receivers`` long polls (one aiohttp connection each, ``wait_time_seconds=20``,
  polling again at once after each empty answer), ``--seconds`` (bench/scale.py's ``longpoll``
  step: about receivers / 20 expiries and new polls a second);
- ``wait2``: the same receivers with ``wait_time_seconds=2``: ten times the expiries, so that
  (wait2 - wait20) / (extra cycles) is the CPU of one empty answer plus the next poll's set-up.

Then ``--sends`` messages, one at a time, each to a random queue with its receivers at wait 20:
send start -> the receiver's answer (delivery p50/p99). No message is sent before the windows.

    .venv/bin/python bench/longpoll_idle.py --base /work/mq-base24 --root /dev/shm/idle-ab --rounds 3 \\
        --output /tmp/idle-ab.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from bench.prefill import fill  # noqa: E402
from bench.run import Api, CpuMeter, Daemons, log  # noqa: E402
from bench.scale import gc_delta, gc_work  # noqa: E402


class Pollers:
    """``count`` long-polling receivers on ``queues`` (round robin) against mq at ``base``; ``wait`` is settable."""

    def __init__(self, base: str, queues: list[str], count: int) -> None:
        self.base, self.queues, self.count = base, queues, count
        self.wait = 20
        self.waiting = 0
        self.empty = 0
        self.arrivals: dict[str, float] = {}
        self.arrived = asyncio.Condition()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self, session: aiohttp.ClientSession, queue: str) -> None:
        while not self._stop.is_set():
            self.waiting += 1
            try:
                async with session.get(f"{self.base}/{queue}/messages?wait_time_seconds={self.wait}") as resp:
                    data = await resp.read()
                    now = time.perf_counter()
                    status, mid = resp.status, resp.headers.get("X-Message-Id", "")
            except (TimeoutError, aiohttp.ClientError):
                await asyncio.sleep(0.5)
                continue
            finally:
                self.waiting -= 1
            if status == 200:
                async with self.arrived:
                    self.arrivals[data.decode()] = now
                    self.arrived.notify_all()
                async with session.delete(f"{self.base}/{queue}/messages/{mid}") as resp:
                    await resp.read()
            elif status == 204:
                self.empty += 1
            else:
                await asyncio.sleep(0.5)

    def start(self, session: aiohttp.ClientSession) -> None:
        """Start every receiver."""
        n = len(self.queues)
        self._tasks = [asyncio.create_task(self._one(session, self.queues[i % n])) for i in range(self.count)]

    async def stop(self) -> None:
        """Cancel every receiver."""
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _settle(pollers: Pollers, seconds: float) -> None:
    """Wait until every receiver waits (at most 30 s), then ``seconds`` more."""
    for _ in range(300):
        if pollers.waiting >= pollers.count:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(seconds)


async def _window(pids: dict[str, int], seconds: float, url: str = "") -> dict[str, Any]:
    before = await asyncio.to_thread(gc_work, url) if url else None
    meter = CpuMeter(pids)
    await asyncio.sleep(seconds)
    out: dict[str, Any] = meter.stop()
    if url:
        out["gc"] = gc_delta(before, await asyncio.to_thread(gc_work, url))
    return out


async def _measure(url: str, pids: dict[str, int], queues: list[str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"floor": await _window(pids, args.floor_seconds, url)}
    pollers = Pollers(url, queues, args.receivers)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        pollers.start(session)
        await _settle(pollers, 2.0)
        empty0 = pollers.empty
        out["wait20"] = await _window(pids, args.seconds, url)
        out["wait20"]["empty_answers"] = pollers.empty - empty0
        pollers.wait = 2
        await asyncio.sleep(20.5)  # every poll of wait 20 has ended once and polls again at wait 2
        empty0 = pollers.empty
        out["wait2"] = await _window(pids, args.seconds, url)
        out["wait2"]["empty_answers"] = pollers.empty - empty0
        pollers.wait = 20
        await asyncio.sleep(2.5)
        rng = random.Random(12)
        latencies: list[float] = []
        async with aiohttp.ClientSession(timeout=timeout) as sender:
            for i in range(args.sends):
                key = f"lp-{i}"
                t0 = time.perf_counter()
                async with sender.post(f"{url}/{rng.choice(queues)}/messages", data=key.encode()) as resp:
                    await resp.read()
                with contextlib.suppress(TimeoutError):
                    async with pollers.arrived:
                        await asyncio.wait_for(pollers.arrived.wait_for(lambda k=key: k in pollers.arrivals), 5.0)
                    latencies.append(pollers.arrivals[key] - t0)
                await asyncio.sleep(0.05)
        await pollers.stop()
    lat = sorted(latencies)
    out["delivery_ms"] = {
        "count": len(lat),
        "p50": round(1000 * lat[len(lat) // 2], 3) if lat else None,
        "p99": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3) if lat else None,
    }
    return out


def _churn(root: Path, api: Api, count: int, per: int) -> dict[str, float]:
    """What the full run's ``queues`` step leaves: ``count`` queues of ``per`` messages filled directly,
    one receive (delete, send again) on each so mq indexes them all, then every one deleted.

    Returns seconds of each part: ``{"fill_s", "warm_s", "delete_s"}``.
    """
    names = [f"churn-{i:05d}" for i in range(count)]
    t0 = time.monotonic()
    fill(root, [(q, per) for q in names])
    t1 = time.monotonic()
    body = os.urandom(1024)
    for q in names:
        status, headers, _ = api.request("GET", f"/{q}/messages")
        if status == 200:
            api.request("DELETE", f"/{q}/messages/{urllib.parse.quote(headers.get('x-message-id', ''))}")
            api.send(q, body)
    t2 = time.monotonic()
    for q in names:
        api.delete_queue(q)
    t3 = time.monotonic()
    return {"fill_s": round(t1 - t0, 1), "warm_s": round(t2 - t1, 1), "delete_s": round(t3 - t2, 1)}


def _round(variant: str, tree: Path | None, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    daemons = Daemons(root / "mq", root / "logs", None, [], tree=tree)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        url = daemons.start()
        api = Api(url)
        churn = _churn(root / "mq", api, args.churn_queues, args.churn_messages) if args.churn_queues else None
        if churn:
            log(f"{variant}: churned {args.churn_queues} queues: {churn}; settling {args.churn_settle:g} s")
            time.sleep(args.churn_settle)
        queues = [f"idle-{i:03d}" for i in range(args.queues)]
        for q in queues:
            api.create_queue(q)
        api.close()
        res = asyncio.run(_measure(url, daemons.pids(), queues, args))
    finally:
        daemons.stop()
        shutil.rmtree(root, ignore_errors=True)
    res["variant"], res["uptime"], res["churn"] = variant, uptime, churn
    per_cycle = None
    extra = res["wait2"]["empty_answers"] - res["wait20"]["empty_answers"]
    if extra > 0:
        cpu_s = (res["wait2"]["mq_cpu_pct"] - res["wait20"]["mq_cpu_pct"]) / 100 * args.seconds
        per_cycle = round(cpu_s / extra * 1e6, 1)
    res["mq_us_per_empty_cycle"] = per_cycle
    log(
        f"{variant}: floor {res['floor']['mq_cpu_pct']} %, wait20 {res['wait20']['mq_cpu_pct']} % "
        f"({res['wait20']['empty_answers']} empty), wait2 {res['wait2']['mq_cpu_pct']} % "
        f"({res['wait2']['empty_answers']} empty), {per_cycle} us/cycle, delivery p99 {res['delivery_ms']['p99']} ms, "
        f"canary {res['wait20'].get('cpu_canary_ms')} ms; gc wait20 {res['wait20'].get('gc')}, "
        f"wait2 {res['wait2'].get('gc')}; {uptime}"
    )
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print one line per measurement, write the JSON; returns 0."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="code tree of main (PYTHONPATH of the 'main' variant)")
    p.add_argument("--root", required=True, help="a directory for the variants' roots (deleted after each)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--receivers", type=int, default=1000)
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--seconds", type=float, default=25.0, help="each window with receivers")
    p.add_argument("--floor-seconds", type=float, default=15.0, help="the window with no receiver")
    p.add_argument("--sends", type=int, default=100)
    churn = p.add_argument_group("churn", "before the windows, what the full run's queues step leaves (_churn)")
    for flag, kind, default, what in (
        ("--churn-queues", int, 0, "queues made, filled, received on and deleted (the full run: 10000)"),
        ("--churn-messages", int, 10, "messages per churned queue"),
        ("--churn-settle", float, 5.0, "seconds after the churn before the windows"),
    ):
        churn.add_argument(flag, type=kind, default=default, help=what)
    p.add_argument("--variants", default="main,new", help="main and/or new (or a --tree), in this order in round 1")
    p.add_argument("--tree", action="append", default=[], help="NAME=PATH: one more variant, the code tree at PATH")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    variants: dict[str, Path | None] = {"main": Path(args.base), "new": None}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        variants[name] = Path(path)
    names = args.variants.split(",")
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            rows.append(_round(name, variants[name], Path(args.root) / name, args))
            Path(args.output).write_text(json.dumps(rows, indent=1))
    for name in names:
        mine = [row for row in rows if row["variant"] == name]

        def med(get: Any, rows: list[dict[str, Any]] = mine) -> float | None:
            vals = [v for v in (get(row) for row in rows) if v is not None]
            return round(statistics.median(vals), 2) if vals else None

        log(
            f"median {name}: floor {med(lambda x: x['floor']['mq_cpu_pct'])} %, "
            f"wait20 {med(lambda x: x['wait20']['mq_cpu_pct'])} %, wait2 {med(lambda x: x['wait2']['mq_cpu_pct'])} %, "
            f"{med(lambda x: x['mq_us_per_empty_cycle'])} us/cycle, p99 {med(lambda x: x['delivery_ms']['p99'])} ms"
        )
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
