"""The file steps every transition repeats, and how their failures become :class:`StorageUnavailable`.

One place for: a durable create (O_EXCL, write, fsync), an atomic replace of
a small JSON file, a rename that may lose a race (ENOENT = somebody else got
there first), a group-committed directory fsync, and the mapping of an
``OSError`` to the storage error that names the step that failed (answered
503 by the daemon). The transitions in the other modules of this package
are written in terms of these.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from mqcore.errors import QueueNotFound, StorageUnavailable
from mqcore.protocol._rounds import SharedRounds

logger = logging.getLogger(__name__)

#: errno values that mean "the disk cannot take this write now" (answered 503).
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EMFILE, errno.ENFILE}
)


class StorageHooks:
    """Observers of storage work that a daemon may set (metrics); every hook is None (no cost) by default.

    Hooks are called on whatever thread did the work (saver, fetcher or worker
    threads), so they must be thread-safe and cheap. Module-level because an
    fsync and a storage error are per process, whichever :class:`Store` did them.

    Attributes:
        on_fsync: ``(kind, seconds, batch)`` after each fsync: kind ``"file"`` (a message file;
            batch 1) or ``"directory"`` (a group-commit round; batch = callers it covered).
        on_error: ``(step)`` for each storage error raised (e.g. ``"fsync"``, ``"rename"``).
        on_race: ``(step, errno name)`` for each file step that lost a race to another process or host
            and was recovered from (docs/protocol.md 13.2, 13.3): ``("create", "EEXIST")`` retried
            under a new name, ``("open" | "rename", "ENOENT" | "ESTALE")`` a message taken by someone else.
    """

    on_fsync: Callable[[str, float, int], None] | None = None
    on_error: Callable[[str], None] | None = None
    on_race: Callable[[str, str], None] | None = None


#: The process's storage hooks (set by ``daemons._metrics``).
STORAGE_HOOKS = StorageHooks()


def lost_race(step: str, exc: OSError) -> None:
    """Tell :data:`STORAGE_HOOKS` that ``step`` lost a race (``exc``: EEXIST, ENOENT, ESTALE) and recovered."""
    if STORAGE_HOOKS.on_race is not None:
        STORAGE_HOOKS.on_race(step, errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def storage_error(step: str, exc: OSError) -> StorageUnavailable:
    """The :class:`StorageUnavailable` for ``exc`` raised by ``step`` (e.g. ``"fsync of remove/"``); hook counts it.

    Args:
        step: What failed, in words; it ends up in the error message (and the HTTP body).
        exc: The OS error; its errno name goes into ``details["errno"]``.
    """
    if STORAGE_HOOKS.on_error is not None:
        STORAGE_HOOKS.on_error(step)
    return StorageUnavailable(
        f"message could not be stored: {step} failed: {exc.strerror or exc}",
        errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
    )


class DirSyncer:
    """Group commit for directory fsyncs.

    :meth:`sync` returns once an ``fsync`` of the directory that *started after
    the call* has completed, so every rename the caller made before calling is
    durable. Concurrent callers share one fsync: the first becomes the leader,
    the others wait for it (or for the next one, if theirs came too late).
    Rounds of one directory run one at a time, numbered 1, 2, ...; a caller
    arriving while round N-1 runs (or after it) is covered by round N, and
    round N's outcome is the caller's.

    The leader opens the directory by path for each fsync: a cached descriptor
    would keep syncing a directory that another process deleted and re-created
    under the same name. An fsync error is given to every caller its round
    covered, and never retried on their behalf (after a failed fsync the
    writes may be gone even if a later fsync succeeds: "fsyncgate").
    Thread-safe.
    """

    #: Failed rounds remembered per directory (older waiters are long gone).
    _KEEP_FAILURES = 1024

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._started: dict[str, int] = {}
        self._finished: dict[str, int] = {}
        self._failures: dict[str, dict[int, tuple[int, str]]] = {}
        self._callers: dict[tuple[str, int], int] = {}
        """Callers per (directory, round): the group-commit batch size reported to STORAGE_HOOKS."""
        self._later: dict[str, list[Callable[[OSError | None], None]]] = {}
        """:meth:`sync_later` callers per directory waiting for the next round of its leader."""

    def sync(self, path: str) -> None:
        """Make every rename into ``path`` done before this call durable.

        Raises:
            OSError: Opening or fsyncing the directory failed in this caller's round.
        """
        with self._cond:
            need = self._finished.get(path, 0) + 1
            if self._started.get(path, 0) >= need:
                need += 1  # round ``need`` is running and may have missed our renames
            self._callers[(path, need)] = self._callers.get((path, need), 0) + 1
            while self._finished.get(path, 0) < need:
                if self._started.get(path, 0) == self._finished.get(path, 0):
                    break  # nobody is syncing: lead the next round
                self._cond.wait()
            else:
                failure = self._failures.get(path, {}).get(need)
                if failure is not None:
                    raise OSError(failure[0], failure[1], path)
                return
            ticket = self._started[path] = self._finished.get(path, 0) + 1
        error: OSError | None = None
        try:
            started = time.perf_counter()
            fsync_dir(path)
        except OSError as exc:
            error = exc
        with self._cond:
            self._finished[path] = ticket
            batch = self._callers.pop((path, ticket), 1)
            if error is not None:
                failures = self._failures.setdefault(path, {})
                failures[ticket] = (error.errno or errno.EIO, error.strerror or str(error))
                for old in [t for t in failures if t <= ticket - self._KEEP_FAILURES]:
                    del failures[old]
            self._cond.notify_all()
        if error is None and STORAGE_HOOKS.on_fsync is not None:
            STORAGE_HOOKS.on_fsync("directory", time.perf_counter() - started, batch)
        if error is not None:
            raise error

    def sync_later(self, path: str, done: Callable[[OSError | None], None]) -> None:
        """Call ``done`` once an fsync of ``path`` that started after this call has completed; never wait for it.

        The group commit of :meth:`sync` without its waiting: a caller that
        finds a round of ``path`` running leaves ``done`` for the thread
        leading it, which runs one more round for everything left meanwhile
        once its round ends, and returns at once to other work. A caller
        that finds nobody leading leads: it runs rounds (each covering every
        ``done`` left before it started) until none is left, calling each
        round's ``done``s with its outcome (None, or the OSError of the open
        or fsync; an error is never retried for them, see "fsyncgate"
        above). ``done`` must be quick and must not raise; it runs on the
        leading thread. Rounds of this method and of :meth:`sync` share
        nothing but the directory: each is an fsync that started after its
        callers' renames.

        Args:
            path: The directory.
            done: Called once, with None or the OSError of this caller's round.
        """
        join_or_lead(self._cond, self._later, path, done, fsync_dir, "directory")


#: A group commit's callback: None, or the OSError of the round that covered its caller.
Done = Callable[[OSError | None], None]


class _Leading(threading.local):
    """Per thread: what :func:`join_or_lead` calls when this thread starts leading a group commit's rounds."""

    hook: Callable[[], None] | None = None


