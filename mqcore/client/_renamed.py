"""Old keyword names of the client methods, still accepted for one release with a DeprecationWarning.

The client interface took SQS's words (docs/glossary.md); a keyword renamed there keeps working
here for one release so callers can move at their pace. One decorator serves the sync and the
async clients alike.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def renamed_keyword(old: str, new: str, *, removed_in: str) -> Callable[[_F], _F]:
    """Method decorator: accept the keyword ``old`` as ``new``, with a DeprecationWarning.

    The wrapped method keeps its signature (``inspect.signature`` and ``typing.get_type_hints``
    see the new name) and stays a coroutine function if it was one.

    Args:
        old: The keyword's former name, e.g. ``"timeout_seconds"``.
        new: Its name now, e.g. ``"visibility_timeout_seconds"``.
        removed_in: The release that stops accepting ``old`` (said in the warning).
    Raises:
        TypeError: (at call time) both ``old`` and ``new`` given.
    """

    def moved(kwargs: dict[str, Any]) -> dict[str, Any]:
        if old in kwargs:
            if new in kwargs:
                raise TypeError(f"give {new}= only (not also its deprecated name {old}=)")
            warnings.warn(
                f"{old}= is deprecated, use {new}= (docs/glossary.md); {old}= goes in {removed_in}",
                DeprecationWarning,
                stacklevel=3,
            )
            kwargs[new] = kwargs.pop(old)
        return kwargs

    def decorate(function: _F) -> _F:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await function(*args, **moved(kwargs))

            return async_wrapper  # type: ignore[return-value]  # same signature as function (functools.wraps)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **moved(kwargs))

        return wrapper  # type: ignore[return-value]  # same signature as function (functools.wraps)

    return decorate


def renamed_attribute(old: str, new: str, *, removed_in: str) -> property:
    """A read-only property ``old`` that returns attribute ``new``, with a DeprecationWarning.

    Args:
        old: The attribute's former name, e.g. ``"visible_at_ms"`` (for the warning).
        new: Its name now, e.g. ``"visibility_deadline_ms"``.
        removed_in: The release that drops ``old`` (said in the warning).
    """

    def get(self: object) -> Any:
        warnings.warn(
            f".{old} is deprecated, use .{new} (docs/glossary.md); .{old} goes in {removed_in}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, new)

    return property(get, doc=f"Deprecated name of ``{new}`` (goes in {removed_in}).")
