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
import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mqcore import model
from mqcore.attributes import QueueAttributes, check_changes, effective
from mqcore.errors import (
    InvalidAttribute,
    InvalidReceiptHandle,
    MessageNotFound,
    MessageNotInFlight,
    MQError,
    QueueNameExists,
    QueueNotFound,
    StaleReceiptHandle,
    StorageUnavailable,
)
from mqcore.model import ReceivedMessage
from mqcore.names import (
    ATTEMPT_WINDOW_MS,
    MAX_PARTITIONS,
    REDRIVE_CANCEL_FILE,
    REMOVED_QUEUE_SUFFIX,
    STAGING_SUFFIX,
    IdGenerator,
    InFlightName,
    Layout,
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    in_flight_name,
    new_lease_token,
    parse_in_flight_name,
    parse_ready_name,
    parse_receipt_handle,
    partition_of,
    ready_name,
    removed_name,
    sent_ms_of,
)

logger = logging.getLogger(__name__)

#: errno values that mean "the disk cannot take this write now" (answered 503).
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EMFILE, errno.ENFILE}
)


#: Age after which a temporary metadata file (``.NAME.TOKEN.tmp``) belongs to a writer that died, in ms.
TMP_GRACE_MS = 300_000


class StorageHooks:
    """Observers of storage work that a daemon may set (metrics); every hook is None (no cost) by default.

    Hooks are called on whatever thread did the work (saver, fetcher or worker
    threads), so they must be thread-safe and cheap. Module-level because an
    fsync and a storage error are per process, whichever :class:`Store` did them.

    Attributes:
        on_fsync: ``(kind, seconds, batch)`` after each fsync: kind ``"file"`` (a message file;
            batch 1) or ``"directory"`` (a group-commit round; batch = callers it covered).
        on_error: ``(step)`` for each storage error raised (e.g. ``"fsync"``, ``"rename"``).
    """

    on_fsync: Any = None
    on_error: Any = None


