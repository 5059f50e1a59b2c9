"""``syncfs`` rounds shared by the processes of one host on one filesystem (``mq --processes N``).

Each process runs its own group commit of ``syncfs`` (:class:`mqcore.protocol._fs.FsSyncer`); without
sharing, N processes make up to N times the ``syncfs`` calls for the same sends, each of which writes
back the whole filesystem. With a :class:`SharedRounds` file the processes number their rounds in
one sequence and run them one at a time, and a process's leader whose files were all closed before
another process's round *started* takes that round's outcome instead of running one of its own.

The file (made by :func:`create`, mapped by every process) holds five 64-bit counters:

- ``started``: rounds started so far (a round's number is the value it set);
- ``finished``: the number of the last round that ended;
- ``failures``: rounds that failed so far, every process's (the shared epoch of ``FsSyncer``'s rule);
- ``last_errno``: the errno of round ``finished`` (0: it succeeded);
- ``failed_errno``: the errno of the last round that failed (0: none yet).

Two POSIX record locks on the file order the steps: byte 0 guards the counters (held for a few
loads and stores), byte 1 is held by the process running a round, for the whole ``syncfs``. A
leader (:meth:`SharedRounds.round`):

1. reads ``started`` as ``s`` (under the counters' lock), after every file it covers was closed;
2. takes the round lock (waiting while another process's round runs);
3. reads ``finished`` as ``f``: if ``f > s``, round ``f`` started after step 1, so after its files were
   closed, and it has ended: its outcome (``last_errno``) is this leader's, no ``syncfs`` is made;
4. else sets ``started = f + 1``, calls ``syncfs``, then sets ``last_errno``, on an error also
   ``failed_errno`` and ``failures + 1``, and ``finished`` to its number (before it releases the round
   lock, so before any process can take the round's outcome);
5. releases the round lock.

Record locks are per process, so one thread per process may lead at a time (``FsSyncer`` has one
leader per process). A process killed while holding a lock loses it (the kernel releases record locks
of a dead process), so a crash never blocks the others; a round it started and never ended leaves
``started > finished`` only until the next leader sets ``started = finished + 1`` again: its number is
reused, and no process ever took its outcome.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from collections.abc import Callable

#: The file's layout: started, finished, failures, last_errno, failed_errno (native 64-bit, aligned).
_LAYOUT = struct.Struct("=5q")
_STARTED, _FINISHED, _FAILURES, _ERRNO, _FAILED_ERRNO = range(5)


def create(path: str) -> None:
    """Make the shared file with every counter 0 (the supervisor, before it starts any process)."""
    with open(path, "wb") as fh:
        fh.write(bytes(_LAYOUT.size))


class SharedRounds:
    """One process's view of the shared round counters of :func:`create`'s file.

    Args:
        path: The file :func:`create` made.
    Raises:
        OSError: The file cannot be opened or mapped.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(self._fd, _LAYOUT.size)
        except BaseException:
            os.close(self._fd)
            raise

    def _get(self, index: int) -> int:
        return int(struct.unpack_from("=q", self._map, 8 * index)[0])

    def _set(self, index: int, value: int) -> None:
        struct.pack_into("=q", self._map, 8 * index, value)

    def failures(self) -> int:
        """Rounds failed so far in every process sharing the file (an aligned 64-bit load: no lock)."""
        return self._get(_FAILURES)

    def round(self, sync: Callable[[], int]) -> tuple[int, bool]:
        """Make every file closed before this call durable: by another process's round, or by ``sync``.

        Args:
            sync: One ``syncfs``: returns 0, or the errno of its failure.
        Returns:
            (0 or the errno of the round that covered the caller, True if that round was another
            process's). The caller must call this only once the files it covers are closed.
        Raises:
            OSError: A lock on the file failed (the caller's round then fails).
        """
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
        try:
            seen = self._get(_STARTED)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, 1)  # the round lock: another process's round may be running
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
            try:
                finished = self._get(_FINISHED)
                if finished > seen:  # started after ``seen`` was read, so after the caller's files were closed
                    return self._get(_ERRNO), True
                number = finished + 1
                self._set(_STARTED, number)
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            code = sync()
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
            try:
                self._set(_ERRNO, code)
                if code:
                    self._set(_FAILED_ERRNO, code)
                    self._set(_FAILURES, self._get(_FAILURES) + 1)
                self._set(_FINISHED, number)
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            return code, False
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 1)

    def failed_errno(self) -> int:
        """The errno of the last round that failed in any process (0: none yet)."""
        return self._get(_FAILED_ERRNO)

    def close(self) -> None:
        """Unmap the file and close it (no round may start after this)."""
        self._map.close()
        os.close(self._fd)