#: ``LEADING.hook``, set by a thread for itself (None: nothing), is called once each time that thread starts leading
#: rounds in :func:`join_or_lead` (it then waits on the disk until its call returns): mq's savers stop counting such a
#: thread among those taking work (daemons/_savers.py).
LEADING = _Leading()


class Gather:
    """When a round that follows another starts (:func:`join_or_lead`): fuller rounds, fewer system calls.

    When a round ends, its leader goes on leading: the next round starts once ``files`` callers
    wait for it, or ``seconds`` after the previous round ended if at least one does; if none came
    by then, the leader stops and the next caller leads a round that starts at once. So a caller
    waits for the gather at most ``seconds`` after the round before its own ended (a lone caller
    that finds nobody leading not at all), and under load each round covers what came during the
    previous round and the gather after it.

    Args:
        files: Callers that start a round at once (>= 1).
        seconds: How long after a round ended the leader waits for callers of the next one.
    """

    __slots__ = ("files", "seconds")

    def __init__(self, files: int, seconds: float) -> None:
        self.files = files
        self.seconds = seconds

    def wait(self, cond: threading.Condition, callers: list[Done], ended: float) -> None:
        """Hold the leader (``cond`` held) until ``callers`` holds :attr:`files` or :attr:`seconds` have passed.

        Args:
            cond: The group commit's lock (held; released while waiting).
            callers: The list the callers of the next round are appended to.
            ended: ``time.monotonic()`` when the previous round ended.
        """
        while len(callers) < self.files:
            left = ended + self.seconds - time.monotonic()
            if left <= 0:
                return
            cond.wait(left)

    def left(self, cond: threading.Condition, callers: list[Done]) -> None:
        """A caller was appended to ``callers`` (``cond`` held): wake the leader once there are :attr:`files`."""
        if len(callers) == self.files:
            cond.notify()


