"""The ``--metrics-port`` options of mq-mover and mq-reaper and the start of their metrics listener.

Apart from :mod:`daemons._metrics` so that a mq-mover or mq-reaper without ``--metrics-port``
(the default, and every daemon the tests start) never imports prometheus-client: the registry,
the counters and the listener are imported when :func:`start_daemon_metrics` starts them
(docs/performance.md, "Daemon start-up and the test suite's load").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mqcore.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("mq.metrics")
T = TypeVar("T")


def metrics_options(env_prefix: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--metrics-port`` and ``--metrics-address`` options of mq-mover or mq-reaper.

    Args:
        env_prefix: Prefix of their environment variables, e.g. ``MQ_MOVER`` (-> ``MQ_MOVER_METRICS_PORT``).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--metrics-address",
            default="127.0.0.1",
            envvar=f"{env_prefix}_METRICS_ADDRESS",
            show_envvar=True,
            show_default=True,
            help="Address of the /metrics listener (with --metrics-port).",
        )(fn)
        return click.option(
            "--metrics-port",
            type=int,
            default=0,
            envvar=f"{env_prefix}_METRICS_PORT",
            show_envvar=True,
            show_default=True,
            help="Serve Prometheus metrics on this TCP port at /metrics (0 = off).",
        )(fn)

    return decorate


def check_metrics_port(port: int) -> None:
    """Raise ConfigError unless ``port`` is 0 (off) or a TCP port, 1-65535."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"metrics-port must be 0 (off) or 1-65535, got {port}", key="metrics_port")


def start_daemon_metrics(
    name: str, root: str, port: int, address: str, make: Callable[[CollectorRegistry], T]
) -> tuple[T | None, Callable[[], None]]:
    """Start mq-mover's or mq-reaper's metrics listener when ``port`` is set.

    Args:
        name: The daemon's name for messages (``mq-mover``).
        root: Its root (the free-space gauge).
        port: TCP port of the listener; 0 = off (nothing is imported or started).
        address: Address of the listener.
        make: Makes the daemon's counters on the registry (called only when ``port`` is set).

    Returns:
        (the daemon's metrics made by ``make`` on the registry, or None when off;
        the function that stops the listener).
    Raises:
        ConfigError: The port cannot be bound.
    """
    if not port:
        return None, lambda: None
    from daemons._metrics import daemon_registry, serve_metrics  # prometheus-client: only when metrics are on

    registry, _storage = daemon_registry(root)
    metrics = make(registry)
    try:
        stop = serve_metrics(port, address, registry)
    except OSError as exc:
        raise ConfigError(f"{name} cannot listen on {address}:{port} for metrics: {exc.strerror}") from exc
    logger.info("%s metrics on http://%s:%d/metrics", name, address, port)
    return metrics, stop
