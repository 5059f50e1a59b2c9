"""Python clients for mq: over HTTP (:class:`Client`, :class:`AsyncClient`) or brokerless on a root folder.

The brokerless clients (:class:`LocalClient`, :class:`AsyncLocalClient`) run
the storage protocol in this process, on the same folder tree and with the
same renames as the daemons, so they are safe alongside them and each other
(docs/protocol.md section 16). Every client has the same methods and raises
the same :mod:`mqcore.errors` classes: the Protocols :class:`QueueClient` and
:class:`AsyncQueueClient` of :mod:`mqcore.client.api`, where they are
documented. :func:`connect` picks one from a URL or a path; :class:`Worker`
is SMQ's worker base on top of any of them. The implementations are imported
on first use, so a program over HTTP never imports the brokerless client.

This package is the top layer: the protocol core (``mqcore`` outside
``mqcore.client``, ``mqcore.spark`` and ``mqcore.ctl``) never imports it
(an import-linter contract in CI keeps it so).
"""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Any

from mqcore.client.api import DEFAULT_URL, AsyncQueueClient, QueueClient
from mqcore.client.options import MessageOptions, PartitionOptions, PeekOptions, ReceiveOptions, SendOptions
from mqcore.client.types import BatchEntry, Message, MessageState, PeekedMessage, PeekPage

if TYPE_CHECKING:
    from mqcore.client._http import AsyncClient, Client
    from mqcore.client._local import AsyncLocalClient, LocalClient
    from mqcore.client.worker import Worker, WorkerStats

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncLocalClient",
    "AsyncQueueClient",
    "BatchEntry",
    "Client",
    "LocalClient",
    "Message",
    "MessageOptions",
    "MessageState",
    "PartitionOptions",
    "PeekOptions",
    "PeekPage",
    "PeekedMessage",
    "QueueClient",
    "ReceiveOptions",
    "SendOptions",
    "Worker",
    "WorkerStats",
    "connect",
    "connect_async",
]

#: The implementations, imported on first use: a program (or an mqctl command) that works over HTTP
#: does not import the brokerless client, and one on a root folder does not import httpx.
_LAZY = {
    "AsyncClient": "mqcore.client._http",
    "Client": "mqcore.client._http",
    "AsyncLocalClient": "mqcore.client._local",
    "LocalClient": "mqcore.client._local",
    "Worker": "mqcore.client.worker",
    "WorkerStats": "mqcore.client.worker",
}


def __getattr__(name: str) -> Any:
    """``from mqcore.client import Client`` (and the other implementations) imports their module then (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


#: ``host:port`` (or ``host:port/...``) without a scheme: a URL typo, not a root folder.
_HOST_PORT_RE = re.compile(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}(/.*)?")


def _local_path(target: str | os.PathLike[str]) -> str:
    """The root directory ``target`` names.

    Raises:
        ValueError: ``target`` looks like ``host:port`` without ``http://``.
        FileNotFoundError: No such directory (a brokerless root must exist: create it with
            :class:`LocalClient` directly, or let a daemon create it).
    """
    text = os.fspath(target)
    text = text.removeprefix("file://")
    if _HOST_PORT_RE.fullmatch(text) and not os.path.isdir(text):
        raise ValueError(f"{text!r} looks like host:port; for the HTTP API give a URL: 'http://{text}'")
    if not os.path.isdir(text):
        raise FileNotFoundError(f"no such mq root directory: {text!r} (for the HTTP API give an http:// URL)")
    return text


def connect(target: str | os.PathLike[str], **options: Any) -> QueueClient:
    """A synchronous client for ``target``: an mq URL or a queue root folder.

    Args:
        target: ``http://host:port`` / ``https://...`` for the HTTP API, or the
            path (or ``file://`` URL) of an existing root directory for brokerless mode.
        **options: Passed to :class:`Client` (e.g. ``timeout_seconds``,
            ``max_retries``) or :class:`LocalClient` (e.g. ``fsync``).
    Returns:
        A :class:`Client` or a :class:`LocalClient` (a :class:`QueueClient`); close it (or use ``with``).
    Raises:
        ValueError: ``target`` looks like ``host:port`` without a scheme.
        FileNotFoundError: ``target`` is a path and no such directory exists.
    """
    if isinstance(target, str) and _is_url(target):
        from mqcore.client._http import Client

        return Client(target, **options)
    from mqcore.client._local import LocalClient

    return LocalClient(_local_path(target), **options)


def connect_async(target: str | os.PathLike[str], **options: Any) -> AsyncQueueClient:
    """The asyncio counterpart of :func:`connect`: an :class:`AsyncClient` or an :class:`AsyncLocalClient`."""
    if isinstance(target, str) and _is_url(target):
        from mqcore.client._http import AsyncClient

        return AsyncClient(target, **options)
    from mqcore.client._local import AsyncLocalClient

    return AsyncLocalClient(_local_path(target), **options)
