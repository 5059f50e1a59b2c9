"""The client methods listed once: :class:`Operations`, shared by ``Client``, ``AsyncClient``, ``AsyncLocalClient``.

Each method of the client interface is one :class:`Operation` attribute here,
naming the operation of :mod:`mqcore.client._operations` that defines its
parameters. Statically (mypy) an operation is, on a blocking client, a method
with the operation's parameters returning its result and, on an asyncio
client, the same as a coroutine (overloads of ``__get__``): the clients
conform to :class:`~mqcore.client.api.QueueClient` /
:class:`~mqcore.client.api.AsyncQueueClient` and a misspelt keyword fails at
the call site. At run time each class that inherits the table gets real
functions, made once when the class is created (``__init_subclass__``) by the
class's own :meth:`Operations._make_method` (``Client``: run the operation;
``AsyncClient``: await it; ``AsyncLocalClient``: LocalClient's method of the
name as a coroutine), so ``inspect.signature``, ``typing.get_type_hints``
and ``help()`` see plain methods and a call costs what a method call costs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from mqcore.client import _operations as ops
from mqcore.client._operations import Op
from mqcore.client._renamed import renamed_keyword

if TYPE_CHECKING:
    from mqcore.client._http import AsyncClient, Client
    from mqcore.client._local_async import AsyncLocalClient

__all__ = ["Operation", "Operations"]

P = ParamSpec("P")
T = TypeVar("T")


class Operation(Generic[P, T]):
    """A client method defined by the operation ``op`` (see the module docstring).

    Args:
        op: The operation: a function with the method's parameters returning an
            :data:`~mqcore.client._operations.Op` whose return value is the method's result.
        decorate: Applied to each method made from ``op`` (e.g. :func:`renamed_keyword`).
    """

    def __init__(self, op: Callable[P, Op[T]], decorate: Callable[[Any], Any] | None = None) -> None:
        self.op = op
        self.decorate = decorate

    def method(self, owner: type[Operations], name: str) -> Callable[..., Any]:
        """The function of ``owner`` named ``name`` for this operation (made by ``owner._make_method``)."""
        function = owner._make_method(name, self.op)
        return function if self.decorate is None else self.decorate(function)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Callable[..., Any]: ...
    @overload
    def __get__(self, obj: Client, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncClient | AsyncLocalClient, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        # Reached only on a class that does not make the methods (``Operations`` itself): the classes
        # that inherit the table have real functions of the same names (``Operations.__init_subclass__``).
        if obj is None:
            return self
        raise TypeError(f"{owner.__name__} does not make its methods from operations")


class Operations:
    """The client interface's methods (docstrings: :class:`mqcore.client.api.QueueClient`)."""

    @classmethod
    def _make_method(cls, name: str, op: Callable[..., Op[Any]]) -> Callable[..., Any]:
        """The function of this class's method ``name``, defined by the operation ``op``."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_make_method" in vars(cls):
            for name, value in vars(Operations).items():
                if isinstance(value, Operation):
                    setattr(cls, name, value.method(cls, name))

    list_queues = Operation(ops.list_queues)
    create_queue = Operation(ops.create_queue)
    delete_queue = Operation(ops.delete_queue)
    queue_stats = Operation(ops.queue_stats)
    get_attributes = Operation(ops.get_attributes)
    set_attributes = Operation(ops.set_attributes)
    purge = Operation(ops.purge)
    send = Operation(ops.send)
    send_batch = Operation(ops.send_batch)
    receive = Operation(ops.receive)
    delete = Operation(ops.delete)
    delete_by_id = Operation(ops.delete_by_id)
    delete_batch = Operation(ops.delete_batch)
    change_visibility = Operation(
        ops.change_visibility, renamed_keyword("timeout_seconds", "visibility_timeout_seconds", removed_in="0.2")
    )
    change_visibility_batch = Operation(ops.change_visibility_batch)
    lease_bulk = Operation(ops.lease_bulk)
    delete_bulk = Operation(ops.delete_bulk)
    peek = Operation(ops.peek)
    peek_ids = Operation(ops.peek_ids)
    delete_by_ids = Operation(ops.delete_by_ids)
    start_redrive = Operation(ops.start_redrive)
    redrive_status = Operation(ops.redrive_status)
    cancel_redrive = Operation(ops.cancel_redrive)
