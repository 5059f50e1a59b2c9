"""What every daemon shares: settings from CLI > env > TOML > defaults, logging,
signals, systemd notification and the uvloop entry point.

Each daemon defines its options once, as click options with an explicit
``envvar``; :func:`config_option` adds ``--config FILE`` (env ``MQ_CONFIG``),
whose table for the daemon (``[mq]``, ``[mq-mover]``, ``[mq-reaper]``) plus
the top-level keys becomes click's ``default_map``. click then resolves
exactly CLI > env > file > default, and :func:`log_sources` logs which layer
won for each setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import click

from daemons import stop_early_on_signals
from daemons._stopguard import DEFAULT_STOP_TIMEOUT_SECONDS, StopGuard, forward_signals
from mqcore.errors import ConfigError

logger = logging.getLogger("mq.runtime")

#: Exit codes (sysexits.h; the systemd units set RestartPreventExitStatus=64 78).
EXIT_OK = 0
EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69
EXIT_SOFTWARE = 70
EXIT_CONFIG = 78

#: Log levels accepted by ``--log-level``.
LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})

#: Keys allowed at the top level of the TOML file (shared by all daemons).
SHARED_KEYS = frozenset({"root"})


def load_config_file(path: str, section: str, known: set[str]) -> dict[str, Any]:
    """Read the settings for daemon ``section`` from a TOML file.

    Top-level keys (only ``root``) apply to every daemon; the table named
    ``section`` overrides them. Keys are option names with ``-`` or ``_``.

    Raises:
        ConfigError: The file is unreadable or not TOML, or holds an unknown
            key (a typo must not be ignored silently).
    """
    import tomllib  # here: only a daemon started with --config reads TOML

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}", path=path) from exc
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            continue
        name = key.replace("-", "_")
        if name not in SHARED_KEYS:
            raise ConfigError(f"config file {path}: unknown top-level key {key!r}", path=path, key=key)
        out[name] = value
    for table in data:
        if isinstance(data[table], dict) and table not in {"mq", "mq-mover", "mq-reaper", "mq-stack"}:
            raise ConfigError(f"config file {path}: unknown table [{table}]", path=path, key=table)
    for key, value in data.get(section, {}).items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(
                f"config file {path}: unknown key {key!r} in [{section}]", path=path, key=key, section=section
            )
        out[name] = value
    return out


def _config_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        known = {p.name for p in ctx.command.params if p.name}
        try:
            ctx.default_map = load_config_file(value, ctx.command.name or "", known)
        except ConfigError as exc:
            raise click.BadParameter(exc.message, ctx=ctx, param=param) from exc
    return value


def config_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--config FILE`` option (env ``MQ_CONFIG``), read before the others."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        envvar="MQ_CONFIG",
        show_envvar=True,
        is_eager=True,
        expose_value=False,
        callback=_config_callback,
        help="TOML file with settings (see config/mq.toml).",
    )(fn)


def root_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--root DIR`` option shared by every daemon (env ``MQ_ROOT``, default /tmp/mq)."""
    return click.option(
        "--root",
        envvar="MQ_ROOT",
        default="/tmp/mq",
        show_default=True,
        show_envvar=True,
        help="Root directory of the folder tree (created if missing).",
    )(fn)


def log_level_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--log-level`` option shared by every daemon (env ``MQ_LOG_LEVEL``, default INFO)."""
    return click.option(
        "--log-level",
        envvar="MQ_LOG_LEVEL",
        default="INFO",
        show_default=True,
        show_envvar=True,
        type=click.Choice(sorted(LOG_LEVELS), case_sensitive=False),
        help="Logging level.",
    )(fn)


def stop_timeout_option(default: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--stop-timeout SECONDS`` option of every daemon (env ``MQ_STOP_TIMEOUT``, config key ``stop-timeout``).

    Args:
        default: The daemon's default, below its systemd unit's ``TimeoutStopSec`` (systemd/).
    """
    return click.option(
        "--stop-timeout",
        type=float,
        envvar="MQ_STOP_TIMEOUT",
        default=default,
        show_default=True,
        show_envvar=True,
        help="Seconds after SIGTERM/SIGINT within which the daemon exits even if a thread is stuck in the "
        "filesystem (it then logs which and exits 69; keep it below systemd's TimeoutStopSec).",
    )


