"""The scale steps of issue 12 ("Scale: how cost grows as the work grows").

Each is a method of :class:`Scale`, run by ``bench/run.py`` (``--steps``):

- ``startup``: a queue of ``--startup-messages`` (default 1,000,000) ready
  messages, written with :mod:`bench.prefill` while the daemons are stopped;
  then mq is started and the time from its spawn to its readiness line and to
  its first served receive is measured, with mq's resident memory before and
  after that receive (the ready index) and where the time went (its threads'
  time on a CPU and in the run queue); then mq-mover's and mq-reaper's start
  (readiness line, and the end of their start-up work: CPU quiet for 1 s);
  then the three started at once, as systemd does. ``--startup-keep DIR``
  keeps the filled queue between runs (alternating A/B runs fill it once).
- ``queues``: ``GET /`` and a receive on a random queue with 10 queues of 10
  messages, then with ``--scale-queues`` (default 10,000), and mq's memory per
  queue.
- ``longpoll``: ``--longpoll-receivers`` (default 1,000) concurrent long polls
  on ``--longpoll-queues`` (default 100) queues from one asyncio/aiohttp client
  (wrk cannot long-poll): mq's CPU while they all wait, then the delay from
  the start of a send to its arrival at a waiting receiver.
- ``large``: sends of 64 KiB and 1 MiB bodies against the disk loop's MB/s at
  the same size and concurrency.

The drain of a 1,000,000-message queue is the ``drain`` step of run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from bench.disk_loop import disk_loop
from bench.prefill import fill
from bench.windows import alternate, paired, summary_row

if TYPE_CHECKING:
    from bench.run import Api, Bench

#: Queue of the start-up step; the drain step drains it when the sizes match.
BIG_QUEUE = "bench-big"


def _pcts_ms(seconds: list[float]) -> dict[str, float | int | None]:
    """count, p50, p90, p99, max (ms) of a list of durations in seconds."""
    if not seconds:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    xs = sorted(seconds)

    def at(p: float) -> float:
        return round(xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] * 1000, 3)

    return {"count": len(xs), "p50": at(50), "p90": at(90), "p99": at(99), "max": round(xs[-1] * 1000, 3)}


def gc_work(url: str) -> dict[str, float] | None:
    """mq's garbage collector so far, from ``GET /metrics``: ``{"gen0": collections, ..., "gen2_s": seconds, ...}``.

    None when mq's ``/metrics`` has no ``mq_gc_pause_seconds_total`` (code before issue 12's stop 26).
    """
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for family, suffix in (("python_gc_collections_total", ""), ("mq_gc_pause_seconds_total", "_s")):
            if line.startswith(family + '{generation="'):
                generation = line[len(family) + 13]
                out[f"gen{generation}{suffix}"] = float(line.rsplit(" ", 1)[1])
    return out if "gen2_s" in out else None


def gc_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """What the collector did between two :func:`gc_work` readings (collections per generation, ms in each)."""
    if before is None or after is None:
        return None
    out: dict[str, float] = {}
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        out[key.replace("_s", "_ms")] = round(delta * 1000, 1) if key.endswith("_s") else delta
    return out


class Scale:
    """The scale steps over one running bench (its API client, wrk, daemons and knobs).

    Args:
        bench: The run's :class:`bench.run.Bench` (``api``, ``wrk``, ``daemons``, ``cfg``).
        mq_root: The mq root directory (for the direct prefill).
        disk_dir: Working directory of the disk loops (same filesystem).
        opts: The parsed command line of run.py (the ``--startup-*``, ``--scale-*``,
            ``--longpoll-*`` and ``--large-*`` flags).
    """

    def __init__(self, bench: Bench, mq_root: Path, disk_dir: Path, opts: Any) -> None:
        self.bench, self.mq_root, self.disk_dir, self.opts = bench, mq_root, disk_dir, opts

    # -- helpers ------------------------------------------------------------------

    def _log(self, msg: str) -> None:
        from bench.run import log

        log(msg)

    def _mq_rss(self) -> int | None:
        from bench.run import rss_bytes

        d = self.bench.daemons
        return rss_bytes(d.procs["mq"].pid) if d is not None and "mq" in d.procs else None

    def _timed(
        self, method: str, path: str, body: bytes | None = None, api: Api | None = None
    ) -> tuple[float, int, dict[str, str], bytes]:
        t0 = time.perf_counter()
        status, headers, data = (api or self.bench.api).request(method, path, body)
        return time.perf_counter() - t0, status, headers, data

    def _receive_delete(self, queue: str, api: Api | None = None) -> tuple[float, int]:
        """One short-poll receive on ``queue`` (timed) and the delete of what it got (not timed)."""
        took, status, headers, data = self._timed("GET", f"/{queue}/messages", api=api)
        if status == 200:
            mid = headers.get("x-message-id", "")
            (api or self.bench.api).request("DELETE", f"/{queue}/messages/{urllib.parse.quote(mid)}")
        elif status != 204:
            raise RuntimeError(f"GET /{queue}/messages answered {status}: {data[:200]!r}")
        return took, status

    # -- start-up with a million ready messages --------------------------------------

    def _start_mq(self, port: int) -> None:
        """Start mq alone on ``port`` and point the bench's API client and wrk at it."""
        daemons = self.bench.daemons
        if daemons is None:
            raise RuntimeError("mq can only be restarted when the bench started it")
        url = daemons.start_mq(port)
        self.bench.api.close()
        self.bench.api.port = int(urllib.parse.urlsplit(url).port or port)
        self.bench.wrk.url = url.rstrip("/")

    def _cpu_s(self, name: str) -> float:
        from bench.run import _proc_cpu_s

        d = self.bench.daemons
        return _proc_cpu_s(d.procs[name].pid) if d is not None and name in d.procs else 0.0

    def _settled(
        self, names: tuple[str, ...], *, quiet_s: float = 1.0, quiet_cpu_s: float = 0.02, limit_s: float = 120.0
    ) -> dict[str, float]:
        """Seconds from each daemon's spawn until its CPU stays under ``quiet_cpu_s`` for ``quiet_s`` (start-up done).

        All are polled together every 0.1 s; one that never settles gets ``limit_s`` from its spawn.
        """
        d = self.bench.daemons
        assert d is not None
        marks = {name: [(time.monotonic(), self._cpu_s(name))] for name in names}
        out: dict[str, float] = {}
        while len(out) < len(names):
            time.sleep(0.1)
            for name in names:
                if name in out:
                    continue
                now, cpu = time.monotonic(), self._cpu_s(name)
                seen = marks[name]
                seen.append((now, cpu))
                while len(seen) > 1 and now - seen[1][0] >= quiet_s:
                    seen.pop(0)
                if now - seen[0][0] >= quiet_s and cpu - seen[0][1] < quiet_cpu_s:
                    out[name] = round(seen[0][0] - d.spawned_at[name], 2)
                elif now - d.spawned_at[name] >= limit_s:
                    out[name] = limit_s
        return out

    def _first_receive(self) -> dict[str, Any]:
        """Time mq's first receive on the big queue from mq's spawn; where its time went (schedstat)."""
        d = self.bench.daemons
        assert d is not None
        pid = d.procs["mq"].pid
        # A slow first receive must not time out and be retried: it is the figure.
        self.bench.api.timeout_s = 600
        try:
            took, status, headers, _ = self._timed("GET", f"/{BIG_QUEUE}/messages")
        finally:
            self.bench.api.timeout_s = 60
        first_receive_s = time.monotonic() - d.spawned_at["mq"]
        run_s, wait_s = _schedstat_s(pid)
        if status == 200:
            mid = urllib.parse.quote(headers.get("x-message-id", ""))
            self.bench.api.request("DELETE", f"/{BIG_QUEUE}/messages/{mid}")
        return {
            "mq_ready_s": d.start_s["mq"],
            "mq_first_receive_s": round(first_receive_s, 3),
            "first_receive_request_ms": round(took * 1000, 1),
            "first_receive_status": status,
            "mq_cpu_s": round(self._cpu_s("mq"), 2),
            "mq_threads_on_cpu_s": run_s,
            "mq_threads_runqueue_wait_s": wait_s,
            "loadavg": _loadavg(),
        }

    def _kept_queue_in(self, qdir: Path) -> bool:
        """Move the queue kept by ``--startup-keep`` into the (stopped) root in place of ``qdir``; whether one was."""
        keep = self.opts.startup_keep
        if not keep or not os.path.isdir(keep):
            return False
        shutil.rmtree(qdir)
        os.rename(keep, qdir)
        return True

    def startup(self) -> dict[str, Any]:
        """Restart the daemons on a root holding ``--startup-messages`` ready messages; time the first receive.

        Needs the bench's own server (it stops and starts the daemons). mq is
        first restarted with the queue empty and received from once (204):
        its RSS then is the baseline, so the memory per message is what the
        ready messages add, wherever mq builds its index (at start or at the
        first receive). Then, on the full queue: mq alone (spawn -> first
        receive, with its threads' time on a CPU and waiting for one from
        ``/proc/PID/task/*/schedstat``); mq-mover and mq-reaper started beside
        it (spawn -> readiness line, and -> the end of their start-up work:
        their CPU quiet for 1 s); and the three started at once, as systemd
        does, with mq's first receive timed again.
        """
        daemons = self.bench.daemons
        if daemons is None:
            return {"skipped": "needs the bench's own server (not --url)"}
        n = self.opts.startup_messages
        port = int(urllib.parse.urlsplit(daemons.url).port or 0)
        self.bench.api.create_queue(BIG_QUEUE)
        self._log("startup: restarting mq with the queue empty (memory baseline)")
        daemons.stop()
        self._start_mq(port)
        base_ready_s = daemons.start_s["mq"]
        _, base_status = self._receive_delete(BIG_QUEUE)
        rss_base = self._mq_rss()
        daemons.stop()
        qdir = self.mq_root / "queues" / BIG_QUEUE
        kept = self._kept_queue_in(qdir)
        have = sum(1 for name in os.listdir(qdir) if not name.startswith("."))
        missing = max(0, n - have)
        self._log(f"startup: {have:,} ready messages kept; writing {missing:,} into {BIG_QUEUE} (direct, no HTTP)")
        filled = fill(self.mq_root, [(BIG_QUEUE, missing)])
        self._log(f"  {filled['messages']:,} in {filled['write_s']} s + sync {filled['sync_s']} s")
        cold = False
        if self.opts.cold_start:
            try:
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
                cold = True
            except OSError as exc:
                self._log(f"  cannot drop the page cache ({exc}): warm start")
        self._log("startup: starting mq alone")
        self._start_mq(port)
        rss_ready = self._mq_rss()
        alone = self._first_receive()
        rss_after = self._mq_rss()
        self._log(f"  mq ready after {alone['mq_ready_s']} s; first receive after {alone['mq_first_receive_s']} s")
        self._log("startup: starting mq-mover and mq-reaper beside it")
        daemons.start_helpers()
        settled = self._settled(("mq-mover", "mq-reaper"))
        helpers = {
            "mover_ready_s": daemons.start_s.get("mq-mover"),
            "reaper_ready_s": daemons.start_s.get("mq-reaper"),
            "mover_settled_s": settled["mq-mover"],
            "reaper_settled_s": settled["mq-reaper"],
            "mover_cpu_s": round(self._cpu_s("mq-mover"), 2),
            "reaper_cpu_s": round(self._cpu_s("mq-reaper"), 2),
            "loadavg": _loadavg(),
        }
        depth = self.bench.api.depth(BIG_QUEUE)
        self._log(f"  {helpers}")
        self._log("startup: the three started at once")
        daemons.stop()
        daemons.spawn_helpers()
        self._start_mq(port)
        together = self._first_receive()
        daemons.wait_helpers()
        settled = self._settled(("mq-mover", "mq-reaper"))
        together.update(
            mover_ready_s=daemons.start_s.get("mq-mover"),
            reaper_ready_s=daemons.start_s.get("mq-reaper"),
            mover_settled_s=settled["mq-mover"],
            reaper_settled_s=settled["mq-reaper"],
        )
        self._log(f"  first receive after {together['mq_first_receive_s']} s; {together}")
        per_msg = (rss_after - rss_base) / depth if rss_after and rss_base and depth else None
        res = {
            "ready_messages": depth,
            "kept_from_an_earlier_run": kept,
            "prefill": filled,
            "page_cache": "dropped before the start (--cold-start)" if cold else "warm (files just written)",
            "mq_ready_s": alone["mq_ready_s"],
            "mq_first_receive_s": alone["mq_first_receive_s"],
            "first_receive_request_ms": alone["first_receive_request_ms"],
            "first_receive_status": alone["first_receive_status"],
            "mq_alone": alone,
            "mover_ready_s": helpers["mover_ready_s"],
            "reaper_ready_s": helpers["reaper_ready_s"],
            "helpers": helpers,
            "all_three_at_once": together,
            "baseline_mq_ready_s": base_ready_s,
            "baseline_receive_status": base_status,
            "mq_rss_bytes_baseline": rss_base,
            "mq_rss_bytes_at_ready": rss_ready,
            "mq_rss_bytes_after_first_receive": rss_after,
            "mq_rss_bytes_per_ready_message": round(per_msg, 1) if per_msg is not None else None,
            "note": "times from each daemon's spawn; memory per message = (RSS after the first receive - RSS of mq "
            "restarted on the same root with the queue empty, after one receive) / ready messages; settled = "
            "the daemon's CPU under 20 ms for 1 s (its start-up scans and first sweep done); schedstat: mq's "
            "live threads' time on a CPU and waiting in the run queue from the spawn to the first answer",
        }
        keep = self.opts.startup_keep
        if keep and "drain" not in str(self.opts.steps).split(","):
            os.rename(qdir, keep)  # mq sees the queue go; the next run moves it back in
            self._log(f"startup: the queue kept in {keep} for the next run")
        return res

    # -- many queues ----------------------------------------------------------------

    def _queue_rounds(self, sides: list[tuple[Api, list[str]]], samples: int) -> list[dict[str, Any]]:
        """``samples`` timed ``GET /`` and receives on random queues of each side, the sides interleaved.

        Each sample times, side after side, a ``GET /`` and then a receive on a
        random queue of that side (its message deleted and sent again, not
        timed), so a change of the machine's load falls on every side alike.
        """
        rng = random.Random(12)
        body = os.urandom(1024)
        lists: list[list[float]] = [[] for _ in sides]
        receives: list[list[float]] = [[] for _ in sides]
        for _ in range(samples):
            for i, (api, _queues) in enumerate(sides):
                took, status, _, data = self._timed("GET", "/", api=api)
                if status != 200:
                    raise RuntimeError(f"GET / answered {status}: {data[:200]!r}")
                lists[i].append(took)
            for i, (api, queues) in enumerate(sides):
                queue = rng.choice(queues)
                took, status = self._receive_delete(queue, api)
                receives[i].append(took)
                if status == 200:
                    api.send(queue, body)
        return [
            {"queues": len(queues), "list_ms": _pcts_ms(lists[i]), "receive_ms": _pcts_ms(receives[i])}
            for i, (_, queues) in enumerate(sides)
        ]

    def queues(self) -> dict[str, Any]:
        """``GET /`` and a receive with 10 queues against ``--scale-queues``, on two mq at once; memory per queue.

        A second mq (with its own mq-mover and mq-reaper, on a root beside the
        bench's) holds the 10 queues while the bench's mq holds all of them, and
        the samples alternate between the two: measured one after the other,
        the two rounds fell in different load on a shared machine (issue 12).
        """
        from bench.run import Api, Daemons, rss_bytes

        d = self.bench.daemons
        assert d is not None
        many, per, samples = self.opts.scale_queues, self.opts.scale_queue_messages, self.opts.scale_samples
        names = [f"bench-scale-{i:05d}" for i in range(many)]
        few = names[:10]
        few_root = self.mq_root.parent / "mq-few"
        few_daemons = Daemons(few_root, d.log_dir / "few", d.workers, d.extra)
        few_api = Api(few_daemons.start())
        try:
            self._log(f"queues: 10 queues of {per} messages on a second mq")
            first = fill(few_root, [(q, per) for q in few])
            self._warm(few, few_api)
            rss_few = rss_bytes(few_daemons.procs["mq"].pid)
            self._log(f"queues: {many:,} queues of {per} messages on the bench's mq (direct prefill)")
            rest = fill(self.mq_root, [(q, per) for q in names])
            rss_created = self._mq_rss()
            self._log(f"  written in {rest['write_s']} s; one receive on every queue so mq knows them all")
            t0 = time.monotonic()
            self._warm(names)
            warm_s = time.monotonic() - t0
            rss_all = self._mq_rss()
            small, big = self._queue_rounds([(few_api, few), (self.bench.api, names)], samples)
        finally:
            few_api.close()
            few_daemons.stop()
            shutil.rmtree(few_root, ignore_errors=True)
        for side in (small, big):
            self._log(
                f"  {side['queues']:,} queues: GET / p50 {side['list_ms']['p50']} ms, "
                f"receive p50 {side['receive_ms']['p50']} ms"
            )
        per_queue = (rss_all - rss_few) / (many - 10) if rss_all and rss_few and many > 10 else None
        res: dict[str, Any] = {
            "messages_per_queue": per,
            "samples": samples,
            "few": small,
            "many": big,
            "list_many_over_few_p50": _ratio(big["list_ms"]["p50"], small["list_ms"]["p50"]),
            "receive_many_over_few_p50": _ratio(big["receive_ms"]["p50"], small["receive_ms"]["p50"]),
            "first_receive_on_every_queue_s": round(warm_s, 1),
            "mq_rss_bytes_few": rss_few,
            "mq_rss_bytes_many_created": rss_created,
            "mq_rss_bytes_many_after_receives": rss_all,
            "mq_rss_bytes_per_queue": round(per_queue, 1) if per_queue is not None else None,
            "prefill": {"few": first, "many": rest},
            "loadavg_at_end": _loadavg(),
            "note": "two mq at once (10 queues; all of them), the samples alternating between them; each receive "
            "is a short poll on a random queue, its message deleted and sent again (not timed) so every queue "
            "keeps its depth; memory per queue = (RSS of the mq with all queues after a receive on each - RSS of "
            "the mq with 10 queues after the same) / the added queues",
        }
        self._log("  deleting the scale queues")
        for q in names:
            self.bench.api.delete_queue(q)
        return res

    def extra_queues(self, many: int) -> dict[str, Any]:
        """Fill ``many`` queues of ``--scale-queue-messages`` directly, then receive once on each (mq indexes all).

        For the metrics step with ``--metrics-queues``: a scrape's cost grows with the queues mq holds.
        """
        per = self.opts.scale_queue_messages
        names = [f"bench-metrics-{i:05d}" for i in range(many)]
        self._log(f"metrics: {many:,} more queues of {per} messages (direct prefill), one receive on each")
        filled = fill(self.mq_root, [(q, per) for q in names])
        t0 = time.monotonic()
        self._warm(names)
        return {"queues": many, "messages_per_queue": per, "prefill": filled, "warm_s": round(time.monotonic() - t0, 1)}

    def _warm(self, queues: list[str], api: Api | None = None) -> None:
        """One receive (and delete, and resend) on every queue, so mq has indexed each."""
        body = os.urandom(1024)
        for q in queues:
            _, status = self._receive_delete(q, api)
            if status == 200:
                (api or self.bench.api).send(q, body)

    # -- long polls -------------------------------------------------------------------

    def longpoll(self) -> dict[str, Any]:
        """Idle CPU with ``--longpoll-receivers`` waiting receivers, then send->arrival latency at p99."""
        return asyncio.run(self._longpoll())

    async def _longpoll(self) -> dict[str, Any]:
        receivers, nq, sends = self.opts.longpoll_receivers, self.opts.longpoll_queues, self.opts.longpoll_messages
        queues = [f"bench-lp-{i:03d}" for i in range(nq)]
        for q in queues:
            self.bench.api.create_queue(q)
        base = f"http://{self.bench.api.host}:{self.bench.api.port}"
        arrivals: dict[str, float] = {}
        arrived = asyncio.Condition()
        counts = {"polls": 0, "empty": 0, "received": 0, "busy": 0, "errors": 0, "waiting": 0}
        stop = asyncio.Event()
        all_waiting = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=60)

        async def receiver(session: aiohttp.ClientSession, queue: str) -> None:
            url = f"{base}/{queue}/messages?wait_time_seconds=20"
            while not stop.is_set():
                counts["polls"] += 1
                counts["waiting"] += 1
                if counts["waiting"] >= receivers:
                    all_waiting.set()
                try:
                    async with session.get(url) as resp:
                        data = await resp.read()
                        now = time.perf_counter()
                        status, mid = resp.status, resp.headers.get("X-Message-Id", "")
                except (TimeoutError, aiohttp.ClientError):
                    counts["errors"] += 1
                    await asyncio.sleep(0.5)
                    continue
                finally:
                    counts["waiting"] -= 1
                if status == 200:
                    counts["received"] += 1
                    async with arrived:
                        arrivals[data.decode()] = now
                        arrived.notify_all()
                    async with session.delete(f"{base}/{queue}/messages/{mid}") as resp:
                        await resp.read()
                elif status == 204:
                    counts["empty"] += 1
                elif status == 503:
                    counts["busy"] += 1
                    await asyncio.sleep(1)
                else:
                    counts["errors"] += 1
                    await asyncio.sleep(0.5)

        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks = [asyncio.create_task(receiver(session, queues[i % nq])) for i in range(receivers)]
            self._log(f"longpoll: {receivers:,} receivers on {nq} queues; letting them settle")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_waiting.wait(), 30)
            await asyncio.sleep(2.0)  # the last requests reach mq and start waiting
            idle_s = self.opts.longpoll_idle
            self._log(f"  {counts['waiting']:,} waiting; measuring mq's CPU for {idle_s:g} s with no message")
            gc_before = await asyncio.to_thread(gc_work, base)
            meter = self.bench._meter()
            await asyncio.sleep(idle_s)
            idle = meter.stop()
            collector = gc_delta(gc_before, await asyncio.to_thread(gc_work, base))
            self._log(f"  mq's garbage collector in the window: {collector}")
            waiting_at_end = counts["waiting"]
            self._log(f"  mq {idle.get('mq_cpu_pct')} % of a core idle; now {sends} sends, one at a time")
            rng = random.Random(12)
            latencies, send_ms, lost = [], [], 0
            async with aiohttp.ClientSession(timeout=timeout) as sender:
                for i in range(sends):
                    key = f"lp-{i}"
                    queue = rng.choice(queues)
                    t0 = time.perf_counter()
                    async with sender.post(f"{base}/{queue}/messages", data=key.encode()) as resp:
                        await resp.read()
                        if resp.status != 201:
                            raise RuntimeError(f"POST /{queue}/messages answered {resp.status}")
                    send_ms.append(time.perf_counter() - t0)
                    try:
                        async with arrived:
                            await asyncio.wait_for(arrived.wait_for(lambda k=key: k in arrivals), 5.0)
                        latencies.append(arrivals[key] - t0)
                    except TimeoutError:
                        lost += 1
                    await asyncio.sleep(0.05)  # the receiver polls again
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        delivery = _pcts_ms(latencies)
        self._log(f"  delivery p50 {delivery['p50']} ms, p99 {delivery['p99']} ms ({lost} not delivered in 5 s)")
        for q in queues:
            self.bench.api.delete_queue(q)
        return {
            "receivers": receivers,
            "queues": nq,
            "waiting_at_start_of_idle": waiting_at_end,
            "idle_s": idle_s,
            "idle_cpu": idle,
            "idle_mq_cpu_pct": idle.get("mq_cpu_pct"),
            "idle_mq_gc": collector,
            "idle_daemons_cpu_pct": round(sum(idle.get(f"{k}_cpu_pct", 0.0) for k in ("mq", "mover", "reaper")), 1),
            "sends": sends,
            "delivery_ms": delivery,
            "send_ms": _pcts_ms(send_ms),
            "not_delivered_in_5s": lost,
            "polls": counts,
            "client": "one Python asyncio process with aiohttp, one connection per receiver "
            "(wait_time_seconds=20); delivery = from the start of the POST to the receiver's answer",
        }

    # -- large bodies -----------------------------------------------------------------

    def large(self) -> dict[str, Any]:
        """Sends of each ``--large-sizes`` body vs the send disk loop at the same size and concurrency, in MB/s.

        Per size, ``--rounds`` rounds of one loop window and one mq window of ``--window`` seconds,
        alternating (:mod:`bench.windows`); ``over_disk_loop`` is the median of the per-round
        ratios. The loop keeps its files and mq's queue is deleted only after every size: a delete
        between windows would make the creates after it pay journal-less ext4's scan of recently
        freed inodes (performance.md). The earlier steps' deletes (the drain's, the queues step's)
        weigh on both sides' creates alike, the order inside a round alternating.
        """
        clients, window, rounds = self.opts.large_clients, self.opts.window, self.opts.rounds
        res: dict[str, Any] = {"clients": clients, "rounds": rounds, "window_s": window}
        for size in self.opts.large_sizes:
            queue = f"bench-large-{size}"
            self.bench.api.create_queue(queue)
            loops, mqs = alternate(
                rounds,
                lambda _r, s=size: self._large_loop_window(clients, s, window),
                lambda _r, s=size, q=queue: self._large_send_window(q, clients, s, window),
            )
            pair = paired(loops, mqs, loop_rate="mb_per_s", mq_rate="mb_per_s")
            mq, loop = summary_row(mqs, "mb_per_s"), summary_row(loops, "mb_per_s")
            res[f"bytes_{size}"] = {
                **mq,
                "body_bytes": size,
                "disk_loop_msgs_per_s": loop["msgs_per_s"],
                "disk_loop_mb_per_s": loop["mb_per_s"],
                "over_disk_loop": pair["ratio"],
                "pairs": pair,
                "disk_loop": loop,
            }
            ratios = ", ".join(str(r["ratio"]) for r in pair["rounds"])
            self._log(f"  {size:,} bytes: per-round ratios {ratios}, median {pair['ratio']}")
        for size in self.opts.large_sizes:  # after every size: a queue deleted earlier would slow the next creates
            self.bench.api.delete_queue(f"bench-large-{size}")
        return res

    def _large_loop_window(self, clients: int, size: int, duration: float) -> dict[str, Any]:
        """One window of the send disk loop at ``size``-byte bodies and ``clients`` threads (files kept)."""
        self._log(f"large: disk loop, {clients} threads, {size:,}-byte bodies, {duration:g} s")
        meter = self.bench._meter()
        loop = disk_loop(self.disk_dir, threads=clients, duration_s=duration, body_bytes=size, keep_files=True)
        loop["cpu"] = meter.stop()
        self._log(f"  {loop['mb_per_s']} MB/s")
        return loop

    def _large_send_window(self, queue: str, clients: int, size: int, duration: float) -> dict[str, Any]:
        """One window of sends of ``size``-byte bodies at ``clients`` connections into ``queue``."""
        self._log(f"large: sends of {size:,} bytes at {clients} clients, {duration:g} s")
        meter = self.bench._meter()
        run = self.bench.wrk.run(
            "post.lua", clients=clients, threads=2, queue=queue, duration_s=duration, body_bytes=size
        )
        sent = run.counts.get("sent", 0)
        cpu = self.bench._cpu(meter, sent)
        self.bench._alive()
        rate = run.rate("sent")
        row = {
            "sends_per_s": round(rate, 1),
            "mb_per_s": round(rate * size / 1e6, 2),
            "latency_ms": run.latency_ms(),
            "statuses": run.statuses(),
            "socket_errors": run.errors,
            "cpu": cpu,
        }
        self._log(f"  {row['mb_per_s']} MB/s")
        return row


def _schedstat_s(pid: int) -> tuple[float | None, float | None]:
    """Seconds the live threads of ``pid`` ran on a CPU and waited in the run queue (``/proc/PID/task/*/schedstat``)."""
    run = wait = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()
                run, wait = run + int(fields[0]), wait + int(fields[1])
    except OSError:
        return None, None
    return round(run / 1e9, 2), round(wait / 1e9, 2)


def _loadavg() -> list[float]:
    from bench.run import _loadavg as loadavg

    return loadavg()


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
