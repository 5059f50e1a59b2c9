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


class _Runner:
    """One run of a plan: the next operation, or the result once the plan returned."""

    def __init__(self, plan: Plan[Any]) -> None:
        self.plan = plan
        self.op: Any = None
        self.value: Any = None
        self._result: Any = None
        self._error: BaseException | None = None

    def advance(self) -> bool:
        """Give the plan the last result (or throw the last error into it); True once it returned."""
        error, self._error = self._error, None
        try:
            self.op = self.plan.throw(error) if error is not None else self.plan.send(self._result)
        except StopIteration as stop:
            self.value = stop.value
            return True
        return False

    def answer(self, result: Any) -> None:
        self._result = result

    def fail(self, error: BaseException) -> None:
        self._result, self._error = None, error


def run_sync(plan: Plan[R], handle: Callable[[Any], Any] | None = None) -> R:
    """Run ``plan`` in this thread: :class:`Blocking` inline, any other operation by ``handle(op)``.

    An operation's error, KeyboardInterrupt included, is thrown into the plan first (its
    ``finally`` and ``except BaseException`` clauses run, and may still yield file work), as
    :func:`run_async` does with a cancellation.

    Returns:
        What the plan returns.
    Raises:
        What the plan raises.
    """
    run = _Runner(plan)
    while not run.advance():
        try:
            if isinstance(run.op, Blocking):
                run.answer(run.op.fn())
            elif handle is None:
                raise TypeError(f"no handler for {run.op!r}")
            else:
                run.answer(handle(run.op))
        except BaseException as exc:  # noqa: BLE001  # thrown into the plan, which re-raises what it does not handle
            run.fail(exc)
    return run.value  # type: ignore[no-any-return]


async def run_async(
    plan: Plan[R], blocking: Callable[[Callable[[], Any]], Awaitable[Any]], handle: Callable[[Any], Awaitable[Any]]
) -> R:
    """Run ``plan`` in a coroutine: ``await blocking(op.fn)`` for :class:`Blocking`, ``await handle(op)`` otherwise.

    Cancelling the coroutine throws the cancellation into the plan (its ``finally``
    and ``except BaseException`` clauses run, and may still yield file work)
    and the plan raises it again.
    """
    run = _Runner(plan)
    while not run.advance():
        op = run.op
        try:
            run.answer(await (blocking(op.fn) if isinstance(op, Blocking) else handle(op)))
        except BaseException as exc:  # noqa: BLE001  # thrown into the plan, which re-raises what it does not handle
            run.fail(exc)
    return run.value  # type: ignore[no-any-return]
