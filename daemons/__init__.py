"""The three asyncio processes (mq, mq-mover, mq-reaper): thin wiring over mqcore.

A daemon asked to stop (SIGTERM, SIGINT) before it is ready exits 0, not "killed by signal 15":
this package is the first of ours that a daemon's process imports (``python -m daemons.reaper``
and the console scripts alike), so when the process was started as one of the daemons it puts
:func:`stop_early_on_signals` in place here, before the daemon's module and its dependencies are
imported; ``daemons._runtime.run`` puts it in place again (``mq --processes`` workers), and
``daemons._runtime.install_stop_signals`` replaces it with the orderly stop once the event loop
runs. Imported by anything else (tests, tools), the package changes no signal handling.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

#: The daemons' modules (``python -m ...``) and console scripts.
DAEMON_MODULES = frozenset({"daemons.front", "daemons.mover", "daemons.reaper", "daemons.stack"})
DAEMON_SCRIPTS = frozenset({"mq", "mq-mover", "mq-reaper", "mq-stack"})


def stop_early_on_signals() -> None:
    """Exit 0 at once on SIGTERM or SIGINT (until the daemon installs its orderly stop).

    Before a daemon is ready it has nothing to finish: every step of the protocol may be cut
    at any point (docs/protocol.md section 12), so exiting 0 at once (``os._exit``) from wherever
    the signal lands is a clean stop. Main thread only (where Python runs signal handlers).
    The signals are unblocked too: a daemon started by another (``mq --processes``, mq-stack) inherits
    its parent's mask, in which ``daemons._stopguard.forward_signals`` blocked them.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_early)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})


def _exit_early(signum: int, frame: FrameType | None) -> None:
    # os._exit, not SystemExit: raised from wherever the signal lands, SystemExit could be caught on
    # the way or wait for a start-up thread at the interpreter's exit (a stop once took over 20 s).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _started_as_daemon() -> bool:
    """True if this process is ``python -m daemons.X`` or one of the daemons' console scripts."""
    argv = sys.orig_argv
    if sys.argv[:1] == ["-m"]:  # the package is imported while ``-m`` looks for its module
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
        return module in DAEMON_MODULES
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in DAEMON_SCRIPTS


if _started_as_daemon():
    stop_early_on_signals()
