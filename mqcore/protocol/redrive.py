"""Redrive (docs/protocol.md 15.10): move dead letters back, and the task's status and cancel files."""

from __future__ import annotations

import json
import os
from typing import Any

from mqcore import model
from mqcore.names import REDRIVE_CANCEL_FILE, QueueName, check_queue_name, parse_ready_name, ready_name
from mqcore.protocol._fs import read_json, rename_if_present
from mqcore.protocol.queues import Queues


class Redrives(Queues):
    """One message out of a dead-letter queue at a time, and the files a redrive task keeps in it."""

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
            source = model.header_source_queue(_header_of(src))
            if source is None or source == dead_letter_queue:
                return None
            try:
                dest = check_queue_name(source)
            except ValueError:
                return None
        qdir = self.layout.queue_dir(dest)
        target = ready_name(self.ids.next_id(), 0)
        if not rename_if_present(src, os.path.join(qdir, target), "rename for redrive"):
            return None
        self.disk.sync_dir(qdir, "fsync of the destination queue")
        return dest, target

    def read_redrive_status(self, queue: QueueName) -> dict[str, Any] | None:
        """The status of the last redrive out of ``queue`` (``queues/Q/.redrive``), or None."""
        return read_json(self.layout.redrive_path(queue))

    def write_redrive_status(self, queue: QueueName, status: dict[str, Any]) -> None:
        """Replace the redrive status of ``queue`` atomically.

        Raises:
            QueueNotFound: The queue was deleted.
            StorageUnavailable: The file could not be written.
        """
        self.disk.replace_json(self.layout.queue_dir(queue), ".redrive", status)

    def request_redrive_cancel(self, queue: QueueName, task_id: str) -> None:
        """Ask the daemon running redrive ``task_id`` out of ``queue`` to stop (``queues/Q/.redrive-cancel``).

        A file of its own, so the request cannot be overwritten by the
        running task's next status write (which a read-modify-write of
        ``.redrive`` would allow). The task checks it at every status write.

        Args:
            queue: The dead-letter queue the task moves messages out of.
            task_id: The task to stop (the request is stamped with the store's clock).
        Raises:
            QueueNotFound: The queue was deleted.
            StorageUnavailable: The file could not be written.
        """
        request = {"task_id": task_id, "requested_ms": self.clock()}
        self.disk.replace_json(self.layout.queue_dir(queue), REDRIVE_CANCEL_FILE, request)

    def redrive_cancel_request(self, queue: QueueName) -> dict[str, Any] | None:
        """The cancel request of ``queue``'s redrive (``{"task_id", "requested_ms"}``), or None."""
        return read_json(os.path.join(self.layout.queue_dir(queue), REDRIVE_CANCEL_FILE))


def _header_of(path: str) -> dict[str, Any]:
    """The header of a message file, read without its body ({} if unreadable)."""
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
