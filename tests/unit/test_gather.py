"""When a group commit's round starts (``mqcore/protocol/_fs.py`` ``Gather``; ``docs/protocol.md`` 6.2).

A round that follows another waits until enough callers gathered (or a time passed since the round before
it ended); a caller that finds nobody leading is synced at once. The rounds' system call here is a
function that counts its callers and, for the first round, waits until the test lets it end, so the
test decides who arrives while a round runs.
"""

from __future__ import annotations

import threading
import time

from mqcore.protocol._fs import Done, Gather, join_or_lead
from tests.unit.test_dirsyncer import JOIN_TIMEOUT_SECONDS


class Rounds:
    """A group commit under test: :meth:`call` is ``join_or_lead``; each round's callers are recorded."""

    def __init__(self, gather: Gather) -> None:
        self.gather = gather
        self.cond = threading.Condition(threading.Lock())
        self.later: dict[str, list[Done]] = {}
        self.first_may_end = threading.Event()
        self.first_running = threading.Event()
        self.rounds: list[int] = []  # callers covered, per round
        self.outcomes: dict[int, OSError | None] = {}
        self.called = threading.Event()
        self._pending = 0

    def call(self, n: int) -> None:
        def done(error: OSError | None) -> None:
            self.outcomes[n] = error
            self.called.set()

        with self.cond:
            self._pending += 1
        join_or_lead(self.cond, self.later, "", done, self._sync, "syncfs", self.gather)

    def _sync(self, _key: str) -> None:
        with self.cond:
            self.rounds.append(self._pending)
            self._pending = 0
        if len(self.rounds) == 1:
            self.first_running.set()
            assert self.first_may_end.wait(JOIN_TIMEOUT_SECONDS)


def _stop(rounds: Rounds, leader: threading.Thread) -> None:
    """End the leader's wait for callers that will not come, and join it."""
    with rounds.cond:
        rounds.gather.seconds = 0.0
        rounds.cond.notify()
    leader.join(JOIN_TIMEOUT_SECONDS)
    assert not leader.is_alive(), "the leader hung"


def _lead(rounds: Rounds) -> threading.Thread:
    leader = threading.Thread(target=rounds.call, args=(0,))
    leader.start()
    assert rounds.first_running.wait(JOIN_TIMEOUT_SECONDS)
    return leader


def test_a_caller_that_finds_nobody_leading_is_synced_without_waiting_for_others():
    rounds = Rounds(Gather(files=2, seconds=3600.0))
    rounds.first_may_end.set()
    leader = threading.Thread(target=rounds.call, args=(0,))
    leader.start()
    assert rounds.called.wait(JOIN_TIMEOUT_SECONDS), "a lone caller waited for others"
    assert rounds.outcomes == {0: None}
    assert rounds.rounds == [1]
    _stop(rounds, leader)  # it waits for the callers of a next round until then


def test_a_round_that_follows_another_starts_once_enough_callers_gathered():
    rounds = Rounds(Gather(files=3, seconds=3600.0))
    leader = _lead(rounds)
    rounds.call(1)  # a round is running: these two are left for the next one and return at once
    rounds.call(2)
    rounds.first_may_end.set()
    time.sleep(0.2)  # room for a leader that did not wait to run a round of two
    rounds.call(3)
    _stop(rounds, leader)
    assert rounds.rounds == [1, 3]  # callers 1-3 in one round
    assert rounds.outcomes == {0: None, 1: None, 2: None, 3: None}


def test_a_caller_that_comes_just_after_a_round_ended_joins_the_leaders_next_round():
    rounds = Rounds(Gather(files=1, seconds=3600.0))
    leader = _lead(rounds)
    rounds.first_may_end.set()
    time.sleep(0.2)  # the first round has ended, with nobody left for the next
    rounds.call(1)  # returns at once: the leader, still leading, runs its round
    _stop(rounds, leader)
    assert rounds.rounds == [1, 1]
    assert rounds.outcomes == {0: None, 1: None}


def test_a_round_that_follows_another_starts_when_the_gather_time_passed():
    rounds = Rounds(Gather(files=100, seconds=0.05))
    leader = _lead(rounds)
    rounds.call(1)
    rounds.first_may_end.set()
    leader.join(JOIN_TIMEOUT_SECONDS)
    assert not leader.is_alive(), "the leader waited for callers that never came"
    assert rounds.rounds == [1, 1]
    assert rounds.outcomes == {0: None, 1: None}
