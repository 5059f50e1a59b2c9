"""The send savers of the ``mq`` daemon: threads that write, fsync and publish sends, one loop wake-up per commit.

A send crosses between the event loop and a thread twice, whatever the
load: the loop puts a :class:`SaveJob` on a queue that the saver threads
take from (one wake-up of an idle saver, the one idle most recently: at a
low rate one warm thread does the work), and the results of every job a
directory fsync made durable come back to the loop together (one
``call_soon_threadsafe`` per group commit, not one per message, and none
while an earlier delivery is still waiting for the loop).

Each saver takes one file to write at a time (``new/Q.ID``: create, write,
fsync), so the files of a batch, and of concurrent sends, are fsynced in
parallel. The thread that writes a job's last file renames all the job's
files into place in entry order (a batch is never visible in part out of
order), then leaves the job with the directory's group commit
(:meth:`mqcore.protocol._fs.DirSyncer.sync_later`) and goes back to take
work: the thread that leads the directory's fsyncs completes every job its
round covered. A job's result is delivered only after its file fsyncs, its
renames and the fsync of each directory they went to (docs/protocol.md 6.2).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable

from mqcore.errors import MQError
from mqcore.names import MessageId, QueueName
from mqcore.protocol import PendingMessage, SendEntry, Store

#: A job's outcome: per entry its message id or its error.
Results = list[MessageId | MQError]


class SaveJob:
    """Messages of one request to store, and the future their results go to (loop thread creates it).

    Args:
        queue: The queue.
        entries: The messages (checked by the caller), in order.
        future: Resolved on the loop with :data:`Results` (or a bug's exception).
    """

    __slots__ = ("entries", "future", "ids", "left", "queue", "results", "unsynced", "written")

    def __init__(self, queue: QueueName, entries: list[SendEntry], future: asyncio.Future[Results]) -> None:
        self.queue = queue
        self.entries = entries
        self.future = future
        #: The entries' ids, taken in entry order by the first thread to take a file of the job (under
        #: the pool's lock), so the job keeps its order (FIFO) whichever write finishes first.
        self.ids: list[MessageId] = []
        self.results: Results = []
        #: Written files by entry index (None: the write failed).
        self.written: list[PendingMessage | None] = [None] * len(entries)
        #: Files still to write (under the pool's lock).
        self.left = len(entries)
        #: Directory fsyncs still to come (under the pool's lock).
        self.unsynced = 0


class SendSavers:
    """``workers`` saver threads for sends, and the one-wake-per-commit hand-back to the event loop.

    Args:
        store: The daemon's store.
        workers: Threads (``--workers``).
        loop: The event loop the results go back to.
    """

    def __init__(self, store: Store, workers: int, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        #: The savers' own lock (job counters and ids); the loop thread never takes it.
        self._lock = threading.Lock()
        # The loop thread must not block on a lock or make a system call here: every such point
        # releases the GIL, and getting it back behind eight busy savers costs up to the interpreter's
        # switch interval (5 ms). So the hand-offs use only operations that are atomic under the GIL
        # (deque.extend/popleft/append, list.append/pop/remove) and a parking lock per thread.
        #: Files to write, oldest first; None tells a thread to stop.
        self._work: collections.deque[tuple[SaveJob, int] | None] = collections.deque()
        #: The parking locks (held while parked) of the idle threads, the latest idle last.
        self._idle: list[threading.Lock] = []
        #: Jobs finished, waiting for the loop's :meth:`_deliver`.
        self._done: collections.deque[tuple[SaveJob, BaseException | None]] = collections.deque()
        #: A :meth:`_deliver` is scheduled and has not started draining ``_done`` yet.
        self._wake_pending = False
        self._threads = [
            threading.Thread(target=self._run, name=f"mq-send-saver-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, queue: QueueName, entries: list[SendEntry]) -> asyncio.Future[Results]:
        """Start storing ``entries`` in ``queue`` (loop thread); the future gets each entry's id or error.

        Takes no lock and makes no system call (see ``__init__``). An entry's error is a
        :class:`~mqcore.errors.QueueNotFound` (no such queue: nothing of it
        written) or a :class:`~mqcore.errors.StorageUnavailable` (a step failed).
        """
        job = SaveJob(queue, entries, self.loop.create_future())
        self._put([(job, i) for i in range(len(entries))])
        return job.future

    def _put(self, items: list[tuple[SaveJob, int] | None]) -> None:
        """Queue ``items`` and wake as many idle threads, the latest idle first (a warm thread, one wake-up each)."""
        self._work.extend(items)
        for _ in items:
            try:
                park = self._idle.pop()
            except IndexError:
                return
            park.release()

    def close(self) -> None:
        """Let every thread finish its work and stop; wait for them (jobs already taken complete)."""
        self._put([None] * len(self._threads))
        for thread in self._threads:
            thread.join()

    # -- saver threads --------------------------------------------------------

    def _run(self) -> None:
        park = threading.Lock()
        park.acquire()
        while True:
            try:
                item = self._work.popleft()
            except IndexError:
                self._idle.append(park)
                if self._work:  # work came between the popleft and the append, maybe with nobody to wake
                    try:
                        self._idle.remove(park)
                    except ValueError:  # _put took it off the list: it has released, or will release, it
                        park.acquire()
                    continue
                park.acquire()  # released by the _put that takes it off the idle list
                continue
            if item is None:
                return
            job, i = item
            try:
                self._write(job, i)
            except Exception as exc:  # noqa: BLE001  # a bug: the request gets it (500), the thread lives on
                self._finish(job, exc)

    def _write(self, job: SaveJob, i: int) -> None:
        """Write entry ``i`` of ``job``; the thread writing its last file publishes the job."""
        entry = job.entries[i]
        if not job.ids:
            with self._lock:
                if not job.ids:
                    job.ids = [self.store.ids.next_id() for _ in job.entries]
                    job.results = list(job.ids)
        try:
            job.written[i] = self.store.write_new(
                job.queue, entry.body, entry.content_type, entry.attributes, job.ids[i], entry.attribute_types
            )
        except MQError as exc:
            job.results[i] = exc
        with self._lock:
            job.left -= 1
            last = job.left == 0
        if last:
            self._publish(job)

    def _publish(self, job: SaveJob) -> None:
        """Rename the job's written files into place, in entry order, and leave them with the group commit."""
        written = [(i, pending) for i, pending in enumerate(job.written) if pending is not None]
        for i, pending in written:  # the id changes when an O_EXCL create was retried
            job.results[i] = pending.message_id
        errors, renamed = self.store.rename_many([(pending, job.entries[i].delay_ms) for i, pending in written])
        for (i, _), error in zip(written, errors, strict=True):
            if error is not None:
                job.results[i] = error
        if not renamed:
            self._finish(job, None)
            return
        job.unsynced = len(renamed)
        for directory, ks in renamed.items():
            done = self._synced(job, [written[k][0] for k in ks])
            self.store.disk.sync_dir_later(directory, "fsync of the directory", done)

    def _synced(self, job: SaveJob, entry_indexes: list[int]) -> Callable[[MQError | None], None]:
        def done(error: MQError | None) -> None:
            if error is not None:
                for i in entry_indexes:
                    job.results[i] = error
            with self._lock:
                job.unsynced -= 1
                last = job.unsynced == 0
            if last:
                self._finish(job, None)

        return done

    def _finish(self, job: SaveJob, exc: BaseException | None) -> None:
        """Hand ``job`` back to the loop; one wake-up covers every job finished before the loop gets to them."""
        self._done.append((job, exc))
        if self._wake_pending:  # read after the append: a _deliver that has not reset it yet will see the job
            return
        self._wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed (mq stopped): nobody waits any more
            pass

    # -- event loop -------------------------------------------------------------

    def _deliver(self) -> None:
        self._wake_pending = False  # before draining: a job appended after this wakes the loop again
        done = self._done
        while done:
            job, exc = done.popleft()
            if job.future.done():  # cancelled: the client went away (the message is stored all the same)
                continue
            if exc is None:
                job.future.set_result(job.results)
            else:
                job.future.set_exception(exc)
