"""A quicker constructor for a frozen slots dataclass, for the types every message makes (issue 12, stop 24).

A ``@dataclass(frozen=True, slots=True)`` sets each field in its ``__init__`` through
``object.__setattr__`` (its own ``__setattr__`` refuses every assignment): a
:class:`~mqcore.model.ReceivedMessage`, 13 fields, cost 2.2 µs to build on this machine against
0.4 µs for the same class unfrozen, and every receive makes one per message (a receipt handle
checked at a delete makes two more frozen objects). :func:`frozen_builder` gives a constructor
that builds the same object through an unfrozen twin of the class (the same fields and slots, in
the same order) and then sets the object's ``__class__`` to the frozen class: the object is an
instance of the frozen class from then on, equal to, hashing as and as immutable as one made by
its own ``__init__``. The twin is never seen outside the builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["frozen_builder"]


def frozen_builder(cls: type[T]) -> Callable[..., T]:
    """A constructor of ``cls`` taking its fields positionally, in order (those with defaults may be left out).

    Args:
        cls: A ``@dataclass(frozen=True, slots=True)`` class without a base class of its own,
            ``__post_init__``, ``InitVar``, keyword-only or ``init=False`` fields.
    Returns:
        ``build(*fields) -> cls``: the object ``cls(*fields)`` makes (its defaults and default
        factories included), made without the frozen ``__init__``'s ``object.__setattr__`` per field.
    Raises:
        TypeError: ``cls`` is not such a class (checked once, here).
    """
    params = getattr(cls, "__dataclass_params__", None)
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    if (
        params is None
        or not params.frozen
        or "__slots__" not in cls.__dict__
        or cls.__bases__ != (object,)
        or hasattr(cls, "__post_init__")
        or any(not f.init or f.kw_only for f in fields)
        or tuple(f.name for f in fields) != tuple(cls.__dict__["__slots__"])
    ):
        raise TypeError(f"{cls.__name__} is not a plain frozen slots dataclass")
    namespace: dict[str, Any] = {"__annotations__": {f.name: f.type for f in fields}, "__module__": cls.__module__}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            namespace[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f.name] = dataclasses.field(default_factory=f.default_factory)
    twin: Any = dataclasses.dataclass(slots=True, eq=False, repr=False, match_args=False)(
        type(f"_{cls.__name__}Building", (), namespace)
    )

    def build(*values: Any) -> T:
        made = twin(*values)
        made.__class__ = cls  # the same slots in the same order: from here on a frozen cls
        return made  # type: ignore[no-any-return]

    build.__doc__ = f"{cls.__name__}(*fields), positional, made through an unfrozen twin (mqcore._frozen)."
    return build