def join_or_lead(
    cond: threading.Condition,
    later: dict[str, list[Done]],
    key: str,
    done: Done,
    sync: Callable[[str], bool | None],
    kind: str,
    gather: Gather | None = None,
) -> None:
    """Leave ``done`` for the round after the one running for ``key``, or lead the rounds (a group commit).

    A caller that finds a leader for ``key`` leaves ``done`` in ``later[key]`` and returns at once.
    Otherwise it leads: it runs rounds of ``sync(key)`` for the callers left in ``later[key]`` until
    none is left. Each round takes every caller left before it started, runs ``sync`` once and calls
    each of them with its outcome (None, or the OSError; an error is never retried for them:
    "fsyncgate"). When a round ends and nobody left anything meanwhile, ``later[key]`` is removed:
    the next caller leads.

    Args:
        cond: The lock guarding ``later``.
        later: Callers waiting per key.
        key: The directory, or ``""`` for a filesystem's ``syncfs``.
        done: This caller's callback (quick, must not raise; runs on the leading thread).
        sync: One round's system call(s), given ``key``; raises OSError. True: it made none (another
            process's round covered its callers: :class:`FsSyncer` with shared rounds), so the round is
            not reported to ``on_fsync``.
        kind: :data:`STORAGE_HOOKS` ``on_fsync``'s kind (``"directory"`` or ``"syncfs"``).
        gather: When a round that follows another starts (:class:`Gather`); None: at once.
    """
    with cond:
        waiting = later.get(key)
        if waiting is not None:
            waiting.append(done)  # a leader is running a round: it runs the next one for us
            if gather is not None:
                gather.left(cond, waiting)
            return
        later[key] = [done]
    hook = LEADING.hook
    if hook is not None:
        hook()
    ended = None
    while True:
        with cond:
            callers = later[key]
            if ended is not None and gather is not None:
                gather.wait(cond, callers, ended)  # callers left meanwhile append to this same list
            if not callers:
                del later[key]  # nobody left anything meanwhile: the next caller leads
                return
            later[key] = []
        error: OSError | None = None
        started = time.perf_counter()
        borrowed = None
        try:
            borrowed = sync(key)
        except OSError as exc:
            error = exc
        if error is None and not borrowed and STORAGE_HOOKS.on_fsync is not None:
            STORAGE_HOOKS.on_fsync(kind, time.perf_counter() - started, len(callers))
        for callback in callers:
            try:
                callback(error)
            except Exception:  # a bug in one caller must not leave the group commit leaderless
                logger.exception("a group-commit callback failed key=%s", key)
        ended = time.monotonic()


def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs(2)`` through ctypes (Python 3.11 has no ``os.syncfs``), or None where libc has none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)


_SYNCFS = _libc_syncfs()

#: A ``syncfs`` round that follows another starts once this many sends wait for it, or ...
SYNCFS_GATHER_FILES = 32
#: ... this many seconds after the previous round ended (:class:`Gather`; docs/performance.md, "Fuller syncfs
#: rounds"). A send that finds nobody leading the rounds never waits for it.
SYNCFS_GATHER_SECONDS = 0.002


def syncfs_available() -> bool:
    """True if this process can call ``syncfs(2)`` (libc has it)."""
    return _SYNCFS is not None


