"""How the ``mq`` daemon listens: exposure check, TLS, socket activation, connection limit (docs/security.md).

- Without ``--auth-file`` mq accepts only a loopback address (127.0.0.0/8, ::1)
  unless ``--insecure-listen`` is given: anyone who reaches the port could read,
  delete and purge every queue.
- ``--tls-cert``/``--tls-key`` (PEM): HTTPS with the ``ssl`` module, TLS 1.2 or newer.
- Socket activation (systemd ``mq.socket``): when ``LISTEN_PID`` is this
  process and ``LISTEN_FDS`` >= 1, mq serves the inherited socket (fd 3,
  sd_listen_fds(3)) instead of binding ``--address``/``--port``; connection
  attempts made while mq restarts wait in that socket's backlog.
- ``--max-connections``: a connection over the limit is answered at once with
  ``503 server_busy`` (JSON, ``Retry-After: 1``, ``Connection: close``) and closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import click
from aiohttp import web

from mqcore.errors import ConfigError, ServerBusy

logger = logging.getLogger("mq.front")

#: First inherited file descriptor of socket activation (sd_listen_fds(3): SD_LISTEN_FDS_START).
SD_LISTEN_FDS_START = 3


def security_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``mq`` options of docs/security.md: auth, TLS, exposure and abuse limits."""
    options = [
        click.option("--auth-file", default="", envvar="MQ_AUTH_FILE", show_envvar=True,
                     help="TOML file of hashed tokens and their grants; empty = no authentication."),
        click.option("--insecure-listen/--no-insecure-listen", default=False, envvar="MQ_INSECURE_LISTEN",
                     show_envvar=True, show_default=True,
                     help="Allow a non-loopback address without --auth-file (whoever reaches it controls all queues)."),
        click.option("--tls-cert", default="", envvar="MQ_TLS_CERT", show_envvar=True,
                     help="PEM certificate chain: serve HTTPS (TLS 1.2+); needs --tls-key."),
        click.option("--tls-key", default="", envvar="MQ_TLS_KEY", show_envvar=True,
                     help="PEM private key of --tls-cert."),
        click.option("--max-connections", type=int, default=1024, envvar="MQ_MAX_CONNECTIONS", show_envvar=True,
                     show_default=True, help="Most open client connections; more get 503 server_busy and are closed."),
        click.option("--idle-timeout", type=float, default=75.0, envvar="MQ_IDLE_TIMEOUT", show_envvar=True,
                     show_default=True,
                     help="Seconds a connection may sit without a complete request header before it is closed."),
        click.option("--body-timeout", type=float, default=60.0, envvar="MQ_BODY_TIMEOUT", show_envvar=True,
                     show_default=True,
                     help="Seconds a request body may take to arrive; slower gets 408 and the connection closed."),
        click.option("--max-waiters", type=int, default=1000, envvar="MQ_MAX_WAITERS", show_envvar=True,
                     show_default=True, help="Most long polls waiting on one queue; more get 503 server_busy."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


def is_loopback(address: str) -> bool:
    """True if every address ``address`` resolves to is a loopback one (127.0.0.0/8, ::1).

    A host name is resolved (``localhost``); an empty address or one that does not resolve is not loopback.
    """
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_exposure(address: str, *, auth: bool, insecure_listen: bool) -> str:
    """The start-up line about who may use mq; raise if mq would listen openly without being told to.

    Args:
        address: The address mq listens on (of the inherited socket under socket activation).
        auth: True with ``--auth-file``.
        insecure_listen: ``--insecure-listen``.
    Returns:
        One log line saying what protects the port.
    Raises:
        ConfigError: A non-loopback address without ``--auth-file`` or ``--insecure-listen`` (exit 78).
    """
    if auth:
        return f"auth: tokens required (--auth-file); listening on {address}"
    if is_loopback(address):
        return f"auth: none (no --auth-file): listening on loopback {address} only, reachable from this host"
    if insecure_listen:
        return f"auth: none and --insecure-listen: anyone who reaches {address} can read, delete and purge every queue"
    raise ConfigError(
        f"address {address} is not loopback: give --auth-file (or --insecure-listen to run without authentication)",
        key="address",
    )


def tls_context(cert: str, key: str) -> ssl.SSLContext | None:
    """The server's TLS context (TLS 1.2 or newer, Python's default ciphers), or None without ``cert``.

    Raises:
        ConfigError: Only one of cert and key, or they cannot be loaded (file missing, not PEM, key mismatch).
    """
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("--tls-cert and --tls-key go together", key="tls_cert" if not cert else "tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load --tls-cert {cert} / --tls-key {key}: {exc}", key="tls_cert") from exc
    return context


def inherited_socket() -> socket.socket | None:
    """The listening socket systemd passed (``LISTEN_PID`` = this pid, ``LISTEN_FDS`` >= 1), else None.

    The variables are removed from the environment (sd_listen_fds(3) with unset_environment), so
    children do not take the socket for theirs.

    Raises:
        ConfigError: fd 3 is not a listening TCP socket.
    """
    pid, fds = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    if not pid or not fds or pid != str(os.getpid()):
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if not fds.isdigit() or int(fds) < 1:
        return None
    if int(fds) > 1:
        logger.warning("socket activation passed %s sockets; serving only the first (fd 3)", fds)
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise ConfigError(f"socket activation: fd 3 is not a socket: {exc.strerror}") from exc
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        raise ConfigError("socket activation: fd 3 must be a TCP socket (ListenStream= host:port)")
    os.set_inheritable(sock.fileno(), False)
    sock.setblocking(False)
    return sock


class _Refuse(asyncio.Protocol):
    """A connection over ``--max-connections``: answer 503 server_busy and close (the request is not read)."""

    _BODY = json.dumps(ServerBusy("too many connections; retry later").to_json()).encode()
    RESPONSE = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.WriteTransport, transport)  # uvloop's transports do not subclass asyncio's
        writer.write(self.RESPONSE)
        writer.close()


class LimitedSite(web.BaseSite):
    """A listening site (``host``/``port``, or an inherited ``sock``) that admits at most ``max_connections``.

    Args:
        runner: The aiohttp runner.
        host: Address to bind (ignored with ``sock``).
        port: Port to bind (0 = any free port; ignored with ``sock``).
        sock: An already listening socket (socket activation), or None.
        max_connections: Most connections served at once (aiohttp's open handlers).
        refusals: Counter whose ``"connections"`` counts the connections refused.
        reuse_port: Bind with ``SO_REUSEPORT`` (a worker of ``mq --processes N``: the kernel spreads
            connections over the workers bound to the port).
        connections: The protocol factory of an admitted connection (``daemons._wire.Wire``), or None for
            the runner server's (aiohttp's connection handler).
        **kwargs: ``ssl_context``, ``shutdown_timeout``, ``backlog`` as for aiohttp's sites.
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        sock: socket.socket | None,
        max_connections: int,
        refusals: Counter[str] | None = None,
        reuse_port: bool = False,
        connections: Callable[[], asyncio.BaseProtocol] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(runner, **kwargs)
        self._connections = connections
        self._host, self._port, self._sock = host, port, sock
        self._reuse_port = reuse_port
        self._max_connections = max_connections
        self.refusals: Counter[str] = refusals if refusals is not None else Counter()

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        limit = self._max_connections
        admit = self._connections or server

        def factory() -> asyncio.BaseProtocol:
            if len(server.connections) >= limit:
                self.refusals["connections"] += 1
                refused = self.refusals["connections"]
                if refused == 1 or refused % 1000 == 0:
                    logger.warning("connection refused: %d open (--max-connections); refused so far %d",
                                   limit, refused)  # fmt: skip
                return _Refuse()
            return admit()

        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(
                factory, sock=self._sock, ssl=self._ssl_context, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                factory, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog, reuse_address=True,
                reuse_port=self._reuse_port or None
            )  # fmt: skip
