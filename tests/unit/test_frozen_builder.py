"""mqcore._frozen.frozen_builder: the quick constructor makes the same frozen objects as the class's own __init__."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqcore._frozen import frozen_builder
from mqcore.model import ReceivedMessage, received_message
from mqcore.names import InFlightName, ReceiptHandle, in_flight_name, parse_in_flight_name

_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"

_texts = st.text(max_size=20)
_maps = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)


@given(
    queue=_texts,
    body=st.binary(max_size=50),
    count=st.integers(1, 10**6),
    deadline=st.integers(0, 10**13),
    attributes=_maps,
    first=st.integers(0, 10**13),
    source=st.none() | _texts,
    types=_maps,
)
def test_a_built_message_is_the_one_its_class_makes(queue, body, count, deadline, attributes, first, source, types):
    args = (queue, _ID, body, "text/plain", count, deadline, "name", attributes, first, source, types)
    made = ReceivedMessage(*args)
    built = received_message(*args)
    assert type(built) is ReceivedMessage
    assert built == made
    assert repr(built) == repr(made)
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    assert pickle.loads(pickle.dumps(built)) == made
    assert copy.copy(built) == made
    assert dataclasses.replace(built, receive_count=count + 1) == dataclasses.replace(made, receive_count=count + 1)


def test_a_built_object_is_as_frozen_as_one_its_class_makes():
    built = received_message("q", _ID, b"x", "text/plain", 1, 2, "name")
    assert built.attributes == {} and built.group_id is None  # the defaults and default factories
    assert built.attributes is not received_message("q", _ID, b"x", "text/plain", 1, 2, "name").attributes
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.queue = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.body  # type: ignore[misc]
    made = ReceivedMessage("q", _ID, b"x", "text/plain", 1, 2, "name")
    for obj in (built, made):  # a new attribute: refused alike (CPython's frozen slots classes raise TypeError)
        with pytest.raises((AttributeError, TypeError)):
            obj.extra = 1  # type: ignore[attr-defined]
        assert not hasattr(obj, "extra")
    with pytest.raises(TypeError):
        received_message("q", _ID)  # too few fields: the class's own error


def test_the_names_parsed_through_the_builder_are_their_classes():
    name = in_flight_name(1_700_000_000_000, "orders", _ID, 3, "0123456789abcdef0")
    parsed = parse_in_flight_name(name)
    assert type(parsed) is InFlightName
    assert parsed == InFlightName(1_700_000_000_000, "orders", _ID, 3, "0123456789abcdef0")  # type: ignore[arg-type]
    handle = ReceiptHandle.parse(name, "orders")
    assert type(handle) is ReceiptHandle and handle == ReceiptHandle(name, parsed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.text = "x"  # type: ignore[misc]


def test_only_plain_frozen_slots_dataclasses_are_taken():
    @dataclasses.dataclass(slots=True)
    class Unfrozen:
        a: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = dataclasses.field(kw_only=True)

    for cls in (Unfrozen, NoSlots, Checked, KeywordOnly, int):
        with pytest.raises(TypeError):
            frozen_builder(cls)
