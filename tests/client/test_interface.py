"""Every client implements the one client interface (``mqcore.client.api``) with the same signatures.

The Protocols :class:`QueueClient` and :class:`AsyncQueueClient` are where the client methods are
documented; :class:`Client`, :class:`LocalClient` and their asyncio twins satisfy them structurally.
mypy checks them where ``connect()`` returns them; these tests make a drift (a renamed keyword, a
changed default, a method left out or no longer a coroutine) fail at once, with no server or root.
"""

from __future__ import annotations

import asyncio
import inspect
import typing

import pytest

from mqcore.client import AsyncClient, AsyncLocalClient, Client, LocalClient
from mqcore.client.api import AsyncQueueClient, QueueClient

IMPLEMENTATIONS = [
    (QueueClient, Client),
    (QueueClient, LocalClient),
    (AsyncQueueClient, AsyncClient),
    (AsyncQueueClient, AsyncLocalClient),
]


CONTEXT_METHODS = ("__enter__", "__exit__", "__aenter__", "__aexit__")


def members(protocol: type) -> list[str]:
    """The methods a Protocol declares (its own attributes, dunders included, not ``typing``'s)."""
    return sorted(
        name
        for name, value in vars(protocol).items()
        if callable(value) and (not name.startswith("_") or name in CONTEXT_METHODS)
    )


def parameters(function: typing.Any) -> list[tuple[str, inspect._ParameterKind, object, object]]:
    """(name, kind, default, resolved annotation) of each parameter after ``self``, and the return type."""
    hints = typing.get_type_hints(function)
    signature = inspect.signature(function)
    out = [(p.name, p.kind, p.default, hints.get(p.name)) for p in list(signature.parameters.values())[1:]]
    return [*out, ("return", inspect.Parameter.POSITIONAL_ONLY, None, hints.get("return"))]


@pytest.mark.parametrize(("protocol", "implementation"), IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_client_has_every_method_of_its_protocol_with_the_same_signature(protocol, implementation):
    names = members(protocol)
    assert len(names) >= 28  # the whole interface, not an empty Protocol
    for name in names:
        declared, actual = getattr(protocol, name), getattr(implementation, name, None)
        assert actual is not None, f"{implementation.__name__} has no {name}()"
        if name in ("__enter__", "__aenter__"):  # -> Self: the implementation returns its own class
            assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(declared)
            continue
        # A default the Protocol leaves to the implementations (``...``) is compared between them below.
        left = [p for p in parameters(declared) if p[2] is Ellipsis]
        found = [(n, k, Ellipsis if (n, k, Ellipsis, a) in left else d, a) for n, k, d, a in parameters(actual)]
        assert found == parameters(declared), f"{implementation.__name__}.{name}() differs"
        if inspect.iscoroutinefunction(declared):
            assert inspect.iscoroutinefunction(actual), f"{implementation.__name__}.{name}() is not a coroutine"
        else:
            assert not inspect.iscoroutinefunction(actual), f"{implementation.__name__}.{name}() is a coroutine"


@pytest.mark.parametrize("protocol", [QueueClient, AsyncQueueClient], ids=lambda c: c.__name__)
def test_defaults_left_to_the_implementations_are_the_same_in_each(protocol):
    implementations = [i for p, i in IMPLEMENTATIONS if p is protocol]
    for name in members(protocol):
        defaults = {i.__name__: {p[0]: p[2] for p in parameters(getattr(i, name))} for i in implementations}
        for parameter, _, default, _ in parameters(getattr(protocol, name)):
            if default is Ellipsis:
                values = {client: given[parameter] for client, given in defaults.items()}
                assert len(set(values.values())) == 1, f"{name}({parameter}=...) defaults differ: {values}"


@pytest.mark.parametrize(("protocol", "implementation"), IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_instances_are_instances_of_their_protocol_only(tmp_path, protocol, implementation):
    other = AsyncQueueClient if protocol is QueueClient else QueueClient
    client = implementation("http://127.0.0.1:9") if implementation in (Client, AsyncClient) else None
    if client is None:
        client = implementation(tmp_path)
    try:
        assert isinstance(client, protocol)
        # runtime_checkable compares names only: the async twins have the same names, so also check coroutines
        assert inspect.iscoroutinefunction(client.close) == (other is QueueClient)
    finally:
        result = client.close()
        if inspect.iscoroutine(result):
            asyncio.run(result)


def test_the_http_clients_show_the_protocol_docstrings():
    """The docstrings are written once, in the Protocol; help(Client.send) still shows them."""
    for implementation in (Client, AsyncClient):
        for name in members(QueueClient):
            if not name.startswith("_"):
                assert getattr(implementation, name).__doc__ == getattr(QueueClient, name).__doc__, name
    assert "SQS: WaitTimeSeconds" in (Client.receive.__doc__ or "")
