"""The storage protocol: every transition a message file makes, as plain ``os`` calls.

One synchronous implementation, shared by the daemons (which call it from
worker threads) and by anything that works on a root directly. Each public
method is one transition of ``docs/protocol.md``; the section names match.

Every transition after the first write is a ``rename(2)``: whoever renames a
file first owns the transition, and a failed rename (ENOENT) means somebody
else got there first. Nothing here holds a lock on disk, so a process killed
at any point leaves only states that the other transitions recover from.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mqcore import model
from mqcore.errors import MessageNotFound, MQError, QueueNotFound, StorageUnavailable
from mqcore.model import ReceivedMessage
from mqcore.names import (
    REMOVED_QUEUE_SUFFIX,
    IdGenerator,
    InFlightName,
    Layout,
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    in_flight_name,
    parse_in_flight_name,
    parse_ready_name,
    ready_name,
    removed_name,
    sent_ms_of,
)

logger = logging.getLogger(__name__)

#: errno values that mean "the disk cannot take this write now" (answered 503).
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EMFILE, errno.ENFILE}
)


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (deadlines on disk use this clock)."""
    return time.time_ns() // 1_000_000


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

    def sync(self, path: str) -> None:
        """Make every rename into ``path`` done before this call durable.

        Raises:
            OSError: Opening or fsyncing the directory failed in this caller's round.
        """
        with self._cond:
            need = self._finished.get(path, 0) + 1
            if self._started.get(path, 0) >= need:
                need += 1  # round ``need`` is running and may have missed our renames
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
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            error = exc
        with self._cond:
            self._finished[path] = ticket
            if error is not None:
                failures = self._failures.setdefault(path, {})
                failures[ticket] = (error.errno or errno.EIO, error.strerror or str(error))
                for old in [t for t in failures if t <= ticket - self._KEEP_FAILURES]:
                    del failures[old]
            self._cond.notify_all()
        if error is not None:
            raise error


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A message written and fsynced in ``new/`` but not yet in its queue."""

    queue: QueueName
    message_id: MessageId
    path: str


def _storage_error(what: str, exc: OSError) -> StorageUnavailable:
    return StorageUnavailable(
        f"message could not be stored: {what} failed: {exc.strerror or exc}",
        errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
    )


class Store:
    """The protocol on one root directory.

    Args:
        root: Root of the folder tree; ``new/``, ``queues/``, ``delay/`` and
            ``remove/`` are created if missing.
        ids: Message id generator (one per process is enough).
        fsync: Make writes durable before they are acknowledged. Only tests of
            throughput without a disk may turn it off.
    """

    def __init__(self, root: str | os.PathLike[str], *, ids: IdGenerator | None = None, fsync: bool = True) -> None:
        self.layout = Layout(root)
        self.layout.create()
        self.ids = ids or IdGenerator()
        self.fsync = fsync
        self.syncer = DirSyncer()
        self._sync_dir(self.layout.root)

    # -- queues ------------------------------------------------------------

    def queue_exists(self, queue: QueueName) -> bool:
        """True if ``queues/<queue>`` is a directory."""
        return os.path.isdir(self.layout.queue_dir(queue))

    def create_queue(self, queue: QueueName) -> bool:
        """Create ``queues/<queue>``; return False if it already existed (idempotent).

        Raises:
            InvalidQueueName: Bad name.
            StorageUnavailable: The directory could not be made durable.
        """
        path = self.layout.queue_dir(queue)
        created = True
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise MQError(f"queues/{queue} exists but is not a directory; remove it by hand", queue=queue) from None
            # Its creator may have died before the fsync below: sync again.
            created = False
        except OSError as exc:
            raise _storage_error("mkdir", exc) from exc
        try:
            self._sync_dir(self.layout.queues)
        except OSError as exc:
            raise _storage_error("fsync of queues/", exc) from exc
        return created

    def list_queues(self) -> list[QueueName]:
        """Names of all queues, sorted."""
        out = []
        with os.scandir(self.layout.queues) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(ValueError):
                        out.append(check_queue_name(entry.name))
        return sorted(out)

    def delete_queue(self, queue: QueueName, now: int | None = None) -> None:
        """Delete a queue and every message in it.

        The queue directory is renamed into ``remove/`` in one step (consumers
        see it vanish at once; mq-reaper removes the tree), then the queue's
        in-flight files in ``delay/`` sent before the millisecond ``now``
        follow it (later ones may belong to a queue re-created since). In-flight files missed here (a
        receive racing the delete) are sent to ``remove/`` by mq-mover when
        they come due and their queue is gone.

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The deletion could not be made durable.
        """
        deleted_at = now if now is not None else now_ms()
        path = self.layout.queue_dir(queue)
        target = self.layout.remove_path(f"{queue}.{uuid.uuid4().hex}{REMOVED_QUEUE_SUFFIX}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from None
        except OSError as exc:
            raise _storage_error("rename of the queue directory", exc) from exc
        for name in self._listdir(self.layout.delay):
            parsed = parse_in_flight_name(name)
            if parsed is not None and parsed.queue == queue and sent_ms_of(parsed.message_id) < deleted_at:
                self._move_to_remove(self.layout.delay_path(name), removed_name(queue, parsed.message_id))
        try:
            self._sync_dir(self.layout.queues)
            self._sync_dir(self.layout.remove)
        except OSError as exc:
            raise _storage_error("fsync after deleting a queue", exc) from exc

    # -- send --------------------------------------------------------------

    def write_new(self, queue: QueueName, body: bytes, content_type: str | None = None) -> PendingMessage:
        """Send, step 1: write the message to ``new/Q.ID`` (O_EXCL) and fsync it.

        Raises:
            QueueNotFound: The queue does not exist (nothing is written).
            StorageUnavailable: Create, write or fsync failed; the partial file
                is unlinked (or left for mq-reaper if even that fails).
        """
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        message_id = self.ids.next_id()
        path = self.layout.new_path(queue, message_id)
        data = model.encode(body, content_type)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _storage_error("create", exc) from exc
        step = "write"
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                step = "fsync"
                os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise _storage_error(step, exc) from exc
        os.close(fd)
        return PendingMessage(queue, message_id, path)

    def publish(self, pending: PendingMessage) -> None:
        """Send, step 2: rename ``new/Q.ID`` to ``queues/Q/ID.0`` and fsync the queue directory.

        Once this returns the message is durable and ready. Directory fsyncs
        of concurrent publishers are group-committed.

        Raises:
            QueueNotFound: The queue was deleted meanwhile; the file is unlinked.
            StorageUnavailable: The rename or the directory fsync failed. After
                a failed fsync the message may or may not survive a power cut:
                the client must treat the send as failed (and may resend).
        """
        qdir = self.layout.queue_dir(pending.queue)
        target = os.path.join(qdir, ready_name(pending.message_id, 0))
        try:
            os.rename(pending.path, target)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.unlink(pending.path)
            if not os.path.isdir(qdir):
                raise QueueNotFound(f"queue {pending.queue!r} does not exist", queue=pending.queue) from None
            raise StorageUnavailable("message file vanished from new/ before it was published") from None
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(pending.path)
            raise _storage_error("rename", exc) from exc
        try:
            self._sync_dir(qdir)
        except OSError as exc:
            raise _storage_error("fsync of the queue directory", exc) from exc

    def send(self, queue: QueueName, body: bytes, content_type: str | None = None) -> MessageId:
        """Write, fsync and publish one message; return its id once it is durable.

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: It could not be guaranteed stored.
        """
        pending = self.write_new(queue, body, content_type)
        self.publish(pending)
        return pending.message_id

    # -- receive -----------------------------------------------------------

    def scan_ready(self, queue: QueueName) -> list[str]:
        """File names of the ready messages of ``queue`` (a directory listing).

        Raises:
            QueueNotFound: No such queue.
        """
        try:
            return [n for n in self._listdir(self.layout.queue_dir(queue), missing_ok=False) if parse_ready_name(n)]
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from None

    def lease(
        self, queue: QueueName, filename: str, visibility_timeout_ms: int, now: int | None = None
    ) -> ReceivedMessage | None:
        """Receive: rename ready ``queues/Q/ID.RC`` to ``delay/DL.Q.ID.RC+1`` and read it.

        Args:
            queue: The queue.
            filename: A ready file name ``ID.RC`` (from the index).
            visibility_timeout_ms: How long the message stays invisible, in ms.
            now: Current epoch ms (defaults to the wall clock).
        Returns:
            The message, or None if the file was gone (another consumer or a
            delete got it first) or unreadable (moved to ``remove/`` if torn).
        """
        parsed = parse_ready_name(filename)
        if parsed is None:
            return None
        message_id, count = parsed
        src = os.path.join(self.layout.queue_dir(queue), filename)
        try:
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _storage_error("open for receive", exc) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                logger.warning("ignoring foreign entry in queue=%s name=%s (not a file)", queue, filename)
                return None
            deadline = (now if now is not None else now_ms()) + visibility_timeout_ms
            leased = in_flight_name(deadline, queue, message_id, count + 1)
            try:
                os.rename(src, self.layout.delay_path(leased))
            except FileNotFoundError:
                return None
            data = _read_all(fd)
        except OSError as exc:
            raise _storage_error("receive", exc) from exc
        finally:
            os.close(fd)
        try:
            header, body = model.decode(data)
        except model.CorruptMessage as exc:
            logger.error("corrupt message file removed queue=%s id=%s error=%s", queue, message_id, exc)
            self._move_to_remove(self.layout.delay_path(leased), removed_name(queue, message_id))
            return None
        return ReceivedMessage(
            queue=queue,
            message_id=message_id,
            body=body,
            content_type=str(header.get("content_type") or model.DEFAULT_CONTENT_TYPE),
            receive_count=count + 1,
            deadline_ms=deadline,
            in_flight_name=leased,
        )

    # -- delete ------------------------------------------------------------

    def delete(
        self,
        queue: QueueName,
        message_id: MessageId,
        *,
        ready_hint: Iterable[str] = (),
        in_flight_hint: Iterable[str] = (),
        list_ready: bool = True,
    ) -> str:
        """Delete a message wherever it is: move it into ``remove/Q.ID``.

        Tries, in order: ``new/Q.ID``; the ready and in-flight names given as
        hints (from in-memory indexes); then a listing of ``delay/`` and, unless
        ``list_ready`` is False (the caller's index of the queue is kept fresh by
        inotify), of the queue directory. The first rename that succeeds wins. ``remove/`` is
        fsynced (group commit) before returning, so a delete is not undone by
        a power cut.

        Returns:
            Where the message was: ``"new"``, ``"ready"`` or ``"in_flight"``.
        Raises:
            QueueNotFound: No such queue.
            MessageNotFound: The message is in none of those places.
        """
        message_id = check_message_id(message_id)
        target = removed_name(queue, message_id)
        where = self._delete_somewhere(queue, message_id, target, ready_hint, in_flight_hint, list_ready)
        if where is None:
            if not self.queue_exists(queue):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
            raise MessageNotFound(f"message {message_id} is not in queue {queue!r}", queue=queue, message_id=message_id)
        try:
            self._sync_dir(self.layout.remove)
        except OSError as exc:
            raise _storage_error("fsync of remove/", exc) from exc
        return where

    def _delete_somewhere(
        self,
        queue: QueueName,
        message_id: MessageId,
        target: str,
        ready_hint: Iterable[str],
        in_flight_hint: Iterable[str],
        list_ready: bool,
    ) -> str | None:
        if self._move_to_remove(self.layout.new_path(queue, message_id), target):
            return "new"
        qdir = self.layout.queue_dir(queue)
        for name in ready_hint:
            if self._move_to_remove(os.path.join(qdir, name), target):
                return "ready"
        for name in in_flight_hint:
            if self._move_to_remove(self.layout.delay_path(name), target):
                return "in_flight"
        suffix = f".{queue}.{message_id}."
        for name in self._listdir(self.layout.delay):
            if suffix in name and self._move_to_remove(self.layout.delay_path(name), target):
                return "in_flight"
        prefix = f"{message_id}."
        for name in self._listdir(qdir) if list_ready else ():
            if name.startswith(prefix) and self._move_to_remove(os.path.join(qdir, name), target):
                return "ready"
        return None

    # -- redelivery (mq-mover) ---------------------------------------------

    def scan_in_flight(self) -> list[InFlightName]:
        """Every well-formed file name in ``delay/``, parsed (a directory listing)."""
        out = []
        for name in self._listdir(self.layout.delay):
            parsed = parse_in_flight_name(name)
            if parsed is not None:
                out.append(parsed)
            else:
                logger.warning("ignoring foreign file in delay/ name=%s", name)
        return out

    def redeliver(self, item: InFlightName) -> str:
        """Redelivery: rename ``delay/DL.Q.ID.RC`` back to ``queues/Q/ID.RC``.

        Returns:
            ``"redelivered"``; ``"gone"`` if the file had already left
            ``delay/`` (deleted, or redelivered by another mover);
            ``"orphaned"`` if its queue no longer exists, in which case the
            file is moved to ``remove/`` instead of being stranded.
        """
        src = self.layout.delay_path(item.filename)
        qdir = os.path.join(self.layout.queues, item.queue)
        try:
            os.rename(src, os.path.join(qdir, ready_name(item.message_id, item.receive_count)))
            return "redelivered"
        except FileNotFoundError:
            if not os.path.lexists(src):
                return "gone"
        if self._move_to_remove(src, removed_name(item.queue, item.message_id)):
            return "orphaned"
        return "gone"

    # -- removal (mq-reaper) -----------------------------------------------

    def scan_removed(self) -> list[str]:
        """Names in ``remove/``."""
        return self._listdir(self.layout.remove)

    def reap(self, name: str) -> bool:
        """Unlink ``remove/<name>`` (a removed queue directory is removed whole).

        Returns:
            True if something was removed, False if it was already gone.
        Raises:
            ValueError: ``name`` is empty, ``.``, ``..`` or has a ``/`` (it
                would address something outside ``remove/``).
        """
        if not name or name in {".", ".."} or "/" in name or "\0" in name:
            raise ValueError(f"not a name inside remove/: {name!r}")
        path = self.layout.remove_path(name)
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            pass
        except PermissionError:
            if not os.path.isdir(path):
                raise
        shutil.rmtree(path, ignore_errors=True)
        return True

    def sweep_new(self, older_than_ms: int, now: int | None = None) -> list[str]:
        """Unlink files in ``new/`` older than ``older_than_ms`` (writers that died).

        A sender answers 201 only after its file left ``new/``, so a file that
        sits there longer than any write takes was never acknowledged: it is
        removed, never delivered. Foreign names get the same grace period (a
        writer of a newer protocol version may be using them).

        Returns:
            The names unlinked.
        """
        cutoff = (now if now is not None else now_ms()) - older_than_ms
        removed = []
        for name in self._listdir(self.layout.new):
            path = os.path.join(self.layout.new, name)
            try:
                mtime_ms = os.stat(path).st_mtime_ns // 1_000_000
            except FileNotFoundError:
                continue
            if mtime_ms > cutoff:
                continue
            try:
                os.unlink(path)
                removed.append(name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("cannot remove stale entry in new/ name=%s error=%s", name, exc)
        return removed

    # -- helpers -----------------------------------------------------------

    def _sync_dir(self, path: str) -> None:
        if self.fsync:
            self.syncer.sync(path)

    def _move_to_remove(self, src: str, name: str) -> bool:
        try:
            os.rename(src, self.layout.remove_path(name))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _storage_error("rename into remove/", exc) from exc

    @staticmethod
    def _listdir(path: str, *, missing_ok: bool = True) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            if missing_ok:
                return []
            raise

    def close(self) -> None:
        """Nothing to release today; kept so callers can treat a Store as a resource."""


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def iter_due(items: Iterable[InFlightName], now: int) -> Iterator[InFlightName]:
    """The in-flight items whose deadline (epoch ms) is at or before ``now``."""
    return (i for i in items if i.deadline_ms <= now)
