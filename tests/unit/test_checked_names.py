"""Queue names are remembered once checked, but every answer stays the regex's (issue 12, stop 23)."""

from __future__ import annotations

import os

import pytest

from mqcore.errors import InvalidQueueName
from mqcore.names import Layout, check_queue_name


class _Lying(str):
    """A str whose hash and equality claim to be another (valid) name's."""

    def __hash__(self) -> int:
        return hash("orders")

    def __eq__(self, other: object) -> bool:
        return True

    __ne__ = str.__ne__


def test_a_name_checked_before_still_answers_as_the_regex() -> None:
    assert check_queue_name("orders") == "orders"
    assert check_queue_name("orders") == "orders"  # remembered
    for bad in ("../orders", "orders/", "", "a" * 81, "orders.fifo.fifo", "ord ers"):
        with pytest.raises(InvalidQueueName):
            check_queue_name(bad)
        with pytest.raises(InvalidQueueName):  # refused again: a refusal is never remembered
            check_queue_name(bad)


def test_a_str_subclass_is_never_taken_for_a_remembered_name() -> None:
    check_queue_name("orders")
    with pytest.raises(InvalidQueueName):
        check_queue_name(_Lying("../../etc"))


def test_delay_and_remove_paths_stay_inside_their_directories(tmp_path: object) -> None:
    layout = Layout(str(tmp_path))
    for name in ("/etc/passwd", "x"):
        assert os.path.dirname(layout.delay_path(name)).startswith(layout.delay)
        assert layout.remove_path(name).startswith(layout.remove + "/")
