"""daemons._inline.LoneOps.enter_now + settle (the hot receive's and delete's way in) answer as enter does."""

from __future__ import annotations

import asyncio
import itertools

from daemons._inline import LONE_STREAK, LoneOps


def lone_in(enabled: bool, active: int, streak: int, burst: int) -> LoneOps:
    lone = LoneOps(enabled)
    lone.active, lone.streak, lone.burst = active, streak, burst
    return lone


def counts(lone: LoneOps) -> tuple[int, int, int, int, int]:
    return lone.active, lone.streak, lone.entered, lone.inline, lone.burst


async def test_enter_now_then_settle_decides_and_counts_as_enter_in_every_state():
    states = itertools.product((True, False), (0, 1), (0, LONE_STREAK - 1, LONE_STREAK), (0, 1, 3))
    for enabled, active, streak, burst in states:
        by_enter = lone_in(enabled, active, streak, burst)
        by_now = lone_in(enabled, active, streak, burst)
        expected = await by_enter.enter()
        here = by_now.enter_now()
        if here is None:
            here = await by_now.settle()
        assert (here, counts(by_now)) == (expected, counts(by_enter)), (enabled, active, streak, burst)


async def test_enter_now_answers_none_only_when_a_yield_must_decide():
    assert lone_in(True, 0, LONE_STREAK, 0).enter_now() is None  # alone, nobody counted this iteration
    assert lone_in(True, 0, LONE_STREAK, 1).enter_now() is True  # counted on its connection, alone
    assert lone_in(True, 0, LONE_STREAK, 2).enter_now() is False  # arrived with another request
    assert lone_in(True, 1, LONE_STREAK, 0).enter_now() is False  # another operation in flight


async def test_a_settle_cancelled_during_its_yield_uncounts_the_operation():
    lone = lone_in(True, 0, LONE_STREAK, 0)
    assert lone.enter_now() is None
    task = asyncio.ensure_future(lone.settle())
    await asyncio.sleep(0)  # the task is at its yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert lone.active == 0