#: The process's storage hooks (set by ``daemons._metrics``).
STORAGE_HOOKS = StorageHooks()


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
        self._callers: dict[tuple[str, int], int] = {}
        """Callers per (directory, round): the group-commit batch size reported to STORAGE_HOOKS."""

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
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
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


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A message written and fsynced in ``new/`` but not yet in its queue."""

    queue: QueueName
    message_id: MessageId
    path: str


@dataclass(frozen=True, slots=True)
class SendEntry:
    """One message of a batch send.

    Attributes:
        body: The body bytes.
        content_type: Its Content-Type, or None.
        attributes: User message attributes (name -> string), already checked.
        delay_ms: Delay before it becomes visible, in ms (0 = ready at once).
        attribute_types: SQS DataType of attributes that are not plain ``String`` (section 15.13), or None.
    """

    body: bytes
    content_type: str | None = None
    attributes: dict[str, str] | None = None
    delay_ms: int = 0
    attribute_types: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class PeekedFile:
    """A message read by :meth:`Store.peek` without being received.

    Attributes:
        queue: The queue it belongs to.
        message_id: Its id.
        state: ``"ready"`` (in ``queues/Q/``), ``"in_flight"`` (in ``delay/``, received at
            least once) or ``"delayed"`` (in ``delay/``, never received: sent with a delay).
        receive_count: Receives so far (0 = never received).
        visible_at_ms: When it becomes ready again (its ``delay/`` deadline), epoch ms;
            None when ready.
        body: The body bytes.
        content_type: As sent.
        attributes: User message attributes.
        source_queue: The queue it was first sent to (its header's ``queue``), or None.
        attribute_types: SQS DataType of attributes that are not plain ``String``.
    """

    queue: QueueName
    message_id: MessageId
    state: str
    receive_count: int
    visible_at_ms: int | None
    body: bytes
    content_type: str
    attributes: dict[str, str]
    source_queue: str | None
    attribute_types: dict[str, str] = field(default_factory=dict)

    @property
    def sent_ms(self) -> int:
        """Send time, epoch milliseconds (from the id)."""
        return sent_ms_of(self.message_id)


#: Most messages one :meth:`Store.peek` returns.
MAX_PEEK_LIMIT = 1000
#: Messages a peek returns when no limit is given.
DEFAULT_PEEK_LIMIT = 100


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """What a receive (or a redelivery) must check before handing a message out.

    Attributes:
        max_receive_count: A message already received this many times goes to
            ``dead_letter_queue`` instead (None = no limit).
        dead_letter_queue: Where such messages go (None = no dead-letter queue).
        retention_ms: Messages older than this (from their send time) are
            removed, in ms (None = kept for ever).
        purged_before: Messages with ids up to this one were purged (None = never purged).
    """

    max_receive_count: int | None = None
    dead_letter_queue: QueueName | None = None
    retention_ms: int | None = None
    purged_before: MessageId | None = None

    @classmethod
    def for_queue(cls, attrs: QueueAttributes, purged_before: MessageId | None) -> LeasePolicy:
        """The policy of a queue with effective attributes ``attrs`` and purge marker ``purged_before``."""
        return cls(
            max_receive_count=attrs.max_receive_count,
            dead_letter_queue=attrs.dead_letter_queue,
            retention_ms=attrs.retention_seconds * 1000,
            purged_before=purged_before,
        )

    def is_gone(self, message_id: MessageId, now: int) -> bool:
        """True if ``message_id`` was purged or has outlived the retention period at ``now`` (epoch ms)."""
        if self.purged_before is not None and message_id <= self.purged_before:
            return True
        return self.retention_ms is not None and sent_ms_of(message_id) + self.retention_ms <= now

    def dead_letter_for(self, receive_count: int) -> QueueName | None:
        """The dead-letter queue a message received ``receive_count`` times must move to, or None."""
        if self.dead_letter_queue is None or self.max_receive_count is None:
            return None
        return self.dead_letter_queue if receive_count >= self.max_receive_count else None


#: Creates a send tries, each with a fresh id, when O_EXCL answers EEXIST (docs/protocol.md 13.2).
SEND_CREATE_ATTEMPTS = 3


def _storage_error(what: str, exc: OSError) -> StorageUnavailable:
    if STORAGE_HOOKS.on_error is not None:
        STORAGE_HOOKS.on_error(what)
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
        """True if ``queues/<queue>`` is a directory.

        Raises:
            StorageUnavailable: The ``stat`` failed other than with ENOENT/ENOTDIR (e.g. ENOTCONN on a lost
                FUSE mount, EIO): whether the queue exists is unknown, so it must not be answered as missing.
        """
        try:
            return stat.S_ISDIR(os.stat(self.layout.queue_dir(queue)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise _storage_error("stat of the queue directory", exc) from exc

    def create_queue(
        self,
        queue: QueueName,
        attributes: dict[str, Any] | None = None,
        now: int | None = None,
        defaults: QueueAttributes | None = None,
    ) -> bool:
        """Create ``queues/<queue>`` with its attributes; return False if it already existed (idempotent).

        A new queue is built as ``queues/.Q.TOKEN.creating`` holding its
        ``.attributes`` file and renamed into place, so no process ever sees
        the queue without its attributes. ``rename(2)`` of a directory fails
        when the target is a non-empty directory, so of two racing creators
        exactly one wins.

        Args:
            queue: The queue name.
            attributes: Explicit queue attributes (``mqcore.attributes`` keys), or None.
            now: Creation time, epoch ms (defaults to the wall clock).
            defaults: The caller's defaults for keys the queue does not set (used to
                compare ``attributes`` with an existing queue's effective values).
        Raises:
            InvalidQueueName: Bad name.
            InvalidAttribute: Bad attributes, or a dead-letter queue that does not exist or is the queue itself.
            QueueNameExists: The queue exists and one of ``attributes`` differs from its effective value
                (SQS: CreateQueue with other attributes fails with QueueNameExists).
            StorageUnavailable: The directory could not be made durable.
        """
        path = self.layout.queue_dir(queue)
        explicit = {k: v for k, v in check_changes(attributes or {}).items() if v is not None}
        if os.path.isdir(path):
            self._check_same_attributes(queue, explicit, defaults)
            try:  # its creator may have died before its fsync of queues/: sync again
                self._sync_dir(self.layout.queues)
            except OSError as exc:
                raise _storage_error("fsync of queues/", exc) from exc
            return False
        self._check_redrive_policy(explicit)
        self._check_dead_letter_queue(queue, explicit.get("dead_letter_queue"))
        created_ms = now if now is not None else now_ms()
        staging = os.path.join(self.layout.queues, f".{queue}.{uuid.uuid4().hex}{STAGING_SUFFIX}")
        try:
            os.mkdir(staging)
            meta = {"version": 1, "created_ms": created_ms, "modified_ms": created_ms, "attributes": explicit}
            self._write_file(os.path.join(staging, ".attributes"), _json_bytes(meta))
            self._sync_dir(staging)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise _storage_error("creating the queue directory", exc) from exc
        created = True
        try:
            os.rename(staging, path)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise _storage_error("rename of the new queue directory", exc) from exc
            if not os.path.isdir(path):
                raise MQError(f"queues/{queue} exists but is not a directory; remove it by hand", queue=queue) from None
            self._check_same_attributes(queue, explicit, defaults)
            created = False  # its creator may have died before the fsync below: sync again
        try:
            self._sync_dir(self.layout.queues)
        except OSError as exc:
            raise _storage_error("fsync of queues/", exc) from exc
        return created

    def _check_same_attributes(
        self, queue: QueueName, explicit: dict[str, Any], defaults: QueueAttributes | None
    ) -> None:
        if not explicit:
            return
        stored = self.get_attributes(queue)
        current = {**effective(stored, defaults or QueueAttributes()).to_json(), **stored}
        differ = sorted(k for k, v in explicit.items() if current.get(k) != v)
        if differ:
            raise QueueNameExists(
                f"queue {queue!r} exists with other values of {', '.join(differ)}; to change an existing queue's "
                f"attributes use PUT /{queue}/attributes (mqctl queues attributes {queue} --set NAME=VALUE)",
                queue=queue,
                attributes=differ,
            )

    @staticmethod
    def _check_redrive_policy(explicit: dict[str, Any]) -> None:
        if explicit.get("max_receive_count") is not None and explicit.get("dead_letter_queue") is None:
            raise InvalidAttribute(
                "max_receive_count needs a dead_letter_queue (SQS: RedrivePolicy sets both)", name="max_receive_count"
            )

    def _check_dead_letter_queue(self, queue: QueueName, dead_letter_queue: str | None) -> None:
        if dead_letter_queue is None:
            return
        if dead_letter_queue == queue:
            raise InvalidAttribute("a queue cannot be its own dead-letter queue", name="dead_letter_queue")
        if not self.queue_exists(QueueName(dead_letter_queue)):
            raise InvalidAttribute(
                f"dead-letter queue {dead_letter_queue!r} does not exist; create it first (as SQS requires)",
                name="dead_letter_queue",
            )

    def queue_meta(self, queue: QueueName) -> dict[str, Any]:
        """The queue's ``.attributes`` file: ``{"created_ms", "modified_ms", "attributes"}`` ({} if absent).

        Raises:
            QueueNotFound: No such queue.
        """
        data = self._read_json(self.layout.attributes_path(queue))
        if data is None:
            if not self.queue_exists(queue):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
            return {}
        return data

    def get_attributes(self, queue: QueueName) -> dict[str, Any]:
        """The explicitly set attributes of ``queue`` ({} when none are set, or for a queue of protocol v1).

        Raises:
            QueueNotFound: No such queue.
        """
        attrs = self.queue_meta(queue).get("attributes")
        return dict(attrs) if isinstance(attrs, dict) else {}

    def queue_settings(self, queue: QueueName) -> tuple[dict[str, Any], int | None]:
        """``(explicit attributes, created_ms)`` of ``queue`` from one read of its ``.attributes``.

        Raises:
            QueueNotFound: No such queue.
        """
        meta = self.queue_meta(queue)
        attrs = meta.get("attributes")
        created = meta.get("created_ms")
        return (dict(attrs) if isinstance(attrs, dict) else {}), (created if isinstance(created, int) else None)

    def queue_created_ms(self, queue: QueueName) -> int | None:
        """Creation time of ``queue`` in epoch ms, or None if unknown (created by protocol v1).

        Raises:
            QueueNotFound: No such queue.
        """
        created = self.queue_meta(queue).get("created_ms")
        return created if isinstance(created, int) else None

    def set_attributes(self, queue: QueueName, changes: dict[str, Any], now: int | None = None) -> dict[str, Any]:
        """Merge ``changes`` into the explicit attributes of ``queue`` (a None value removes a key).

        The file is replaced atomically (write, fsync, rename, fsync of the
        queue directory). Two processes changing attributes at the same time:
        the last rename wins whole (SQS's SetQueueAttributes has the same race).

        Returns:
            The explicit attributes after the change.
        Raises:
            QueueNotFound: No such queue.
            InvalidAttribute: A key or value is invalid, or the dead-letter queue does not exist.
            StorageUnavailable: The change could not be made durable.
        """
        checked = check_changes(changes)
        self._check_dead_letter_queue(queue, checked.get("dead_letter_queue"))
        meta = self.queue_meta(queue)
        explicit = dict(meta.get("attributes") or {})
        for key, value in checked.items():
            if value is None:
                explicit.pop(key, None)
            else:
                explicit[key] = value
        self._check_redrive_policy(explicit)
        stamp = now if now is not None else now_ms()
        meta = {
            "version": 1,
            "created_ms": meta.get("created_ms", stamp),
            "modified_ms": stamp,
            "attributes": explicit,
        }
        self._replace_json(self.layout.queue_dir(queue), ".attributes", meta)
        return explicit

    def read_sqs_meta(self, queue: QueueName) -> dict[str, Any]:
        """The queue's ``.sqs`` file (section 15.13: tags and SQS-only attributes), ``{}`` if it has none.

        Raises:
            QueueNotFound: No such queue.
        """
        data = self._read_json(os.path.join(self.layout.queue_dir(queue), ".sqs"))
        if data is None:
            if not self.queue_exists(queue):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
            return {}
        return data

    def replace_sqs_meta(self, queue: QueueName, meta: dict[str, Any]) -> None:
        """Atomically replace the queue's ``.sqs`` file with ``meta`` (write, fsync, rename, fsync).

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The change could not be made durable.
        """
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        self._replace_json(self.layout.queue_dir(queue), ".sqs", meta)

    def list_queues(self, prefix: str = "") -> list[QueueName]:
        """Names of all queues starting with ``prefix``, sorted."""
        out = []
        with os.scandir(self.layout.queues) as it:
            for entry in it:
                if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
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

    def write_new(
        self,
        queue: QueueName,
        body: bytes,
        content_type: str | None = None,
        attributes: dict[str, str] | None = None,
        message_id: MessageId | None = None,
        attribute_types: dict[str, str] | None = None,
    ) -> PendingMessage:
        """Send, step 1: write the message to ``new/Q.ID`` (O_EXCL) and fsync it.

        Args:
            queue: The queue.
            body: The body bytes.
            content_type: Its Content-Type, or None.
            attributes: User message attributes (checked by the caller with
                :func:`mqcore.attributes.check_message_attributes`).
            message_id: An id taken from ``self.ids`` beforehand, so that a batch
                written by parallel threads keeps its entries' order; None
                takes the next id.
            attribute_types: SQS DataType of attributes that are not plain ``String`` (section 15.13).
        Raises:
            QueueNotFound: The queue does not exist (nothing is written).
            StorageUnavailable: Create, write or fsync failed; the partial file
                is unlinked (or left for mq-reaper if even that fails).
        """
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        message_id = message_id or self.ids.next_id()
        data = model.encode(body, content_type, attributes, queue, attribute_types)
        for attempt in range(1, SEND_CREATE_ATTEMPTS + 1):
            path = self.layout.new_path(queue, message_id)
            try:
                self._write_file(path, data, exists_ok_to_retry=attempt < SEND_CREATE_ATTEMPTS)
            except FileExistsError:
                # Ids are unique, so the name is not another sender's file: GlusterFS without kernel caches
                # can answer EEXIST to both of two racing O_EXCL creates with no file left (docs/protocol.md
                # 13.2). Nothing of ours was created; a fresh id is a fresh name.
                message_id = self.ids.next_id()
                continue
            break
        return PendingMessage(queue, message_id, path)

    def _write_file(self, path: str, data: bytes, *, exists_ok_to_retry: bool = False) -> None:
        """Create ``path`` (O_EXCL), write ``data`` and fsync it; on failure unlink it and raise StorageUnavailable.

        Raises:
            FileExistsError: The create said EEXIST and ``exists_ok_to_retry`` (nothing was created).
            StorageUnavailable: Any other failure (EEXIST too without ``exists_ok_to_retry``).
        """
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            if exists_ok_to_retry:
                raise
            raise _storage_error("create", FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))) from None
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
                started = time.perf_counter()
                os.fsync(fd)
                if STORAGE_HOOKS.on_fsync is not None:
                    STORAGE_HOOKS.on_fsync("file", time.perf_counter() - started, 1)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise _storage_error(step, exc) from exc
        os.close(fd)

    def publish(self, pending: PendingMessage, delay_ms: int = 0, now: int | None = None) -> None:
        """Send, step 2: rename ``new/Q.ID`` into place and fsync the directory it went to.

        ``delay_ms == 0``: to ``queues/Q/ID.0`` (ready). ``delay_ms > 0``: to
        ``delay/DL.Q.ID.0.LT`` with ``DL = now + delay_ms`` and a fresh lease token (a delayed send:
        mq-mover makes it ready when DL passes). Once this returns the message
        is durable. Directory fsyncs of concurrent publishers are group-committed.

        Raises:
            QueueNotFound: The queue was deleted meanwhile; the file is unlinked.
            StorageUnavailable: The rename or the directory fsync failed. After
                a failed fsync the message may or may not survive a power cut:
                the client must treat the send as failed (and may resend).
        """
        target_dir = self._publish_rename(pending, delay_ms, now)
        try:
            self._sync_dir(target_dir)
        except OSError as exc:
            raise _storage_error("fsync of the directory", exc) from exc

    def _publish_rename(self, pending: PendingMessage, delay_ms: int, now: int | None) -> str:
        """The rename of :meth:`publish`; returns the directory to fsync."""
        qdir = self.layout.queue_dir(pending.queue)
        if delay_ms > 0:
            deadline = (now if now is not None else now_ms()) + delay_ms
            target_dir = self.layout.delay
            target = self.layout.delay_path(
                in_flight_name(deadline, pending.queue, pending.message_id, 0, new_lease_token())
            )
            if not os.path.isdir(qdir):
                with contextlib.suppress(OSError):
                    os.unlink(pending.path)
                raise QueueNotFound(f"queue {pending.queue!r} does not exist", queue=pending.queue)
        else:
            target_dir = qdir
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
        return target_dir

    def send(
        self,
        queue: QueueName,
        body: bytes,
        content_type: str | None = None,
        attributes: dict[str, str] | None = None,
        delay_ms: int = 0,
        attribute_types: dict[str, str] | None = None,
    ) -> MessageId:
        """Write, fsync and publish one message; return its id once it is durable.

        Args:
            queue: The queue.
            body: The body bytes.
            content_type: Its Content-Type, or None.
            attributes: User message attributes (name -> string), already checked.
            delay_ms: Invisible for this many ms after the send (SQS: DelaySeconds 0-900, here in ms).
            attribute_types: SQS DataType of attributes that are not plain ``String`` (section 15.13).
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: It could not be guaranteed stored.
        """
        pending = self.write_new(queue, body, content_type, attributes, attribute_types=attribute_types)
        self.publish(pending, delay_ms)
        return pending.message_id

    def publish_many(self, items: list[tuple[PendingMessage, int]], now: int | None = None) -> list[MQError | None]:
        """Send, step 2 for several written messages: rename each into place, then fsync each target directory once.

        Args:
            items: ``(pending, delay_ms)`` pairs from :meth:`write_new` (which
                callers may run in parallel threads: each fsyncs its own file).
            now: Epoch ms the delays count from.
        Returns:
            None for each published message, or its error (in order). A
            failed directory fsync fails every message renamed into that
            directory (it may or may not survive a power cut).
        """
        now = now if now is not None else now_ms()
        results: list[MQError | None] = [None] * len(items)
        renamed: dict[str, list[int]] = {}
        for i, (pending, delay_ms) in enumerate(items):
            try:
                renamed.setdefault(self._publish_rename(pending, delay_ms, now), []).append(i)
            except MQError as exc:
                results[i] = exc
        for directory, indexes in renamed.items():
            try:
                self._sync_dir(directory)
            except OSError as exc:
                error = _storage_error("fsync of the directory", exc)
                for i in indexes:
                    results[i] = error
        return results

    def send_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Send several messages with one group commit; return each entry's id or error, in order.

        Every file is written and fsynced, all are renamed into place, then
        each target directory (the queue's, and ``delay/`` for delayed
        entries) is fsynced once. An entry whose step fails gets its error;
        the others are unaffected, except that a failed directory fsync fails
        every entry renamed into that directory.

        Raises:
            QueueNotFound: No such queue (nothing is written).
        """
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        results: list[MessageId | MQError] = []
        written: list[tuple[int, PendingMessage, int]] = []
        for i, entry in enumerate(entries):
            try:
                pending = self.write_new(
                    queue, entry.body, entry.content_type, entry.attributes, attribute_types=entry.attribute_types
                )
            except MQError as exc:
                results.append(exc)
                continue
            results.append(pending.message_id)
            written.append((i, pending, entry.delay_ms))
        published = self.publish_many([(pending, delay_ms) for _, pending, delay_ms in written])
        for (i, _, _), outcome in zip(written, published, strict=True):
            if outcome is not None:
                results[i] = outcome
        return results

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

    def policy(self, queue: QueueName, now: int | None = None) -> LeasePolicy:
        """The :class:`LeasePolicy` of ``queue`` from its ``.attributes`` and ``.purge`` files (two small reads).

        A queue that no longer exists gets the empty policy.
        """
        try:
            attrs = effective(self.get_attributes(queue), QueueAttributes())
        except QueueNotFound:
            return LeasePolicy()
        return LeasePolicy.for_queue(attrs, self.purged_before(queue))

    def purged_before(self, queue: QueueName) -> MessageId | None:
        """The id up to which ``queue`` was purged (its ``.purge`` marker), or None."""
        data = self._read_json(self.layout.purge_path(queue))
        if data is None:
            return None
        try:
            return check_message_id(data.get("purged_before_id"))  # type: ignore[arg-type]
        except ValueError:
            logger.error("ignoring malformed purge marker queue=%s", queue)
            return None

    def lease(
        self,
        queue: QueueName,
        filename: str,
        visibility_timeout_ms: int,
        now: int | None = None,
        policy: LeasePolicy | None = None,
    ) -> ReceivedMessage | None:
        """Receive: rename ready ``queues/Q/ID.RC`` to ``delay/DL.Q.ID.RC+1.LT`` and read it.

        ``LT`` is a fresh lease token (:func:`mqcore.names.new_lease_token`), so
        the target name is this receive's alone: two receives racing for the
        file (on this host or another, in the same millisecond) aim at two
        different names, and the rename of the one source succeeds once.

        With a ``policy``, a message that was purged or outlived the retention
        period is moved to ``remove/``, and one already received
        ``max_receive_count`` times is moved to the dead-letter queue
        (``queues/DLQ/ID.RC``), instead of being delivered.

        On a first receive (RC 0) the file's mtime is set to the receive time:
        it is the message's ApproximateFirstReceiveTimestamp from then on.

        Args:
            queue: The queue.
            filename: A ready file name ``ID.RC`` (from the index).
            visibility_timeout_ms: How long the message stays invisible, in ms.
            now: Current epoch ms (defaults to the wall clock).
            policy: Dead-letter, retention and purge rules of the queue.
        Returns:
            The message, or None if the file was gone (another consumer or a
            delete got it first), unreadable (moved to ``remove/`` if torn),
            or removed or dead-lettered by the policy.
        """
        parsed = parse_ready_name(filename)
        if parsed is None:
            return None
        message_id, count = parsed
        src = os.path.join(self.layout.queue_dir(queue), filename)
        return self._take(queue, src, message_id, count, visibility_timeout_ms, now, policy)

    def _take(
        self,
        queue: QueueName,
        src: str,
        message_id: MessageId,
        count: int,
        visibility_timeout_ms: int,
        now: int | None,
        policy: LeasePolicy | None,
    ) -> ReceivedMessage | None:
        """Lease the file at ``src`` (ready, or in flight for a re-let) as receive number ``count + 1``."""
        now = now if now is not None else now_ms()
        if policy is not None:
            if policy.is_gone(message_id, now):
                self._move_to_remove(src, removed_name(queue, message_id))
                return None
            dead_letter_queue = policy.dead_letter_for(count)
            if dead_letter_queue is not None and self._dead_letter_path(src, dead_letter_queue, message_id, count):
                logger.info(
                    "dead-lettered queue=%s id=%s receives=%d dlq=%s", queue, message_id, count, dead_letter_queue
                )
                return None
        try:
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ESTALE:  # moved or replaced by another host meanwhile: taken (section 13.3)
                return None
            raise _storage_error("open for receive", exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                logger.warning("ignoring foreign entry in queue=%s path=%s (not a file)", queue, src)
                return None
            deadline = now + visibility_timeout_ms
            leased = in_flight_name(deadline, queue, message_id, count + 1, new_lease_token())
            try:
                os.rename(src, self.layout.delay_path(leased))
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno != errno.ESTALE:
                    raise
                # Another host moved the file between the open and the rename (section 13.3). Had our rename
                # happened after all, the lease name is ours alone and the mover redelivers it at its deadline.
                return None
            if count == 0:
                first_receive_ms = now
                with contextlib.suppress(OSError):
                    os.utime(fd, ns=(now * 1_000_000, now * 1_000_000))
            else:
                first_receive_ms = st.st_mtime_ns // 1_000_000
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
        source = header.get("queue")
        return ReceivedMessage(
            queue=queue,
            message_id=message_id,
            body=body,
            content_type=str(header.get("content_type") or model.DEFAULT_CONTENT_TYPE),
            receive_count=count + 1,
            deadline_ms=deadline,
            in_flight_name=leased,
            attributes=model.header_attributes(header),
            attribute_types=model.header_attribute_types(header),
            first_receive_ms=first_receive_ms,
            source_queue=source if isinstance(source, str) else None,
        )

    def _dead_letter_path(self, src: str, dead_letter_queue: QueueName, message_id: MessageId, count: int) -> bool:
        """Rename ``src`` to ``queues/DLQ/ID.RC``; False if ``src`` is gone or the dead-letter queue does not exist."""
        new_id = self._id_outside_purge(dead_letter_queue, message_id)
        target = os.path.join(self.layout.queue_dir(dead_letter_queue), ready_name(new_id, count))
        try:
            os.rename(src, target)
            return True
        except FileNotFoundError:
            if os.path.lexists(src):  # the caller decides what to do (and logs it)
                logger.debug("dead-letter queue %s does not exist (message %s)", dead_letter_queue, message_id)
            return False
        except OSError as exc:
            raise _storage_error("rename into the dead-letter queue", exc) from exc

    def _id_outside_purge(self, queue: QueueName, message_id: MessageId) -> MessageId:
        """The id a message moved into ``queue`` must have so that ``queue``'s purge marker does not cover it.

        A purge covers ids up to its marker, and a dead-lettered or redriven
        message keeps its (older) id; moved into a queue purged after it was
        sent, it would be removed as purged. Such a message gets a fresh id
        instead (the file name is the only place the id lives), so it is
        placed after the messages already there.
        """
        purged = self.purged_before(queue)
        if purged is None or message_id > purged:
            return message_id
        new_id = self.ids.next_id()
        logger.info("new id for a message moved into purged queue=%s id=%s new_id=%s", queue, message_id, new_id)
        return new_id

    def dead_letter(self, item: InFlightName, dead_letter_queue: QueueName) -> bool:
        """Dead-letter a due in-flight message: ``delay/DL.Q.ID.RC`` -> ``queues/DLQ/ID.RC`` (mq-mover).

        The id (so the send time, from which retention counts, as SQS) and the
        receive count are kept.

        Returns:
            False if the file had left ``delay/`` or the dead-letter queue does not exist.
        """
        return self._dead_letter_path(
            self.layout.delay_path(item.filename), dead_letter_queue, item.message_id, item.receive_count
        )

    def remove_in_flight(self, item: InFlightName) -> bool:
        """Remove a purged or expired in-flight (or delayed) file: ``delay/DL.Q.ID.RC`` -> ``remove/Q.ID`` (mq-mover).

        Not fsynced: if a power cut undoes the rename, the file is back in
        ``delay/``, already due, and is removed again at the next pass.

        Returns:
            True if moved, False if the file had already left ``delay/``.
        Raises:
            StorageUnavailable: Any other rename failure.
        """
        return self._move_to_remove(self.layout.delay_path(item.filename), removed_name(item.queue, item.message_id))

    def move_due(self, item: InFlightName, now: int, policy: LeasePolicy | None) -> str:
        """Move on one due ``delay/`` file as mq-mover does (also the brokerless client's redelivery).

        In order: a purged or expired message goes to ``remove/``; one received
        ``max_receive_count`` times (RC > 0) goes to its dead-letter queue; any
        other (or one whose dead-letter queue is missing: it is kept, not lost)
        is redelivered to its queue.

        Args:
            item: The parsed ``delay/`` name, its deadline at or before ``now``.
            now: Epoch ms of the decision (retention counts to it).
            policy: The queue's policy (:meth:`policy`), or None if the queue is gone.
        Returns:
            ``"purged"`` or ``"expired"`` (moved to ``remove/``), ``"dead_lettered"``,
            ``"redelivered"``, ``"kept"`` (redelivered because the dead-letter queue
            does not exist), ``"orphaned"`` (its queue is gone: moved to ``remove/``)
            or ``"gone"`` (the file had already left ``delay/``).
        Raises:
            StorageUnavailable: A rename failed for another reason than a missing file.
        """
        kept = False
        if policy is not None:
            if policy.is_gone(item.message_id, now):
                if not self.remove_in_flight(item):
                    return "gone"
                purged = policy.purged_before is not None and item.message_id <= policy.purged_before
                return "purged" if purged else "expired"
            dead_letter_queue = policy.dead_letter_for(item.receive_count)
            if dead_letter_queue is not None and item.receive_count > 0:
                if self.dead_letter(item, dead_letter_queue):
                    return "dead_lettered"
                if not os.path.lexists(self.layout.delay_path(item.filename)):
                    return "gone"
                kept = True
        result = self.redeliver(item)
        return "kept" if kept and result == "redelivered" else result

    def peek(
        self,
        queue: QueueName,
        after: MessageId | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        now: int | None = None,
        partition: tuple[int, int] | None = None,
    ) -> tuple[list[PeekedFile], MessageId | None]:
        """Read a page of a queue's messages without receiving them (nothing is renamed or changed).

        Lists ``queues/Q/`` and ``delay/`` (the queue's ready, in-flight and
        delayed messages), orders them by id (send order) and reads the first
        ``limit`` with ids greater than ``after``. Purged and expired messages
        are left out. A snapshot, not a transaction: a message that moves
        between the listing and its read (received, redelivered) is looked up
        again in one fresh listing; only one that moved twice meanwhile, or was
        deleted, is left out. None appears twice in one page, and paging by id
        never returns a message twice.

        Args:
            queue: The queue.
            after: Only ids greater than this (the previous page's ``next_after``); None = from the start.
            limit: 1 to :data:`MAX_PEEK_LIMIT` messages.
            now: Epoch ms for the retention check.
            partition: ``(i, M)``: only messages of partition ``i`` of ``M``
                (:func:`mqcore.names.partition_of`); None = all.
        Returns:
            ``(messages, next_after)``: ``next_after`` is the id to pass as ``after``
            for the next page, None when there are no more messages.
        Raises:
            QueueNotFound: No such queue.
            ValueError: ``limit`` or ``partition`` out of range.
        """
        if not 1 <= limit <= MAX_PEEK_LIMIT:
            raise ValueError(f"limit must be 1-{MAX_PEEK_LIMIT}, got {limit}")
        if partition is not None and not 0 <= partition[0] < partition[1] <= MAX_PARTITIONS:
            raise ValueError(f"partition must be (i, M) with 0 <= i < M <= {MAX_PARTITIONS}, got {partition}")
        now = now if now is not None else now_ms()
        policy = self.policy(queue, now)
        found = self._locate(queue)
        ids = sorted(
            i
            for i in found
            if (after is None or i > after)
            and (partition is None or partition_of(i, partition[1]) == partition[0])
            and not policy.is_gone(MessageId(i), now)
        )
        page = ids[:limit]
        return self._read_located(queue, page, found), (page[-1] if len(ids) > limit else None)  # type: ignore[return-value]

    def peek_ids(self, queue: QueueName, message_ids: Iterable[str], now: int | None = None) -> list[PeekedFile]:
        """Read the given messages of a queue without receiving them, wherever they are (ready, in flight, delayed).

        Ids that are not in the queue (deleted, never sent, purged, expired, or
        malformed) are left out. Used to rebuild a batch from its message ids
        (the Spark source after a restart). One listing of ``queues/Q/`` and of
        ``delay/``, whatever the number of ids.

        Returns:
            The messages found, in id order.
        Raises:
            QueueNotFound: No such queue.
        """
        now = now if now is not None else now_ms()
        policy = self.policy(queue, now)
        found = self._locate(queue)
        wanted = sorted({i for i in message_ids if i in found and not policy.is_gone(MessageId(i), now)})
        return self._read_located(queue, wanted, found)

    def _locate(self, queue: QueueName) -> dict[str, tuple[str, int, int | None]]:
        """Message id -> (path, receive count, ``delay/`` deadline or None) of every message of ``queue``."""
        found: dict[str, tuple[str, int, int | None]] = {}
        qdir = self.layout.queue_dir(queue)
        for name in self.scan_ready(queue):
            parsed = parse_ready_name(name)
            if parsed is not None:
                found[parsed[0]] = (os.path.join(qdir, name), parsed[1], None)
        for name in self._listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is not None and item.queue == queue and item.message_id not in found:
                found[item.message_id] = (self.layout.delay_path(name), item.receive_count, item.deadline_ms)
        return found

    def _read_located(
        self, queue: QueueName, ids: list[str], found: dict[str, tuple[str, int, int | None]]
    ) -> list[PeekedFile]:
        """Read ``ids`` at their located paths; a file that moved meanwhile is located once more."""
        read: dict[str, PeekedFile] = {}
        moved: list[str] = []
        for message_id in ids:
            peeked = self._read_peeked(queue, message_id, *found[message_id])
            if peeked is None:
                moved.append(message_id)
            else:
                read[message_id] = peeked
        if moved:
            again = self._locate(queue)
            for message_id in moved:
                if message_id in again:
                    peeked = self._read_peeked(queue, message_id, *again[message_id])
                    if peeked is not None:
                        read[message_id] = peeked
        return [read[i] for i in ids if i in read]

    def _read_peeked(
        self, queue: QueueName, message_id: str, path: str, count: int, deadline: int | None
    ) -> PeekedFile | None:
        """One message file read for a peek; None if it is gone or unreadable as a message."""
        try:
            with open(path, "rb") as f:
                header, body = model.decode(f.read())
        except (FileNotFoundError, model.CorruptMessage):
            return None
        except OSError as exc:
            raise _storage_error("read for peek", exc) from exc
        source = header.get("queue")
        return PeekedFile(
            queue=queue,
            message_id=MessageId(message_id),
            state="ready" if deadline is None else ("in_flight" if count > 0 else "delayed"),
            receive_count=count,
            visible_at_ms=deadline,
            body=body,
            content_type=str(header.get("content_type") or model.DEFAULT_CONTENT_TYPE),
            attributes=model.header_attributes(header),
            attribute_types=model.header_attribute_types(header),
            source_queue=source if isinstance(source, str) else None,
        )

    # -- receipt handles ---------------------------------------------------

    def _handle(self, queue: QueueName, handle: str) -> InFlightName:
        parsed = parse_receipt_handle(handle)
        if parsed.queue != queue:
            raise InvalidReceiptHandle(
                f"receipt handle belongs to queue {parsed.queue!r}, not {queue!r}", receipt_handle=handle
            )
        return parsed

    def find_lease(self, queue: QueueName, handle: str, hint: str | None = None) -> str | None:
        """The current ``delay/`` name of the lease ``handle`` made, or None if that lease is over.

        Tries the handle itself (no change of visibility since), then ``hint``
        (a name remembered by the caller; ignored unless it has the handle's
        lease key), then lists ``delay/`` for a name with the handle's lease
        key (:attr:`~mqcore.names.InFlightName.lease_key`). Never another lease
        of the same message.

        Raises:
            InvalidReceiptHandle: Malformed, or of another queue.
        """
        parsed = self._handle(queue, handle)
        for name in self._candidates(parsed, handle, hint):
            if os.path.lexists(self.layout.delay_path(name)):
                return name
        return self._search_lease(parsed)

    def find_leases(self, queue: QueueName, handles: list[str], hints: dict[str, str] | None = None) -> dict[str, str]:
        """Current ``delay/`` names of the leases several handles made, with at most one listing of ``delay/``.

        Like :meth:`find_lease` for each handle, but the handles neither found
        by name nor by ``hints`` (handle -> remembered name) share one listing.
        Malformed handles and handles of other queues are left out.

        Returns:
            handle -> current ``delay/`` name, for the leases still in flight.
        """
        found: dict[str, str] = {}
        wanted: dict[str, str] = {}  # lease key "Q.ID.RC.LT" -> handle
        for handle in handles:
            try:
                parsed = self._handle(queue, handle)
            except InvalidReceiptHandle:
                continue
            for name in self._candidates(parsed, handle, (hints or {}).get(handle)):
                if os.path.lexists(self.layout.delay_path(name)):
                    found[handle] = name
                    break
            else:
                wanted[parsed.lease_key] = handle
        if wanted:
            for name in self._listdir(self.layout.delay):
                handle = wanted.get(name[name.find(".") + 1 :])  # the key follows "DL."; parsed only on a hit
                if handle is not None and parse_in_flight_name(name) is not None:
                    found[handle] = name
        return found

    def _search_lease(self, parsed: InFlightName) -> str | None:
        """The ``delay/`` name with the lease key of ``parsed`` (one listing), or None."""
        key = parsed.lease_key
        for name in self._listdir(self.layout.delay):
            if name.endswith(key):
                item = parse_in_flight_name(name)
                if item is not None and item.lease_key == key:
                    return name
        return None

    @staticmethod
    def _candidates(parsed: InFlightName, handle: str, hint: str | None) -> list[str]:
        """The handle, then ``hint`` if it names the same lease (same lease key), never another lease."""
        if not hint or hint == handle:
            return [handle]
        hinted = parse_in_flight_name(hint)
        if hinted is None or hinted.lease_key != parsed.lease_key:
            return [handle]
        return [handle, hint]

    def change_visibility(
        self,
        queue: QueueName,
        handle: str,
        visibility_timeout_ms: int,
        now: int | None = None,
        hint: str | None = None,
    ) -> str:
        """Extend, shorten or end the lease ``handle`` made (SQS: ChangeMessageVisibility).

        The new deadline counts from ``now``. The rename of the lease's
        current ``delay/`` file is the compare-and-swap: if mq-mover
        redelivered it first, the rename fails and nothing changes. The
        lease keeps its key (``Q.ID.RC.LT``): only the deadline in the name
        changes, so the handle keeps naming this lease and no other.

        Args:
            queue: The queue (must be the handle's).
            handle: Receipt handle from a receive.
            visibility_timeout_ms: New timeout from now, in ms; 0 makes the
                message ready at once (renamed straight back into its queue).
            now: Current epoch ms.
            hint: The lease's current ``delay/`` name if the caller remembers it.
        Returns:
            The lease's new ``delay/`` name (usable as the handle from now on;
            the old one keeps working); for a release, ``handle`` unchanged.
        Raises:
            InvalidReceiptHandle: Malformed, or of another queue.
            MessageNotInFlight: The lease expired and the message is ready again, not yet received.
            StaleReceiptHandle: The message was received again since.
            MessageNotFound: The message is gone (deleted, dead-lettered, purged, expired).
            QueueNotFound: The queue was deleted.
        """
        parsed = self._handle(queue, handle)
        now = now if now is not None else now_ms()
        if visibility_timeout_ms > 0:
            new_name = in_flight_name(
                now + visibility_timeout_ms, queue, parsed.message_id, parsed.receive_count, parsed.token
            )
            target = self.layout.delay_path(new_name)
        else:
            new_name = handle
            target = os.path.join(self.layout.queue_dir(queue), ready_name(parsed.message_id, parsed.receive_count))
        names = self._candidates(parsed, handle, hint)
        for attempt in range(2):
            for name in names:
                try:
                    os.rename(self.layout.delay_path(name), target)
                    return new_name
                except FileNotFoundError:
                    if os.path.lexists(self.layout.delay_path(name)):
                        raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from None
                except OSError as exc:
                    raise _storage_error("rename for change of visibility", exc) from exc
            found = self._search_lease(parsed) if attempt == 0 else None
            if found is None:
                break
            names = [found]
        self._raise_lease_over(parsed, in_flight_ok=False)
        raise AssertionError("unreachable")

    def delete_by_handle(self, queue: QueueName, handle: str, hint: str | None = None) -> str:
        """Delete the message ``handle`` received, only if no later receive took it (SQS: DeleteMessage).

        Tries the lease's ``delay/`` file (the handle, ``hint``, then a listing
        of ``delay/`` for the handle's lease key: exactly this lease, never
        another lease of the message), then ``queues/Q/ID.RC`` with the
        handle's receive count (the lease expired but nobody received the
        message since, so this handle is still the latest). ``remove/`` is
        fsynced before returning.

        Returns:
            ``"in_flight"`` or ``"ready"``: where the message was.
        Raises:
            InvalidReceiptHandle: Malformed, or of another queue.
            StaleReceiptHandle: The message was received again since (the newer lease is untouched).
            MessageNotFound: The message is gone.
            QueueNotFound: The queue was deleted.
        """
        parsed = self._handle(queue, handle)
        target = removed_name(queue, parsed.message_id)
        where = None
        for name in self._candidates(parsed, handle, hint):
            if self._move_to_remove(self.layout.delay_path(name), target):
                where = "in_flight"
                break
        if where is None:
            found = self._search_lease(parsed)
            if found is not None and self._move_to_remove(self.layout.delay_path(found), target):
                where = "in_flight"
        if where is None:
            ready = os.path.join(self.layout.queue_dir(queue), ready_name(parsed.message_id, parsed.receive_count))
            if self._move_to_remove(ready, target):
                where = "ready"
        if where is None:
            self._raise_lease_over(parsed, in_flight_ok=True)
        try:
            self._sync_dir(self.layout.remove)
        except OSError as exc:
            raise _storage_error("fsync of remove/", exc) from exc
        return where  # type: ignore[return-value]

    def _raise_lease_over(self, parsed: InFlightName, *, in_flight_ok: bool) -> None:
        """Raise the error that says why the lease of ``parsed`` cannot be acted on.

        Stale: the message has a file with a higher receive count, or another
        lease (another lease key) with the same one (a receive made again
        after a power cut undid this handle's lease).
        """
        queue, message_id, count = parsed.queue, parsed.message_id, parsed.receive_count
        qdir = self.layout.queue_dir(queue)
        if not in_flight_ok and os.path.lexists(os.path.join(qdir, ready_name(message_id, count))):
            raise MessageNotInFlight(
                f"message {message_id} is not in flight: its visibility timeout expired and it is ready again",
                queue=queue,
                message_id=message_id,
            )
        later = 0
        rival = False  # another lease with this receive count
        infix = f".{queue}.{message_id}."
        for name in self._listdir(self.layout.delay):
            if infix in name:
                item = parse_in_flight_name(name)
                if item is not None and item.queue == queue and item.message_id == message_id:
                    later = max(later, item.receive_count)
                    rival = rival or (item.receive_count == count and item.lease_key != parsed.lease_key)
        if later <= count:
            prefix = f"{message_id}."
            for name in self._listdir(qdir):
                if name.startswith(prefix):
                    ready = parse_ready_name(name)
                    if ready is not None:
                        later = max(later, ready[1])
        if later > count:
            raise StaleReceiptHandle(
                f"message {message_id} was received again since this receipt handle was issued "
                f"(receive {later} > {count})",
                queue=queue,
                message_id=message_id,
                receive_count=later,
            )
        if rival:
            raise StaleReceiptHandle(
                f"message {message_id} is in flight under another receive than this receipt handle's "
                f"(receive {count} was made again)",
                queue=queue,
                message_id=message_id,
                receive_count=count,
            )
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        raise MessageNotFound(
            f"message {message_id} is no longer in queue {queue!r} (deleted, dead-lettered, purged or expired)",
            queue=queue,
            message_id=message_id,
        )

    def relet(
        self,
        queue: QueueName,
        handle: str,
        visibility_timeout_ms: int,
        now: int | None = None,
        policy: LeasePolicy | None = None,
        hint: str | None = None,
        search: bool = True,
    ) -> ReceivedMessage | None:
        """Receive again the message an earlier receive got (a retried receive request attempt).

        ``search=False`` skips the listing of ``delay/`` when neither the handle
        nor ``hint`` names the lease (the caller already searched, e.g. with
        :meth:`find_leases` for a whole batch).

        The message is taken from its lease's ``delay/`` file, or from
        ``queues/Q/ID.RC`` if that lease expired and nobody received it
        since, and leased afresh (receive count + 1, a new handle).

        Returns:
            The message, or None if it is gone or was received by someone else since.
        Raises:
            InvalidReceiptHandle: Malformed, or of another queue.
        """
        parsed = self._handle(queue, handle)
        ready = os.path.join(self.layout.queue_dir(queue), ready_name(parsed.message_id, parsed.receive_count))
        if search:
            current = self.find_lease(queue, handle, hint)
        else:
            candidates = self._candidates(parsed, handle, hint)
            current = next((n for n in candidates if os.path.lexists(self.layout.delay_path(n))), None)
        if current is not None:
            message = self._take(
                queue,
                self.layout.delay_path(current),
                parsed.message_id,
                parsed.receive_count,
                visibility_timeout_ms,
                now,
                policy,
            )
            if message is not None or not os.path.lexists(ready):
                return message
            # mq-mover made it ready between the lookup and the take: take it from there.
        return self._take(queue, ready, parsed.message_id, parsed.receive_count, visibility_timeout_ms, now, policy)

    # -- receive request attempts --------------------------------------------

    @staticmethod
    def _attempt_hash(attempt_id: str) -> str:
        return hashlib.sha256(attempt_id.encode()).hexdigest()

    def load_attempt_record(
        self, queue: QueueName, attempt_id: str, now: int | None = None
    ) -> tuple[list[str], int] | None:
        """``(handles, created_ms)`` recorded for ``attempt_id`` on ``queue`` within the last 5 minutes, or None.

        SQS: ReceiveRequestAttemptId is remembered for 5 minutes (from the first call).
        """
        data = self._read_json(self.layout.attempt_path(queue, self._attempt_hash(attempt_id)))
        if data is None or data.get("attempt_id") != attempt_id:
            return None
        created = data.get("created_ms")
        handles = data.get("handles")
        now = now if now is not None else now_ms()
        if not isinstance(created, int) or now - created >= ATTEMPT_WINDOW_MS or not isinstance(handles, list):
            return None
        return [h for h in handles if isinstance(h, str)], created

    def load_attempt(self, queue: QueueName, attempt_id: str, now: int | None = None) -> list[str] | None:
        """Receipt handles recorded for ``attempt_id`` on ``queue`` within the last 5 minutes, or None."""
        record = self.load_attempt_record(queue, attempt_id, now)
        return record[0] if record is not None else None

    def attempt_created_ms(self, queue: QueueName, attempt_id: str) -> int | None:
        """When ``attempt_id`` was first recorded on ``queue`` (epoch ms), or None."""
        data = self._read_json(self.layout.attempt_path(queue, self._attempt_hash(attempt_id)))
        created = data.get("created_ms") if data else None
        return created if isinstance(created, int) else None

    def save_attempt(
        self,
        queue: QueueName,
        attempt_id: str,
        handles: list[str],
        now: int | None = None,
        created_ms: int | None = None,
    ) -> None:
        """Record the handles a receive with ``attempt_id`` returned (atomic replace, not fsynced).

        ``created_ms`` keeps the first call's time on a retry, so the 5-minute
        window is not extended by retrying. Not fsynced: after a power cut a
        retry gets new messages, and the old ones come back after their
        visibility timeout (at-least-once still holds).

        Raises:
            StorageUnavailable: The record could not be written.
        """
        stamp = now if now is not None else now_ms()
        record = {"attempt_id": attempt_id, "created_ms": created_ms or stamp, "queue": queue, "handles": handles}
        name = os.path.basename(self.layout.attempt_path(queue, self._attempt_hash(attempt_id)))
        tmp = os.path.join(self.layout.attempts, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_json_bytes(record))
            os.rename(tmp, os.path.join(self.layout.attempts, name))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _storage_error("writing the receive attempt record", exc) from exc

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

    # -- purge -------------------------------------------------------------

    def purge(self, queue: QueueName, now: int | None = None) -> int:
        """Remove every message of ``queue`` sent up to now, in one step as seen by consumers (SQS: PurgeQueue).

        Step 1 writes the marker ``queues/Q/.purge`` holding a fresh message
        id T (atomic replace, fsynced): from then on every receive, redelivery
        and sweep treats a message with id <= T as gone. Step 2 moves the
        files it finds (the queue directory and the queue's files in
        ``delay/``, in flight and delayed) to ``remove/``; what it misses
        (a send publishing concurrently, a crash in step 2) is removed by the
        next receive, mq-mover or mq-reaper that meets it. A marker never
        moves back (a concurrent purge with a smaller T keeps the larger).

        Returns:
            Number of message files moved to ``remove/`` in step 2.
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The marker could not be made durable.
        """
        if not self.queue_exists(queue):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        stamp = now if now is not None else now_ms()
        threshold = self.ids.next_id(stamp)
        previous = self.purged_before(queue)
        if previous is not None and previous > threshold:
            threshold = previous
        self._replace_json(self.layout.queue_dir(queue), ".purge", {"purged_before_id": threshold, "purged_ms": stamp})
        moved = 0
        qdir = self.layout.queue_dir(queue)
        for name in self._listdir(qdir):
            parsed = parse_ready_name(name)
            if parsed is not None and parsed[0] <= threshold:
                moved += self._move_to_remove(os.path.join(qdir, name), removed_name(queue, parsed[0]))
        for name in self._listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is not None and item.queue == queue and item.message_id <= threshold:
                moved += self._move_to_remove(self.layout.delay_path(name), removed_name(queue, item.message_id))
        try:
            self._sync_dir(self.layout.remove)
        except OSError as exc:
            raise _storage_error("fsync of remove/", exc) from exc
        return moved

    # -- redrive -------------------------------------------------------------

    def redrive_one(
        self, dead_letter_queue: QueueName, filename: str, destination: QueueName | None = None
    ) -> tuple[QueueName, str] | None:
        """Move one ready message out of a dead-letter queue: ``queues/DLQ/ID.RC`` -> ``queues/DEST/NEWID.0``.

        The message gets a fresh id (NEWID) and its receive count starts
        again at 0, so it has its full ``max_receive_count`` again. The fresh
        id is what keeps the name forms free of ABA (protocol.md §2): with
        the old id and a count back at 0, the names ``ID.1``, ``ID.2``, ...
        would come back, and a receipt handle from before the dead-lettering
        would match a new consumer's lease. Redriven oldest first, the
        messages keep their relative order and join DEST behind what is
        already there. DEST is ``destination`` or else the queue the message
        was first sent to (its header's ``queue``). DEST's directory is
        fsynced (group commit).

        Returns:
            ``(DEST, its ready file name there)``, or None if the file is gone, has no known
            source queue, or DEST does not exist.
        Raises:
            StorageUnavailable: The rename or fsync failed.
        """
        parsed = parse_ready_name(filename)
        if parsed is None:
            return None
        src = os.path.join(self.layout.queue_dir(dead_letter_queue), filename)
        dest = destination
        if dest is None:
            source = self._header_of(src).get("queue")
            if not isinstance(source, str) or source == dead_letter_queue:
                return None
            try:
                dest = check_queue_name(source)
            except ValueError:
                return None
        qdir = self.layout.queue_dir(dest)
        target = ready_name(self.ids.next_id(), 0)
        try:
            os.rename(src, os.path.join(qdir, target))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _storage_error("rename for redrive", exc) from exc
        try:
            self._sync_dir(qdir)
        except OSError as exc:
            raise _storage_error("fsync of the destination queue", exc) from exc
        return dest, target

    def _header_of(self, path: str) -> dict[str, Any]:
        """The header of a message file ({} if unreadable)."""
        try:
            with open(path, "rb") as f:
                line = f.readline(65536)
        except OSError:
            return {}
        if not line.startswith(model.MAGIC):
            return {}
        try:
            header = json.loads(line[len(model.MAGIC) :])
        except ValueError:
            return {}
        return header if isinstance(header, dict) else {}

    def read_redrive_status(self, queue: QueueName) -> dict[str, Any] | None:
        """The status of the last redrive out of ``queue`` (``queues/Q/.redrive``), or None."""
        return self._read_json(self.layout.redrive_path(queue))

    def write_redrive_status(self, queue: QueueName, status: dict[str, Any]) -> None:
        """Replace the redrive status of ``queue`` atomically.

        Raises:
            QueueNotFound: The queue was deleted.
            StorageUnavailable: The file could not be written.
        """
        self._replace_json(self.layout.queue_dir(queue), ".redrive", status)

    def request_redrive_cancel(self, queue: QueueName, task_id: str, now: int | None = None) -> None:
        """Ask the daemon running redrive ``task_id`` out of ``queue`` to stop (``queues/Q/.redrive-cancel``).

        A file of its own, so the request cannot be overwritten by the
        running task's next status write (which a read-modify-write of
        ``.redrive`` would allow). The task checks it at every status write.

        Raises:
            QueueNotFound: The queue was deleted.
            StorageUnavailable: The file could not be written.
        """
        stamp = now if now is not None else now_ms()
        self._replace_json(
            self.layout.queue_dir(queue), REDRIVE_CANCEL_FILE, {"task_id": task_id, "requested_ms": stamp}
        )

    def redrive_cancel_request(self, queue: QueueName) -> dict[str, Any] | None:
        """The cancel request of ``queue``'s redrive (``{"task_id", "requested_ms"}``), or None."""
        return self._read_json(os.path.join(self.layout.queue_dir(queue), REDRIVE_CANCEL_FILE))

    # -- counts and sweeps (mq, mq-reaper) ------------------------------------

    def count_delay(self, queue: QueueName | None = None) -> dict[QueueName, tuple[int, int]]:
        """``{queue: (in_flight, delayed)}`` from one listing of ``delay/`` (only ``queue`` if given).

        In flight = receive count >= 1; delayed = a delayed send not yet visible (receive count 0).
        """
        counts: dict[QueueName, list[int]] = {}
        for name in self._listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is None or (queue is not None and item.queue != queue):
                continue
            pair = counts.setdefault(item.queue, [0, 0])
            pair[0 if item.receive_count else 1] += 1
        return {q: (a, b) for q, (a, b) in counts.items()}

    def expire_queue(self, queue: QueueName, now: int | None = None) -> int:
        """Move ready messages of ``queue`` that were purged or outlived its retention period to ``remove/``.

        Also unlinks temporary metadata files (``.NAME.TOKEN.tmp``) older than
        the attempt window, left by a writer that died. Used by mq-reaper.

        Returns:
            Number of messages moved.
        """
        now = now if now is not None else now_ms()
        policy = self.policy(queue, now)
        qdir = self.layout.queue_dir(queue)
        moved = 0
        for name in self._listdir(qdir):
            parsed = parse_ready_name(name)
            if parsed is not None:
                if policy.is_gone(parsed[0], now):
                    moved += self._move_to_remove(os.path.join(qdir, name), removed_name(queue, parsed[0]))
            elif name.startswith(".") and name.endswith(".tmp"):
                self._unlink_if_older(os.path.join(qdir, name), now - TMP_GRACE_MS)
        return moved

    def expire_in_flight(self, now: int | None = None) -> int:
        """Move files in ``delay/`` whose message was purged or outlived its queue's retention to ``remove/``.

        Files of queues that no longer exist are left to mq-mover (it moves
        them to ``remove/`` when they come due). Used by mq-reaper.

        Returns:
            Number of messages moved.
        """
        now = now if now is not None else now_ms()
        policies: dict[QueueName, LeasePolicy] = {}
        moved = 0
        for name in self._listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is None:
                continue
            policy = policies.get(item.queue)
            if policy is None:
                policy = policies[item.queue] = self.policy(item.queue, now)
            if policy.is_gone(item.message_id, now):
                moved += self._move_to_remove(self.layout.delay_path(name), removed_name(item.queue, item.message_id))
        return moved

    def sweep_attempts(self, now: int | None = None) -> int:
        """Unlink receive attempt records (and their temporary files) older than 5 minutes; return how many."""
        cutoff = (now if now is not None else now_ms()) - ATTEMPT_WINDOW_MS
        return sum(
            self._unlink_if_older(os.path.join(self.layout.attempts, n), cutoff)
            for n in self._listdir(self.layout.attempts)
        )

    def sweep_staging(self, older_than_ms: int, now: int | None = None) -> int:
        """Remove staging directories ``queues/.Q.TOKEN.creating`` older than ``older_than_ms`` (a creator died)."""
        cutoff = (now if now is not None else now_ms()) - older_than_ms
        removed = 0
        for name in self._listdir(self.layout.queues):
            if not (name.startswith(".") and name.endswith(STAGING_SUFFIX)):
                continue
            path = os.path.join(self.layout.queues, name)
            try:
                if os.stat(path).st_mtime_ns // 1_000_000 > cutoff:
                    continue
            except FileNotFoundError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
        return removed

    def _unlink_if_older(self, path: str, cutoff_ms: int) -> bool:
        try:
            if os.stat(path).st_mtime_ns // 1_000_000 > cutoff_ms:
                return False
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("cannot remove stale file path=%s error=%s", path, exc)
            return False

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
        except OSError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return "gone"  # moved by another host meanwhile (section 13.3); a later rescan finds it if not
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

    def _read_json(self, path: str) -> dict[str, Any] | None:
        """A small JSON metadata file as a dict; None if it does not exist or is not a JSON object."""
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except (OSError, ValueError) as exc:
            logger.error("unreadable metadata file path=%s error=%s", path, exc)
            return None
        return data if isinstance(data, dict) else None

    def _replace_json(self, directory: str, name: str, obj: Any) -> None:
        """Atomically replace ``directory/name`` with ``obj`` as JSON: write ``.NAME.TOKEN.tmp``, fsync, rename, fsync.

        Raises:
            QueueNotFound: ``directory`` is gone (its queue was deleted).
            StorageUnavailable: Any step failed (the temporary file is removed).
        """
        tmp = os.path.join(directory, f".{name.lstrip('.')}.{uuid.uuid4().hex}.tmp")
        try:
            self._write_file(tmp, _json_bytes(obj))
        except StorageUnavailable:
            if not os.path.isdir(directory):
                raise QueueNotFound(f"{os.path.basename(directory)!r} does not exist") from None
            raise
        try:
            os.rename(tmp, os.path.join(directory, name))
            self._sync_dir(directory)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _storage_error(f"replacing {name}", exc) from exc

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


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


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
