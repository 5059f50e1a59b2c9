"""mq-stack: run mq, mq-mover and mq-reaper together on one root (for a new user).

In production systemd runs the three daemons separately (``systemd/``); this
command is the one-line way to try mq. It starts each daemon as a child
process, prints the URL once ``mq`` is listening, and on SIGTERM/SIGINT stops
all three. If one of them dies, it stops the others and exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from typing import Any

import click

from daemons import _runtime

logger = logging.getLogger("mq.stack")

_READY = {
    "mq": re.compile(r"mq listening on (http://\S+)"),
    "mq-mover": re.compile(r"mq-mover ready"),
    "mq-reaper": re.compile(r"mq-reaper ready"),
}
_MODULES = {"mq": "daemons.front", "mq-mover": "daemons.mover", "mq-reaper": "daemons.reaper"}


async def _pump(name: str, proc: asyncio.subprocess.Process, ready: asyncio.Future[str]) -> None:
    """Copy a child's stderr to ours, line by line, and resolve ``ready`` on its readiness line."""
    assert proc.stderr is not None
    async for raw in proc.stderr:
        line = raw.decode(errors="replace").rstrip("\n")
        sys.stderr.write(f"[{name}] {line}\n")
        match = _READY[name].search(line)
        if match and not ready.done():
            ready.set_result(match.group(1) if match.groups() else "")
    if not ready.done():
        ready.set_exception(RuntimeError(f"{name} exited before it was ready"))


async def run_stack(root: str, address: str, port: int, extra: dict[str, list[str]]) -> int:
    """Start the three daemons; return 0 after a clean stop, 1 if a daemon failed."""
    stop = asyncio.Event()
    _runtime.install_stop_signals(stop)
    procs: dict[str, asyncio.subprocess.Process] = {}
    pumps = []
    url = ""
    for name, module in _MODULES.items():
        args = [sys.executable, "-m", module, "--root", root, *extra.get(name, [])]
        if name == "mq":
            args += ["--address", address, "--port", str(port)]
        proc = await asyncio.create_subprocess_exec(*args, stderr=asyncio.subprocess.PIPE)
        procs[name] = proc
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        pumps.append(asyncio.create_task(_pump(name, proc, ready)))
        try:
            value = await asyncio.wait_for(ready, timeout=30)
        except (TimeoutError, RuntimeError) as exc:
            logger.error("could not start %s: %s", name, exc)
            stop.set()
            break
        if name == "mq":
            url = value
    else:
        click.echo(f"mq is running at {url} (root {root}); press Ctrl-C to stop", err=False)
        sys.stdout.flush()
    waits = {asyncio.create_task(p.wait()): n for n, p in procs.items()}
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
    failed = stopper not in done
    if failed:
        for task in done:
            if task in waits:
                logger.error("%s exited with code %s; stopping the others", waits[task], task.result())
    for proc in procs.values():
        if proc.returncode is None:
            proc.terminate()
    codes = {n: await p.wait() for n, p in procs.items()}
    stopper.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    logger.info("stopped exit_codes=%s", codes)
    return 1 if failed or any(codes.values()) else _runtime.EXIT_OK


@click.command(name="mq-stack", context_settings={"help_option_names": ["-h", "--help"]})
@_runtime.root_option
@click.option("--address", default="127.0.0.1", envvar="MQ_ADDRESS", show_envvar=True, show_default=True)
@click.option("--port", type=int, default=8080, envvar="MQ_PORT", show_envvar=True, show_default=True)
@click.option("--mq-arg", "mq_args", multiple=True, help="Extra argument passed to mq (repeatable).")
def cli(**values: Any) -> int:
    """Run mq, mq-mover and mq-reaper on one root until Ctrl-C."""
    _runtime.setup_logging("INFO", prefix="[mq-stack] ")
    root = _runtime.check_root(values["root"])
    return _runtime.run(lambda: run_stack(root, values["address"], values["port"], {"mq": list(values["mq_args"])}))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mq-stack`` console script."""
    return _runtime.run_command(cli, argv, "mq-stack")


if __name__ == "__main__":
    sys.exit(main())
