"""daemons._wakes.Wake: the timed wait of a long poll ends by its timer or by a firing, never by a cancel."""

from __future__ import annotations

import asyncio

from daemons._wakes import Wake


async def _timed(wake: Wake, seconds: float) -> tuple[bool, float]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    woken = await wake.wait_for(seconds)
    return woken, loop.time() - t0


def test_a_wait_nobody_wakes_ends_unwoken_at_its_time_and_the_task_is_not_cancelled() -> None:
    async def main() -> tuple[bool, float, int]:
        wake = Wake()
        task = asyncio.create_task(_timed(wake, 0.2))
        woken, took = await task
        return woken, took, task.cancelling()

    woken, took, cancelling = asyncio.run(main())
    assert woken is False
    assert took >= 0.19
    assert cancelling == 0


def test_a_firing_wakes_every_timed_and_plain_waiter() -> None:
    async def main() -> list[object]:
        wake = Wake()
        timed = [asyncio.create_task(_timed(wake, 30)) for _ in range(3)]
        plain = asyncio.create_task(wake.wait())
        await asyncio.sleep(0.05)
        wake.set()
        return [*(t[0] for t in await asyncio.gather(*timed)), await plain]

    assert asyncio.run(main()) == [True, True, True, True]


def test_an_event_set_before_the_wait_answers_at_once_and_a_zero_wait_answers_its_state() -> None:
    async def main() -> tuple[bool, bool, bool]:
        unset = Wake()
        zero = await unset.wait_for(0)
        done = Wake()
        done.set()
        return zero, await done.wait_for(0), await done.wait_for(20)

    assert asyncio.run(main()) == (False, True, True)


def test_a_cancelled_wait_raises_and_leaves_no_waiter_behind() -> None:
    async def main() -> tuple[bool, bool]:
        wake = Wake()
        task = asyncio.create_task(wake.wait_for(30))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        else:
            cancelled = False
        left = bool(wake._timed)
        wake.set()  # nothing left to wake: no error on a cancelled future
        return cancelled, left

    assert asyncio.run(main()) == (True, False)
