"""daemons._runtime.run sets the garbage collector's generation-0 threshold every daemon runs with (issue 12)."""

from __future__ import annotations

import subprocess
import sys

from daemons._runtime import GC_GEN0_THRESHOLD

# A daemon's main as _runtime.run runs it (uvloop, in a fresh interpreter): what the collector's thresholds are there.
PROGRAM = """
import gc
from daemons import _runtime

async def main():
    print(*gc.get_threshold())
    return 0

raise SystemExit(_runtime.run(main))
"""


def test_a_daemon_loop_runs_with_the_raised_generation_0_threshold_and_default_older_ones() -> None:
    defaults = subprocess.run(
        [sys.executable, "-c", "import gc; print(*gc.get_threshold())"], capture_output=True, text=True, check=True
    )
    _, gen1, gen2 = (int(x) for x in defaults.stdout.split())
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True)
    assert [int(x) for x in done.stdout.split()] == [GC_GEN0_THRESHOLD, gen1, gen2]
    assert GC_GEN0_THRESHOLD > 700  # Python's own default, which promoted every long poll's objects
