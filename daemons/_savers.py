"""The saver threads of the ``mq`` daemon: one pool for every route's file work, one loop wake-up per commit.

One pool of at most ``--workers`` threads serves the sends (single, batch and
FIFO) and every other route's blocking file call (queue metadata, peeks,
changes of visibility, redrive status files...). Threads are started as work
needs them, so a daemon that never had more than one request at a time runs
one saver. Before, mq ran ``--workers`` send savers *and* a
``ThreadPoolExecutor`` of ``--workers`` general savers, and the two sets
fought each other for the GIL.

A send crosses between the event loop and a thread twice, whatever the
load: the loop puts a :class:`SaveJob` on the work queue that the saver
threads take from (one wake-up of an idle saver, the one idle most recently:
at a low rate one warm thread does the work), and the results of every job a
directory fsync made durable come back to the loop together
(:mod:`daemons._loopdelivery`: one ``call_soon_threadsafe`` per group
commit, not one per message, and none while an earlier delivery is still
waiting for the loop). Any other job (:meth:`Savers.run`) comes back the same
way.

Each saver takes one part of a job at a time and writes its files in order
(``new/Q.ID``: create, write, fsync each); a batch is a part per file while
savers are free when it arrives (:meth:`Savers._free`), so at a low rate its
files are fsynced in parallel, and when the savers are busy one saver writes
it whole (concurrent jobs' fsyncs overlap instead) and no other saver is
woken to fight for the GIL. The thread that writes a job's last part
renames all the job's files into place in entry order (a batch is never visible in part out of
order), then leaves the job with the directory's group commit
(:meth:`mqcore.protocol._fs.DirSyncer.sync_later`) and goes back to take
work: the thread that leads the directory's fsyncs completes every job its
round covered. A job's result is delivered only after its file fsyncs, its
renames and the fsync of each directory they went to (docs/protocol.md 6.2).

A lone single send (:mod:`daemons._inline`: no other send, receive or delete in
flight in the process, on a local filesystem) skips both crossings:
:meth:`Savers.send_here` runs the same steps on the event loop's thread.

With ``--file-sync syncfs`` (:meth:`Savers.use_file_sync`; local filesystems only; with ``auto``
only while more sends overlap than there are savers: at a low rate the file fsyncs cost less; only for
bodies under :data:`SYNCFS_BODY_LIMIT` on average; and only while little of the machine's dirty data is
not mq's, :data:`FOREIGN_DIRTY_LIMIT`) a saver's
files are written and closed without their fsyncs; the thread that writes a job's last part
leaves it with the filesystem's group commit (:meth:`mqcore.protocol._fs.Disk.syncfs_later`):
one ``syncfs`` of the root's filesystem, started after every job it covers was written, makes
all their data durable, and only then is each job handed back to a saver (ahead of the queued
work) to be renamed into place and left with the directory's group commit as above. A failed
``syncfs`` fails every entry of its round (the files are unlinked, nothing is renamed). The
lone send on the loop thread keeps its file fsync (one writer: ``syncfs`` gains nothing there).

While sends go to ``syncfs`` rounds, a saver waits on nothing but the GIL between its system calls,
so a send handed over then wakes (or starts) a saver only while fewer than :data:`SYNCFS_RUNNABLE`
take work; those take the rest from the queue. A saver that leads a round of ``syncfs`` or of a
directory's fsyncs (``mqcore.protocol._fs.LEADING``), or runs a call (which may fsync), does not
count until it takes its next item, and wakes another if too few are left. Eight savers all woken
took the GIL from each other at every system call: futex wake-ups were the largest piece of mq's
CPU at many clients (docs/performance.md, "Sends at many clients: fewer savers woken while their
files wait for a syncfs round").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Protocol, TypeVar

from daemons._loopdelivery import LoopDelivery, Outcome, delivery_for, settle
from mqcore.errors import MQError, QueueNotFound, StorageUnavailable
from mqcore.fsinfo import DirtyMeter, MountInfo
from mqcore.names import MessageId, QueueName, ready_name
from mqcore.protocol import PendingMessage, SendEntry, Store
from mqcore.protocol._fs import LEADING, syncfs_available
from mqcore.protocol._rounds import SharedRounds

T = TypeVar("T")

#: A job's outcome: per entry its message id or its error.
Results = list[MessageId | MQError]

#: Values of ``--file-sync``: how a saver makes a message file's data durable before its rename.
FILE_SYNC_MODES = ("auto", "fsync", "syncfs")
#: With ``--file-sync auto``, savers use ``syncfs`` only while the machine's dirty data that is not mq's own
#: (``/proc/meminfo`` ``Dirty:`` + ``Writeback:`` minus the bodies mq wrote for a ``syncfs`` not yet done) is
#: below this many bytes, and again once it has stayed under half of it for FOREIGN_DIRTY_HOLD_SECONDS: a ``syncfs``
#: waits for every dirty page of the filesystem, another writer's too (32 MiB took ~50 ms to write back on the test
#: machine's disk; docs/performance.md, "Sends: syncfs only without foreign dirty data").
FOREIGN_DIRTY_LIMIT = 32 << 20
#: With ``--file-sync auto``, a job whose bodies average this many bytes or more fsyncs its files instead of leaving
#: them to a ``syncfs`` round: a round then carries up to tens of MiB, written back and waited for as one, which the
#: savers' own fsyncs overlap better while the machine has CPU to spare (1 MiB sends at 16 clients: 360-380 against
#: 460-490 sends/s on the test machine's disk). Smaller bodies keep their rounds: at 256 KiB they won clearly, at
#: 512 KiB they were even (docs/performance.md, "Large bodies: 1 MiB sends").
SYNCFS_BODY_LIMIT = 1 << 20
#: How long ``auto`` keeps to file fsyncs after a reading over the limit, in seconds: the rounds already under way
#: write the other writer's data back at once, and a writer that writes in bursts would otherwise meet a round again
#: with each burst.
FOREIGN_DIRTY_HOLD_SECONDS = 1.0
#: While sends overlap enough for ``syncfs`` rounds (:meth:`Savers._limited`), a send wakes or starts a saver only
#: while fewer than this many savers take work (the leaders of a ``syncfs`` or directory round not counted): their
#: files wait for a round, not for the disk, so more of them would only pass the GIL to each other at every system
#: call (docs/performance.md, "Sends at many clients: fewer savers woken while their files wait for a syncfs round").
SYNCFS_RUNNABLE = 2

#: A worker of ``mq --processes N``: the file of the ``syncfs`` rounds its processes share (set at its start by
#: ``daemons._processes``), else None: this process's rounds are its own.
SHARED_ROUNDS: str | None = None

logger = logging.getLogger("mq.front")  # the mq daemon's logger, as daemons._broker


def syncfs_allowed(mode: str, mount: MountInfo | None) -> bool:
    """Whether savers use the ``syncfs`` group commit for ``--file-sync mode`` on ``mount``.

    Args:
        mode: One of :data:`FILE_SYNC_MODES`: ``fsync`` never; ``syncfs`` and ``auto`` on a local
            filesystem (:attr:`mqcore.fsinfo.MountInfo.local`) where libc has ``syncfs``.
        mount: The mount of the root (:func:`mqcore.fsinfo.mount_of`), or None if unknown (never then:
            on FUSE, NFS, CIFS or Ceph a ``syncfs`` may not reach the server's disk).
    """
    return mode != "fsync" and mount is not None and mount.local and syncfs_available()


def _small_bodies(job: SaveJob) -> bool:
    """Whether ``job``'s bodies average under :data:`SYNCFS_BODY_LIMIT` bytes (``auto`` may use ``syncfs`` for it)."""
    return sum(len(entry.body) for entry in job.entries) < SYNCFS_BODY_LIMIT * len(job.entries)


def _page_bytes(job: SaveJob) -> int:
    """The page cache a job's bodies take (each rounded up to 4 KiB pages), in bytes."""
    return sum(-(-len(entry.body) // 4096) * 4096 for entry in job.entries)


class SaveJob:
    """Messages of one request to store, and the future their results go to (loop thread creates it).

    Args:
        queue: The queue.
        entries: The messages (checked by the caller), in order.
        future: Resolved on the loop with :data:`Results` (or a bug's exception).
    """

    __slots__ = (
        "bounds",
        "entries",
        "future",
        "here",
        "ids",
        "parts_done",
        "queue",
        "refused",
        "results",
        "syncfs",
        "syncfs_bytes",
        "syncfs_epoch",
        "syncs",
        "syncs_done",
        "written",
    )

    def __init__(self, queue: QueueName, entries: list[SendEntry], future: asyncio.Future[Results]) -> None:
        self.queue = queue
        self.entries = entries
        self.future = future
        #: The entries' ids, taken in entry order by the first thread to take a file of the job (under
        #: the pool's lock if the job has several; one ``os.urandom`` for all), so the job keeps its order
        #: (FIFO) whichever write finishes first. Set last: a thread that finds it set may read ``results``
        #: and ``refused``.
        self.ids: list[MessageId] = []
        self.results: Results = []
        #: The error of every entry when the queue's check failed (no such queue: nothing is written).
        self.refused: MQError | None = None
        #: Written files by entry index (None: the write failed).
        self.written: list[PendingMessage | None] = [None] * len(entries)
        #: Where the job's parts begin, and its end: part k is entries ``bounds[k]:bounds[k + 1]``, written in
        #: order by one saver (:meth:`Savers.send`: a part per file while savers are free, else one part).
        self.bounds = [0, len(entries)]
        #: Counts the parts written (``next`` of an ``itertools.count`` is atomic under the GIL: no lock).
        self.parts_done = itertools.count(1)
        #: Directory fsyncs the job waits for, and a count of those done (as ``parts_done``).
        self.syncs = 0
        self.syncs_done = itertools.count(1)
        #: Its files' data are made durable by the ``syncfs`` group commit, not by their own fsyncs
        #: (:meth:`Savers._take_ids` decides), and ``Disk.syncfs_epoch`` read before its first file was written.
        self.syncfs = False
        self.syncfs_epoch = 0
        #: ``auto``: the page cache its bodies take, counted as mq's own dirty data until its round ends.
        self.syncfs_bytes = 0
        #: The thread writing the job itself (:meth:`Savers.send_here`), whose own finish sets the future
        #: directly; 0: a saver's job, always handed back through the loop's delivery.
        self.here = 0


class ForeignDirt:
    """``--file-sync auto``'s check of the machine's dirty data that is not mq's own (:data:`FOREIGN_DIRTY_LIMIT`).

    Saver threads call it. The bytes mq wrote for ``syncfs`` rounds not yet done (page-rounded, changed
    under a lock) are taken off ``/proc/meminfo``'s dirty data, so that only other writers' count.
    """

    def __init__(self) -> None:
        self.meter = DirtyMeter()
        self.limit = FOREIGN_DIRTY_LIMIT
        self._lock = threading.Lock()
        self._own = 0
        self._high = False
        self._until = 0.0

    def admit(self, job: SaveJob) -> bool:
        """Whether ``job`` may use ``syncfs``: little dirty data is not mq's (its bytes then count as mq's until
        :meth:`release`; sets ``job.syncfs_bytes``)."""
        size = _page_bytes(job)
        dirty = self.meter.dirty_bytes()
        now = time.monotonic()
        limit = self.limit // 2 if self._high else self.limit
        with self._lock:
            foreign = None if dirty is None else dirty - self._own
            low = foreign is not None and foreign < limit
            if not low:
                self._until = now + FOREIGN_DIRTY_HOLD_SECONDS
            elif now < self._until:
                return False
            else:
                self._own += size
                job.syncfs_bytes = size  # taken off again when its round ends (Savers._files_synced)
        if low == self._high:  # it changed: say so once
            self._high = not low
            logger.info(
                "file sync auto: %s; %s",
                "unknown dirty data" if foreign is None else f"{max(foreign, 0) >> 20} MiB of dirty data not mq's",
                f"file fsyncs until under {self.limit >> 21} MiB for {FOREIGN_DIRTY_HOLD_SECONDS:g} s"
                if not low
                else "syncfs rounds again",
            )
        return low

    def release(self, size: int) -> None:
        """The ``syncfs`` round of a job that :meth:`admit` counted ended: its ``size`` bytes are no longer dirty."""
        with self._lock:
            self._own -= size


class ReadyNames(Protocol):
    """Told, on a saver thread, the ready names a job is about to rename into its queue, and those whose rename failed.

    ``daemons._queues.QueueStates`` (daemons/_own.py): so that its event loop indexes each name once
    without reading inotify on the send's path.
    """

    def expect_ready(self, queue: QueueName, names: list[str]) -> None: ...

    def drop_ready(self, names: list[str]) -> None: ...


class _Call:
    """A blocking call for a saver: ``fn(*args)`` and the future (asyncio or concurrent) that gets its outcome."""

    __slots__ = ("args", "fn", "future")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], future: asyncio.Future[Any] | Future[Any]
    ) -> None:
        self.fn = fn
        self.args = args
        self.future = future


#: What a saver takes: a part of a send job (the job, the part's index), a call (index unused), or None (stop).
_Item = tuple[SaveJob | _Call, int] | None


class Savers(Executor):
    """The daemon's saver threads: sends with group commit, and every route's other blocking file calls.

    Also a :class:`concurrent.futures.Executor`, so ``loop.run_in_executor(savers, ...)`` works for the
    callers that need a concurrent future.

    Args:
        store: The daemon's store.
        workers: At most this many threads (``--workers``), started as work needs them.
    """

    def __init__(self, store: Store, workers: int) -> None:
        self.store = store
        self.workers = workers
        #: The loop the jobs' results go back to (the first one to hand over a job; mq runs one loop), and its delivery.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._delivery: LoopDelivery | None = None
        #: The savers' own lock (a batch's ids, taken once per job); the loop thread never takes it.
        self._lock = threading.Lock()
        #: Held while a thread is started or the pool closes (rare).
        self._start_lock = threading.Lock()
        # The loop thread must not block on a lock or make a system call here: every such point
        # releases the GIL, and getting it back behind eight busy savers costs up to the interpreter's
        # switch interval (5 ms). So the hand-offs use only operations that are atomic under the GIL
        # (deque.extend/popleft/append, list.append/pop/remove) and a parking lock per thread.
        #: Work to do, oldest first; None tells a thread to stop.
        self._work: collections.deque[_Item] = collections.deque()
        #: The parking locks (held while parked) of the idle threads, the latest idle last.
        self._idle: list[threading.Lock] = []
        self._threads: list[threading.Thread] = []
        #: The idents of savers that run a call or lead a round of ``syncfs`` or directory fsyncs (:meth:`_step_aside`),
        #: until they take their next item: they may wait on the disk, so they do not count as taking work.
        self._aside: list[int] = []
        self._closed = False
        #: Told each job's ready names before its renames (set by the daemon; None: nobody).
        self.ready_names: ReadyNames | None = None
        #: Savers may write files without fsync and group-commit their data by ``syncfs`` (:meth:`use_file_sync`):
        #: always (``syncfs``), or only for the jobs taken while more sends are in flight than ``workers`` (``auto``).
        self.syncfs = False
        self.syncfs_always = False
        #: Jobs handed over by :meth:`send` (loop thread), and the count of those finished (a saver's
        #: ``next`` of ``_finished``, atomic under the GIL): how many sends overlap, for ``auto``.
        self._sent = 0
        self._finished = itertools.count(1)
        self._done = 0
        #: ``auto``: the machine's dirty data that is not mq's.
        self.foreign = ForeignDirt()

    def use_file_sync(self, mode: str, mount: MountInfo | None) -> bool:
        """Choose how savers make files durable (``--file-sync``; before the first send); True: by ``syncfs``.

        A worker of ``mq --processes N`` shares its ``syncfs`` rounds with the other workers
        (:data:`SHARED_ROUNDS`, :mod:`mqcore.protocol._rounds`).

        Args:
            mode: One of :data:`FILE_SYNC_MODES` (:func:`syncfs_allowed` decides).
            mount: The mount of the root, or None if unknown.
        Raises:
            OSError: The root (or the shared rounds' file) cannot be opened for ``syncfs``.
        """
        self.syncfs = syncfs_allowed(mode, mount)
        self.syncfs_always = self.syncfs and mode == "syncfs"
        if self.syncfs:
            shared = SharedRounds(SHARED_ROUNDS) if SHARED_ROUNDS else None
            self.store.disk.use_syncfs(self.store.layout.root, shared)
        return self.syncfs

    # -- event loop ------------------------------------------------------------

    def send(self, queue: QueueName, entries: list[SendEntry]) -> asyncio.Future[Results]:
        """Start storing ``entries`` in ``queue`` (loop thread); the future gets each entry's id or error.

        Takes no lock and makes no system call once the threads run (see
        ``__init__``). An entry's error is a :class:`~mqcore.errors.QueueNotFound`
        (no such queue: nothing of it written) or a
        :class:`~mqcore.errors.StorageUnavailable` (a step failed).

        Raises:
            RuntimeError: The pool was shut down.
        """
        job = SaveJob(queue, entries, self._bound_loop().create_future())
        self._sent += 1
        limited = self._limited()
        if len(entries) > 1 and self._free(limited) > 1:  # a part per file: the files' fsyncs overlap on free savers
            job.bounds = list(range(len(entries) + 1))
        self._put([(job, k) for k in range(len(job.bounds) - 1)], limited=limited)
        return job.future

    def send_here(self, queue: QueueName, entries: list[SendEntry]) -> asyncio.Future[Results]:
        """:meth:`send` written on the calling thread, the event loop's (a lone send: daemons/_inline.py).

        The same steps as a saver's, in the same order (the queue's check, the ids, each file
        created, written and fsynced, the renames, the directory's group commit), so the same
        outcome for every entry; a single entry skips the queue's check (:meth:`_send_one_here`).
        The returned future is usually done already: unless another thread is leading a round of
        the directory's fsyncs when this one's renames are made, this thread leads it itself and
        waits for it (the loop serves nothing meanwhile). If one is, this send is left with it and
        the future is resolved through the loop's delivery, as a saver's job would be.

        Raises:
            RuntimeError: The pool was shut down.
        """
        if self._closed:
            raise RuntimeError("mq savers: cannot run a job after shutdown")
        if len(entries) == 1:
            return self._send_one_here(queue, entries[0])
        job = SaveJob(queue, entries, self._bound_loop().create_future())
        job.here = threading.get_ident()
        try:
            self._write(job, 0)
        except Exception as exc:  # noqa: BLE001  # a bug: the request gets it (500), as from a saver
            self._finish(job, exc)
        return job.future

    def _send_one_here(self, queue: QueueName, entry: SendEntry) -> asyncio.Future[Results]:
        """:meth:`send_here` of one entry, without a :class:`SaveJob`: the same system calls in the same order.

        The queue is not ``stat``-ed first: the caller found it (its state is loaded), and one deleted
        since is found by the rename, as for a saver's job whose queue went after its check
        (QueueNotFound, the file unlinked: :meth:`mqcore.protocol.send.Sending.write_new`).
        """
        future: asyncio.Future[Results] = self._bound_loop().create_future()
        store, names, delay_ms = self.store, self.ready_names, entry.delay_ms
        try:
            try:
                pending = store.write_new(
                    queue, entry.body, entry.content_type, entry.attributes, None, entry.attribute_types,
                    check_queue=False,
                )  # fmt: skip
            except MQError as exc:
                future.set_result([exc])
                return future
            message_id = pending.message_id
            if delay_ms:
                names = None  # a delayed send is not made ready here
            ready = [ready_name(message_id, 0)]
            if names is not None:
                names.expect_ready(queue, ready)
            try:
                directory = store.rename_one(pending, delay_ms)
            except MQError as exc:
                if names is not None:
                    names.drop_ready(ready)  # no event comes for it
                future.set_result([exc])
                return future
            here = threading.get_ident()

            def synced(error: MQError | None) -> None:  # on another thread if it led the round covering this send
                self._hand_back((future, True, [message_id if error is None else error]), here)

            store.disk.sync_dir_later(directory, "fsync of the directory", synced)
        except Exception as exc:  # noqa: BLE001  # a bug: the request gets it (500), as from a saver
            if not future.done():
                future.set_exception(exc)
        return future

    def _free(self, limited: bool) -> int:
        """How many savers could start on a job now: the idle and the not yet started, less the work queued.

        ``limited`` (:meth:`_limited`): only as many as :data:`SYNCFS_RUNNABLE` allows beside the savers
        taking work.

        A batch is one part per file (each file a job of its own saver, their fsyncs in parallel)
        while at least two savers are free; when at most one is (many clients: the savers are busy
        with other jobs, whose fsyncs overlap anyway), the batch is one part, written file after
        file by one saver, without waking others that would only take the GIL from each other at
        every system call (docs/performance.md, "Batches and hand-offs"). Cutting a batch into as
        many parts as savers were free measured worse at one client on the real disk.
        """
        if limited:
            return SYNCFS_RUNNABLE - self._runnable() - len(self._work)
        return len(self._idle) + self.workers - len(self._threads) - len(self._work)

    def _limited(self) -> bool:
        """Whether sends now go to ``syncfs`` rounds (``syncfs``, or ``auto`` with more sends in flight than
        ``workers``): then at most :data:`SYNCFS_RUNNABLE` savers are woken to take work."""
        return self.syncfs and (self.syncfs_always or self._sent - self._done > self.workers)

    def _runnable(self) -> int:
        """Savers taking work: started, not parked, not leading a round (lengths of lists: atomic under the GIL)."""
        return len(self._threads) - len(self._idle) - len(self._aside)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on a saver (loop thread); the future gets its result or exception.

        Raises:
            RuntimeError: The pool was shut down.
        """
        future: asyncio.Future[T] = self._bound_loop().create_future()
        self._put([(_Call(fn, args, future), 0)])
        return future

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._delivery = delivery_for(loop)
        return loop

    # -- any thread --------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """:meth:`concurrent.futures.Executor.submit`: ``fn(*args, **kwargs)`` on a saver (any thread may call).

        Raises:
            RuntimeError: The pool was shut down.
        """
        future: Future[T] = Future()
        if kwargs:
            self._put([(_Call(lambda: fn(*args, **kwargs), (), future), 0)])
        else:
            self._put([(_Call(fn, args, future), 0)])
        return future

    def _put(self, items: list[_Item], *, first: bool = False, limited: bool = False) -> None:
        """Queue ``items`` (ahead of the queued work if ``first``) and wake as many idle threads (the latest idle
        first), starting threads if none is idle; if ``limited``, only while fewer than :data:`SYNCFS_RUNNABLE`
        savers take work (those that do take the rest from the queue)."""
        if self._closed:
            raise RuntimeError("mq savers: cannot run a job after shutdown")
        if first:
            self._work.extendleft(items)
        else:
            self._work.extend(items)
        for _ in items:
            if (limited and self._runnable() >= SYNCFS_RUNNABLE) or not self._wake_one():
                return

    def _wake_one(self) -> bool:
        """Wake the latest idle thread, or start one; False if every thread runs already."""
        try:
            park = self._idle.pop()
        except IndexError:
            if len(self._threads) < self.workers:
                self._start_thread()
                return True
            return False
        park.release()
        return True

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._closed or len(self._threads) >= self.workers:
                return
            thread = threading.Thread(target=self._serve, name=f"mq-saver-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _step_aside(self) -> None:
        """This saver runs a call or leads a group commit's rounds (``LEADING.hook``), and may wait on the disk until
        it takes its next item: it stops counting among the savers taking work, and wakes another for the queued
        work if too few take it."""
        me = threading.get_ident()
        if me not in self._aside:
            self._aside.append(me)
        if self._work and self._runnable() < SYNCFS_RUNNABLE:
            self._wake_one()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let every thread finish the queued work and stop (jobs already queued complete); joined if ``wait``."""
        with self._start_lock:
            if self._closed:
                threads = []
            else:
                self._closed = True
                threads = list(self._threads)
                self._work.extend([None] * len(threads))
                for _ in threads:
                    try:
                        self._idle.pop().release()
                    except IndexError:
                        break
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    # -- saver threads --------------------------------------------------------

    def _serve(self) -> None:
        park = threading.Lock()
        park.acquire()
        me = threading.get_ident()
        LEADING.hook = self._step_aside  # leading a group commit's rounds: waiting on the disk, not taking work
        while True:
            if me in self._aside:  # its last item's call or rounds ended
                self._aside.remove(me)
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
            job, k = item
            if isinstance(job, _Call):
                self._step_aside()  # it may wait on the disk (a FIFO send's fsyncs)
                self._call(job)
                continue
            try:
                if k < 0:  # its files' data are durable (syncfs): rename them into place
                    self._publish(job)
                else:
                    self._write(job, k)
            except Exception as exc:  # noqa: BLE001  # a bug: the request gets it (500), the thread lives on
                self._finish(job, exc)

    def _call(self, call: _Call) -> None:
        future = call.future
        if isinstance(future, Future) and not future.set_running_or_notify_cancel():
            return
        try:
            result: Any = call.fn(*call.args)
            ok = True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request, as run_in_executor does
            result, ok = exc, False
        if isinstance(future, Future):
            if ok:
                future.set_result(result)
            else:
                future.set_exception(result)
        else:
            self._delivery_of(future).put((future, ok, result))

    def _write(self, job: SaveJob, k: int) -> None:
        """Write part ``k`` of ``job``, file after file; the thread writing its last part publishes the job."""
        if not job.ids:
            self._open(job)
        start, stop = job.bounds[k], job.bounds[k + 1]
        if job.refused is not None:
            for i in range(start, stop):
                job.results[i] = job.refused
        else:
            write_new, queue, ids, entries = self.store.write_new, job.queue, job.ids, job.entries
            fsync = not job.syncfs
            for i in range(start, stop):
                entry = entries[i]
                try:
                    job.written[i] = write_new(
                        queue,
                        entry.body,
                        entry.content_type,
                        entry.attributes,
                        ids[i],
                        entry.attribute_types,
                        check_queue=False,  # _open checked the queue once for the job
                        fsync=fsync,
                    )
                except MQError as exc:
                    job.results[i] = exc
        if next(job.parts_done) == len(job.bounds) - 1:
            if job.syncfs and any(job.written):
                self.store.disk.syncfs_later(lambda error: self._files_synced(job, error), job.syncfs_epoch)
            else:
                self._publish(job)

    def _files_synced(self, job: SaveJob, error: StorageUnavailable | None) -> None:
        """The ``syncfs`` round covering ``job``'s files ended (its leader's thread): publish it on a saver.

        A failed round fails every file of the job (unlinked here: never renamed, so never a
        message; mq-reaper would sweep it from ``new/`` otherwise).
        """
        if job.syncfs_bytes:
            self.foreign.release(job.syncfs_bytes)
        if error is not None:
            for i, pending in enumerate(job.written):
                if pending is not None:
                    job.results[i] = error
                    job.written[i] = None
                    with contextlib.suppress(OSError):
                        os.unlink(pending.path)
        try:
            self._put([(job, -1)], first=True, limited=self._limited())  # the leader goes on with the next round
        except RuntimeError:  # shut down: no saver takes work any more, publish on this thread
            self._publish(job)

    def _open(self, job: SaveJob) -> None:
        """Check that the job's queue exists and take its ids, once per job: by its only thread, or under the lock.

        The ``stat`` is made outside the lock (a thread holding it over a system call would stall the
        other savers); the threads of one batch that start before its ids are taken may each make one.
        """
        refused: MQError | None = None
        try:
            if not self.store.queue_exists(job.queue):
                refused = QueueNotFound(f"queue {job.queue!r} does not exist", queue=job.queue)
        except MQError as exc:  # the stat failed: whether the queue exists is unknown
            refused = exc
        if len(job.bounds) == 2:  # one part (a single send): no other thread takes a file of it
            self._take_ids(job, refused)
            return
        with self._lock:
            if not job.ids:
                self._take_ids(job, refused)

    def _take_ids(self, job: SaveJob, refused: MQError | None) -> None:
        # syncfs: never for the lone send on the loop (one writer: two group commits in a row cost more
        # than its fsync); with ``auto`` only while more sends overlap than there are savers, so that one
        # syncfs covers many files (docs/performance.md, "Sends: a group commit by syncfs").
        # And only for bodies under SYNCFS_BODY_LIMIT (larger ones: their own fsyncs overlap), and only while
        # little of the machine's dirty data is not mq's own (FOREIGN_DIRTY_LIMIT).
        if (
            self.syncfs
            and job.here == 0
            and (
                self.syncfs_always
                or (self._sent - self._done > self.workers and _small_bodies(job) and self.foreign.admit(job))
            )
        ):
            job.syncfs = True
            job.syncfs_epoch = self.store.disk.syncfs_epoch()  # before any file of the job is written
        job.refused = refused
        count = len(job.entries)
        ids = self.store.ids.next_ids(count) if count > 1 else [self.store.ids.next_id()]
        job.results = list(ids)
        job.ids = ids  # last: a thread that finds it set reads results and refused without the lock

    def _publish(self, job: SaveJob) -> None:
        """Rename the job's written files into place, in entry order, and leave them with the group commit."""
        written = [(i, pending) for i, pending in enumerate(job.written) if pending is not None]
        for i, pending in written:  # the id changes when an O_EXCL create was retried
            job.results[i] = pending.message_id
        entries, names = job.entries, self.ready_names
        if names is not None:
            names.expect_ready(job.queue, [ready_name(p.message_id, 0) for i, p in written if not entries[i].delay_ms])
        errors, renamed = self.store.rename_many([(pending, entries[i].delay_ms) for i, pending in written])
        failed = [(i, pending, error) for (i, pending), error in zip(written, errors, strict=True) if error is not None]
        for i, _, error in failed:
            job.results[i] = error
        if failed and names is not None:  # no event comes for these
            names.drop_ready([ready_name(pending.message_id, 0) for _, pending, _ in failed])
        if not renamed:
            self._finish(job, None)
            return
        job.syncs = len(renamed)
        for directory, ks in renamed.items():
            done = self._synced(job, [written[k][0] for k in ks])
            self.store.disk.sync_dir_later(directory, "fsync of the directory", done)

    def _synced(self, job: SaveJob, entry_indexes: list[int]) -> Callable[[MQError | None], None]:
        def done(error: MQError | None) -> None:
            if error is not None:
                for i in entry_indexes:
                    job.results[i] = error
            if next(job.syncs_done) == job.syncs:
                self._finish(job, None)

        return done

    def _finish(self, job: SaveJob, exc: BaseException | None) -> None:
        """Hand ``job`` back to the loop; one wake-up covers every job finished before the loop gets to them.

        A job written by the loop thread itself (:meth:`send_here`) and finished there gets its
        outcome at once, without a wake of the loop.
        """
        outcome = (job.future, True, job.results) if exc is None else (job.future, False, exc)
        if job.here == 0:
            self._done = next(self._finished)
        self._hand_back(outcome, job.here)

    def _hand_back(self, outcome: Outcome, here: int) -> None:
        """Settle ``outcome`` (future, ok, result) at once on thread ``here`` (the loop's, for a send made on it),
        else through the loop's delivery (0, a saver's job, is no thread's ident)."""
        if here == threading.get_ident():
            settle(outcome)
            return
        self._delivery_of(outcome[0]).put(outcome)

    def _delivery_of(self, future: asyncio.Future[Any]) -> LoopDelivery:
        """The delivery of ``future``'s loop: the pool's (bound by the first job from a loop), or the loop's own."""
        delivery = self._delivery
        if delivery is None or self._loop is not future.get_loop():
            delivery = delivery_for(future.get_loop())
        return delivery
