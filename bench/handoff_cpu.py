"""CPU per job of daemons._handoff.Handoff (issue 12, stop 18): one uvloop task hands ``--burst`` no-op
jobs at a time to one Handoff and awaits them, ``--rounds`` times; prints CPU and wall time per job.

Run it against two code trees alternately (the tree comes from PYTHONPATH or this checkout):

    for tree in /work/mq-base /work/mq-recv; do PYTHONPATH=$tree .venv/bin/python bench/handoff_cpu.py --burst 16; done
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import uvloop

from daemons._handoff import Handoff


def _job(x: int) -> int:
    return x


async def _measure(rounds: int, burst: int) -> str:
    handoff = Handoff("bench")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(handoff.run(_job, k) for k in range(burst)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    handoff.shutdown()
    jobs = rounds * burst
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw / jobs
    return (
        f"burst {burst}: cpu {cpu / jobs * 1e6:.2f} us/job, wall {wall / jobs * 1e6:.2f} us/job, "
        f"voluntary switches {switches:.3f}/job"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print one line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--burst", type=int, default=16)
    args = parser.parse_args(argv)
    print(uvloop.run(_measure(args.rounds, args.burst)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
