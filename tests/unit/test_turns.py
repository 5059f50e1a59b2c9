"""The queues a shared filesystem's change checks look at, tick by tick (daemons/_turns.py, docs/api.md)."""

from __future__ import annotations

import itertools

from daemons._turns import CHANGE_CHECK_BATCH, QUIET_CHECK_SECONDS, CheckTurns
from mqcore.names import QueueName

QUEUES = [QueueName(f"q{i:04d}") for i in range(1000)]
#: A tick of exact binary fractions (1/16 s), so that loop times add up without rounding.
TICK = 0.0625


def ticks_picking(turns: CheckTurns, queue: QueueName, start: int, stop: int) -> list[int]:
    """The ticks in ``range(start, stop)`` at which ``turns`` picks ``queue`` (nothing waited on)."""
    return [t for t in range(start, stop) if queue in turns.pick(t * TICK, [], lambda: [queue])]


def test_idle_queues_take_turns_a_batch_a_tick_and_waited_ones_come_every_tick() -> None:
    turns = CheckTurns(TICK)
    seen: list[QueueName] = []
    for tick in range(len(QUEUES) // CHANGE_CHECK_BATCH):
        picked = turns.pick(tick * TICK, [QUEUES[999]], lambda: list(QUEUES))
        assert picked[0] == QUEUES[999]  # waited on: every tick
        assert len(picked) <= CHANGE_CHECK_BATCH + 1
        seen += picked[1:]
    assert set(seen) | {QUEUES[999]} == set(QUEUES)  # the first turns cover every indexed queue


def test_a_quiet_queues_gap_doubles_to_the_ceiling_and_a_change_brings_it_back_to_every_tick() -> None:
    turns = CheckTurns(TICK)
    queue = QUEUES[0]
    ceiling = round(QUIET_CHECK_SECONDS / TICK)
    picked = ticks_picking(turns, queue, 0, 8 * ceiling)
    gaps = [b - a for a, b in itertools.pairwise(picked)]
    assert gaps[:5] == [1, 2, 4, 8, 16]  # one tick, doubling ...
    assert gaps[-3:] == [ceiling] * 3  # ... up to QUIET_CHECK_SECONDS, never more
    assert all(g <= ceiling for g in gaps)
    at = 8 * ceiling
    turns.changed(queue, at * TICK)  # a check at that tick found it changed
    assert ticks_picking(turns, queue, at + 1, at + 8) == [at + 1, at + 3, at + 7]  # at once, then backing off


def test_a_busy_queue_is_checked_at_every_tick_and_a_forgotten_one_never() -> None:
    turns = CheckTurns(TICK)
    busy, forgotten, dropped = QUEUES[1], QUEUES[2], QUEUES[3]
    lookup = round(QUIET_CHECK_SECONDS / TICK)  # ticks between two looks at the indexed queues
    for t in range(300):
        indexed = [busy] + ([forgotten] if t <= 50 else []) + ([dropped] if t < 100 else [])
        picked = turns.pick(t * TICK, [], lambda indexed=indexed: indexed)
        assert busy in picked, t
        turns.changed(busy, t * TICK)  # every check finds it changed (another host sends all the time)
        if t == 50:
            turns.forget(forgotten)  # QueueStates.forget_queue
        assert t <= 50 or forgotten not in picked, t
        assert t < 100 + lookup or dropped not in picked, t  # no longer indexed: leaves the turns at the next look
    again = [t for t in range(300, 301 + lookup) if dropped in turns.pick(t * TICK, [], lambda: [dropped])]
    assert again, "indexed again: back in the turns at the next look"


def test_a_stamp_checked_outside_the_ticks_counts_for_one_tick() -> None:
    turns = CheckTurns(TICK)
    queue = QUEUES[3]
    assert queue in turns.pick(0.0, [queue], lambda: [queue])
    assert not turns.checked_within(queue, TICK / 2)  # the tick's check may still be under way
    turns.pick(TICK / 2, [], lambda: [queue])  # the next tick: that check is done
    assert turns.checked_within(queue, TICK / 2) and not turns.checked_within(queue, TICK)
    turns.checking(queue, 10.0)
    assert turns.checked_within(queue, 10.0 + TICK / 2)
    assert not turns.checked_within(queue, 10.0 + TICK)
