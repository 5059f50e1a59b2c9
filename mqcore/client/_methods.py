"""Client methods made from one definition, with the signature ``help()`` shows kept exact.

Each method of the client interface is defined once per kind of client: for
HTTP as an operation in :mod:`mqcore.client._operations` (a function with the
method's parameters that returns a generator of requests), brokerless as a
method of :class:`~mqcore.client.LocalClient`. The methods of the other
classes are made from that definition by one typed wrapper each
(``ParamSpec``/``Concatenate``, so mypy sees the definition's parameters):
``Client`` and ``AsyncClient`` drive the HTTP operation, ``AsyncLocalClient``
runs the ``LocalClient`` method in a worker thread or drives its operation on
the event loop. :func:`derive` gives such a wrapper, at run time, the name,
parameters and annotations of its definition (for ``inspect.signature``,
``typing.get_type_hints`` and ``help()``), with ``self`` first and, for an
operation, the operation's result as the return type. The docstrings are the
Protocols' (:func:`mqcore.client.api.documented_by`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["OPERATION", "derive"]

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute of a brokerless method written as an operation: the operation (for ``AsyncLocalClient``).
OPERATION = "__mq_operation__"


def derive(wrapper: F, definition: Callable[..., Any], *, add_self: bool, operation: bool) -> F:
    """Give ``wrapper`` the name, parameters and annotations of ``definition``; return it.

    Args:
        wrapper: The method made from ``definition``.
        definition: The function or method that defines the parameters (and, with ``operation``,
            returns an operation: a generator whose return value is the method's result).
        add_self: ``definition`` is a plain function: the method gets a ``self`` parameter first.
        operation: The return annotation of ``definition`` is ``Generator[..., ..., R]``; the
            method's is ``R``.
    Returns:
        ``wrapper``, its docstring None (``documented_by`` gives it the Protocol's).
    """
    signature = inspect.signature(definition, eval_str=True)
    returns = signature.return_annotation
    if operation:
        returns = typing.get_args(returns)[-1]  # Generator[yield, send, result]
        returns = None if returns is type(None) else returns  # as written: ``-> None``
    parameters = list(signature.parameters.values())
    if add_self:
        parameters.insert(0, inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD))
    functools.update_wrapper(wrapper, definition)
    annotations = {p.name: p.annotation for p in parameters if p.annotation is not inspect.Parameter.empty}
    method: Any = wrapper
    method.__annotations__ = {**annotations, "return": returns}
    method.__signature__ = signature.replace(parameters=parameters, return_annotation=returns)
    method.__doc__ = None
    method.__dict__.pop(OPERATION, None)  # update_wrapper copied the definition's; the caller sets its own
    return wrapper