def log_sources(ctx: click.Context, values: dict[str, Any]) -> None:
    """Log each setting with the layer it came from (cli, env, config file or default)."""
    names = {
        click.core.ParameterSource.COMMANDLINE: "cli",
        click.core.ParameterSource.ENVIRONMENT: "env",
        click.core.ParameterSource.DEFAULT_MAP: "config",
        click.core.ParameterSource.DEFAULT: "default",
    }
    parts = []
    for key, value in sorted(values.items()):
        source = ctx.get_parameter_source(key)
        parts.append(f"{key}={value}({names.get(source, '?') if source else '?'})")
    logger.info("settings %s", " ".join(parts))


def setup_logging(level: str = "INFO", prefix: str = "") -> None:
    """One line per event on stderr: ``prefix``, time, level, logger, message.

    Args:
        level: Logging level name.
        prefix: Text before each line (mq-stack's own lines: ``[mq-stack] ``, as its daemons' lines).
    """
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        stream=sys.stderr,
        format=prefix.replace("%", "%%") + "%(asctime)s %(levelname)s %(name)s %(message)s",
        force=True,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def sd_notify(state: str) -> None:
    """Send ``state`` (e.g. ``READY=1``) to systemd if NOTIFY_SOCKET is set; else do nothing."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        logger.warning("sd_notify failed state=%s error=%s", state, exc)


#: The stop guard of this process (:func:`run` sets it; :func:`install_stop_signals` arms it on a stop signal).
_guard = StopGuard(DEFAULT_STOP_TIMEOUT_SECONDS)


def describe_stop_wait(waiting_for: Callable[[], str]) -> None:
    """Name what a stop waits for besides this process's threads, in the stop guard's give-up line.

    Args:
        waiting_for: Called (from the guard's thread) when the bound has passed and no thread of this
            process is in a file system call; returns e.g. "mq process 2 (pid 4711, killed)", or "".
    """
    _guard.waiting_for = waiting_for


def install_stop_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (the daemons then finish their work and exit 0).

    The signal also arms the stop guard (:mod:`daemons._stopguard`): a stop not finished within
    ``--stop-timeout`` (a thread stuck in the filesystem) is logged and exits 69. The signals are
    taken by a thread of their own (:func:`daemons._stopguard.forward_signals`), so they are seen
    while the loop's thread is blocked in a system call too.

    Python-level handlers (``signal.signal``), not ``loop.add_signal_handler``: uvloop wakes on
    any signal through its self-pipe and runs them on the loop's thread, and each only queues
    :func:`_on_signal` on the loop. The loop's own handlers would have to be removed before the
    loop closes, and uvloop's removal puts SIGTERM's default action back before
    :func:`_ignore_stop_signals` can ignore it: a SIGTERM in that gap (the main thread preempted
    there under load) killed a daemon that had already stopped cleanly ("killed by signal 15").
    """
    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(_on_signal, stop, signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)

    def forwarded(sig: signal.Signals) -> None:
        _guard.arm()  # also after main() returned: an exit stuck in joining threads is bounded too
        with contextlib.suppress(RuntimeError):  # the loop has closed: main() returned, the signal is ignored
            loop.call_soon_threadsafe(_on_signal, stop, sig)

    forward_signals(forwarded)


def install_reload_signal(reload: Callable[[], None]) -> None:
    """Call ``reload()`` on SIGHUP (mq: read the auth file again; connections stay open)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, _on_reload, reload)


def _on_reload(reload: Callable[[], None]) -> None:
    logger.info("received SIGHUP, reloading")
    sd_notify("RELOADING=1")
    try:
        reload()
    finally:
        sd_notify("READY=1")


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    if stop.is_set():
        # One Ctrl-C reaches a whole process group (SIGINT), then mq-stack sends its children SIGTERM.
        logger.debug("received %s while stopping", sig.name)
        return
    _guard.arm()
    logger.info("received %s, stopping (at most %g s: --stop-timeout)", sig.name, _guard.timeout_seconds)
    sd_notify("STOPPING=1")
    stop.set()


def run(
    main: Callable[[], Awaitable[int]], *, stop_timeout_seconds: float = DEFAULT_STOP_TIMEOUT_SECONDS, root: str = ""
) -> int:
    """Run ``main()`` on uvloop and return its exit code.

    ``stop_timeout_seconds`` (``--stop-timeout``) bounds the stop: that long after the first
    SIGTERM or SIGINT the process exits 69 whatever it still waits for, logging the threads stuck in
    the filesystem (paths relative to ``root``; :mod:`daemons._stopguard`).

    Until ``main()`` installs its orderly stop (:func:`install_stop_signals`), SIGTERM and
    SIGINT exit 0 at once (:func:`daemons.stop_early_on_signals`, put in place first thing here
    and, for a daemon's own process, already when the ``daemons`` package was imported): a daemon
    stopped while it starts exits 0, not "killed by signal 15".
    Once ``main()`` has returned, SIGTERM and SIGINT are ignored for the rest of the process's
    life. Closing the loop would otherwise put their default actions back while the interpreter
    is still shutting down, and a late SIGTERM (mq-stack stopping a child that already got the
    terminal's SIGINT, or systemd's stop racing an exit) would turn a clean exit 0 into "killed
    by signal 15".
    """
    global _guard
    stop_early_on_signals()
    _guard = StopGuard(stop_timeout_seconds, root)
    import uvloop  # here: ``--help``, a usage error or a bad setting exits before any event loop

    async def guarded() -> int:
        try:
            return await main()
        finally:
            _ignore_stop_signals()

    return uvloop.run(guarded())


def freeze_start_up(name: str) -> int:
    """Move every object alive at the end of a daemon's start-up out of the cyclic collector's reach.

    One full collection first (start-up's own garbage goes), then ``gc.freeze()``: what is left (imported
    modules, classes, functions, settings, the stores and indexes built so far) goes to the permanent
    generation, which no later collection walks. Long pollers' objects live their whole wait (20 s), are
    promoted to the oldest generation and set off full collections of the whole heap every 20-45 s at
    1,000 idle pollers; without the start-up's objects each walks a smaller heap (docs/performance.md,
    "The collector after start-up: gc.freeze() and its counts in /metrics (issue 12, stop 26)"). Frozen
    objects are still freed by their reference counts; a reference cycle among them is never collected, so
    what a queue present at start-up leaves in a cycle when it is deleted stays (bounded by those queues).

    Args:
        name: The daemon (``mq``, ``mq-mover``, ``mq-reaper``), for the log line.
    Returns:
        How many objects are frozen (``gc.get_freeze_count()``).
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%s: %d objects of the start-up frozen out of the garbage collector's walks", name, frozen)
    return frozen


def _ignore_stop_signals() -> None:
    # One switch from the handler (install_stop_signals's, or the early exit's) straight to SIG_IGN:
    # the default action (terminate) is never in place in between.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def check_root(root: str) -> str:
    """Make ``root`` absolute and make sure it exists (created if only it is missing) and is writable.

    Only the root itself is created, never a missing parent: ``--root /srv/mq-typo/q`` must not
    quietly start an empty tree somewhere new (mqctl and the clients refuse a missing root too).

    Raises:
        click.UsageError: The parent directory of ``root`` does not exist (exit 64, the path named).
        ConfigError: It cannot be created or is not writable.
    """
    path = os.path.abspath(root)
    parent = os.path.dirname(path)
    if not os.path.isdir(path) and not os.path.isdir(parent):
        raise click.UsageError(
            f"root {path}: its parent directory {parent} does not exist; create it first or fix the path"
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"root {path} cannot be created: {exc.strerror}", root=path) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"root {path} is not writable", root=path)
    return path


def positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise ConfigError unless ``value`` is > 0 (or >= 0 with ``allow_zero``)."""
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}", key=name)


def check_interval(key: str, value: float) -> None:
    """Raise ConfigError unless ``value`` (seconds) is a finite number > 0.

    Raises:
        ConfigError: Zero, negative, NaN or infinite; ``details["key"]`` is ``key``.
    """
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key} must be a finite number of seconds > 0, got {value}", key=key, value=value)


def check_log_level(value: str) -> None:
    """Raise ConfigError unless ``value`` names a logging level (any case).

    Raises:
        ConfigError: Not one of DEBUG, INFO, WARNING, ERROR, CRITICAL.
    """
    if value.upper() not in LOG_LEVELS:
        raise ConfigError(
            f"log-level must be one of {', '.join(sorted(LOG_LEVELS))}, got {value!r}", key="log-level", value=value
        )


def check_root_value(value: str) -> None:
    """Raise ConfigError if ``value`` is empty (the root itself is checked by ``check_root``)."""
    if not value:
        raise ConfigError("root must not be empty", key="root", value=value)


async def wait_for_wake(wake: asyncio.Event, timeout_seconds: float) -> bool:
    """Wait until ``wake`` is set or ``timeout_seconds`` have passed (no error either way).

    Returns:
        True if ``wake`` is set.
    """
    if wake.is_set() or timeout_seconds <= 0:
        return wake.is_set()
    try:
        async with asyncio.timeout(timeout_seconds):
            await wake.wait()
    except TimeoutError:
        return False
    return True


def _layer(ctx: click.Context, key: str) -> str:
    """Where the value of option ``key`` (e.g. ``rescan-interval``) came from, for error messages."""
    name = key.replace("-", "_")
    source = ctx.get_parameter_source(name)
    param = next((p for p in ctx.command.params if p.name == name), None)
    if source == click.core.ParameterSource.COMMANDLINE:
        return f"--{key} on the command line"
    if source == click.core.ParameterSource.ENVIRONMENT and param is not None:
        return f"env {param.envvar}"
    if source == click.core.ParameterSource.DEFAULT_MAP:
        return f"key {key} in the config file"
    return "the default"


def build_settings(ctx: click.Context, factory: Callable[..., Any], **fields: Any) -> Any:
    """Call ``factory(**fields)``; a ConfigError gets the layer of the bad value appended.

    Raises:
        ConfigError: From the factory, its message naming the layer (``env MQ_...``).
    """
    try:
        return factory(**fields)
    except ConfigError as exc:
        key = exc.details.get("key")
        if isinstance(key, str):
            raise ConfigError(f"{exc.message} (from {_layer(ctx, key)})", **exc.details) from exc
        raise


def _is_config_layer(exc: click.ClickException) -> bool:
    """True if a click error comes from the config file or an env var rather than the command line."""
    if isinstance(exc.__cause__, ConfigError):
        return True  # --config: unreadable, not TOML, unknown key
    if isinstance(exc, click.BadParameter) and exc.ctx is not None and exc.param is not None and exc.param.name:
        source = exc.ctx.get_parameter_source(exc.param.name)
        return source in (click.core.ParameterSource.ENVIRONMENT, click.core.ParameterSource.DEFAULT_MAP)
    return False


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a daemon's click command and map failures to exit codes (sysexits.h).

    Returns:
        The command's exit code: 0 after a clean stop (or ``--help``); 64
        (EX_USAGE) for a bad command line; 78 (EX_CONFIG) for a bad config
        file, environment variable or setting value.
    """
    try:
        rv = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return EXIT_CONFIG if _is_config_layer(exc) else EXIT_USAGE
    except click.Abort:  # Ctrl-C before the signal handlers were installed
        return EXIT_OK
    except ConfigError as exc:
        logger.error("config error: %s", exc.message)
        if not logging.getLogger().handlers:
            click.echo(f"Error: {exc.message}", err=True)
        return EXIT_CONFIG
    return int(rv or 0)