class FsSyncer:
    """A group commit of ``syncfs(2)`` on the filesystem of ``root``: the data of many files, one system call.

    A caller writes and closes its files without fsyncing them, then calls :meth:`sync_later`; a
    round's ``syncfs`` starts after every caller it covers called, so it writes back their data
    (and everything else dirty on that filesystem). Whoever calls while a round runs is covered by
    the next one, as :meth:`DirSyncer.sync_later`. The descriptor on ``root`` stays open: since
    Linux 5.8 ``syncfs`` reports a writeback error of the filesystem once per open file description
    (errseq), so every error since it was opened fails the round that sees it.

    An error is reported once, but the pages it lost may belong to files of callers of later rounds
    (written while the failed round ran, or before it, and written back by it or by the kernel's
    flusher): a later ``syncfs`` finds them clean and succeeds. So every caller gives the
    :meth:`epoch` it read before it wrote its first file, and a caller whose epoch is older than
    the last failed round gets that round's error even if its own round succeeded ("fsyncgate":
    nothing that may have been lost is ever called durable).

    With ``shared`` (the processes of ``mq --processes N``), the rounds of every process sharing it are
    numbered in one sequence and run one at a time, a leader whose files were closed before another
    process's round started takes that round's outcome instead of calling ``syncfs``, and the epoch
    counts the failed rounds of every process (:mod:`mqcore.protocol._rounds`): a round that failed in
    any process fails every caller, in any process, that read its epoch before that round ended. A
    process that took another's failed round also gets the same error again from its own descriptor's
    next ``syncfs`` (errseq: each open file description sees each error once), which fails that round
    too: the safe side.

    Args:
        root: A directory on the filesystem (mq's root).
        shared: The rounds shared with the other processes of this host on the root, or None.
    Raises:
        OSError: ``root`` cannot be opened, or libc has no ``syncfs``.
    """

    def __init__(self, root: str, shared: SharedRounds | None = None) -> None:
        if _SYNCFS is None:
            raise OSError(errno.ENOSYS, "libc has no syncfs")
        self._syncfs = _SYNCFS
        self._fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._cond = threading.Condition(threading.Lock())
        self._later: dict[str, list[Done]] = {}
        #: Failed rounds so far, the error of the last one, and what a later caller of an older epoch gets.
        self._failures = 0
        self._failure = OSError(errno.EIO, os.strerror(errno.EIO))
        self._failure_earlier = self._failure
        self._shared = shared
        #: Rounds of another process whose outcome this one took (``shared`` only).
        self.borrowed = 0
        #: When a round that follows another starts.
        self._gather = Gather(SYNCFS_GATHER_FILES, SYNCFS_GATHER_SECONDS)

    def epoch(self) -> int:
        """The count of failed rounds: read it before writing the files that :meth:`sync_later` is to cover."""
        return self._failures if self._shared is None else self._shared.failures()

    def sync_later(self, done: Done, epoch: int) -> None:
        """Call ``done`` once a ``syncfs`` that started after this call has completed; never wait for it.

        ``done`` runs on the thread leading the round (this one, if nobody was leading); it must be
        quick and must not raise. It gets None, or the OSError of its round's ``syncfs``, or that of
        the last failed round if one failed after ``epoch`` was read (see the class; its ``strerror``
        then says the error was reported to a round that ended after this caller began).

        Args:
            done: The callback.
            epoch: :meth:`epoch`, read before the caller's files were written.
        """

        def checked(error: OSError | None) -> None:
            if error is None and self.epoch() != epoch:
                error = self._failure_earlier if self._shared is None else _earlier(self._shared.failed_errno())
            done(error)

        join_or_lead(
            self._cond,
            self._later,
            "",
            checked,
            self._sync if self._shared is None else self._sync_shared,
            "syncfs",
            self._gather,
        )

    def _call(self) -> int:
        """One ``syncfs`` of the root's filesystem: 0, or its errno."""
        return 0 if self._syncfs(self._fd) == 0 else ctypes.get_errno() or errno.EIO

    def _sync(self, _key: str) -> None:
        code = self._call()
        if code:
            error = OSError(code, os.strerror(code))
            self._failure = error
            # The epoch rule's callers: their own round succeeded, so say whose round reported the error.
            self._failure_earlier = _earlier(code)
            self._failures += 1  # before any callback of this round runs (only the leader writes these)
            raise error

    def _sync_shared(self, _key: str) -> bool:
        assert self._shared is not None
        code, borrowed = self._shared.round(self._call)  # the shared failure count is updated before it returns
        self.borrowed += borrowed
        if code:
            raise OSError(code, os.strerror(code))
        return borrowed

    def close(self) -> None:
        """Close the descriptor on the root, and the shared rounds' file if any (no round may start after this)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if self._shared is not None:
            with contextlib.suppress(OSError):
                self._shared.close()


def _earlier(code: int) -> OSError:
    """The epoch rule's error: its caller's own round succeeded, so it says whose round reported the error."""
    return OSError(code, f"{os.strerror(code)}, reported to a round that ended after this send began")


def fsync_dir(path: str) -> None:
    """Open directory ``path`` by name, fsync it and close it (a cached descriptor could outlive the directory).

    Raises:
        OSError: The open or the fsync failed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Flags of a message file's create (O_EXCL: never over another file), computed once.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class Disk:
    """How one :class:`~mqcore.protocol.Store` makes its writes durable.

    Args:
        fsync: Fsync files and directories before a write is acknowledged. Only
            tests of throughput without a disk may turn it off.
    """

    def __init__(self, fsync: bool = True) -> None:
        self.fsync = fsync
        self.syncer = DirSyncer()
        #: The ``syncfs`` group commit of the root's filesystem, once :meth:`use_syncfs` opened it (None: not used).
        self.files: FsSyncer | None = None

    def use_syncfs(self, root: str, shared: SharedRounds | None = None) -> None:
        """Open the ``syncfs`` group commit on ``root``'s filesystem (:attr:`files`), for :meth:`syncfs_later`.

        Args:
            root: mq's root.
            shared: Rounds shared with the other processes of this host on ``root`` (:class:`FsSyncer`), or None.
        Raises:
            OSError: ``root`` cannot be opened, or libc has no ``syncfs``.
        """
        if self.files is None:
            self.files = FsSyncer(root, shared)

    def syncfs_epoch(self) -> int:
        """:meth:`FsSyncer.epoch` (0 before :meth:`use_syncfs`): read before writing files for :meth:`syncfs_later`."""
        return 0 if self.files is None else self.files.epoch()

    def syncfs_later(self, done: Callable[[StorageUnavailable | None], None], epoch: int) -> None:
        """Make the data of every file written (and closed) before this call durable, then call ``done``; never wait.

        One ``syncfs`` of the root's filesystem covers every caller that came before it started
        (:class:`FsSyncer`); ``done`` may run on this thread before this returns, or later on the
        thread leading the round, and must be quick and must not raise. Without fsyncs (``fsync``
        False) ``done(None)`` at once.

        Args:
            done: Called once: None, or the StorageUnavailable of a failed ``syncfs`` (the files'
                data may or may not survive a power cut).
            epoch: :meth:`syncfs_epoch`, read before the files were written (a round that failed
                since fails this caller too: :class:`FsSyncer`).
        Raises:
            RuntimeError: :meth:`use_syncfs` was not called.
        """
        if not self.fsync:
            done(None)
            return
        if self.files is None:
            raise RuntimeError("mq disk: syncfs_later before use_syncfs")

        def synced(error: OSError | None) -> None:
            done(None if error is None else storage_error("syncfs", error))

        self.files.sync_later(synced, epoch)

    def sync_dir(self, path: str, step: str) -> None:
        """Make every rename into directory ``path`` done before this call durable (group commit).

        Args:
            path: The directory.
            step: What to call the step in the error, e.g. ``"fsync of remove/"``.
        Raises:
            StorageUnavailable: The fsync failed: the renames may or may not survive a power cut.
        """
        if not self.fsync:
            return
        try:
            self.syncer.sync(path)
        except OSError as exc:
            raise storage_error(step, exc) from exc

    def sync_dir_later(self, path: str, step: str, done: Callable[[StorageUnavailable | None], None]) -> None:
        """:meth:`sync_dir` without waiting: ``done(None)`` once the renames into ``path`` are durable.

        ``done`` may run on this thread before this returns, or later on the
        thread leading the directory's group commit (:meth:`DirSyncer.sync_later`);
        it must be quick and must not raise.

        Args:
            path: The directory.
            step: What to call the step in the error, e.g. ``"fsync of the directory"``.
            done: Called once: None, or the StorageUnavailable of a failed fsync (the renames may or
                may not survive a power cut).
        """
        if not self.fsync:
            done(None)
            return

        def synced(error: OSError | None) -> None:
            done(None if error is None else storage_error(step, error))

        self.syncer.sync_later(path, synced)

    def write_file(
        self, path: str, data: bytes, *, exists_ok_to_retry: bool = False, body: bytes = b"", sync: bool = True
    ) -> None:
        """Create ``path`` (O_EXCL), write ``data`` and fsync it; on failure unlink it and raise.

        Args:
            path: The file to create.
            data: Its content (a message file's header, if ``body`` follows).
            exists_ok_to_retry: Raise FileExistsError for EEXIST (the caller retries under another name).
            body: Bytes written after ``data`` with the same ``writev``, so a large message body is
                not copied into one string with its header first.
            sync: False skips the fsync: the caller makes the data durable otherwise (:meth:`syncfs_later`)
                before it renames the file anywhere.
        Raises:
            FileExistsError: The create said EEXIST and ``exists_ok_to_retry`` (nothing was created).
            StorageUnavailable: Any other failure (EEXIST too without ``exists_ok_to_retry``).
        """
        try:
            fd = os.open(path, _CREATE_FLAGS, 0o644)
        except FileExistsError as exc:
            if exists_ok_to_retry:
                lost_race("create", exc)
                raise
            raise storage_error("create", FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))) from None
        except OSError as exc:
            raise storage_error("create", exc) from exc
        step = "write"
        try:
            write_all(fd, data, body)
            if sync and self.fsync:
                step = "fsync"
                started = time.perf_counter()
                os.fsync(fd)
                if STORAGE_HOOKS.on_fsync is not None:
                    STORAGE_HOOKS.on_fsync("file", time.perf_counter() - started, 1)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise storage_error(step, exc) from exc
        os.close(fd)

    def replace_json(self, directory: str, name: str, obj: Any) -> None:
        """Atomically replace ``directory/name`` with ``obj`` as JSON: write ``.NAME.TOKEN.tmp``, fsync, rename, fsync.

        Raises:
            QueueNotFound: ``directory`` is gone (its queue was deleted).
            StorageUnavailable: Any step failed (the temporary file is removed).
        """
        tmp = temporary_path(directory, name)
        try:
            self.write_file(tmp, json_bytes(obj))
        except StorageUnavailable:
            if not os.path.isdir(directory):
                raise QueueNotFound(f"{os.path.basename(directory)!r} does not exist") from None
            raise
        rename_or_unlink(tmp, os.path.join(directory, name), f"replacing {name}")
        self.sync_dir(directory, f"replacing {name}")


