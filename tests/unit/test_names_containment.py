"""Hypothesis over the parsers of client-given names (queue names, message ids, receipt handles):
whatever text a client sends, a name that is accepted builds paths that stay exactly one level
inside their directory of the root; traversal, NUL, separators, ``..``, look-alike unicode and
overlong names are refused (docs/security.md: nothing outside the root is ever named)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqcore.errors import InvalidMessageId, InvalidQueueName, InvalidReceiptHandle
from mqcore.names import (
    Layout,
    check_message_id,
    check_queue_name,
    parse_receipt_handle,
)

ROOT = "/srv/mq-root"
LAYOUT = Layout(ROOT)

#: Strings an attacker would try, alone or glued to random text.
NASTY = [
    "..", ".", "/", "\\", "\x00", "%2e%2e", "%2f", "..%2f", "..\\", "\u2025", "\uff0e\uff0e", "\u2215",
    "\ufe52", "\u0000", "~", "*", "?", "\n", " ", "a" * 81, "A" * 1000, "\u00e9", "\uff51", "\udcff",
]  # fmt: skip
nasty_text = st.one_of(
    st.text(max_size=120),
    st.sampled_from(NASTY),
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=10)), max_size=8).map("".join),
)


def _inside(path: str, directory: str) -> bool:
    """True if ``path`` is a direct child of ``directory`` after normalisation."""
    real = os.path.normpath(path)
    return os.path.dirname(real) == os.path.normpath(directory) and real == path


def _plain(name: str) -> None:
    assert name and "/" not in name and "\x00" not in name and name not in (".", "..")
    assert name.isascii() and name.isprintable()


@settings(max_examples=250)
@given(nasty_text)
def test_queue_names_never_escape_the_root(text: str) -> None:
    try:
        queue = check_queue_name(text)
    except InvalidQueueName:
        return
    _plain(queue)
    assert len(queue) <= 80
    assert _inside(LAYOUT.queue_dir(queue), LAYOUT.queues)
    assert _inside(LAYOUT.attempt_path(queue, "0" * 64), LAYOUT.attempts)


@settings(max_examples=250)
@given(nasty_text)
def test_message_ids_never_escape_the_root(text: str) -> None:
    try:
        message_id = check_message_id(text)
    except InvalidMessageId:
        return
    _plain(message_id)
    assert _inside(LAYOUT.ready_path(check_queue_name("q"), message_id, 0), LAYOUT.queue_dir(check_queue_name("q")))
    assert _inside(LAYOUT.new_path(check_queue_name("q"), message_id), LAYOUT.new)


@settings(max_examples=250)
@given(nasty_text)
def test_receipt_handles_never_escape_the_root(text: str) -> None:
    try:
        parsed = parse_receipt_handle(text)
    except InvalidReceiptHandle:
        return
    _plain(text)
    assert _inside(LAYOUT.delay_path(text), LAYOUT.delay)
    assert _inside(LAYOUT.queue_dir(parsed.queue), LAYOUT.queues)


@pytest.mark.parametrize("text", [*NASTY, "../queues", "q/../../etc", "q\x00", "Q" * 81])
def test_known_attacks_are_refused(text: str) -> None:
    for check, error in (
        (check_queue_name, InvalidQueueName),
        (check_message_id, InvalidMessageId),
        (parse_receipt_handle, InvalidReceiptHandle),
    ):
        with pytest.raises(error):
            check(text)


def test_non_strings_are_refused() -> None:
    for value in (None, 1, b"q", ["q"]):
        with pytest.raises(InvalidQueueName):
            check_queue_name(value)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageId):
            check_message_id(value)  # type: ignore[arg-type]
        with pytest.raises(InvalidReceiptHandle):
            parse_receipt_handle(value)  # type: ignore[arg-type]
