"""Bulk leases (docs/protocol.md 20, issue 17): many leases under one key, recorded in ``queues/Q/.lease.KEY``.

A bulk lease is up to *n* ordinary leases (6.3, 15.5: one rename each into
``delay/``) made by one request, and one record in the queue's directory
naming their receipt handles. The record is written (atomic replace, not
fsynced, like an attempt record, 15.7) before the request is answered, and
kept as long as its leases may be in flight: a retry with the same key leases
the recorded messages again instead of new ones (the re-let of a receive
attempt, 15.7) and rewrites the record; a delete by key deletes exactly them,
by their handles (15.6), then unlinks the record
(:meth:`BulkLeases.drop_bulk_lease`); mq-reaper unlinks a record
left behind once its deadline is :data:`BULK_RECORD_GRACE_MS` past
(:func:`sweep_bulk_record`). Leasing itself is unchanged: which ready names a
bulk lease takes is the driver's, as for a receive.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from mqcore.names import (
    ATTEMPT_WINDOW_MS,
    BULK_LEASE_PREFIX,
    QueueName,
)
from mqcore.protocol._fs import read_json, storage_error, unlink_if_older, write_json_unsynced
from mqcore.protocol.handles import Handles

__all__ = ["BULK_RECORD_GRACE_MS", "BulkLeases", "BulkRecord", "is_bulk_record_name", "sweep_bulk_record"]

#: How long after its deadline a bulk lease record is kept before mq-reaper unlinks it, ms (the
#: receive attempt window, 5 minutes): a delete by key meanwhile still deletes messages whose lease
#: ended but that nobody received since (15.6's fallback to ``queues/Q/ID.RC``).
BULK_RECORD_GRACE_MS = ATTEMPT_WINDOW_MS


def is_bulk_record_name(name: str) -> bool:
    """True for a record's name ``.lease.KEY`` in a queue directory (not its temporary ``.lease.KEY.HEX.tmp``)."""
    return name.startswith(BULK_LEASE_PREFIX) and "." not in name[len(BULK_LEASE_PREFIX) :]


@dataclass(frozen=True, slots=True)
class BulkRecord:
    """What ``queues/Q/.lease.KEY`` holds.

    Attributes:
        key: The lease key (:func:`mqcore.names.check_bulk_key`).
        queue: The queue.
        created_ms: When the leases were made (epoch ms, the leasing host's clock).
        deadline_ms: The leases' visibility deadline when they were made (epoch ms).
        handles: The receipt handles (``delay/`` names) of the leases, in the order leased.
    """

    key: str
    queue: QueueName
    created_ms: int
    deadline_ms: int
    handles: list[str]


class BulkLeases(Handles):
    """The record of a bulk lease: write, read, unlink (docs/protocol.md 20)."""

    def load_bulk_lease(self, queue: QueueName, key: str) -> BulkRecord | None:
        """The record of ``key`` on ``queue``, or None (none, unreadable, or of another key).

        Raises:
            InvalidRequest: ``key`` is not a lease key (before any path is built).
            InvalidQueueName: ``queue`` is not a queue name.
        """
        data = read_json(self.layout.bulk_lease_path(queue, key))
        if data is None or data.get("key") != key:
            return None
        handles, created, deadline = data.get("handles"), data.get("created_ms"), data.get("deadline_ms")
        if not isinstance(handles, list) or not isinstance(created, int) or not isinstance(deadline, int):
            return None
        return BulkRecord(key, queue, created, deadline, [h for h in handles if isinstance(h, str)])

    def save_bulk_lease(self, queue: QueueName, key: str, handles: Sequence[str], deadline_ms: int) -> BulkRecord:
        """Write the record of ``key``: ``.lease.KEY.HEX.tmp`` then ``rename`` over ``.lease.KEY`` (not fsynced).

        Called after the leases' renames and before the answer. Not fsynced: the leases
        themselves are not durable either (6.3); after a power cut a retry leases anew
        and the old leases end at their deadline.

        Raises:
            InvalidRequest: ``key`` is not a lease key.
            StorageUnavailable: The write or the rename failed (e.g. the queue was deleted meanwhile).
        """
        record = BulkRecord(key, queue, self.clock(), deadline_ms, list(handles))
        path = self.layout.bulk_lease_path(queue, key)
        body = {
            "key": key,
            "queue": queue,
            "created_ms": record.created_ms,
            "deadline_ms": deadline_ms,
            "handles": record.handles,
        }
        write_json_unsynced(os.path.dirname(path), os.path.basename(path), body, "writing the bulk lease record")
        return record

    def drop_bulk_lease(self, queue: QueueName, key: str) -> bool:
        """Unlink the record of ``key`` (after its leases were deleted); False if it was gone.

        Raises:
            StorageUnavailable: The unlink failed other than with ENOENT.
        """
        try:
            os.unlink(self.layout.bulk_lease_path(queue, key))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error("unlinking the bulk lease record", exc) from exc


def sweep_bulk_record(path: str, now: int) -> bool:
    """Unlink the bulk lease record at ``path`` if its deadline is :data:`BULK_RECORD_GRACE_MS` past (mq-reaper).

    The unlink is :func:`~mqcore.protocol._fs.unlink_if_older` with the deadline read as the
    cutoff, so a record a retry rewrote after that read (mtime later than the old deadline) is
    kept. A record that cannot be read as one (foreign content) is judged by its mtime alone.
    Returns True if it was unlinked; a failure is logged (the next sweep tries again).
    """
    data = read_json(path)
    deadline = data.get("deadline_ms") if data else None
    if not isinstance(deadline, int):
        return unlink_if_older(path, now - BULK_RECORD_GRACE_MS)
    if deadline + BULK_RECORD_GRACE_MS > now:
        return False
    return unlink_if_older(path, deadline)
