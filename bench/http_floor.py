"""The floor of one HTTP request in mq's stack: an aiohttp server whose only route answers an empty 200.

The same stack as ``mq`` (aiohttp's ``web`` on uvloop, ``handler_cancellation=True``; with
``--middlewares`` two pass-through middlewares of the shape of mq's metrics and error middlewares),
loaded by wrk with keep-alive, one connection per thread. What it prints is the server's CPU per
request from /proc: what every receive and every delete of mq pays before it touches a file
(docs/performance.md, "Receive side: batches and receive+delete CPU", bar 3). With ``--low-level``
the empty answer comes from a handler of aiohttp's low-level server (``web.Server``, no
``Application``, no router), as mq's hot routes are served (``daemons/_fastpath.py``).

    .venv/bin/python bench/http_floor.py --clients 1,16 --seconds 5 [--middlewares | --low-level]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def serve(port: int, middlewares: bool, low_level: bool = False) -> None:
    """Run the floor server on 127.0.0.1:``port`` until killed (the child process)."""
    import uvloop
    from aiohttp import web

    async def empty(request: web.Request) -> web.Response:
        return web.Response(status=200, text="")

    @web.middleware
    async def timing(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            _ = (request.match_info.route.resource, time.perf_counter() - started)

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise

    uvloop.install()
    if low_level:
        asyncio.run(_serve_low_level(port, empty))
        return
    app = web.Application(middlewares=[timing, errors] if middlewares else [])
    app.router.add_get("/{queue}/messages", empty)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, handler_cancellation=True, print=None)


async def _serve_low_level(port: int, handler: Callable[..., Awaitable[object]]) -> None:
    """Serve ``handler`` for every request with aiohttp's low-level server until killed."""
    from aiohttp import web

    runner = web.ServerRunner(web.Server(handler, handler_cancellation=True), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _wait_listening(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"http_floor: the server did not listen on port {port}")


def main() -> int:
    """Measure each client count; print one JSON object."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", default="1,16", help="wrk connections (one per thread), comma-separated")
    p.add_argument("--seconds", type=int, default=5, help="seconds of wrk per client count")
    p.add_argument("--middlewares", action="store_true", help="two pass-through middlewares, as mq has")
    p.add_argument("--low-level", action="store_true", help="aiohttp's low-level server (web.Server), no Application")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.middlewares, args.low_level)
        return 0
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("http_floor: wrk is required (apt-get install -y wrk)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--serve", str(port)] + (["--middlewares"] if args.middlewares else [])
    cmd += ["--low-level"] if args.low_level else []
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, object] = {"middlewares": args.middlewares, "low_level": args.low_level, "loadavg": os.getloadavg()}
    try:
        _wait_listening(port)
        for clients in (int(c) for c in args.clients.split(",")):
            before = _cpu_s(server.pid)
            run = subprocess.run(
                [wrk, f"-t{clients}", f"-c{clients}", f"-d{args.seconds}s", f"http://127.0.0.1:{port}/q/messages"],
                capture_output=True,
                text=True,
                check=True,
            )
            cpu = _cpu_s(server.pid) - before
            match = re.search(r"(\d+) requests in", run.stdout)
            requests = int(match.group(1)) if match else 0
            out[f"clients_{clients}"] = {
                "requests": requests,
                "server_cpu_ms_per_request": round(cpu * 1000 / requests, 4) if requests else None,
            }
    finally:
        server.kill()
        server.wait()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
