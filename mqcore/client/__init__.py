"""Python clients for mq: over HTTP (:class:`Client`, :class:`AsyncClient`) or brokerless on a root folder.

The brokerless clients (:class:`LocalClient`, :class:`AsyncLocalClient`) run
the storage protocol in this process, on the same folder tree and with the
same renames as the daemons, so they are safe alongside them and each other
(docs/protocol.md section 16). Every client has the same methods and raises
the same :mod:`mqcore.errors` classes. :func:`connect` picks one from a URL or
a path; :class:`Worker` is SMQ's worker base on top of any of them.

This package is the top layer: the protocol core (``mqcore`` outside
``mqcore.client``, ``mqcore.spark`` and ``mqcore.ctl``) never imports it
(an import-linter contract in CI keeps it so).
"""

from __future__ import annotations

import os
import re
from typing import Any

from mqcore.client._http import AsyncClient, Client
from mqcore.client._local import AsyncLocalClient, LocalClient
from mqcore.client._types import BatchEntry, Message, MessageState, PeekedMessage, PeekPage
from mqcore.client.worker import Worker, WorkerStats

__all__ = [
    "AsyncClient",
    "AsyncLocalClient",
    "BatchEntry",
    "Client",
    "LocalClient",
    "Message",
    "MessageState",
    "PeekPage",
    "PeekedMessage",
    "Worker",
    "WorkerStats",
    "connect",
    "connect_async",
]


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


def connect(target: str | os.PathLike[str], **options: Any) -> Client | LocalClient:
    """A synchronous client for ``target``: an mq URL or a queue root folder.

    Args:
        target: ``http://host:port`` / ``https://...`` for the HTTP API, or the
            path (or ``file://`` URL) of an existing root directory for brokerless mode.
        **options: Passed to :class:`Client` (e.g. ``timeout_seconds``,
            ``max_retries``) or :class:`LocalClient` (e.g. ``fsync``).
    Returns:
        A :class:`Client` or a :class:`LocalClient`; close it (or use ``with``).
    Raises:
        ValueError: ``target`` looks like ``host:port`` without a scheme.
        FileNotFoundError: ``target`` is a path and no such directory exists.
    """
    if isinstance(target, str) and _is_url(target):
        return Client(target, **options)
    return LocalClient(_local_path(target), **options)


def connect_async(target: str | os.PathLike[str], **options: Any) -> AsyncClient | AsyncLocalClient:
    """The asyncio counterpart of :func:`connect`: an :class:`AsyncClient` or an :class:`AsyncLocalClient`."""
    if isinstance(target, str) and _is_url(target):
        return AsyncClient(target, **options)
    return AsyncLocalClient(_local_path(target), **options)
