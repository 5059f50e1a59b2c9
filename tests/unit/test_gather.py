"""When a group commit's round starts (``mqcore/protocol/_fs.py`` ``Gather``; ``docs/protocol.md`` 6.2).

A round that follows another waits until enough callers gathered (or a time passed since the first of
them); a caller that finds no round running is synced at once. The rounds' system call here is a
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
        self._pending = 0

    def call(self, n: int) -> None:
        def done(error: OSError | None) -> None:
            self.outcomes[n] = error

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


def _lead(rounds: Rounds) -> threading.Thread:
    leader = threading.Thread(target=rounds.call, args=(0,))
    leader.start()
    assert rounds.first_running.wait(JOIN_TIMEOUT_SECONDS)
    return leader


def test_a_caller_that_finds_no_round_running_is_synced_before_it_returns():
    rounds = Rounds(Gather(files=3, seconds=3600.0))
    rounds.first_may_end.set()
    caller = threading.Thread(target=rounds.call, args=(0,))
    caller.start()
    caller.join(JOIN_TIMEOUT_SECONDS)
    assert not caller.is_alive(), "a lone caller waited for others"
    assert rounds.outcomes == {0: None}
    assert rounds.rounds == [1]


def test_a_round_that_follows_another_starts_once_enough_callers_gathered():
    rounds = Rounds(Gather(files=3, seconds=3600.0))
    leader = _lead(rounds)
    rounds.call(1)  # a round is running: these two are left for the next one and return at once
    rounds.call(2)
    rounds.first_may_end.set()
    time.sleep(0.2)  # room for a leader that did not wait to run a round of two
    rounds.call(3)
    leader.join(JOIN_TIMEOUT_SECONDS)
    assert not leader.is_alive(), "the leader hung"
    assert rounds.rounds == [1, 3]  # callers 1-3 in one round
    assert rounds.outcomes == {0: None, 1: None, 2: None, 3: None}


def test_a_round_that_follows_another_starts_when_its_first_caller_waited_long_enough():
    rounds = Rounds(Gather(files=100, seconds=0.05))
    leader = _lead(rounds)
    rounds.call(1)
    rounds.first_may_end.set()
    leader.join(JOIN_TIMEOUT_SECONDS)
    assert not leader.is_alive(), "the leader waited for callers that never came"
    assert rounds.rounds == [1, 1]
    assert rounds.outcomes == {0: None, 1: None}
