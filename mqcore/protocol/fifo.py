"""FIFO queues on disk (docs/protocol.md 19): deduplication records and the message group of a file.

A FIFO queue is one whose name ends with ``.fifo`` (:func:`mqcore.names.is_fifo_queue`);
nothing else on disk marks it. Its sends go through :func:`send_fifo` instead of
``Store.send``:

1. ``open("queues/Q/.dedup.HASH")`` and read it (HASH = sha256 of the deduplication id,
   hex; of ``GROUP\\nID`` on a queue deduplicating per message group). A record younger
   than :data:`DEDUP_WINDOW_MS` names the message already sent with that id: the send is a
   duplicate and answers that message's id (after rolling a half-done send forward, below)
   without storing anything.
2. ``new/Q.ID`` is written and fsynced exactly as a standard send (section 6.2), its header
   carrying ``group_id`` and ``dedup_id``.
3. An expired record is first renamed to ``.dedup.HASH.TOKEN.old`` (only one racer wins) and
   unlinked; then the record is written and fsynced under a unique temporary name
   ``.dedup.HASH.TOKEN.tmp`` and published with ``link`` to ``.dedup.HASH`` (atomic, never
   replaces), so no process and no other host ever sees the record incomplete. ``EEXIST``:
   another sender won the id meanwhile: ``new/Q.ID`` is unlinked and step 1 runs again. The
   temporary name is unlinked either way.
4. ``rename("new/Q.ID", "queues/Q/ID.0")`` and ``fsync("queues/Q")`` commit the record
   and the message together (one directory).

A duplicate whose record names a message still in ``new/`` (its sender died, or is
between steps 3 and 4) renames it into the queue itself ("roll forward"): the file was
fsynced before the record existed, so it is complete. Either rename wins once; the
other's ``ENOENT`` is then success.

Blocking functions over the Store; pure rules are in :mod:`mqcore.service.fifo`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass

from mqcore import model
from mqcore.errors import StorageUnavailable
from mqcore.names import MessageId, QueueName, check_message_id, ready_name
from mqcore.protocol import Store
from mqcore.protocol._fs import lost_race, storage_error
from mqcore.protocol.send import SEND_CREATE_ATTEMPTS, PendingMessage

logger = logging.getLogger(__name__)

#: How long a deduplication id is remembered, in ms (SQS: 5 minutes).
DEDUP_WINDOW_MS = 300_000
#: Prefix of deduplication records inside ``queues/Q/`` (a "." name: never a message name).
DEDUP_PREFIX = ".dedup."
#: Header keys of a FIFO message file (section 4: readers ignore unknown keys).
GROUP_KEY = "group_id"
DEDUP_KEY = "dedup_id"
#: Least time between two sweeps of one queue's expired records by one process, in ms.
SWEEP_INTERVAL_MS = 60_000
#: Age below which an unreadable record is taken for one being written, not one torn by a crash, in ms.
TORN_RECORD_MS = 10_000
#: Least age (by mtime) of a record mq-reaper sweeps, in ms: the window plus a minute, for hosts sharing a root
#: whose clocks (and the file server's mtimes) differ a little.
REAPER_MIN_AGE_MS = DEDUP_WINDOW_MS + 60_000
#: Suffix of a record's temporary name ``.dedup.HASH.TOKEN.tmp``: written and fsynced there, then linked to its name.
TMP_SUFFIX = ".tmp"
#: Bytes read to find a header: more than its largest form (8,000 bytes of attributes, 1,024 of content type, ids).
HEADER_READ_BYTES = 65_536

_swept: dict[str, int] = {}
_swept_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class FifoSend:
    """One message to send to a FIFO queue, its rules already checked (:mod:`mqcore.service.fifo`).

    Attributes:
        body: The body bytes.
        group_id: MessageGroupId (1-128 characters).
        dedup_id: MessageDeduplicationId, given or derived from the body (1-128 characters).
        content_type: Its Content-Type, or None.
        attributes: User message attributes (name -> string), or None.
        attribute_types: SQS DataType of attributes that are not plain ``String``, or None.
        per_group: The queue's deduplication scope is the message group (SQS: DeduplicationScope
            messageGroup): the record is named by the group and the id (:func:`dedup_key`).
    """

    body: bytes
    group_id: str
    dedup_id: str
    content_type: str | None = None
    attributes: dict[str, str] | None = None
    attribute_types: dict[str, str] | None = None
    per_group: bool = False


def dedup_key(message: FifoSend) -> str:
    """What the record's HASH is taken of: the deduplication id, or ``GROUP + "\\n" + ID`` when scoped per group.

    A group id has no ``\\n`` (``[!-~]``), so the two forms never name the same record.
    """
    return f"{message.group_id}\n{message.dedup_id}" if message.per_group else message.dedup_id


def dedup_hash(key: str) -> str:
    """HASH of a record name: the sha256 of :func:`dedup_key`'s UTF-8 bytes, 64 hex digits."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _record_path(store: Store, queue: QueueName, key: str) -> str:
    return os.path.join(store.layout.queue_dir(queue), DEDUP_PREFIX + dedup_hash(key))