def write_all(fd: int, first: bytes, second: bytes = b"") -> None:
    """Write ``first`` then ``second`` to ``fd`` completely: one ``writev`` (one ``write`` if ``second`` is empty).

    A short write (a signal, a full pipe; not a regular file's usual case) continues with the rest.

    Raises:
        OSError: A write failed.
    """
    written = os.writev(fd, (first, second)) if second else os.write(fd, first)
    for part in (first, second):
        if written >= len(part):
            written -= len(part)
            continue
        view = memoryview(part)[written:]
        written = 0
        while view:
            view = view[os.write(fd, view) :]


def temporary_path(directory: str, name: str) -> str:
    """``directory/.NAME.TOKEN.tmp``: where a new version of ``directory/name`` is written before its rename."""
    return os.path.join(directory, f".{name.lstrip('.')}.{uuid.uuid4().hex}.tmp")


def write_json_unsynced(directory: str, name: str, obj: Any, step: str) -> None:
    """Atomically replace ``directory/name`` with ``obj`` as JSON, without any fsync (a record a power cut may lose).

    Raises:
        StorageUnavailable: The write or the rename failed (the temporary file is removed).
    """
    tmp = temporary_path(directory, name)
    try:
        with open(tmp, "wb") as f:
            f.write(json_bytes(obj))
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise storage_error(step, exc) from exc
    rename_or_unlink(tmp, os.path.join(directory, name), step)


