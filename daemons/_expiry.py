"""mq-reaper's expiry sweep of the queue directories: paced, skipping those that cannot hold anything gone.

An expiry sweep used to list every queue directory once a minute: at
1,000,000 ready messages that was 0.5-0.7 s of mq-reaper's CPU in one second
beside a draining mq (which lost a quarter of its CPU that second), and with
10,000 idle queues a listing and two metadata reads per queue kept mq-reaper
at a few percent of a core while nothing happened (issue 12,
docs/performance.md "The drain after a restart; mq-reaper's sweep").

- **Skipped while unchanged.** After a complete sweep of a queue, its
  directory's change stamp (taken before the listing) and the time before
  which nothing it left can be gone (:attr:`mqcore.protocol.sweeps.QueueSweep.due_ms`)
  are kept. A later sweep lists the queue only when the stamp differs (any
  entry added, removed or renamed over: a send, a lease, a redelivery, a
  purge's marker, an attribute change), when that time has come, when the
  stamp was too recent to be trusted (the coarse clock of a directory's
  mtime may hide a change made in the same tick), or on the queue's turn,
  one sweep in :data:`RELIST_SWEEPS` (a safety net). One ``stat`` per
  queue, all of them in one worker-thread call.
- **Paced.** A queue is read in chunks (:meth:`mqcore.protocol.sweeps.Sweeps.sweep_queue`);
  between two chunks, and after each queue, the worker thread sleeps so
  that the sweep uses at most :data:`SWEEP_CPU_SHARE` of a core (its own
  thread's CPU time, from ``time.thread_time``). Not the first sweep after
  mq-reaper starts, which lists every queue anyway: paced, it kept start-up
  work going for 18 s at 1,000,000 ready messages (issue 12's start-up
  figures), at full speed it takes about 1.8 s.

Nothing of this is on disk: a restarted mq-reaper lists every queue at its
first sweep, as before.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Callable

from mqcore.fsinfo import dir_stamp, settled_dir_stamp
from mqcore.names import QueueName
from mqcore.protocol import Store
from mqcore.protocol.sweeps import QueueSweep

#: Share of one core an expiry sweep's worker thread may use (it sleeps the rest).
SWEEP_CPU_SHARE = 0.1
#: A queue is listed whatever its stamp once in this many sweeps (its turn: the crc32 of its name; 30 min at 60 s).
RELIST_SWEEPS = 30
#: ``(st_ino, st_mtime_ns, st_ctime_ns)`` of a directory (:func:`mqcore.fsinfo.dir_stamp`).
Stamp = tuple[int, int, int]


class CpuShare:
    """A pause for a worker thread that keeps its CPU time to ``share`` of its wall time.

    Call :meth:`begin` at the start of a worker-thread call, the instance
    between chunks of work, and :meth:`end` at its end: each sleeps
    ``(1 / share - 1)`` times the thread's CPU time since the last of them.

    Args:
        share: Fraction of a core, in (0, 1].
        stop: When set, the pause returns False at once (the caller ends its work).
    """

    def __init__(self, share: float, stop: Callable[[], bool]) -> None:
        self.factor = 1.0 / share - 1.0
        self.stop = stop
        self._local = threading.local()
        #: Seconds slept so far, by every thread.
        self.slept = 0.0

    def begin(self) -> None:
        """Start counting this thread's CPU time."""
        self._local.mark = time.thread_time()

    def __call__(self) -> bool:
        """Sleep in proportion to the CPU time used since the last call; False if the sweep should stop."""
        if self.stop():
            return False
        used = time.thread_time() - getattr(self._local, "mark", time.thread_time())
        if used > 0 and self.factor > 0:
            wait = used * self.factor
            time.sleep(wait)
            self.slept += wait
        self._local.mark = time.thread_time()
        return not self.stop()

    end = __call__


class SweptQueues:
    """What the last complete sweep of each queue found: its directory's stamp and when something can be gone.

    The methods that touch the disk run in a worker thread; :meth:`note`
    and :meth:`keep_only` on the event loop.
    """

    def __init__(self) -> None:
        self._swept: dict[QueueName, tuple[Stamp, int | None]] = {}
        #: Sweeps begun (:meth:`to_sweep` calls): the turn of :data:`RELIST_SWEEPS`.
        self.sweeps = 0

    def __len__(self) -> int:
        return len(self._swept)

    def to_sweep(self, store: Store, queues: list[QueueName], now: int) -> list[QueueName]:
        """Worker thread: those of ``queues`` that a sweep at ``now`` (epoch ms) must list, in order.

        One ``stat`` of each remembered queue's directory; a queue never swept,
        whose stamp changed (or cannot be read), whose ``due_ms`` has come, or
        whose turn it is, is listed.
        """
        turn = self.sweeps % RELIST_SWEEPS
        self.sweeps += 1
        out = []
        for queue in queues:
            kept = self._swept.get(queue)
            if kept is None or zlib.crc32(queue.encode()) % RELIST_SWEEPS == turn:
                out.append(queue)
                continue
            stamp, due = kept
            try:
                same = dir_stamp(store.layout.queue_dir(queue)) == stamp
            except OSError:
                same = False  # gone or unreadable: the sweep finds out which
            if not same or (due is not None and due <= now):
                out.append(queue)
        return out

    @staticmethod
    def sweep(store: Store, queue: QueueName, pause: CpuShare) -> tuple[QueueSweep, Stamp | None]:
        """Worker thread: stamp ``queue``'s directory, then sweep it paced by ``pause``.

        Returns:
            What the sweep did, and the stamp taken before its listing (None if it
            cannot be trusted: not settled (:func:`mqcore.fsinfo.settled_dir_stamp`), or the directory could not
            be read).
        Raises:
            OSError, MQError: As :meth:`mqcore.protocol.sweeps.Sweeps.sweep_queue`.
        """
        pause.begin()
        stamp: Stamp | None = None
        with contextlib.suppress(OSError):
            taken, settled = settled_dir_stamp(store.layout.queue_dir(queue))
            stamp = taken if settled else None
        try:
            return store.sweep_queue(queue, pause), stamp
        finally:
            pause.end()

    def note(self, queue: QueueName, result: QueueSweep, stamp: Stamp | None, now: int) -> None:
        """Remember a sweep of ``queue`` (event loop); forget the queue if it must be listed next time anyway."""
        if stamp is None or (result.due_ms is not None and result.due_ms <= now):
            self._swept.pop(queue, None)
        else:
            self._swept[queue] = (stamp, result.due_ms)

    def forget(self, queue: QueueName) -> None:
        """List ``queue`` at the next sweep whatever its stamp (its sweep failed; event loop)."""
        self._swept.pop(queue, None)

    def keep_only(self, queues: list[QueueName]) -> None:
        """Forget the queues not in ``queues`` (deleted since; event loop)."""
        if len(self._swept) > len(queues):
            listed = set(queues)
            for queue in [q for q in self._swept if q not in listed]:
                del self._swept[queue]
