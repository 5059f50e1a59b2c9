"""Brokerless asyncio client: :class:`AsyncLocalClient`, the :class:`LocalClient` interface as coroutines.

It holds a :class:`LocalClient` and uses only its public surface: each of its
methods is made from the LocalClient method of the same name by one typed
wrapper, :func:`_coroutine` (the same parameters). Which methods: the table
:class:`mqcore.client._table.Operations`, shared with the HTTP clients (mypy
types them from the HTTP operations' parameters, which
``tests/client/test_interface.py`` keeps equal to LocalClient's through the
Protocol), and ``close``. Calls that never wait run the LocalClient method in
``asyncio.to_thread``. The ones that may wait (``send``, ``send_batch``: for
capacity; ``receive``: long polling) are written in LocalClient as operations;
they are driven here: file work in worker threads, sleeps awaited on the event
loop (woken from the inotify thread), so a waiting call ties up no thread and
never blocks the loop. ``send_json``, ``ack``, ``nack``, ``iter_peek`` and
``async with`` are :class:`~mqcore.client.api.AsyncQueueClient`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from mqcore.client._local import LocalClient
from mqcore.client._local_waiters import Op, Sleep, Undoable
from mqcore.client._methods import OPERATION, derive
from mqcore.client._table import Operations
from mqcore.client.api import AsyncQueueClient, documented_by
from mqcore.service.plans import run_async

__all__ = ["AsyncLocalClient"]

T = TypeVar("T")
P = ParamSpec("P")


async def _sleep(step: Sleep) -> None:
    """Await ``step``'s waiter on the loop (woken from the inotify thread), at most its timeout."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(event.set)

    if step.watches.listen(step.waiter, notify):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), step.timeout_seconds)


async def _call(step: Undoable[T]) -> T:
    """Run ``step``'s file work in a worker thread; if the caller is cancelled meanwhile, undo its result."""
    future = asyncio.ensure_future(asyncio.to_thread(step.fn))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        undo = step.undo

        def give_back(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                undo(done.result())

        future.add_done_callback(give_back)
        raise


async def _drive(op: Op[T], expand: Callable[[Any], Op[Any]] | None = None) -> T:
    """Run ``op`` on the event loop (:func:`mqcore.service.plans.run_async`), the twin of ``_local_waiters.drive``."""

    async def handle(step: Any) -> Any:
        if isinstance(step, Sleep):
            return await _sleep(step)
        if isinstance(step, Undoable):
            return await _call(step)
        if expand is None:
            raise TypeError(f"no handler for {step!r}")
        return await run_async(expand(step), asyncio.to_thread, handle)

    return await run_async(op, asyncio.to_thread, handle)


def _coroutine(
    method: Callable[Concatenate[LocalClient, P], T],
) -> Callable[Concatenate[AsyncLocalClient, P], Coroutine[Any, Any, T]]:
    """The :class:`AsyncLocalClient` method of a :class:`LocalClient` method: the same parameters, as a coroutine.

    A method written as an operation (LocalClient's ``_waits``: the calls that may wait) is
    driven on the event loop (:func:`_drive`); any other runs in ``asyncio.to_thread``.
    """
    operation: Callable[Concatenate[LocalClient, P], Op[T]] | None = getattr(method, OPERATION, None)
    if operation is None:

        async def threaded(self: AsyncLocalClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await asyncio.to_thread(method, self.sync, *args, **kwargs)

        return derive(threaded, method, add_self=False, operation=False)
    waiting = operation

    async def driven(self: AsyncLocalClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await _drive(waiting(self.sync, *args, **kwargs), self.sync.receiver.expand)

    return derive(driven, method, add_self=False, operation=False)


@documented_by(AsyncQueueClient)
class AsyncLocalClient(Operations, AsyncQueueClient):
    """:class:`LocalClient` with every method a coroutine, for asyncio programs.

    Its methods are the asyncio client interface, documented once in
    ``mqcore.client.api.AsyncQueueClient``.

    File work runs in ``asyncio.to_thread``; long polls and capacity waits
    are awaited on the event loop (woken by the inotify thread), so a waiting
    receive ties up no thread and never blocks the loop.

    Args:
        root: The queue root.
        fsync: As :class:`LocalClient`.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.sync = LocalClient(root, fsync=fsync)
        self.root = self.sync.root

    def __repr__(self) -> str:
        return f"AsyncLocalClient({self.root!r})"

    # -- the API: LocalClient's methods (docstrings: mqcore.client.api.QueueClient) --

    close = _coroutine(LocalClient.close)

    @classmethod
    def _make_method(cls, name: str, op: Callable[..., Any]) -> Callable[..., Any]:
        """The method ``name`` of the table: LocalClient's method of that name, as a coroutine."""
        return _coroutine(getattr(LocalClient, name))