def rename_or_unlink(src: str, dst: str, step: str) -> None:
    """Rename ``src`` to ``dst``; if that fails, unlink ``src`` (a file of ours nobody else may see) and raise.

    Raises:
        StorageUnavailable: The rename failed, naming ``step``.
    """
    try:
        os.rename(src, dst)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(src)
        raise storage_error(step, exc) from exc


def rename_if_present(src: str, dst: str, step: str) -> bool:
    """Rename ``src`` to ``dst``; False if ``src`` is gone (another process took the transition first).

    Raises:
        StorageUnavailable: Any other failure, naming ``step``.
    """
    try:
        os.rename(src, dst)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(step, exc) from exc


def read_json(path: str) -> dict[str, Any] | None:
    """A small JSON metadata file as a dict; None if it does not exist or is not a JSON object (logged)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        logger.error("unreadable metadata file path=%s error=%s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def listdir(path: str, *, missing_ok: bool = True) -> list[str]:
    """The names in directory ``path``; ``[]`` if it does not exist and ``missing_ok``.

    Raises:
        FileNotFoundError: ``path`` does not exist and not ``missing_ok``.
    """
    try:
        return os.listdir(path)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise


def mtime_ms(path: str) -> int:
    """Modification time of ``path`` in epoch ms (follows links).

    Raises:
        OSError: The ``stat`` failed (FileNotFoundError if ``path`` is gone).
    """
    return os.stat(path).st_mtime_ns // 1_000_000


def unlink_if_older(path: str, cutoff_ms: int) -> bool:
    """Unlink ``path`` if its mtime is at or before ``cutoff_ms`` (epoch ms); True if it did.

    A file that is gone is not an error; any other failure is logged (the next sweep tries again).
    """
    try:
        if mtime_ms(path) > cutoff_ms:
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("cannot remove stale file path=%s error=%s", path, exc)
        return False


def json_bytes(obj: Any) -> bytes:
    """``obj`` as compact JSON with sorted keys (the form of every metadata file)."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def read_all(fd: int) -> bytes:
    """Everything from ``fd``'s position to its end."""
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
