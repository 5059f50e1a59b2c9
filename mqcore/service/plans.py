"""Sans-I/O plans: a rule that interleaves file work with a driver's own work, written once as a generator.

A plan is a generator that yields *operations* and gets each one's result
back. :class:`Blocking` asks for blocking file work (the daemon runs it on a
worker thread; the brokerless client inline); other operations are the
driver's own (a receive that waits, moves under the daemon's fetcher lock,
a pause). The drivers are :func:`run_sync` and :func:`run_async`: each sends
results back, or throws the operation's exception into the plan, so the
plan's own ``try``/``except`` sees it. The style of ``mqcore/client/_http.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: A plan: yields operations, receives their results, returns ``R``.
Plan = Generator[Any, Any, R]

__all__ = ["Blocking", "Plan", "run_async", "run_sync"]


@dataclass(frozen=True, slots=True)
class Blocking(Generic[T]):
    """Blocking file work: call ``fn()`` where the driver runs such work and send back its result.

    Attributes:
        fn: The work (Store calls, no waiting).
    """

    fn: Callable[[], T]


def run_sync(plan: Plan[R], handle: Callable[[Any], Any] | None = None) -> R:
    """Run ``plan`` in this thread: :class:`Blocking` inline, any other operation by ``handle(op)``.

    Returns:
        The plan's result.
    Raises:
        Whatever the plan raises (an operation's error is thrown into the plan first).
    """
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = plan.throw(error) if error is not None else plan.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            if isinstance(op, Blocking):
                result = op.fn()
            elif handle is None:
                raise TypeError(f"no handler for {op!r}")
            else:
                result = handle(op)
        except Exception as exc:  # noqa: BLE001  # thrown into the plan, which re-raises what it does not handle
            error = exc


async def run_async(
    plan: Plan[R], blocking: Callable[[Callable[[], Any]], Awaitable[Any]], handle: Callable[[Any], Awaitable[Any]]
) -> R:
    """Run ``plan`` in a coroutine: :class:`Blocking` by ``await blocking(op.fn)``, others by ``await handle(op)``.

    Cancelling the coroutine throws the cancellation into the plan (its ``finally``
    and ``except BaseException`` clauses run) and re-raises it.

    Returns:
        The plan's result.
    Raises:
        Whatever the plan raises (an operation's error is thrown into the plan first).
    """
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = plan.throw(error) if error is not None else plan.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            result = await (blocking(op.fn) if isinstance(op, Blocking) else handle(op))
        except BaseException as exc:  # noqa: BLE001  # thrown into the plan, which re-raises what it does not handle
            error = exc
