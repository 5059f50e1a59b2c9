"""The queues a shared filesystem's change checks look at, tick by tick (daemons/_turns.py, docs/api.md)."""

from __future__ import annotations

from daemons._turns import CHANGE_CHECK_BATCH, CHANGE_HOT_SECONDS, CheckTurns
from mqcore.names import QueueName

QUEUES = [QueueName(f"q{i:04d}") for i in range(1000)]
TICK = 0.05


def test_idle_queues_take_turns_a_batch_a_tick_and_waited_ones_come_every_tick() -> None:
    turns = CheckTurns()
    seen: list[QueueName] = []
    for tick in range(len(QUEUES) // CHANGE_CHECK_BATCH):
        picked = turns.pick(tick * TICK, [QUEUES[999]], lambda: list(QUEUES))
        assert picked[0] == QUEUES[999]  # waited on: every tick
        assert len(picked) <= CHANGE_CHECK_BATCH + 1
        seen += picked[1:]
    assert set(seen) | {QUEUES[999]} == set(QUEUES)  # one round covers every indexed queue


def test_a_queue_a_receive_found_empty_is_checked_every_tick_until_it_goes_quiet() -> None:
    turns = CheckTurns()
    turns.pick(0.0, [], lambda: list(QUEUES))  # the round's first batch: q0000-q0009
    polled = QUEUES[500]  # its turn is 50 ticks away
    turns.asked(polled, 0.0)
    for tick in range(1, 20):
        assert polled in turns.pick(tick * TICK, [], lambda: list(QUEUES))
    turns.asked(polled, 1.0)  # polled again: checked closely for another CHANGE_HOT_SECONDS
    assert polled in turns.pick(1.0 + CHANGE_HOT_SECONDS - TICK, [], lambda: list(QUEUES))
    later = turns.pick(1.0 + CHANGE_HOT_SECONDS + TICK, [], lambda: list(QUEUES))
    assert polled not in later  # quiet for longer than that: back to its turn
