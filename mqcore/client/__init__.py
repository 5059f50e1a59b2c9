"""Python clients for mq: over HTTP (:class:`Client`, :class:`AsyncClient`) or brokerless on a root folder.

The brokerless clients (:class:`LocalClient`, :class:`AsyncLocalClient`) run
the storage protocol in this process, on the same folder tree and with the
same renames as the daemons, so they are safe alongside them and each other.
Every client has the same methods and raises the same :mod:`mqcore.errors`
classes. :func:`connect` picks one from a URL or a path.

This package is the top layer: the protocol core (``mqcore`` outside
``mqcore.client``, ``mqcore.spark`` and ``mqcore.ctl``) never imports it.
"""

from __future__ import annotations

from mqcore.client._types import BatchEntry, Message, MessageState, PeekedMessage, PeekPage

__all__ = ["BatchEntry", "Message", "MessageState", "PeekPage", "PeekedMessage"]