def _read_record(path: str) -> tuple[MessageId, int] | None:
    """``(message id, written at ms)`` of a record; None if absent or unreadable (a torn record is stale)."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read(4096))
        return check_message_id(record["message_id"]), int(record["at_ms"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("unreadable deduplication record path=%s error=%s", path, exc)
        return None


def _retire(path: str) -> None:
    """Move an expired or unreadable record out of the way: rename to a unique ``.old`` name, then unlink."""
    old = f"{path}.{uuid.uuid4().hex}.old"
    try:
        os.rename(path, old)
    except FileNotFoundError:
        return  # another sender retired it first
    except OSError as exc:
        raise storage_error("retiring a deduplication record", exc) from exc
    with contextlib.suppress(OSError):
        os.unlink(old)


def _retire_unless_being_written(path: str, now_ms: int) -> bool:
    """Retire an expired or unreadable record; an unreadable one younger than :data:`TORN_RECORD_MS` is being written.

    Records this version writes are never seen incomplete (:func:`_publish_record`): an unreadable record
    is one an older version (which created the record with ``O_EXCL`` and then wrote it) is writing, or
    left torn by its crash (docs/protocol.md 19.2). The record is read again here: one that is live now
    (its writer finished since step 1) is never retired.

    Args:
        path: The record ``queues/Q/.dedup.HASH``.
        now_ms: The send's time, epoch ms.
    Returns:
        True if the record is gone (retired here or by another sender); False if it is live now (the caller
        reads it again: its send is a duplicate).
    Raises:
        StorageUnavailable: The record is unreadable and young: a send of an older version is between its
            create and its write (503, retriable: the retry sees its record).
    """
    try:
        mtime_ms = os.stat(path).st_mtime_ns // 1_000_000
    except FileNotFoundError:
        return True
    except OSError as exc:
        raise storage_error("stat of a deduplication record", exc) from exc
    found = _read_record(path)
    if found is not None and now_ms - found[1] < DEDUP_WINDOW_MS:
        return False
    if found is None and now_ms - mtime_ms < TORN_RECORD_MS:
        raise StorageUnavailable("another send of this deduplication id is in progress; retry")
    _retire(path)
    return True


def _write_new(store: Store, queue: QueueName, message: FifoSend) -> PendingMessage:
    """Step 2: ``new/Q.ID`` written (O_EXCL) and fsynced, with the FIFO header keys."""
    extra = {GROUP_KEY: message.group_id, DEDUP_KEY: message.dedup_id}
    body = message.body
    head = model.encode_header(
        len(body), message.content_type, message.attributes, queue, message.attribute_types, extra
    )
    for attempt in range(1, SEND_CREATE_ATTEMPTS + 1):
        message_id = store.ids.next_id()
        path = store.layout.new_path(queue, message_id)
        try:
            store.disk.write_file(path, head, exists_ok_to_retry=attempt < SEND_CREATE_ATTEMPTS, body=body)
        except FileExistsError:
            continue  # section 13.2: a fresh id is a fresh name
        return PendingMessage(queue, message_id, path)
    raise StorageUnavailable("could not create the message file")  # pragma: no cover - write_file raised


def _publish_record(tmp: str, record: str) -> bool:
    """Step 4's end: ``link`` the written and fsynced temporary ``tmp`` to ``record``, then unlink ``tmp``.

    ``link`` is atomic and never replaces an existing name, so the record appears complete or not at
    all, to this host and to every other one (tests/cluster/test_cluster_fifo.py races it on GlusterFS).

    Args:
        tmp: The temporary ``queues/Q/.dedup.HASH.TOKEN.tmp``, complete and fsynced.
        record: The record's path ``queues/Q/.dedup.HASH``.
    Returns:
        True if this send's record now has the name; False if another sender's record had it (``EEXIST``).
    Raises:
        StorageUnavailable: The link failed otherwise (the record may or may not be in place: a retry reads it).
    """
    try:
        os.link(tmp, record)
    except FileExistsError as exc:
        lost_race("link", exc)
        return False
    except OSError as exc:
        raise storage_error("link of a deduplication record", exc) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return True


def _commit(store: Store, queue: QueueName, message_id: MessageId, record: str) -> None:
    """Step 4 (and the roll forward): rename ``new/Q.ID`` to ``queues/Q/ID.0``, fsync ``queues/Q``.

    ``ENOENT`` is success when the record still names ``message_id`` (a duplicate rolled it
    forward first, or this is the roll forward of a message already committed).
    """
    qdir = store.layout.queue_dir(queue)
    try:
        os.rename(store.layout.new_path(queue, message_id), os.path.join(qdir, ready_name(message_id, 0)))
    except FileNotFoundError:
        store._require_queue(queue)
        current = _read_record(record)
        if current is None or current[0] != message_id:
            raise StorageUnavailable("message file vanished from new/ before it was published") from None
    except OSError as exc:
        raise storage_error("rename", exc) from exc
    store.disk.sync_dir(qdir, "fsync of the directory")


def send_fifo(store: Store, queue: QueueName, message: FifoSend) -> tuple[MessageId, bool]:
    """Send one message to a FIFO queue with deduplication (docs/protocol.md 19.2).

    Args:
        store: The store.
        queue: A FIFO queue (name ending ``.fifo``).
        message: The message, its group and deduplication ids checked.
    Returns:
        ``(message id, duplicate)``: the new message's id, or, for a duplicate of a message sent
        in the last :data:`DEDUP_WINDOW_MS` with the same deduplication id, that message's id and True
        (nothing stored: SQS accepts a duplicate and does not deliver it again).
    Raises:
        QueueNotFound: No such queue (nothing is written).
        StorageUnavailable: It could not be guaranteed stored (the sender may resend: a resend within the
            window with the same deduplication id is never delivered twice).
    """
    store._require_queue(queue)
    record = _record_path(store, queue, dedup_key(message))
    _maybe_sweep(store, queue)
    for _ in range(SEND_CREATE_ATTEMPTS):
        now = store.clock()
        found = _read_record(record)
        if found is not None and now - found[1] < DEDUP_WINDOW_MS:
            _commit(store, queue, found[0], record)  # roll forward if still in new/; fsync either way
            return found[0], True
        if os.path.lexists(record) and not _retire_unless_being_written(record, now):
            continue  # written since the read above (an older version's record): read it again
        pending = _write_new(store, queue, message)
        body = json.dumps({"message_id": pending.message_id, "at_ms": now}).encode()
        tmp = f"{record}.{uuid.uuid4().hex}{TMP_SUFFIX}"
        try:
            store.disk.write_file(tmp, body)  # on failure nothing of it is left
        except StorageUnavailable:
            with contextlib.suppress(OSError):
                os.unlink(pending.path)
            raise
        # A link failing otherwise than EEXIST raises with new/Q.ID left to sweep_new: the link may have
        # happened, and the record must not name a message unlinked under it (docs/protocol.md 19.2, step 4).
        if not _publish_record(tmp, record):
            with contextlib.suppress(OSError):
                os.unlink(pending.path)
            continue  # another sender took the id meanwhile: we are its duplicate
        _commit(store, queue, pending.message_id, record)
        return pending.message_id, False
    raise StorageUnavailable("the deduplication record kept changing under this send")


def sweep_dedup(store: Store, queue: QueueName, now_ms: int | None = None, min_age_ms: int = DEDUP_WINDOW_MS) -> int:
    """Unlink the queue's records (and retired ``.old``, leftover ``.tmp`` names) older than ``min_age_ms``, by mtime.

    Used by senders (:func:`send_fifo`, at most once a minute) and by mq-reaper's expiry sweep
    (``min_age_ms`` = :data:`REAPER_MIN_AGE_MS`). A record is never unlinked by the name it was
    judged under: it is renamed to a unique ``.old`` name first and its age checked again there,
    so a record that a sender put in place between the first check and the rename (an expired
    one retired and a new one written, docs/protocol.md 19.2 steps 2 and 4) is linked back, not
    lost.

    Args:
        store: The root.
        queue: A FIFO queue.
        now_ms: The time to judge by, epoch ms (default: the store's clock).
        min_age_ms: Records whose mtime is less than this old are kept; at least the window
            (SQS: 5 minutes), so no live record and no record of a send in progress is removed.
    Returns:
        How many were unlinked. Listing or stat errors end the sweep quietly (the next one retries).
    Raises:
        ValueError: ``min_age_ms`` below :data:`DEDUP_WINDOW_MS`.
    """
    if min_age_ms < DEDUP_WINDOW_MS:
        raise ValueError(f"min_age_ms must be at least the deduplication window ({DEDUP_WINDOW_MS} ms)")
    now = store.clock() if now_ms is None else now_ms
    cutoff_ns = (now - min_age_ms) * 1_000_000
    removed = 0
    try:
        with os.scandir(store.layout.queue_dir(queue)) as entries:
            for entry in entries:
                if not entry.name.startswith(DEDUP_PREFIX):
                    continue
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime_ns >= cutoff_ns:
                        continue
                    if entry.name.endswith((".old", TMP_SUFFIX)):  # retired, or a crashed send's temporary
                        os.unlink(entry.path)  # never read again
                    elif not _sweep_record(entry.path, cutoff_ns):
                        continue
                    removed += 1
    except OSError:
        return removed
    return removed


def _sweep_record(path: str, cutoff_ns: int) -> bool:
    """Retire the record ``path``, judged older than ``cutoff_ns``; True if an old record was unlinked.

    Raises:
        OSError: The rename or a stat failed (the record is then where it was, or retired).
    """
    old = f"{path}.{uuid.uuid4().hex}.old"
    try:
        os.rename(path, old)
    except FileNotFoundError:
        return False  # a sender retired it first
    if os.stat(old).st_mtime_ns >= cutoff_ns:  # replaced by a sender since the first stat: put it back
        with contextlib.suppress(FileExistsError):  # a newer record of the same id is there: it stands
            os.link(old, path)
        os.unlink(old)
        return False
    os.unlink(old)
    return True


def _maybe_sweep(store: Store, queue: QueueName) -> None:
    """Sweep a queue's expired records at most once per :data:`SWEEP_INTERVAL_MS` per process (FIFO sends only)."""
    now = int(time.monotonic() * 1000)
    key = f"{store.layout.root}/{queue}"
    with _swept_lock:
        if now - _swept.get(key, -SWEEP_INTERVAL_MS) < SWEEP_INTERVAL_MS:
            return
        _swept[key] = now
    sweep_dedup(store, queue)


def read_fifo_header(path: str) -> tuple[str, str] | None:
    """``(group id, deduplication id)`` from a message file's header; None if absent, gone or unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_READ_BYTES)
    except OSError:
        return None
    end = head.find(b"\n")
    if not head.startswith(model.MAGIC) or end < 0:
        return None
    try:
        header = json.loads(head[len(model.MAGIC) : end])
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(header.get(GROUP_KEY), str):
        return None
    dedup = header.get(DEDUP_KEY)
    return header[GROUP_KEY], dedup if isinstance(dedup, str) else ""
